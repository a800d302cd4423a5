"""tvm_ollie.cpu.matmul with a packed B (matmul_packed_size, matmul_pack_weight, wpacked=1)
against numpy: transposed and batched A, epilogues, a pack read under another primitive (its
format tag), a Relax build, the errors."""

import numpy as np
import pytest
import tvm_ffi

from native_util import call_direct, call_relax, require_native
from tvm_ollie import native


@pytest.fixture(autouse=True)
def _native():
    require_native()


def _t(x):
    return tvm_ffi.from_dlpack(x)


def _pack(attrs, a, w, out_shape):
    """The pack of ``w`` for calls ``attrs;wpacked=1`` on ``a``."""
    out = np.zeros(out_shape, "float32")
    size = int(tvm_ffi.get_global_func(native.MATMUL_PACKED_SIZE)(attrs, _t(a), _t(w), _t(out)))
    packed = np.zeros(size, "float32")
    tvm_ffi.get_global_func(native.MATMUL_PACK_WEIGHT)(attrs, _t(a), _t(w), _t(out), _t(packed))
    return packed


@pytest.mark.parametrize("a_shape,k,n,tb", [((5, 7), 7, 9, False), ((2, 3, 16), 16, 33, True),
                                            ((1, 64, 32), 32, 64, False), ((4, 20), 20, 3, True)])
def test_packed_matches_numpy(a_shape, k, n, tb):
    """Packed B: the same product as numpy for plain and transposed B, A with a batch."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal(a_shape).astype("float32")
    w = rng.standard_normal((n, k) if tb else (k, n)).astype("float32")
    ref = a.astype("float64") @ (w.T if tb else w).astype("float64")
    attrs = f"tb={int(tb)}"
    packed = _pack(attrs, a, w, ref.shape)
    assert packed.ndim == 1 and packed.size >= 16 + k * n
    out = call_direct(native.MATMUL, attrs + ";wpacked=1", [a, packed], ref.shape)
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)


def test_packed_epilogue_and_relax():
    """Bias, residual and an activation with a packed B, called directly and from Relax."""
    rng = np.random.default_rng(1)
    a = rng.standard_normal((6, 12)).astype("float32")
    w = rng.standard_normal((12, 10)).astype("float32")
    bias = rng.standard_normal(10).astype("float32")
    res = rng.standard_normal((6, 10)).astype("float32")
    ref = np.maximum(a.astype("float64") @ w + bias + res, 0)
    attrs = "tb=0;bias=1;res=1;act=relu"
    packed = _pack(attrs, a, w, ref.shape)
    for call in (call_direct, call_relax):
        out = call(native.MATMUL, attrs + ";wpacked=1", [a, packed, bias, res], ref.shape)
        np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)


def test_pack_of_another_primitive_is_reordered():
    """A pack made for another problem over the same weights (another epilogue, so another
    primitive) is read through its format tag: the same answer."""
    rng = np.random.default_rng(2)
    a = rng.standard_normal((8, 24)).astype("float32")
    w = rng.standard_normal((24, 40)).astype("float32")
    packed = _pack("tb=0", a, w, (8, 40))
    ref = np.tanh(a.astype("float64") @ w)
    out = call_direct(native.MATMUL, "tb=0;act=tanh;wpacked=1", [a, packed], ref.shape)
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)


def test_packed_errors():
    """Plain weights as a pack, a pack of other weights, bad attrs and shapes are rejected."""
    rng = np.random.default_rng(3)
    a = rng.standard_normal((4, 8)).astype("float32")
    w = rng.standard_normal((8, 6)).astype("float32")
    packed = _pack("tb=0", a, w, (4, 6))
    other = _pack("tb=0", rng.standard_normal((4, 9)).astype("float32"),
                  rng.standard_normal((9, 6)).astype("float32"), (4, 6))
    with pytest.raises(ValueError, match="1-D"):
        call_direct(native.MATMUL, "wpacked=1", [a, w], (4, 6))
    with pytest.raises(ValueError, match="other weights"):
        call_direct(native.MATMUL, "wpacked=1", [a, w.reshape(-1)], (4, 6))
    with pytest.raises(ValueError, match="other weights"):
        call_direct(native.MATMUL, "wpacked=1", [a, other], (4, 6))
    with pytest.raises(ValueError, match="ta=0"):
        call_direct(native.MATMUL, "ta=1;wpacked=1", [a, packed], (4, 6))
    with pytest.raises(ValueError, match="Out"):
        call_direct(native.MATMUL, "wpacked=1", [a, packed], (5, 6))
    with pytest.raises(ValueError, match="does not fit"):
        _pack("tb=1", a, w, (4, 6))
