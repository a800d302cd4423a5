"""transform/norm_kernels: instance norms as one native call, epilogue folded.

Before/Expected modules compared structurally; numerics against TVM's build of the original
(Relax ``nn.instance_norm`` and the ONNX importer's decomposition, no library); the cases the
rules refuse; the option inside ``optimize_module``."""

import numpy as np
import pytest
import tvm
from tvm import relax

from tvm_ollie import native
from tvm_ollie.codegen import library as lib
from tvm_ollie.transform.norm_kernels import instance_norm_kernels
from tvm_ollie.transform.optimize import optimize_module


@pytest.fixture(autouse=True)
def _native():
    if not native.available() or not native.provides(lib.INSTANCE_NORM):
        pytest.skip("native library without instance_norm")


def _module(shape, body):
    """``main(x, r)`` (``r`` a second tensor of ``x``'s shape) with ``body(bb, x, r)``."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    r = relax.Var("r", relax.TensorType(shape, "float32"))
    with bb.function("main", [x, r]):
        with bb.dataflow():
            out = bb.emit_output(body(bb, x, r))
        bb.emit_func_output(out)
    return bb.get()


def _consts(c, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(c).astype("float32"), rng.standard_normal(c).astype("float32"))


def _op_norm(gamma, beta, axes=(2, 3), relu=False, residual=False, eps=1e-5):
    def body(bb, x, r):
        y = bb.emit(relax.op.nn.instance_norm(x, relax.const(gamma), relax.const(beta),
                                              channel_axis=1, axes=list(axes), epsilon=eps))
        if residual:
            y = bb.emit(relax.op.add(r, y))
        return relax.op.nn.relu(y) if relu else y
    return body


def _onnx_norm(gamma=None, beta=None, relu=False, eps=1e-5, extra_use=False):
    """The ONNX importer's InstanceNormalization (frontend/onnx_frontend.py)."""
    def body(bb, x, r):
        mean = bb.emit(relax.op.mean(x, axis=[2, 3], keepdims=True))
        var = bb.emit(relax.op.variance(x, axis=[2, 3], keepdims=True))
        s = bb.emit(relax.op.sqrt(relax.op.add(var, relax.const(eps, "float32"))))
        y = bb.emit(relax.op.divide(bb.emit(relax.op.subtract(x, mean)), s))
        if gamma is not None:
            y = bb.emit(relax.op.multiply(y, relax.const(gamma.reshape(-1, 1, 1))))
        if beta is not None:
            y = bb.emit(relax.op.add(y, relax.const(beta.reshape(-1, 1, 1))))
        if relu:
            y = bb.emit(relax.op.nn.relu(y))
        if extra_use:
            y = bb.emit(relax.op.add(y, mean))
        return y
    return body


def _run(mod, args):
    ex = tvm.compile(mod, target="llvm")
    vm = relax.VirtualMachine(ex, tvm.cpu())
    return vm["main"](*[tvm.runtime.tensor(a) for a in args]).numpy()


def _kernels(mod):
    found = []

    def visit(expr):
        call = lib.lib_call_of(expr)
        if call is not None:
            found.append(call[0])
    for binding in mod["main"].body.blocks[0].bindings:
        visit(binding.value)
    return found


def _check(mod, shape, expect_attrs, seed=0):
    new, counts = instance_norm_kernels(mod)
    calls = _kernels(new)
    assert [c.func for c in calls] == [lib.INSTANCE_NORM], new
    assert dict(calls[0].attrs) == expect_attrs
    assert sum(counts.values()) == 1
    rng = np.random.default_rng(seed)
    args = [(rng.standard_normal(shape) * 2 + 1).astype("float32") for _ in range(2)]
    np.testing.assert_allclose(_run(new, args), _run(mod, args), rtol=1e-4, atol=1e-4)
    return new


def test_op_with_relu_before_expected():
    gamma, beta = _consts(8)
    before = _module((1, 8, 6, 6), _op_norm(gamma, beta, axes=(0, 2, 3), relu=True))
    after, _ = instance_norm_kernels(before)

    def expected_body(bb, x, r):
        call = lib.LibCall(lib.INSTANCE_NORM, (("eps", repr(1e-5)), ("scale", "1"),
                                               ("bias", "1"), ("act", "relu")))
        return lib.emit_call(call, [x, relax.const(gamma), relax.const(beta)], (1, 8, 6, 6))
    expected = _module((1, 8, 6, 6), expected_body)
    tvm.ir.assert_structural_equal(after, expected, map_free_vars=True)


@pytest.mark.parametrize("shape, axes", [((1, 8, 16, 16), (0, 2, 3)), ((2, 5, 7, 9), (2, 3)),
                                         ((1, 3, 4, 4, 4), (2, 3, 4))])
def test_op_numerics(shape, axes):
    gamma, beta = _consts(shape[1])
    mod = _module(shape, _op_norm(gamma, beta, axes=axes))
    _check(mod, shape, {"eps": repr(1e-5), "scale": "1", "bias": "1"})


def test_op_residual_and_relu_fold():
    gamma, beta = _consts(4)
    mod = _module((2, 4, 8, 8), _op_norm(gamma, beta, relu=True, residual=True, eps=1e-3))
    _check(mod, (2, 4, 8, 8), {"eps": repr(1e-3), "scale": "1", "bias": "1", "res": "1",
                               "act": "relu"})


@pytest.mark.parametrize("affine, relu", [(True, True), (True, False), (False, False)])
def test_onnx_decomposition_numerics(affine, relu):
    gamma, beta = _consts(6, seed=3)
    mod = _module((1, 6, 10, 12), _onnx_norm(gamma if affine else None,
                                             beta if affine else None, relu=relu))
    expect = {"eps": repr(float(np.float32(1e-5)))}
    if affine:
        expect.update(scale="1", bias="1")
    if relu:
        expect["act"] = "relu"
    _check(mod, (1, 6, 10, 12), expect)


def test_refused():
    """Batch axis of extent 2 in the axes; one spatial axis only; an intermediate read
    elsewhere."""
    gamma, beta = _consts(4)
    cases = [
        _module((2, 4, 5, 5), _op_norm(gamma, beta, axes=(0, 2, 3))),
        _module((1, 4, 5, 5), _op_norm(gamma, beta, axes=(2,))),
        _module((1, 4, 5, 5), _onnx_norm(gamma, beta, extra_use=True)),
    ]
    for mod in cases:
        new, counts = instance_norm_kernels(mod)
        assert not counts and new.same_as(mod)


@pytest.mark.parametrize("on", [True, False])
def test_optimize_module_option(on):
    gamma, beta = _consts(8)
    mod = _module((1, 8, 12, 12), _op_norm(gamma, beta, relu=True))
    new, report = optimize_module(mod, target="llvm", derive=False, model_guard=False,
                                  norm_kernels=on)
    assert bool(_kernels(new)) == on
    assert report.inference_folds.get("instance_norm_op", 0) == (1 if on else 0)
    rng = np.random.default_rng(0)
    args = [rng.standard_normal((1, 8, 12, 12)).astype("float32") for _ in range(2)]
    np.testing.assert_allclose(_run(new, args), _run(mod, args), rtol=1e-4, atol=1e-4)
