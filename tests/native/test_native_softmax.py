"""tvm_ollie.cpu.softmax against numpy: ranks, row lengths, large and -inf values, one and two
threads, through Relax, and its argument errors."""

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


def test_argument_errors():
    func = tvm_ffi.get_global_func(lib.SOFTMAX)
    x = np.ones((2, 3), dtype="float32")
    with pytest.raises(ValueError, match="Out has shape"):
        call(x, out_shape=(3, 2))
    with pytest.raises(TypeError, match="expected 2 arguments"):
        func(tvm_ffi.from_dlpack(x))
    with pytest.raises(TypeError, match="X must be a tensor"):
        func(1, tvm_ffi.from_dlpack(x))
