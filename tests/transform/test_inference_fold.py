"""Inference folding (batch norm into convolutions, SiLU): Before/Expected modules and numerics
against TVM's build of the unfolded module."""

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.script import relax as R

from tvm_ollie import native
from tvm_ollie.codegen import library as lib
from tvm_ollie.config import OllieConfig
from tvm_ollie.transform.inference_fold import FOLD_RULES, FoldInference, fold_inference
from tvm_ollie.transform.epilogue import fuse_epilogues
from tvm_ollie.transform.optimize import optimize_module

# Values chosen so that every folded number is exact in float32: s = γ / √(σ² + ε) = [1, 2].
GAMMA = np.array([2.0, 6.0], "float32")
BETA = np.array([0.5, -1.0], "float32")
MEAN = np.array([1.0, 2.0], "float32")
VAR = np.array([3.0, 8.0], "float32")
EPS = 1.0
SCALE = np.array([1.0, 2.0], "float32")
SHIFT = BETA - MEAN * SCALE
WEIGHT = np.arange(2 * 3 * 3 * 3, dtype="float32").reshape(2, 3, 3, 3) / 10


def _c(a):
    return relax.const(np.asarray(a, "float32"))


def _conv_bn(weight=WEIGHT, bias=None, transpose=False, training=False, extra_use=False,
             weight_param=False):
    """main(x) = batch_norm(conv(x, W) [+ b])[0] (+ conv's output again with extra_use)."""
    bb = relax.BlockBuilder()
    shape = (1, 2, 5, 5) if transpose else (1, 3, 5, 5)
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    params = [x]
    w = _c(weight)
    if weight_param:
        w = relax.Var("w", relax.TensorType(weight.shape, "float32"))
        params.append(w)
    with bb.function("main", params):
        with bb.dataflow():
            if transpose:
                y = bb.emit(relax.op.nn.conv2d_transpose(x, w, padding=1))
            else:
                y = bb.emit(relax.op.nn.conv2d(x, w, padding=1))
            if bias is not None:
                y = bb.emit(relax.op.add(y, _c(bias)))
            bn = bb.emit(relax.op.nn.batch_norm(y, _c(GAMMA), _c(BETA), _c(MEAN), _c(VAR),
                                                axis=1, epsilon=EPS, training=training))
            out = bb.emit(relax.TupleGetItem(bn, 0))
            if extra_use:
                out = bb.emit(relax.op.add(out, y))
            gv = bb.emit_output(out)
        bb.emit_func_output(gv)
    return bb.get()


def _conv_bias(weight, bias, transpose=False):
    """main(x) = conv(x, weight) + bias (the folded form)."""
    bb = relax.BlockBuilder()
    shape = (1, 2, 5, 5) if transpose else (1, 3, 5, 5)
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            if transpose:
                y = bb.emit(relax.op.nn.conv2d_transpose(x, _c(weight), padding=1))
            else:
                y = bb.emit(relax.op.nn.conv2d(x, _c(weight), padding=1))
            gv = bb.emit_output(relax.op.add(y, _c(bias.reshape(1, 2, 1, 1))))
        bb.emit_func_output(gv)
    return bb.get()


def _run(mod, *args):
    ex = tvm.compile(mod, target="llvm")
    vm = relax.VirtualMachine(ex, tvm.cpu())
    return vm["main"](*[tvm.runtime.tensor(a) for a in args]).numpy()


