"""fuse_epilogues with the activations of transform/activations.py: leaky ReLU and the
hard-sigmoid / hard-swish composites folded into native kernel calls (oneDNN post-ops for the
convolution and the oneDNN matmul, the scalar loop after OpenBLAS), numerics against TVM's
build of the unfolded model."""

from dataclasses import replace

import numpy as np
import pytest
import tvm
from tvm import relax

from tvm_ollie import native
from tvm_ollie.codegen import library as lib
from tvm_ollie.pipeline import build
from tvm_ollie.transform.activations import hardsigmoid_composite, hardswish_composite
from tvm_ollie.transform.epilogue import block_index, fold_chain, fuse_epilogues, use_counts
from tvm_ollie.transform.inference_fold import fold_inference
from tvm_ollie.verify.tolerance import tolerance

import small_models as sm
from test_epilogue import _build, _conv_params, _f32

CONV = lib.conv2d_call((1, 1), (1, 1, 1, 1), (1, 1), 1, "NCHW", "OIHW")
BIAS = (np.arange(8, dtype="float32") - 4).reshape(1, 8, 1, 1) / 4
HS = f"hardswish_{np.float32(1 / 6).item()!r}_0.5"
op = relax.op


def _conv_then(act):
    """conv -> + bias -> act, the conv as a native kernel call."""
    def body(bb, x, w):
        y = bb.emit(lib.emit_call(CONV, [x, w], (1, 8, 6, 6)))
        y = bb.emit(op.add(y, relax.const(BIAS)))
        return act(bb, y)
    return body


def _hardswish(bb, y):
    return _emit_nested(bb, hardswish_composite(y))


def _hardsigmoid(bb, y):
    return _emit_nested(bb, hardsigmoid_composite(y, 0.2, 0.5))


def _leaky(bb, y):
    return op.nn.leakyrelu(y, 0.125)


def _emit_nested(bb, expr):
    """Emit the inner calls of a nested ``expr`` one by one; return the outermost unbound."""
    args = [bb.emit(_emit_nested(bb, a)) if isinstance(a, relax.Call) else a for a in expr.args]
    return relax.Call(expr.op, args, expr.attrs, expr.ty_args)


ACTS = {"hardswish": (_hardswish, HS),
        "hardsigmoid": (_hardsigmoid, f"hardsigmoid_{np.float32(0.2).item()!r}_0.5"),
        "leaky_relu": (_leaky, "leaky_relu_0.125")}


@pytest.mark.parametrize("name", list(ACTS))
def test_activation_folds_into_the_conv_call(name):
    act, text = ACTS[name]

    def expected(bb, x, w):
        call = CONV.with_attrs(bias=1, act=text)
        return lib.emit_call(call, [x, w, relax.const(BIAS.reshape(8))], (1, 8, 6, 6))

    got, counts = fuse_epilogues(_build(_conv_params(), _conv_then(act)))
    tvm.ir.assert_structural_equal(got, _build(_conv_params(), expected))
    assert counts == {"conv2d": 2}


def test_composite_read_elsewhere_is_not_folded():
    def body(bb, x, w):
        y = bb.emit(lib.emit_call(CONV, [x, w], (1, 8, 6, 6)))
        hs = bb.emit(_hardswish(bb, y))
        return op.add(hs, y)  # y read outside the composite

    before = _build(_conv_params(), body)
    got, counts = fuse_epilogues(before)
    assert counts == {}
    tvm.ir.assert_structural_equal(got, before)


@pytest.mark.parametrize("name", list(ACTS))
def test_cuda_kernels_do_not_take_the_new_activations(name):
    cuda_conv = replace(CONV, func=lib.CUDA_CONV2D)

    def body(bb, x, w):
        y = bb.emit(lib.emit_call(cuda_conv, [x, w], (1, 8, 6, 6)))
        return ACTS[name][0](bb, y)

    before = _build(_conv_params(), body)
    assert fuse_epilogues(before)[1] == {}


def _model(kind, act):
    """The unfolded model: conv2d or matmul (+ bias) -> act, all Relax operators."""
    if kind == "conv2d":
        params = _conv_params()

        def body(bb, x, w):
            y = bb.emit(op.nn.conv2d(x, w, padding=1))
            return act(bb, bb.emit(op.add(y, relax.const(BIAS))))
    else:
        params = [relax.Var("a", _f32((5, 7))), relax.Var("b", _f32((7, 8)))]

        def body(bb, a, b):
            y = bb.emit(op.matmul(a, b))
            return act(bb, bb.emit(op.add(y, relax.const(BIAS.reshape(8)))))
    return params, body


def _native(kind, act, matmul_lib):
    """The model with its conv2d/matmul as the native kernel, then fuse_epilogues."""
    params, _ = _model(kind, act)
    call = CONV if kind == "conv2d" else lib.matmul_call().with_attrs(lib=matmul_lib)
    shape = (1, 8, 6, 6) if kind == "conv2d" else (5, 8)
    bias = BIAS if kind == "conv2d" else BIAS.reshape(8)

    def body(bb, *args):
        y = bb.emit(lib.emit_call(call, list(args), shape))
        return act(bb, bb.emit(op.add(y, relax.const(bias))))

    return fuse_epilogues(_build(params, body))


def _run(mod, args):
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    return vm["main"](*[tvm.runtime.tensor(a) for a in args]).numpy()


