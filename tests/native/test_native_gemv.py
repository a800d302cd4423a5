"""Matrix-vector products (tvm_ollie/gemv.cc) against numpy: each implementation this CPU runs
(tvm_ollie.cpu.gemv_with_vectors: avx2, baseline) in both storage forms, over lengths that
reach every block and tail. tvm_ollie.cpu.matmul's M == 1 and N == 1 calls, which take it, are
in test_native_matmul.py (test_matrix_vector_calls)."""

import numpy as np
import pytest
import tvm_ffi

from native_util import require_native
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
