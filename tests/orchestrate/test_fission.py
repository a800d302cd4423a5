"""Operator fission: each rule is numerically equivalent to TVM's own lowering of the composite
op, leaves only primitives, and leaves what its guards reject exactly as it was."""

# pylint: disable=missing-function-docstring,invalid-name
import numpy as np
import pytest

import tvm
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R

from tvm_ollie.orchestrate import FISSION_RULES, Fission, FissionReport, fission
from tvm_ollie.orchestrate.fission import count_ops, non_primitive_ops
from tvm_ollie.orchestrate.fission_rules import ATTENTION_RULE, PRIMITIVE_KINDS, RuleContext

F32 = "float32"


def _module(shapes, make, dtype=F32):
    """``main(x0, x1, ...)`` whose body is ``make(bb, *params)`` (one dataflow block)."""
    bb = relax.BlockBuilder()
    params = [relax.Var(f"x{i}", relax.TensorType(s, dtype)) for i, s in enumerate(shapes)]
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(make(bb, *params))
        bb.emit_func_output(out)
    return bb.get()


def _single(op):
    return lambda bb, *xs: bb.emit(op(*xs))


def _batch_norm_all(bb, x, gamma, beta, mean, var):
    res = bb.emit(relax.op.nn.batch_norm(x, gamma, beta, mean, var, axis=1, training=False))
    return bb.emit(relax.Tuple([bb.emit(relax.TupleGetItem(res, i)) for i in range(3)]))


def _attention(bb, scores, values):
    prob = bb.emit(relax.op.nn.softmax(scores, axis=-1))
    return bb.emit(relax.op.matmul(prob, values))


def _attention_exported(bb, scores, values):
    """softmax -> broadcast_to -> reshape -> matmul, as torch.export writes ``softmax(S) @ V``."""
    prob = bb.emit(relax.op.nn.softmax(scores, axis=-1))
    wide = bb.emit(relax.op.broadcast_to(prob, (1, 2, 5, 7)))
    rows = bb.emit(relax.op.reshape(wide, (2, 5, 7)))
    return bb.emit(relax.op.matmul(rows, values))


nn = relax.op.nn

