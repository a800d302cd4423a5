"""Emitted modules compute what the original computes; fallbacks keep them correct."""

import shutil

import numpy as np
import pytest

from tvm_ollie.compat import cuda_target, relax, tvm
from tvm_ollie.codegen.builder import single_function_module, tensor_var
from tvm_ollie.orchestrate import (AnalyticCost, CostModel, OrchestrateConfig,
                                   orchestrate_module, orchestrate_pipeline)
from tvm_ollie.orchestrate.emit import KernelCycle, plan_kernels
from tvm_ollie.orchestrate.graph import build_graph
from tvm_ollie.orchestrate.candidates import make_candidate

from orch_helpers import CALIB, const, random_args, random_dag_module, run

COST = AnalyticCost("llvm", CALIB)


def conv_chain():
    def body(bb, x, w1, w2):
        c = bb.emit(relax.op.nn.conv2d(x, w1, padding=1))
        b = bb.emit(relax.op.add(c, const((1, 4, 1, 1), 1)))
        r = bb.emit(relax.op.nn.relu(b))
        c2 = bb.emit(relax.op.nn.conv2d(r, w2, padding=1))
        b2 = bb.emit(relax.op.add(c2, const((1, 4, 1, 1), 2)))
        return relax.op.nn.relu(b2)

    return single_function_module([tensor_var("x", (1, 4, 8, 8)), tensor_var("w1", (4, 4, 3, 3)),
                                   tensor_var("w2", (4, 4, 3, 3))], body)


def residual_block():
    """x -> conv -> relu -> conv -> (+ x) -> relu, with a side branch x -> sigmoid -> (*)."""
    def body(bb, x, w1, w2):
        c = bb.emit(relax.op.nn.conv2d(x, w1, padding=1))
        r = bb.emit(relax.op.nn.relu(c))
        c2 = bb.emit(relax.op.nn.conv2d(r, w2, padding=1))
        gate = bb.emit(relax.op.sigmoid(x))
        s = bb.emit(relax.op.add(c2, x))
        m = bb.emit(relax.op.multiply(s, gate))
        return relax.op.nn.relu(m)

    return single_function_module([tensor_var("x", (1, 4, 8, 8)), tensor_var("w1", (4, 4, 3, 3)),
                                   tensor_var("w2", (4, 4, 3, 3))], body)


def attention_block():
    def body(bb, x, wq):
        q = bb.emit(relax.op.matmul(x, wq))
        t = bb.emit(relax.op.permute_dims(q, [1, 0]))
        s = bb.emit(relax.op.matmul(q, t))
        sm = bb.emit(relax.op.nn.softmax(relax.op.multiply(s, relax.const(0.25, "float32"))))
        o = bb.emit(relax.op.matmul(sm, q))
        res = bb.emit(relax.op.add(o, x))
        return relax.op.nn.layer_norm(res, const((16,), 3), const((16,), 4), axes=[-1])

    return single_function_module([tensor_var("x", (8, 16)), tensor_var("wq", (16, 16))], body)


def two_outputs():
    def body(bb, x):
        e = bb.emit(relax.op.exp(x))
        s = bb.emit(relax.op.sum(e, axis=[1], keepdims=True))
        d = bb.emit(relax.op.divide(e, s))
        sp = bb.emit(relax.op.split(d, 2, axis=1))
        a = bb.emit(relax.TupleGetItem(sp, 0))
        b = bb.emit(relax.TupleGetItem(sp, 1))
        ra = bb.emit(relax.op.nn.relu(a))
        return relax.Tuple([ra, relax.op.negative(b)])

    return single_function_module([tensor_var("x", (4, 8))], body)


