"""transform/softmax_kernel: a last-axis softmax as one native call.

Before/Expected modules compared structurally; numerics against TVM's build of the original; the
cases the rule refuses (another axis, float16, a dynamic shape); the rule inside
``optimize_module`` with ``norm_kernels`` on and off."""

import numpy as np
import pytest
import tvm
from tvm import relax

from tvm_ollie import native
from tvm_ollie.codegen import library as lib
from tvm_ollie.transform.optimize import optimize_module
from tvm_ollie.transform.softmax_kernel import SOFTMAX_LAST_AXIS, softmax_kernels


@pytest.fixture(autouse=True)
def _native():
    if not native.available() or not native.provides(lib.SOFTMAX):
        pytest.skip("native library without softmax")


def _module(shape, axis=-1, dtype="float32", scale=True):
    """``main(x) = softmax(x * 0.5, axis)`` (or of ``x`` itself)."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, dtype))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.multiply(x, relax.const(0.5, dtype))) if scale else x
            out = bb.emit_output(relax.op.nn.softmax(y, axis=axis))
        bb.emit_func_output(out)
    return bb.get()


def _expected(shape):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.multiply(x, relax.const(0.5, "float32")))
            out = bb.emit_output(relax.call_dps_packed(lib.SOFTMAX, [y],
                                                       relax.TensorType(shape, "float32")))
        bb.emit_func_output(out)
    return bb.get()


def _run(mod, x):
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    return vm["main"](tvm.runtime.tensor(x)).numpy()


@pytest.mark.parametrize("shape,axis", [((2, 4, 33), -1), ((2, 4, 33), 2), ((5,), 0)])
def test_before_expected_and_numerics(shape, axis):
    before = _module(shape, axis)
    after, counts = softmax_kernels(before)
    assert counts == {SOFTMAX_LAST_AXIS[0]: 1}
    tvm.ir.assert_structural_equal(after, _expected(shape))
    x = (np.random.default_rng(0).standard_normal(shape) * 6).astype("float32")
    np.testing.assert_allclose(_run(after, x), _run(before, x), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mod", [_module((2, 4, 33), axis=1), _module((3, 8), axis=0),
                                 _module((2, 8), dtype="float16")],
                         ids=["middle-axis", "first-axis", "float16"])
def test_refused(mod):
    after, counts = softmax_kernels(mod)
    assert counts == {} and after is mod


def test_a_dynamic_shape_is_refused():
    bb = relax.BlockBuilder()
    n = tvm.tirx.Var("n", "int64")
    x = relax.Var("x", relax.TensorType((n, 8), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.softmax(x))
        bb.emit_func_output(out)
    mod = bb.get()
    assert softmax_kernels(mod) == (mod, {})


@pytest.mark.parametrize("on", [True, False])
def test_optimize_module_option(on):
    mod = _module((1, 2, 16, 40))
    new, report = optimize_module(mod, target="llvm", derive=False, model_guard=False,
                                  norm_kernels=on)
    assert (lib.SOFTMAX in new.script()) == on
    assert report.inference_folds.get(SOFTMAX_LAST_AXIS[0], 0) == (1 if on else 0)
    x = np.random.default_rng(1).standard_normal((1, 2, 16, 40)).astype("float32")
    np.testing.assert_allclose(_run(new, x), _run(mod, x), rtol=1e-5, atol=1e-6)