#: case -> (composite op, input shapes, body, input scale, rule names expected to fire)
CASES = {
    "softmax": ("relax.nn.softmax", [(2, 3, 16)], _single(lambda x: nn.softmax(x, -1)), 1.0),
    "softmax_axis1": ("relax.nn.softmax", [(2, 5, 4)], _single(lambda x: nn.softmax(x, 1)), 1.0),
    "softmax_large": ("relax.nn.softmax", [(4, 32)], _single(lambda x: nn.softmax(x)), 1e4),
    "log_softmax": ("relax.nn.log_softmax", [(4, 10)], _single(nn.log_softmax), 1.0),
    "log_softmax_large": ("relax.nn.log_softmax", [(4, 10)], _single(nn.log_softmax), 1e4),
    "layer_norm": ("relax.nn.layer_norm", [(2, 5, 16), (16,), (16,)],
                   _single(lambda x, g, b: nn.layer_norm(x, g, b, axes=[-1])), 1.0),
    "layer_norm_mid": ("relax.nn.layer_norm", [(2, 6, 3), (6,), (6,)],
                       _single(lambda x, g, b: nn.layer_norm(x, g, b, axes=[1])), 1.0),
    "rms_norm": ("relax.nn.rms_norm", [(2, 5, 16), (16,)],
                 _single(lambda x, w: nn.rms_norm(x, w, axes=[-1])), 1.0),
    "batch_norm": ("relax.nn.batch_norm", [(2, 4, 5, 5), (4,), (4,), (4,), (4,)],
                   _batch_norm_all, 1.0),
    "instance_norm": ("relax.nn.instance_norm", [(2, 4, 5, 5), (4,), (4,)],
                      _single(lambda x, g, b: nn.instance_norm(x, g, b, 1, [2, 3])), 1.0),
    "group_norm": ("relax.nn.group_norm", [(2, 6, 5, 5), (6,), (6,)],
                   _single(lambda x, g, b: nn.group_norm(x, g, b, 3, 1, [2, 3])), 1.0),
    "gelu": ("relax.nn.gelu", [(3, 7)], _single(nn.gelu), 3.0),
    "gelu_tanh": ("relax.nn.gelu_tanh", [(3, 7)], _single(nn.gelu_tanh), 3.0),
    "silu": ("relax.nn.silu", [(3, 7)], _single(nn.silu), 3.0),
    "avg_pool2d": ("relax.nn.avg_pool2d", [(1, 3, 8, 6)],
                   _single(lambda x: nn.avg_pool2d(x, (2, 3), (2, 3))), 1.0),
    "avg_pool2d_global": ("relax.nn.avg_pool2d", [(1, 3, 4, 4)],
                          _single(lambda x: nn.avg_pool2d(x, (4, 4), (4, 4))), 1.0),
    "max_pool2d": ("relax.nn.max_pool2d", [(1, 3, 8, 8)],
                   _single(lambda x: nn.max_pool2d(x, (2, 2), (2, 2))), 1.0),
    "max_pool2d_nhwc": ("relax.nn.max_pool2d", [(1, 4, 6, 3)],
                        _single(lambda x: nn.max_pool2d(x, (2, 3), (2, 3), layout="NHWC")), 1.0),
    "adaptive_avg_pool2d": ("relax.nn.adaptive_avg_pool2d", [(1, 3, 8, 6)],
                            _single(lambda x: nn.adaptive_avg_pool2d(x, (2, 3))), 1.0),
    "adaptive_avg_pool2d_1": ("relax.nn.adaptive_avg_pool2d", [(1, 3, 5, 7)],
                              _single(lambda x: nn.adaptive_avg_pool2d(x, 1)), 1.0),
    "attention": ("relax.nn.softmax", [(2, 5, 7), (2, 7, 4)], _attention, 1.0),
    "attention_large": ("relax.nn.softmax", [(2, 5, 7), (7, 4)], _attention, 1e4),
    "attention_exported": ("relax.nn.softmax", [(1, 2, 5, 7), (2, 7, 4)], _attention_exported,
                           1.0),
}


def _inputs(name):
    rng = np.random.default_rng(abs(hash(name)) % 2**32)
    _, shapes, _, scale = CASES[name]
    arrays = [rng.standard_normal(s).astype(F32) for s in shapes]
    arrays[0] *= np.float32(scale)
    if name == "batch_norm":
        arrays[4] = np.abs(arrays[4]) + np.float32(0.5)  # a variance
    return arrays


@pytest.fixture(scope="module")
def compiled():
    """Every case before and after fission in one module, compiled once (tests share it)."""
    combined = {}
    fissioned = {}
    for name, (_, shapes, make, _) in CASES.items():
        mod = _module(shapes, make)
        new_mod, report = fission(mod, attention=name.startswith("attention"))
        fissioned[name] = (new_mod, report)
        for tag, m in (("orig", mod), ("fiss", new_mod)):
            gname = f"{tag}_{name}"
            func = relax.utils.copy_with_new_vars(m["main"])  # one definition site per var
            combined[gname] = func.with_attr("global_symbol", gname)
    # LLVM -O0: both sides are compiled alike, and it builds ~4x faster than -O3
    target = tvm.target.Target({"kind": "llvm", "opt-level": 0})
    ex = tvm.compile(tvm.IRModule(combined), target)
    vm = relax.VirtualMachine(ex, tvm.cpu())
    return vm, fissioned


def _run(vm, fname, arrays):
    out = vm[fname](*[tvm.runtime.tensor(a) for a in arrays])
    return [out.numpy()] if hasattr(out, "numpy") else [o.numpy() for o in out]