def _x(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype("float32")


def test_rules_have_names_and_equations():
    assert [r.name for r in FOLD_RULES][:4] == ["bn_into_conv", "bn_runtime", "space_to_depth_conv",
                                               "silu"]
    for rule in FOLD_RULES:
        assert "=" in rule.rewrite.__doc__


def test_bn_into_conv_expected():
    got, counts = fold_inference(_conv_bn())
    expected = _conv_bias(WEIGHT * SCALE.reshape(2, 1, 1, 1), SHIFT)
    tvm.ir.assert_structural_equal(got, expected)
    assert counts == {"bn_into_conv": 1}


def test_bn_into_conv_with_bias_expected():
    bias = np.array([1.0, -3.0], "float32").reshape(1, 2, 1, 1)
    got, _ = fold_inference(_conv_bn(bias=bias))
    expected = _conv_bias(WEIGHT * SCALE.reshape(2, 1, 1, 1),
                          (bias.reshape(2) - MEAN) * SCALE + BETA)
    tvm.ir.assert_structural_equal(got, expected)


def test_bn_into_conv_with_a_reshaped_bias_expected():
    """TVM's PyTorch frontend adds the conv bias as reshape(constant)."""
    bias = np.array([1.0, -3.0], "float32")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 3, 5, 5), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, _c(WEIGHT), padding=1))
            y = bb.emit(relax.op.add(y, bb.emit(relax.op.reshape(_c(bias), (1, 2, 1, 1)))))
            bn = bb.emit(relax.op.nn.batch_norm(y, _c(GAMMA), _c(BETA), _c(MEAN), _c(VAR),
                                                axis=1, epsilon=EPS, training=False))
            gv = bb.emit_output(relax.TupleGetItem(bn, 0))
        bb.emit_func_output(gv)
    got, counts = fold_inference(bb.get())
    assert counts == {"bn_into_conv": 1}
    expected = _conv_bias(WEIGHT * SCALE.reshape(2, 1, 1, 1), (bias - MEAN) * SCALE + BETA)
    tvm.ir.assert_structural_equal(got, expected)


