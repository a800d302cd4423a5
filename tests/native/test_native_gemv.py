"""Matrix-vector products (tvm_ollie/gemv.cc) against numpy: each implementation this CPU runs
(tvm_ollie.cpu.gemv_with_vectors: avx2, baseline) in both storage forms, over lengths that
reach every block and tail; and tvm_ollie.cpu.matmul's M == 1 and N == 1 calls, which take it,
with transposes, batches, bias, residual and activation."""

import numpy as np
import pytest
import tvm_ffi

from native_util import call_direct, require_native
from tvm_ollie import native

WITH_VECTORS = "tvm_ollie.cpu.gemv_with_vectors"


@pytest.fixture(autouse=True)
def _native():
    require_native()
    if not native.provides(WITH_VECTORS):
        pytest.skip("native library built before gemv")


def vectors():
    return tvm_ffi.get_global_func("tvm_ollie.cpu.gemv_vectors")().split(",")


def test_vectors_list_ends_with_the_baseline():
    names = vectors()
    assert names[-1] == "baseline"
    assert set(names) <= {"avx2", "baseline"}


def gemv(name, x, w, form, y0=None):
    """y = (y0 or 0) + x @ W through the named implementation."""
    y = np.array(y0, dtype="float32") if y0 is not None else np.full(
        w.shape[1] if form == "rows" else w.shape[0], np.nan, dtype="float32")
    tvm_ffi.get_global_func(WITH_VECTORS)(name, tvm_ffi.from_dlpack(x), tvm_ffi.from_dlpack(w),
                                          tvm_ffi.from_dlpack(y), form, y0 is not None)
    return y


@pytest.mark.parametrize("name", ["avx2", "baseline"])
@pytest.mark.parametrize("form", ["rows", "columns"])
@pytest.mark.parametrize("k,n", [(1, 1), (3, 5), (13, 7), (40, 8), (64, 64), (37, 75),
                                 (256, 320), (320, 100), (33, 130)])
def test_each_implementation_against_numpy(name, form, k, n):
    if name not in vectors():
        pytest.skip(f"{name} not run by this CPU")
    rng = np.random.default_rng(k * 1000 + n)
    x = rng.standard_normal(k).astype("float32")
    w = rng.standard_normal((k, n) if form == "rows" else (n, k)).astype("float32")
    mat = w.astype("float64") if form == "rows" else w.astype("float64").T
    ref = x.astype("float64") @ mat
    tol = dict(rtol=1e-5, atol=1e-5 * k ** 0.5)
    np.testing.assert_allclose(gemv(name, x, w, form), ref, **tol)
    y0 = rng.standard_normal(n).astype("float32")
    np.testing.assert_allclose(gemv(name, x, w, form, y0), ref + y0, **tol)


def test_implementations_agree_closely():
    rng = np.random.default_rng(5)
    x = rng.standard_normal(300).astype("float32")
    w = rng.standard_normal((300, 77)).astype("float32")
    outs = [gemv(name, x, w, "rows") for name in vectors()]
    for out in outs[1:]:
        np.testing.assert_allclose(out, outs[0], rtol=1e-5, atol=1e-4)


def test_bad_arguments_raise():
    x = np.zeros(4, "float32")
    w = np.zeros((4, 3), "float32")
    y = np.zeros(3, "float32")
    f = tvm_ffi.get_global_func(WITH_VECTORS)
    args = [tvm_ffi.from_dlpack(a) for a in (x, w, y)]
    with pytest.raises(ValueError, match="not available"):
        f("avx1024", *args, "rows", False)
    with pytest.raises(ValueError, match="form"):
        f("baseline", *args, "diagonal", False)
    with pytest.raises(ValueError, match="do not agree"):
        f("baseline", *args, "columns", False)


def _matmul_case(rng, a_shape, b_shape, ta, tb, bias, res, act, lib=""):
    a = rng.standard_normal(a_shape).astype("float32")
    b = rng.standard_normal(b_shape).astype("float32")
    a_l = np.swapaxes(a, -1, -2) if ta else a
    b_l = np.swapaxes(b, -1, -2) if tb else b
    ref = np.matmul(a_l.astype("float64"), b_l.astype("float64"))
    arrays = [a, b]
    attrs = f"ta={ta};tb={tb};bias={bias};res={res};act={act}" + (f";lib={lib}" if lib else "")
    if bias:
        arrays.append(rng.standard_normal(ref.shape[-1]).astype("float32"))
        ref = ref + arrays[-1]
    if res:
        arrays.append(rng.standard_normal(ref.shape).astype("float32"))
        ref = ref + arrays[-1]
    if act == "relu":
        ref = np.maximum(ref, 0)
    out = call_direct(native.MATMUL, attrs, arrays, ref.shape)
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-5 * a_l.shape[-1] ** 0.5 + 1e-5)


@pytest.mark.parametrize("lib", ["", "openblas"])
@pytest.mark.parametrize("ta", [0, 1])
@pytest.mark.parametrize("tb", [0, 1])
@pytest.mark.parametrize("m,k,n", [(1, 256, 320), (1, 13, 5), (70, 33, 1), (1, 9, 1)])
def test_matmul_matrix_vector_calls(lib, ta, tb, m, k, n):
    rng = np.random.default_rng(m + k + n + 2 * ta + tb)
    a_shape = (k, m) if ta else (m, k)
    b_shape = (n, k) if tb else (k, n)
    _matmul_case(rng, a_shape, b_shape, ta, tb, 0, 0, "none", lib)
    _matmul_case(rng, a_shape, b_shape, ta, tb, 1, 1, "relu", lib)
    # batched, each batch a matrix-vector product; B shared (folded when ta=0)
    _matmul_case(rng, (3,) + a_shape, b_shape, ta, tb, 1, 0, "none", lib)
    _matmul_case(rng, (2, 1) + a_shape, (3,) + b_shape, ta, tb, 0, 1, "relu", lib)