@pytest.mark.parametrize("name", sorted(CASES))
def test_rule_equivalent_and_primitive(compiled, name):
    vm, fissioned = compiled
    op_name = CASES[name][0]
    new_mod, report = fissioned[name]
    assert report.total_split >= 1, report.to_text()
    ops = count_ops(new_mod)
    assert op_name not in ops
    assert non_primitive_ops(new_mod) == {}, ops
    arrays = _inputs(name)
    want = _run(vm, f"orig_{name}", arrays)
    got = _run(vm, f"fiss_{name}", arrays)
    assert len(want) == len(got) == (3 if name == "batch_norm" else 1)
    for w, g in zip(want, got):
        assert np.all(np.isfinite(g)), name
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5 if "large" not in name else 1e-4)


def test_large_logits_match_numpy(compiled):
    vm, _ = compiled
    (x,) = _inputs("softmax_large")
    shifted = x.astype(np.float64) - x.max(axis=-1, keepdims=True)
    want = np.exp(shifted) / np.exp(shifted).sum(axis=-1, keepdims=True)
    (got,) = _run(vm, "fiss_softmax_large", [x])
    assert np.abs(x).max() > 1e4  # exp(x) alone would overflow float32
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_attention_uses_one_matmul(compiled):
    _, fissioned = compiled
    new_mod, report = fissioned["attention"]
    ops = count_ops(new_mod)
    assert report.split == {ATTENTION_RULE.name: 1}
    assert ops["relax.matmul"] == 1 and ops["relax.concat"] == 1 and ops["relax.max"] == 1
    assert "relax.sum" not in ops  # the row sum comes out of the matmul


def test_attention_through_row_wise_layout(compiled):
    _, fissioned = compiled
    new_mod, report = fissioned["attention_exported"]
    assert report.split == {ATTENTION_RULE.name: 1}
    assert count_ops(new_mod)["relax.matmul"] == 1


def test_attention_not_through_row_mixing_reshape():
    def body(bb, s, v):
        prob = bb.emit(relax.op.nn.softmax(s))
        return bb.emit(relax.op.matmul(bb.emit(relax.op.reshape(prob, (2, 14))), v))

    _, report = fission(_module([(4, 7), (14, 3)], body), attention=True)
    assert report.split == {"softmax": 1}


def test_attention_off_by_default():
    mod = _module(CASES["attention"][1], _attention)
    new_mod, report = fission(mod)
    assert report.split == {"softmax": 1}
    assert count_ops(new_mod)["relax.sum"] == 1


def test_attention_needs_single_use():
    def body(bb, s, v):
        prob = bb.emit(relax.op.nn.softmax(s))
        return bb.emit(relax.Tuple([bb.emit(relax.op.matmul(prob, v)), prob]))

    new_mod, report = fission(_module([(2, 5, 7), (2, 7, 4)], body), attention=True)
    assert report.split == {"softmax": 1}
    assert "attention_softmax_matmul: guard softmax_lhs" not in str(report.untouched)
    assert non_primitive_ops(new_mod) == {}


@I.ir_module
class SoftmaxBefore:
    @R.function
    def main(x: R.Tensor((2, 8), "float32")) -> R.Tensor((2, 8), "float32"):
        with R.dataflow():
            y = R.nn.softmax(x, axis=-1)
            R.output(y)
        return y


@I.ir_module
class SoftmaxExpected:
    @R.function
    def main(x: R.Tensor((2, 8), "float32")) -> R.Tensor((2, 8), "float32"):
        with R.dataflow():
            m = R.max(x, axis=[-1], keepdims=True)
            d = R.subtract(x, m)
            e = R.exp(d)
            s = R.sum(e, axis=[-1], keepdims=True)
            y = R.divide(e, s)
            R.output(y)
        return y


def test_softmax_structure():
    after, report = fission(SoftmaxBefore)
    tvm.ir.assert_structural_equal(after, SoftmaxExpected)
    assert report.split == {"softmax": 1} and report.untouched == {}


@I.ir_module
class BatchNormBefore:
    @R.function
    def main(x: R.Tensor((1, 2, 3, 3), "float32"), g: R.Tensor((2,), "float32"),
             b: R.Tensor((2,), "float32"), mu: R.Tensor((2,), "float32"),
             var: R.Tensor((2,), "float32")) -> R.Tensor((1, 2, 3, 3), "float32"):
        with R.dataflow():
            t = R.nn.batch_norm(x, g, b, mu, var, axis=1, epsilon=0.5, training=False)
            y = t[0]
            R.output(y)
        return y