@pytest.mark.parametrize("weight_param", [False, True], ids=["constant", "run-time"])
def test_bn_guard_a_bias_along_the_width(weight_param):
    """A (C,) bias added to an NCHW output runs along its width (here W == C): not folded."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 3, 2, 2), "float32"))
    params = [x] + ([relax.Var("w", relax.TensorType((2, 3, 3, 3), "float32"))]
                    if weight_param else [])
    with bb.function("main", params):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, params[-1] if weight_param else _c(WEIGHT),
                                           padding=1))
            y = bb.emit(relax.op.add(y, _c([1.0, -3.0])))
            bn = bb.emit(relax.op.nn.batch_norm(y, _c(GAMMA), _c(BETA), _c(MEAN), _c(VAR),
                                                axis=1, epsilon=EPS, training=False))
            gv = bb.emit_output(relax.TupleGetItem(bn, 0))
        bb.emit_func_output(gv)
    before = bb.get()
    got, counts = fold_inference(before)
    assert counts == {}
    tvm.ir.assert_structural_equal(got, before)


def test_bn_into_conv_transpose_expected():
    weight = np.arange(2 * 2 * 3 * 3, dtype="float32").reshape(2, 2, 3, 3) / 10  # IOHW
    got, counts = fold_inference(_conv_bn(weight=weight, transpose=True))
    expected = _conv_bias(weight * SCALE.reshape(1, 2, 1, 1), SHIFT, transpose=True)
    tvm.ir.assert_structural_equal(got, expected)
    assert counts == {"bn_into_conv": 1}


@pytest.mark.parametrize("case", [dict(extra_use=True), dict(training=True)],
                         ids=["conv-read-twice", "training"])
def test_bn_guards_keep_the_module(case):
    before = _conv_bn(**case)
    got, counts = fold_inference(before)
    assert counts == {}
    tvm.ir.assert_structural_equal(got, before)


@pytest.mark.parametrize("bias", [None, np.array([0.3, -0.7], "float32").reshape(1, 2, 1, 1)])
@pytest.mark.parametrize("transpose", [False, True])
def test_bn_fold_numerics(bias, transpose):
    rng = np.random.default_rng(1)
    weight = rng.standard_normal((2, 2, 3, 3) if transpose else (2, 3, 3, 3)).astype("float32")
    before = _conv_bn(weight=weight, bias=bias, transpose=transpose)
    got, counts = fold_inference(before)
    assert counts == {"bn_into_conv": 1}
    x = _x((1, 2, 5, 5) if transpose else (1, 3, 5, 5))
    np.testing.assert_allclose(_run(got, x), _run(before, x), rtol=1e-5, atol=1e-5)


@R.function(private=True)
def _silu_before(x: R.Tensor((1, 4, 6, 6), "float32")):
    with R.dataflow():
        s = R.sigmoid(x)
        y = R.multiply(s, x)
        R.output(y)
    return y


@R.function(private=True)
def _silu_expected(x: R.Tensor((1, 4, 6, 6), "float32")):
    with R.dataflow():
        y = R.nn.silu(x)
        R.output(y)
    return y


@R.function(private=True)
def _silu_shared(x: R.Tensor((1, 4, 6, 6), "float32")):
    with R.dataflow():
        s = R.sigmoid(x)
        y = R.multiply(x, s)
        z = R.add(y, s)
        R.output(z)
    return z


def test_silu_expected():
    got, counts = fold_inference(tvm.IRModule({"main": _silu_before}))
    tvm.ir.assert_structural_equal(got, tvm.IRModule({"main": _silu_expected}))
    assert counts == {"silu": 1}
    x = _x((1, 4, 6, 6))
    np.testing.assert_allclose(_run(got, x), _run(tvm.IRModule({"main": _silu_before}), x),
                               rtol=1e-6, atol=1e-6)


def test_silu_keeps_a_shared_sigmoid():
    before = tvm.IRModule({"main": _silu_shared})
    got, counts = fold_inference(before)
    assert counts == {}
    tvm.ir.assert_structural_equal(got, before)


def test_pass_form_and_optimize_module_report():
    before = _conv_bn()
    tvm.ir.assert_structural_equal(FoldInference()(before), fold_inference(before)[0])
    cfg = OllieConfig(derive=False, library=False, check_untuned=False)
    folded, report = optimize_module(before, target="llvm", config=cfg)
    assert report.inference_folds == {"bn_into_conv": 1}
    assert "inference folds before deciding: bn_into_conv 1" in report.to_text()
    kept, report = optimize_module(before, target="llvm",
                                   config=cfg.replace(fold_inference=False))
    assert report.inference_folds == {}
    assert any(c.op.name == "relax.nn.batch_norm" for c in _calls(kept))
    assert not any(c.op.name == "relax.nn.batch_norm" for c in _calls(folded))


def _calls(mod):
    out = []
    for block in mod["main"].body.blocks:
        for b in block.bindings:
            if isinstance(b.value, relax.Call) and isinstance(b.value.op, tvm.ir.Op):
                out.append(b.value)
    return out


# --- batch norm with run-time weights or parameters (bn_runtime) ----------------------------


def _conv_bn_runtime(bn_params=False, bias=False, matmul=False):
    """main(x, w[, b][, γ, β, μ, σ²]) = batch_norm(P(x, w) [+ b])[0], P a conv2d or a matmul;
    the weight is a parameter, the batch norm's parameters too with ``bn_params``."""
    bb = relax.BlockBuilder()
    xs, ws = ((4, 3), (3, 2)) if matmul else ((1, 3, 5, 5), (2, 3, 3, 3))
    x, w = relax.Var("x", relax.TensorType(xs, "float32")), relax.Var("w", relax.TensorType(
        ws, "float32"))
    params = [x, w]
    if bias:
        params.append(relax.Var("b", relax.TensorType((2,) if matmul else (1, 2, 1, 1),
                                                      "float32")))
    stats = [_c(GAMMA), _c(BETA), _c(MEAN), _c(VAR)]
    if bn_params:
        stats = [relax.Var(n, relax.TensorType((2,), "float32")) for n in ("g", "be", "m", "v")]
        params += stats
    with bb.function("main", params):
        with bb.dataflow():
            y = bb.emit(relax.op.matmul(x, w) if matmul else relax.op.nn.conv2d(x, w, padding=1))
            if bias:
                y = bb.emit(relax.op.add(y, params[2]))
            bn = bb.emit(relax.op.nn.batch_norm(y, *stats, axis=1, epsilon=EPS, training=False))
            gv = bb.emit_output(relax.TupleGetItem(bn, 0))
        bb.emit_func_output(gv)
    return bb.get()