@pytest.mark.skipif(not native.load(), reason="native library not loaded")
@pytest.mark.parametrize("kind,matmul_lib", [("conv2d", None), ("matmul", "openblas")])
def test_folded_activation_numerics(kind, matmul_lib):
    """Every new activation through the kernel (a oneDNN post-op on the conv, the scalar loop
    after OpenBLAS) against TVM's build (tests/native checks the oneDNN matmul directly)."""
    rng = np.random.default_rng(0)
    tol = tolerance("float32")
    for name, (act, text) in ACTS.items():
        params, body = _model(kind, act)
        fused, counts = _native(kind, act, matmul_lib)
        assert sum(counts.values()) == 2, name
        assert f"act={text}" in fused.script(), name
        args = [rng.standard_normal([int(s) for s in p.ty.shape]).astype("float32") * 3
                for p in params]
        want = _run(_build(params, body), args)
        np.testing.assert_allclose(_run(fused, args), want, rtol=tol,
                                   atol=tol * np.abs(want).max(), err_msg=name)


def test_exporter_spelling_reaches_the_kernel():
    """fold_inference's canonical hard-swish is what fuse_epilogues folds."""
    def body(bb, x, w):
        y = bb.emit(lib.emit_call(CONV, [x, w], (1, 8, 6, 6)))
        r6 = bb.emit(op.clip(bb.emit(op.add(y, relax.const(np.float32(3)))), 0, 6))
        return op.divide(bb.emit(op.multiply(y, r6)), relax.const(np.float32(6)))

    folded, counts = fold_inference(_build(_conv_params(), body))
    assert counts == {"hardswish": 1}
    got, fused = fuse_epilogues(folded)
    assert fused == {"conv2d": 1} and f"act={HS}" in got.script()


@pytest.mark.skipif(not native.load(), reason="native library not loaded")
def test_build_folds_exporter_activations_into_native_convs():
    """The whole pass: PyTorch-frontend hard-swish and a where-form leaky ReLU after two
    convolutions the Decider puts on the library (a fake timer makes it fastest) end up as the
    kernels' activations, and the build computes what TVM's build of the model does."""
    rng = np.random.default_rng(5)
    w1 = relax.const(rng.standard_normal((8, 4, 3, 3)).astype("float32") / 4)
    w2 = relax.const(rng.standard_normal((8, 8, 3, 3)).astype("float32") / 4)

    def body(bb, x):
        y = bb.emit(op.nn.conv2d(x, w1, padding=1))
        r6 = bb.emit(op.clip(bb.emit(op.add(y, relax.const(np.float32(3)))), 0, float("inf")))
        r6 = bb.emit(op.clip(r6, float("-inf"), 6))
        h = bb.emit(op.divide(bb.emit(op.multiply(y, r6)), relax.const(np.float32(6))))
        z = bb.emit(op.nn.conv2d(h, w2, padding=1))
        cond = bb.emit(op.greater(z, relax.const(np.float32(0))))
        return op.where(cond, z, bb.emit(op.multiply(z, relax.const(np.float32(0.1)))))

    mod = _build([relax.Var("x", _f32((1, 4, 8, 8)))], body)

    def timer(_mod, label):
        return 1e-4 if label.split("|")[-1] == "original [native]" else 10e-3

    ex, report = build(mod, "llvm", timer=timer, max_depth=1, search_time_s=2.0,
                       calibration=sm.LLVM_CALIB)
    assert report.inference_folds == {"clip_of_clip": 1, "hardswish": 1, "leaky_relu": 1}
    assert report.epilogues == {"conv2d": 2}
    args = sm.random_inputs(mod, seed=1)
    sm.assert_close(sm.run(ex, args), sm.run(tvm.compile(mod, target="llvm"), args))


def _two_conv_chains():
    """Two conv -> + bias -> hard-swish chains in one block (two folds sharing one index)."""
    def body(bb, x, w):
        a = bb.emit(_conv_then(_hardswish)(bb, x, w))
        b = bb.emit(lib.emit_call(CONV, [x, w], (1, 8, 6, 6)))
        b = bb.emit(op.nn.relu(b))
        return op.add(a, b)
    return _build(_conv_params(), body)


def test_fold_chain_with_the_block_index_as_without():
    """``fold_chain`` given the block's index once folds every call as it does computing the
    index itself (the offer passes one index per block)."""
    func = _two_conv_chains()["main"]
    bindings = list(func.body.blocks[0].bindings)
    uses = use_counts(func)
    index = block_index(bindings)
    calls = [(b.var, lib.lib_call_of(b.value)) for b in bindings if lib.lib_call_of(b.value)]
    assert len(calls) == 2
    got = []
    for var, (kernel, operands) in calls:
        shared = fold_chain(kernel, operands, var, bindings, uses, index)
        alone = fold_chain(kernel, operands, var, bindings, uses)
        assert shared.steps == alone.steps and shared.consumers == alone.consumers
        tvm.ir.assert_structural_equal(shared.operands, alone.operands)
        got.append(shared.steps)
    assert got == [["bias", HS], ["relu"]]
    first = index.readers[calls[0][0]]
    assert bindings[first].value.args[0].same_as(calls[0][0])
    assert index.position[calls[1][0]] == [b.var for b in bindings].index(calls[1][0])
