"""tvm_ollie.cpu.softmax against numpy: ranks, row lengths, large and -inf values, one and two
threads, through Relax, and its argument errors; each row implementation this CPU runs
(tvm_ollie.cpu.softmax_with_vectors: avx512f, avx2, baseline) the same way."""

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import relax

from tvm_ollie import native
from tvm_ollie.codegen import library as lib

from native_util import require_native, two_threads_stall_on


@pytest.fixture(autouse=True)
def _native():
    require_native()
    if not native.provides(lib.SOFTMAX):
        pytest.skip("native library built before softmax")


def reference(x):
    """Softmax over the last axis in float64."""
    x64 = x.astype(np.float64)
    e = np.exp(x64 - x64.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True)).astype(np.float32)


def call(x, out_shape=None):
    out = np.full(x.shape if out_shape is None else out_shape, np.nan, dtype="float32")
    tvm_ffi.get_global_func(lib.SOFTMAX)(tvm_ffi.from_dlpack(np.ascontiguousarray(x)),
                                         tvm_ffi.from_dlpack(out))
    return out


@pytest.mark.parametrize("shape", [(7,), (3, 1), (4, 33), (2, 3, 5, 17), (1, 1, 256, 1000)])
def test_rows_against_numpy(shape):
    x = (np.random.default_rng(0).standard_normal(shape) * 4).astype("float32")
    np.testing.assert_allclose(call(x), reference(x), rtol=1e-5, atol=1e-7)


def test_two_threads_give_the_one_thread_result():
    x = np.random.default_rng(1).standard_normal((64, 129)).astype("float32")
    one = call(x)
    with two_threads_stall_on():
        two = call(x)
    np.testing.assert_array_equal(one, two)


def test_large_and_minus_infinite_values():
    x = np.array([[1000.0, 999.0, -np.inf], [-1e30, 0.0, 1e30]], dtype="float32")
    np.testing.assert_allclose(call(x), reference(x), rtol=1e-6, atol=0)
    assert np.isnan(call(np.full((1, 4), -np.inf, dtype="float32"))).all()


def test_through_relax():
    x = np.random.default_rng(2).standard_normal((2, 8, 16)).astype("float32")
    bb = relax.BlockBuilder()
    param = relax.Var("x", relax.TensorType(x.shape, "float32"))
    with bb.function("main", [param]):
        with bb.dataflow():
            y = bb.emit_output(relax.call_dps_packed(lib.SOFTMAX, [param],
                                                     relax.TensorType(x.shape, "float32")))
        bb.emit_func_output(y)
    vm = relax.VirtualMachine(tvm.compile(bb.get(), target="llvm"), tvm.cpu())
    np.testing.assert_allclose(vm["main"](tvm.runtime.tensor(x)).numpy(), reference(x),
                               rtol=1e-5, atol=1e-7)


WITH_VECTORS = "tvm_ollie.cpu.softmax_with_vectors"


def runs(vectors):
    """Skip unless this CPU (and the loaded library) runs the row implementation ``vectors``."""
    if not native.provides(WITH_VECTORS):
        pytest.skip("native library built before softmax_with_vectors")
    available = tvm_ffi.get_global_func("tvm_ollie.cpu.softmax_vectors")().split(",")
    if vectors not in available:
        pytest.skip(f"this CPU runs {available}, not {vectors}")


def call_with(vectors, x):
    out = np.full(x.shape, np.nan, dtype="float32")
    tvm_ffi.get_global_func(WITH_VECTORS)(vectors, tvm_ffi.from_dlpack(np.ascontiguousarray(x)),
                                          tvm_ffi.from_dlpack(out))
    return out


VECTORS = ["avx512f", "avx2", "baseline"]
# every remainder of a row by 8 and 16 lanes, one and several of the AVX2 row's 256-element
# sum blocks
LENGTHS = [1, 2, 3, 5, 7, 8, 9, 15, 16, 17, 31, 33, 63, 255, 256, 257, 1000, 4099]


@pytest.mark.parametrize("vectors", VECTORS)
@pytest.mark.parametrize("n", LENGTHS)
def test_each_vectors_against_numpy(vectors, n):
    runs(vectors)
    x = (np.random.default_rng(n).standard_normal((3, n)) * 6).astype("float32")
    np.testing.assert_allclose(call_with(vectors, x), reference(x), rtol=1e-5, atol=1e-9)


@pytest.mark.parametrize("vectors", VECTORS)
def test_each_vectors_far_below_the_max_and_minus_infinity(vectors):
    """Differences beyond float32's exp range give 0 (not a wrapped exponent), -inf entries
    (masks) 0, a row of -inf NaN."""
    runs(vectors)
    rng = np.random.default_rng(3)
    x = rng.uniform(-120, 0, size=(4, 37)).astype("float32")
    x[:, 5] = 0.0
    x[1, ::3] = -np.inf
    x[2, 10:] = -1e30
    x[3, 7] = 1e30
    np.testing.assert_allclose(call_with(vectors, x), reference(x), rtol=1e-5, atol=1e-37)
    masked = np.full((2, 19), -np.inf, dtype="float32")
    masked[0, 4] = 2.0
    got = call_with(vectors, masked)
    np.testing.assert_array_equal(got[0], reference(masked[:1])[0])
    assert np.isnan(got[1]).all()


@pytest.mark.parametrize("vectors", VECTORS)
def test_each_vectors_two_threads(vectors):
    runs(vectors)
    x = np.random.default_rng(4).standard_normal((64, 129)).astype("float32")
    one = call_with(vectors, x)
    with two_threads_stall_on():
        two = call_with(vectors, x)
    np.testing.assert_array_equal(one, two)
    np.testing.assert_allclose(one, reference(x), rtol=1e-5, atol=1e-9)


def test_softmax_runs_the_best_vectors():
    """The kernel runs the first (widest) implementation of the list."""
    runs("baseline")
    best = tvm_ffi.get_global_func("tvm_ollie.cpu.softmax_vectors")().split(",")[0]
    x = (np.random.default_rng(5).standard_normal((5, 300)) * 3).astype("float32")
    np.testing.assert_array_equal(call(x), call_with(best, x))


def test_vectors_errors():
    runs("baseline")
    x = tvm_ffi.from_dlpack(np.ones((2, 3), dtype="float32"))
    func = tvm_ffi.get_global_func(WITH_VECTORS)
    with pytest.raises(ValueError, match="not available on this CPU"):
        func("sse9", x, x)
    with pytest.raises(TypeError, match="vectors must be a string"):
        func(1, x, x)
    with pytest.raises(TypeError, match="expected 3 arguments"):
        func("baseline", x)


def test_argument_errors():
    func = tvm_ffi.get_global_func(lib.SOFTMAX)
    x = np.ones((2, 3), dtype="float32")
    with pytest.raises(ValueError, match="Out has shape"):
        call(x, out_shape=(3, 2))
    with pytest.raises(TypeError, match="expected 2 arguments"):
        func(tvm_ffi.from_dlpack(x))
    with pytest.raises(TypeError, match="X must be a tensor"):
        func(1, tvm_ffi.from_dlpack(x))