def _check_equal(mod, **kwargs):
    reports = []
    ex = tvm.compile(mod, "llvm", relax_pipeline=orchestrate_pipeline(
        "llvm", cost=kwargs.pop("cost", COST), reports=reports, **kwargs))
    ref = tvm.compile(mod, "llvm")
    args = random_args(mod)
    for got, want in zip(run(ex, args), run(ref, args)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    return reports[-1]


# conv_chain is compiled and compared by test_failing_kernel_falls_back
@pytest.mark.parametrize("build", [residual_block, attention_block, two_outputs])
def test_orchestrated_equals_original(build):
    report = _check_equal(build())
    assert report.partitions and all(p.status == "optimal" for p in report.partitions)
    fused = [k for p in report.partitions for k in p.kernels if len(k.primitives) > 1]
    assert fused, report.to_text()
    assert report.kernels < report.primitives


def test_convs_absorb_bias_and_relu():
    mod, report = orchestrate_module(conv_chain(), "llvm", cost=COST)
    kernels = [k for p in report.partitions for k in p.kernels]
    # two kernels, one per convolution; bias and relu go in the epilogue of the first or the
    # prologue of the second (same cost)
    assert len(kernels) == 2, report.to_text()
    assert all(k.kinds.count("linear") == 1 for k in kernels)
    calls = [b.value for b in mod["main"].body.blocks[0].bindings]
    assert len(calls) == 2 and all(c.op.name == "relax.call_tir" for c in calls)


def test_report_numbers_are_filled():
    _, report = orchestrate_module(attention_block(), "llvm", cost=COST)
    part = report.partitions[0]
    assert part.primitives == 8 and part.candidates >= part.primitives
    assert part.variables == part.candidates and part.constraints > 0
    assert part.solve_s > 0 and part.gap == 0 and part.enumeration == "exhausted"
    assert 0 < part.objective_s < part.singleton_cost_s
    assert sum(k.cost_s for k in part.kernels) == pytest.approx(part.objective_s)
    text = report.to_text()
    assert "vars=" in text and "kernel " in text


def test_failing_kernel_falls_back():
    failed = []

    def check(kmod):
        names = [gv.name_hint for gv, _ in kmod.functions_items()]
        if any("conv2d" in n and n.startswith("orch_") for n in names):
            failed.append(names)
            raise RuntimeError("injected build failure")

    report = _check_equal(conv_chain(), check=check)
    part = report.partitions[0]
    assert failed and any("injected build failure" in r for r in part.fallbacks)
    assert part.rounds > 1
    assert not any("conv2d" in p for k in part.kernels if len(k.primitives) > 1
                   for p in k.primitives)


def test_always_failing_check_gives_singletons():
    def check(_):
        raise RuntimeError("nothing builds")

    report = _check_equal(two_outputs(), check=check,
                          config=OrchestrateConfig(max_rounds=2))
    part = report.partitions[0]
    assert part.status.endswith("+singletons")
    assert all(len(k.primitives) == 1 for k in part.kernels)


def _cycle_module():
    def body(bb, x, y):
        n1 = bb.emit(relax.op.nn.relu(x))
        n5 = bb.emit(relax.op.exp(n1))
        n3 = bb.emit(relax.op.nn.relu(y))
        n2 = bb.emit(relax.op.add(n1, n3))
        n4 = bb.emit(relax.op.add(n5, n3))
        return relax.Tuple([n2, n4])

    return single_function_module([tensor_var("x", (4, 4)), tensor_var("y", (4, 4))], body)


class _FavourCycle(CostModel):
    """Makes the two kernels that depend on each other the cheapest choice."""

    name = "fake"

    def kernel_seconds(self, graph, cand):
        return 1.0 if cand.mask in (0b10011, 0b01100) else 5.0


def test_kernel_cycle_is_cut():
    mod = _cycle_module()
    graph = build_graph(mod["main"].body.blocks[0], mod)
    a, b = make_candidate(graph, 0b10011), make_candidate(graph, 0b01100)
    with pytest.raises(KernelCycle):
        plan_kernels(graph, [a, b], [graph.nodes[3].var, graph.nodes[4].var],
                     lambda v: v in graph.producer)
    report = _check_equal(mod, cost=_FavourCycle())
    assert any("cycle" in r for r in report.partitions[0].fallbacks)


def test_partitions_of_a_long_chain():
    def body(bb, x):
        v = x
        for k in range(40):
            v = bb.emit(relax.op.nn.relu(v) if k % 2 else relax.op.add(v, v))
        return v

    mod = single_function_module([tensor_var("x", (4, 4))], body)
    config = OrchestrateConfig(max_partition_nodes=16, min_partition_nodes=8,
                               max_kernel_size=4)
    report = _check_equal(mod, config=config)
    assert len(report.partitions) >= 3
    assert sum(p.primitives for p in report.partitions) == 41  # + the output alias
    assert all(len(k.primitives) <= 4 for p in report.partitions for k in p.kernels)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_cuda_build_without_gpu():
    """On a GPU target every fused kernel must be scheduled by dlight (schedule_check)."""
    reports = []
    tgt = cuda_target()
    ex = tvm.compile(two_outputs(), tgt, relax_pipeline=orchestrate_pipeline(
        tgt, cost=AnalyticCost(tgt), reports=reports))
    part = reports[-1].partitions[0]
    assert ex is not None and part.status == "optimal" and not part.fallbacks
    assert any(len(k.primitives) > 1 for k in part.kernels)


@pytest.mark.gpu
def test_cuda_numerics():
    tgt = cuda_target()
    mod = attention_block()
    ex = tvm.compile(mod, tgt, relax_pipeline=orchestrate_pipeline(tgt))
    dev = tvm.cuda(0)
    args = random_args(mod)
    got = relax.VirtualMachine(ex, dev)["main"](*[tvm.runtime.tensor(a, dev) for a in args])
    want = run(tvm.compile(mod, "llvm"), args)[0]
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=1e-4)


def test_fission_hook_runs_before_legalization():
    seen = []

    @relax.expr_functor.mutator
    class ReluToMaximum(relax.PyExprMutator):
        def visit_call_(self, call):  # pylint: disable=arguments-renamed
            call = super().visit_call_(call)
            if isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.nn.relu":
                return relax.op.maximum(call.args[0], relax.const(0.0, "float32"))
            return call

    def fission(mod):
        seen.append(sorted({b.value.op.name for b in mod["main"].body.blocks[0].bindings
                            if isinstance(b.value, relax.Call)}))
        mod["main"] = ReluToMaximum().visit_expr(mod["main"])
        return mod

    _, report = orchestrate_module(conv_chain(), "llvm", cost=COST, fission=fission)
    assert "relax.nn.relu" in seen[0]
    names = [n for p in report.partitions for k in p.kernels for n in k.primitives]
    assert "maximum" in names and "relu" not in names