@I.ir_module
class BatchNormExpected:
    @R.function
    def main(x: R.Tensor((1, 2, 3, 3), "float32"), g: R.Tensor((2,), "float32"),
             b: R.Tensor((2,), "float32"), mu: R.Tensor((2,), "float32"),
             var: R.Tensor((2,), "float32")) -> R.Tensor((1, 2, 3, 3), "float32"):
        with R.dataflow():
            mu4 = R.reshape(mu, R.shape([1, 2, 1, 1]))
            var4 = R.reshape(var, R.shape([1, 2, 1, 1]))
            d = R.subtract(x, mu4)
            s = R.sqrt(R.add(var4, R.const(0.5, "float32")))
            n = R.divide(d, s)
            g4 = R.reshape(g, R.shape([1, 2, 1, 1]))
            sc = R.multiply(n, g4)
            b4 = R.reshape(b, R.shape([1, 2, 1, 1]))
            out = R.add(sc, b4)
            y = out
            R.output(y)
        return y


def test_batch_norm_tuple_output_structure():
    after, report = fission(BatchNormBefore)
    tvm.ir.assert_structural_equal(after, BatchNormExpected)
    assert report.split == {"batch_norm": 1}


def _const_batch_norm():
    """batch_norm(x) with its four parameters as constants (a model's weights)."""
    rng = np.random.default_rng(7)
    params = [rng.standard_normal(2).astype(F32) for _ in range(4)]
    params[3] = np.abs(params[3]) + np.float32(0.1)
    g, b, mu, var = [relax.const(p) for p in params]
    x = relax.Var("x", relax.TensorType((1, 2, 3, 3), F32))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            t = bb.emit(relax.op.nn.batch_norm(x, g, b, mu, var, axis=1, epsilon=0.5,
                                                      training=False))
            y = bb.emit_output(relax.TupleGetItem(t, 0))
        bb.emit_func_output(y)
    return bb.get(), params


def test_batch_norm_of_constants_folds_its_parameters():
    """Constant parameters are reshaped, and ``sqrt(var + eps)`` computed, by the rule itself:
    no ``reshape``/``add``/``sqrt`` of constants is left for ``FoldConstant`` to build and
    run (YOLOX quick: 377 + 184 LLVM builds in every orchestrated plan), and the result is
    what TVM's build of the original computes."""
    mod, (g, b, mu, var) = _const_batch_norm()
    after, report = fission(mod)
    assert report.split == {"batch_norm": 1}
    x = after["main"].params[0]
    four = (1, 2, 1, 1)
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            d = bb.emit(relax.op.subtract(x, relax.const(mu.reshape(four))))
            std = np.sqrt(var + np.float32(0.5)).reshape(four)
            n = bb.emit(relax.op.divide(d, relax.const(std)))
            sc = bb.emit(relax.op.multiply(n, relax.const(g.reshape(four))))
            out = bb.emit(relax.op.add(sc, relax.const(b.reshape(four))))
            y = bb.emit_output(out)
        bb.emit_func_output(y)
    tvm.ir.assert_structural_equal(after, bb.get(), map_free_vars=True)
    arr = np.random.default_rng(8).standard_normal((1, 2, 3, 3)).astype(F32)
    got, want = [relax.VirtualMachine(tvm.compile(m, "llvm"), tvm.cpu())["main"](
        tvm.runtime.tensor(arr)).numpy() for m in (after, mod)]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def _unchanged(mod, op_name, reason):
    after, report = fission(mod)
    tvm.ir.assert_structural_equal(after, mod)
    assert report.total_split == 0
    assert any(reason in r for r in report.untouched.get(op_name, {})), report.untouched
    return report


