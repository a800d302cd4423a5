"""Inference folding (batch norm into convolutions, SiLU): Before/Expected modules and numerics
against TVM's build of the unfolded module."""

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.script import relax as R

from tvm_ollie.config import OllieConfig
from tvm_ollie.transform.inference_fold import FOLD_RULES, FoldInference, fold_inference
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
    assert [r.name for r in FOLD_RULES][:2] == ["bn_into_conv", "silu"]
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


def test_bn_into_conv_transpose_expected():
    weight = np.arange(2 * 2 * 3 * 3, dtype="float32").reshape(2, 2, 3, 3) / 10  # IOHW
    got, counts = fold_inference(_conv_bn(weight=weight, transpose=True))
    expected = _conv_bias(weight * SCALE.reshape(1, 2, 1, 1), SHIFT, transpose=True)
    tvm.ir.assert_structural_equal(got, expected)
    assert counts == {"bn_into_conv": 1}


@pytest.mark.parametrize("case", [dict(extra_use=True), dict(weight_param=True),
                                  dict(training=True)],
                         ids=["conv-read-twice", "weight-is-a-parameter", "training"])
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