def test_time_limit_uses_incumbent_or_singletons(monkeypatch):
    import tvm_ollie.orchestrate.pipeline as pipeline_mod  # pylint: disable=C0415
    from tvm_ollie.orchestrate.blp import BLPResult, solve_blp  # pylint: disable=C0415

    def incumbent(problem, time_limit_s):
        res = solve_blp(problem, time_limit_s)
        res.status, res.gap = "time_limit", 0.5
        return res

    monkeypatch.setattr(pipeline_mod, "solve_blp", incumbent)
    _, report = orchestrate_module(two_outputs(), "llvm", cost=COST)
    part = report.partitions[0]
    assert part.status == "time_limit" and part.gap == 0.5 and not part.fallbacks
    assert any(len(k.primitives) > 1 for k in part.kernels)

    def nothing(problem, time_limit_s):
        return BLPResult([], float("nan"), "time_limit_no_incumbent", float("nan"),
                         time_limit_s, len(problem.costs), 1, "time limit reached")

    monkeypatch.setattr(pipeline_mod, "solve_blp", nothing)
    _, report = orchestrate_module(two_outputs(), "llvm", cost=COST)
    part = report.partitions[0]
    assert part.status == "time_limit_no_incumbent+singletons"
    assert "time limit reached" in part.fallbacks[0]
    assert all(len(k.primitives) == 1 for k in part.kernels)


def test_too_many_candidates_splits_the_partition():
    mod = random_dag_module(30, 1)
    config = OrchestrateConfig(max_partition_candidates=60)
    report = _check_equal(mod, config=config)
    assert len(report.partitions) >= 2
    assert all(p.candidates <= 60 or p.primitives <= 4 for p in report.partitions)


def test_kernels_are_primitive_functions_in_dependency_order():
    from tvm_ollie.orchestrate import orchestrate_legalized  # pylint: disable=C0415

    mod = relax.transform.AnnotateTIROpPattern()(relax.transform.LegalizeOps()(two_outputs()))
    out, report = orchestrate_legalized(mod, COST)
    prim = {gv.name_hint: f for gv, f in out.functions_items()
            if isinstance(f, relax.Function) and f.attrs is not None and "Primitive" in f.attrs}
    assert len(prim) == 1 and report.kernels == 2  # the fused kernel and the output tuple
    bindings = out["main"].body.blocks[0].bindings
    assert bindings[0].value.op.name_hint in prim  # the kernel, then its two outputs, the tuple
    assert [type(b.value).__name__ for b in bindings] == ["Call", "TupleGetItem",
                                                          "TupleGetItem", "Tuple"]
    fused = relax.transform.FuseTIR()(out)
    assert sum(isinstance(f, tvm.tirx.PrimFunc) for _, f in fused.functions_items()) == 1


def test_build_check_accepts_good_kernels():
    from tvm_ollie.orchestrate import build_check  # pylint: disable=C0415

    _, report = orchestrate_module(two_outputs(), "llvm", cost=COST, check=build_check("llvm"))
    part = report.partitions[0]
    assert not part.fallbacks and any(len(k.primitives) > 1 for k in part.kernels)


def test_orchestration_fuses_a_reflection_pad_into_one_kernel():
    """Before: ``relu(take(take(x, i, 2), i, 3))`` (PyTorch's reflection pad), whose takes
    TVM's pattern analysis calls opaque (never fused). Expected after ``orchestrate_module``:
    the gathers marked injective (:mod:`tvm_ollie.tune.gather_pattern`) are layout
    primitives, and the pad and the relu one kernel; it computes what TVM's build does."""
    idx = np.abs(5 - np.abs(5 - np.arange(-2, 8))).astype("int64")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 4, 6, 6), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            h = bb.emit(relax.op.take(x, relax.const(idx), axis=2))
            w = bb.emit(relax.op.take(h, relax.const(idx), axis=3))
            out = bb.emit_output(relax.op.nn.relu(w))
        bb.emit_func_output(out)
    mod = bb.get()
    fused, _ = orchestrate_module(mod, "llvm", cost=AnalyticCost(tvm.target.Target("llvm")))
    calls = [b.value for b in fused["main"].body.blocks[0].bindings]
    assert len(calls) == 1 and calls[0].op.name == "relax.call_tir", fused["main"]
    ex = tvm.compile(mod, "llvm", relax_pipeline=orchestrate_pipeline("llvm"))
    data = np.random.default_rng(0).standard_normal((1, 4, 6, 6)).astype("float32")
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(data)).numpy()
    want = relax.VirtualMachine(tvm.compile(mod, "llvm"), tvm.cpu())["main"](
        tvm.runtime.tensor(data)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