def _conv_bn_runtime_expected():
    """The fold of _conv_bn_runtime(): conv(x, w·s) + t, s and t computed by Relax ops."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 3, 5, 5), "float32"))
    w = relax.Var("w", relax.TensorType((2, 3, 3, 3), "float32"))
    op = relax.op
    with bb.function("main", [x, w]):
        with bb.dataflow():
            scale = op.multiply(_c(GAMMA), op.rsqrt(op.add(_c(VAR), relax.const(EPS,
                                                                               "float32"))))
            shift = op.add(op.multiply(op.negative(_c(MEAN)), scale), _c(BETA))
            y = op.nn.conv2d(x, op.multiply(w, op.reshape(scale, (2, 1, 1, 1))), padding=1)
            gv = bb.emit_output(op.add(y, op.reshape(shift, (1, 2, 1, 1))))
        bb.emit_func_output(gv)
    return relax.transform.Normalize()(bb.get())


def test_bn_runtime_expected():
    got, counts = fold_inference(_conv_bn_runtime())
    assert counts == {"bn_runtime": 1}
    tvm.ir.assert_structural_equal(got, _conv_bn_runtime_expected())


def _runtime_args(mod, seed=2):
    rng = np.random.default_rng(seed)
    args = []
    for p in mod["main"].params:
        shape = tuple(int(d) for d in p.ty.shape)
        value = rng.standard_normal(shape).astype("float32")
        args.append(np.abs(value) + 0.5 if p.name == "v" else value)  # a variance
    return args


def _run_all(mod, args):
    ex = tvm.compile(mod, target="llvm")
    vm = relax.VirtualMachine(ex, tvm.cpu())
    return vm["main"](*[tvm.runtime.tensor(a) for a in args]).numpy()


@pytest.mark.parametrize("case", [dict(bn_params=True, bias=True), dict(matmul=True, bias=True)],
                         ids=["conv-all-at-run-time", "matmul"])
def test_bn_runtime_numerics(case):
    before = _conv_bn_runtime(**case)
    got, counts = fold_inference(before)
    assert counts == {"bn_runtime": 1}
    args = _runtime_args(before)
    want = _run_all(before, args)
    np.testing.assert_allclose(_run_all(got, args), want, rtol=1e-5,
                               atol=1e-5 * np.abs(want).max())


@pytest.mark.skipif(not native.load(), reason="native library not loaded")
def test_bn_runtime_shift_becomes_the_native_kernels_bias():
    """After the fold, a native conv takes the run-time shift as its bias epilogue."""
    before = _conv_bn_runtime(bn_params=True)
    folded, _ = fold_inference(before)
    native_mod, swapped = _conv_to_native(folded)
    assert swapped == 1
    fused, counts = fuse_epilogues(native_mod)
    assert counts == {"conv2d": 1}
    assert "bias=1" in fused.script()
    args = _runtime_args(before)
    want = _run_all(before, args)
    np.testing.assert_allclose(_run_all(fused, args), want, rtol=1e-5,
                               atol=1e-5 * np.abs(want).max())


def _conv_to_native(mod):
    """``mod`` with its conv2d calls bound to a variable replaced by the native kernel call."""
    func = mod["main"]
    blocks, swapped = [], 0
    for block in func.body.blocks:
        bindings = []
        for b in block.bindings:
            value = b.value
            if isinstance(value, relax.Call) and getattr(value.op, "name", "") == \
                    "relax.nn.conv2d":
                call = lib.emit_call(lib.call_form(value), list(value.args),
                                     [int(d) for d in value.ty.shape])
                value = relax.BlockBuilder().normalize(call)
                swapped += 1
            bindings.append(relax.VarBinding(b.var, value))
        blocks.append(relax.DataflowBlock(bindings))
    new = relax.Function(func.params, relax.SeqExpr(blocks, func.body.body), func.ret_ty,
                         func.is_pure, func.attrs)
    return tvm.IRModule({"main": new}), swapped