def test_guard_dynamic_shape():
    @I.ir_module
    class Dynamic:  # pylint: disable=too-few-public-methods
        @R.function
        def main(x: R.Tensor(("n", 8), "float32")) -> R.Tensor(("n", 8), "float32"):
            with R.dataflow():
                y = R.nn.softmax(x, axis=-1)
                R.output(y)
            return y

    _unchanged(Dynamic, "relax.nn.softmax", "guard static_shapes")


def test_guard_integer_data():
    mod = _module([(1, 2, 4, 4)], _single(lambda x: nn.max_pool2d(x, (2, 2), (2, 2))),
                  dtype="int32")
    _unchanged(mod, "relax.nn.max_pool2d", "guard float_data (kept as one reduce primitive)")


def test_rule_apply_returns_none_when_a_guard_fails():
    mod = _module([(1, 2, 4, 4)], _single(lambda x: nn.max_pool2d(x, (2, 2), (2, 2))),
                  dtype="int32")
    call = mod["main"].body.blocks[0].bindings[0].value
    rule = FISSION_RULES["relax.nn.max_pool2d"]
    assert rule.failed_guard(call, RuleContext()) == "float_data"
    assert rule.apply(relax.BlockBuilder(), call, RuleContext()) is None


def test_guard_overlapping_pool_windows():
    mod = _module([(1, 2, 8, 8)], _single(lambda x: nn.max_pool2d(x, (3, 3), (2, 2), padding=1)))
    _unchanged(mod, "relax.nn.max_pool2d", "guard tiled_windows")


def test_guard_training_batch_norm():
    shapes = [(2, 4, 5, 5)] + [(4,)] * 4

    def body(bb, *xs):
        res = bb.emit(relax.op.nn.batch_norm(*xs, axis=1, training=True))
        return bb.emit(relax.TupleGetItem(res, 0))

    _unchanged(_module(shapes, body), "relax.nn.batch_norm", "guard inference_mode")


def test_unknown_op_reported():
    mod = _module([(2, 6)], _single(relax.op.nn.softplus))
    report = _unchanged(mod, "relax.nn.softplus", "no fission rule")
    assert "no fission rule" in report.to_text()


def test_module_pass_and_rule_table():
    seq = Fission()
    after = seq(SoftmaxBefore)
    tvm.ir.assert_structural_equal(after, SoftmaxExpected)
    assert isinstance(seq.last_report, FissionReport)
    assert seq.last_report.split == {"softmax": 1}
    for op_name, rule in FISSION_RULES.items():
        assert rule.op_name == op_name and rule.equation and "=" in rule.equation
        assert rule.guards and all(callable(g) for _, g in rule.guards)
    assert {v for v in PRIMITIVE_KINDS.values()} == {"elementwise", "reduce", "layout", "linear"}


@I.ir_module
class AttentionBefore:
    @R.function
    def main(s: R.Tensor((2, 4, 6), "float32"),
             v: R.Tensor((2, 6, 3), "float32")) -> R.Tensor((2, 4, 3), "float32"):
        with R.dataflow():
            p = R.nn.softmax(s, axis=-1)
            y = R.matmul(p, v)
            R.output(y)
        return y


@I.ir_module
class AttentionExpected:
    @R.function
    def main(s: R.Tensor((2, 4, 6), "float32"),
             v: R.Tensor((2, 6, 3), "float32")) -> R.Tensor((2, 4, 3), "float32"):
        with R.dataflow():
            m = R.max(s, axis=[-1], keepdims=True)
            d = R.subtract(s, m)
            e = R.exp(d)
            ones = R.ones(R.shape([2, 6, 1]), "float32")
            vc = R.concat((v, ones), axis=-1)
            both = R.matmul(e, vc)
            num = R.strided_slice(both, axes=[2], begin=[0], end=[3])
            den = R.strided_slice(both, axes=[2], begin=[3], end=[4])
            y = R.divide(num, den)
            R.output(y)
        return y


def test_attention_structure():
    after, report = fission(AttentionBefore, attention=True)
    tvm.ir.assert_structural_equal(after, AttentionExpected)
    assert report.split == {ATTENTION_RULE.name: 1}
