"""The banded matmul kernels ``tvm_ollie.cpu.g2bmm`` / ``tvm_ollie.cpu.gbmm`` against numpy.

    g2bmm: out[b, i, j] = sum_k A[b, i, k] * B[b, i + D*(j - W), k]
    gbmm:  out[b, i, n] = sum_j A[b, i, j] * B[b, i + D*(j - W), n]      (j in [0, 2W])

with rows of B outside [0, L) reading as 0. The references are float64 loops over the window.
"""

import numpy as np
import pytest

from native_util import call_direct, call_relax, require_native
from tvm_ollie import native


@pytest.fixture(autouse=True)
def _native():
    require_native()
    if not native.provides(native.G2BMM) or not native.provides(native.GBMM):
        pytest.skip("the loaded native library predates the g2bmm/gbmm kernels")


def _band_rows(length, width, dil):
    """For each window slot j, the rows i whose B row i + D*(j - W) is in range, and that row."""
    for j in range(2 * width + 1):
        rows = np.arange(length)
        src = rows + dil * (j - width)
        keep = (src >= 0) & (src < length)
        yield j, rows[keep], src[keep]


def g2bmm_ref(a, b, width, dil):
    a, b = a.astype(np.float64), b.astype(np.float64)
    out = np.zeros(a.shape[:-1] + (2 * width + 1,))
    for j, rows, src in _band_rows(a.shape[-2], width, dil):
        out[..., rows, j] = np.einsum("...ik,...ik->...i", a[..., rows, :], b[..., src, :])
    return out


def gbmm_ref(a, b, width, dil):
    a, b = a.astype(np.float64), b.astype(np.float64)
    out = np.zeros(b.shape)
    for j, rows, src in _band_rows(b.shape[-2], width, dil):
        out[..., rows, :] += a[..., rows, j, None] * b[..., src, :]
    return out


def _rand(rng, *shape):
    return rng.standard_normal(shape).astype("float32")


# (batch dims, L, K or N, W, D, extra attrs): dilations, widths wider than the band, a window
# past both ends, odd sizes, several batch dims, forced tiles (one row; tiles longer than L),
# both GEMM libraries.
CASES = [
    ((2,), 37, 5, 3, 2, ""),
    ((4,), 64, 16, 8, 4, ""),
    ((2, 3), 19, 7, 4, 3, ";tile=5"),
    ((1,), 5, 3, 6, 1, ""),
    ((3,), 40, 8, 2, 7, ";tile=1"),
    ((2,), 23, 6, 0, 1, ""),
    ((), 30, 4, 5, 1, ";tile=64"),
    ((2,), 33, 9, 3, 2, ";lib=openblas"),
    ((1,), 50, 4, 2, 60, ""),
]


@pytest.mark.parametrize("batch,length,cols,width,dil,extra", CASES)
def test_g2bmm_matches_numpy(batch, length, cols, width, dil, extra):
    rng = np.random.default_rng(length + width)
    a, b = _rand(rng, *batch, length, cols), _rand(rng, *batch, length, cols)
    out = call_direct(native.G2BMM, f"width={width};dil={dil}{extra}", (a, b),
                      (*batch, length, 2 * width + 1))
    np.testing.assert_allclose(out, g2bmm_ref(a, b, width, dil), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("batch,length,cols,width,dil,extra", CASES)
def test_gbmm_matches_numpy(batch, length, cols, width, dil, extra):
    rng = np.random.default_rng(length * width + 1)
    a, b = _rand(rng, *batch, length, 2 * width + 1), _rand(rng, *batch, length, cols)
    out = call_direct(native.GBMM, f"width={width};dil={dil}{extra}", (a, b),
                      (*batch, length, cols))
    np.testing.assert_allclose(out, gbmm_ref(a, b, width, dil), rtol=1e-5, atol=1e-5)


def test_g2bmm_with_two_threads_matches_numpy():
    """The (batch, residue, block) items run in parallel when the library has threads."""
    rng = np.random.default_rng(3)
    a, b = _rand(rng, 3, 70, 12), _rand(rng, 3, 70, 12)
    s = _rand(rng, 3, 70, 9)
    before = native.get_num_threads()
    native.set_num_threads(2)
    try:
        g2 = call_direct(native.G2BMM, "width=4;dil=3;tile=4", (a, b), (3, 70, 9))
        gb = call_direct(native.GBMM, "width=4;dil=3;tile=4", (s, b), (3, 70, 12))
    finally:
        native.set_num_threads(before)
    np.testing.assert_allclose(g2, g2bmm_ref(a, b, 4, 3), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(gb, gbmm_ref(s, b, 4, 3), rtol=1e-5, atol=1e-5)


def test_band_kernels_through_relax():
    rng = np.random.default_rng(4)
    a, b = _rand(rng, 2, 21, 6), _rand(rng, 2, 21, 6)
    out = call_relax(native.G2BMM, "width=2;dil=2", (a, b), (2, 21, 5))
    np.testing.assert_allclose(out, g2bmm_ref(a, b, 2, 2), rtol=1e-5, atol=1e-5)
    s = _rand(rng, 2, 21, 5)
    out = call_relax(native.GBMM, "width=2;dil=2", (s, b), (2, 21, 6))
    np.testing.assert_allclose(out, gbmm_ref(s, b, 2, 2), rtol=1e-5, atol=1e-5)


def test_empty_inner_dim_gives_zeros():
    a, b = np.zeros((2, 6, 0), "float32"), np.zeros((2, 6, 0), "float32")
    out = call_direct(native.G2BMM, "width=1;dil=1", (a, b), (2, 6, 3))
    assert not out.any()


@pytest.mark.parametrize("name,attrs,shapes,out_shape,match", [
    (native.G2BMM, "dil=1", ((2, 4, 3), (2, 4, 3)), (2, 4, 3), "width"),
    (native.G2BMM, "width=1;dil=0", ((2, 4, 3), (2, 4, 3)), (2, 4, 3), "dil"),
    (native.G2BMM, "width=-1", ((2, 4, 3), (2, 4, 3)), (2, 4, 3), "width"),
    (native.G2BMM, "width=1;bias=1", ((2, 4, 3), (2, 4, 3)), (2, 4, 3), "bias"),
    (native.G2BMM, "width=1", ((2, 4, 3), (2, 4, 5)), (2, 4, 3), "K"),
    (native.G2BMM, "width=1", ((2, 4, 3), (2, 4, 3)), (2, 4, 4), "Out"),
    (native.G2BMM, "width=1", ((2, 4, 3), (1, 4, 3)), (2, 4, 3), "leading"),
    (native.GBMM, "width=1", ((2, 4, 4), (2, 4, 3)), (2, 4, 3), "2W\\+1"),
    (native.GBMM, "width=1", ((2, 4, 3), (2, 4, 5)), (2, 4, 3), "Out"),
])
def test_bad_attrs_and_shapes_raise(name, attrs, shapes, out_shape, match):
    arrays = [np.zeros(s, "float32") for s in shapes]
    with pytest.raises(ValueError, match=match):
        call_direct(name, attrs, arrays, out_shape)
