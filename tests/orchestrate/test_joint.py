"""Joint selection (orchestrate.joint): alternatives of a heavy call enter the binary program."""

from __future__ import annotations

import numpy as np
import pytest

from tvm_ollie.compat import relax, tvm
from tvm_ollie.orchestrate import blp as blp_mod
from tvm_ollie.orchestrate import pipeline as pipe
from tvm_ollie.orchestrate.cost import CostModel
from tvm_ollie.orchestrate.joint import apply_picked
from tvm_ollie.orchestrate.pipeline import ollie_orchestration
from tvm_ollie.pipeline.joint import offer_alternatives, offer_folded
from tvm_ollie.pipeline.joint_plans import joint_build
from tvm_ollie.transform.decide import Alternative, Choice

from orch_helpers import CALIB

X, W, B = (1, 8, 8, 8), (8, 8, 3, 3), (1, 8, 1, 1)


def _conv_module() -> "tvm.IRModule":
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(X, "float32"))
    w = relax.Var("w", relax.TensorType(W, "float32"))
    b = relax.Var("b", relax.TensorType(B, "float32"))
    with bb.function("main", [x, w, b]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, w, padding=(1, 1)), name_hint="y")
            z = bb.emit(relax.op.add(y, b), name_hint="z")
            r = bb.emit_output(relax.op.nn.relu(z), name_hint="r")
        bb.emit_func_output(r)
    return bb.get()


def _args(seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype("float32") for s in (X, W, B)]


def _run(ex, args):
    vm = relax.VirtualMachine(ex, tvm.cpu())
    return vm["main"](*[tvm.runtime.tensor(a) for a in args]).numpy()


def _reference(args):
    return _run(tvm.compile(_conv_module(), "llvm"), args)


class _FakeDecider:
    """Offers the original and one more TVM-built copy of it (``original`` label twice is
    avoided by a distinct estimate): the selection is what is under test, not derivation."""

    measures = False

    def __init__(self, sequential_alt: bool):
        self.sequential_alt = sequential_alt
        self.alt = Alternative(None, "tvm", 1.0)

    def decide(self, call, budget_s=None):  # noqa: ARG002
        if self.sequential_alt:
            return Choice(None, ["x", "w"], "fake", 2.0, 1.0, impl="copy")
        return Choice(None, ["x", "w"], "fake", 2.0, 2.0)

    def alternatives(self, call, budget_s):  # noqa: ARG002
        return [Alternative(None, "tvm", 2.0), _Copy()], 1, ""

    def check(self, call, alt):  # noqa: ARG002
        return True, ""


class _Copy(Alternative):
    """The original operator again, labelled as the Decider's choice ``original [copy]``."""

    def __init__(self):
        super().__init__(None, "copy", 1.0)

    @property
    def label(self):
        return "original [copy]"


class _NamedCost(CostModel):
    """Seconds: ``linear_orig`` per original conv, ``linear_alt`` per alternative conv, 1 us per
    other primitive, plus 2 us per kernel."""

    name = "fake"

    def __init__(self, linear_orig: float, linear_alt: float):
        self.orig, self.alt = linear_orig, linear_alt

    def kernel_seconds(self, graph, cand):
        total = 2e-6
        for i in cand.nodes:
            node = graph.nodes[i]
            if node.kind == "linear":
                total += self.alt if "__alt" in node.var.name else self.orig
            else:
                total += 1e-6
        return total


def _joint_compile(decider, cost):
    from tvm_ollie.transform import units  # pylint: disable=import-outside-toplevel

    orig_form = units.original_form
    # the fake "copy" implementation is the Relax operator itself
    units.original_form = lambda call, args, impl="tvm": orig_form(call, args, "tvm")
    try:
        mod, table, _ = offer_alternatives(_conv_module(), decider)
    finally:
        units.original_form = orig_form
    reports: list = []
    ex = tvm.compile(mod, "llvm", relax_pipeline=ollie_orchestration(
        "llvm", cost=cost, reports=reports, joint=table))
    return ex, table, reports[-1]


@pytest.mark.parametrize("alt_cheaper", [True, False])
def test_selection_picks_the_cheaper_alternative(alt_cheaper):
    cost = _NamedCost(1e-3, 1e-4) if alt_cheaper else _NamedCost(1e-4, 1e-3)
    ex, table, report = _joint_compile(_FakeDecider(sequential_alt=False), cost)
    assert table.chosen["y"] == ("original [copy]" if alt_cheaper else "original")
    part = report.partitions[0]
    assert part.joint.startswith("predicted: joint")
    kernels = [k.primitives for k in part.kernels]
    if not alt_cheaper:  # the original conv keeps its epilogue fusion
        assert any(len(k) == 3 for k in kernels)
    args = _args()
    np.testing.assert_allclose(_run(ex, args), _reference(args), rtol=1e-4, atol=1e-4)


def test_never_worse_guard_keeps_the_sequential_plan(monkeypatch):
    """A joint solve that comes back worse (a time-limited incumbent) is replaced by the
    sequential plan, and the report says why."""
    real = blp_mod.solve_blp

    def worse_unrestricted(problem, time_limit_s=10.0):
        res = real(problem, time_limit_s)
        if not any(len(c) == 1 for c in problem.extra_cuts):
            res.objective *= 10.0  # pretend the joint program found only a poor incumbent
        return res

    monkeypatch.setattr(pipe, "solve_blp", worse_unrestricted)
    ex, table, report = _joint_compile(_FakeDecider(sequential_alt=True), _NamedCost(1e-3, 1e-4))
    part = report.partitions[0]
    assert any("sequential plan kept" in f for f in part.fallbacks), part.fallbacks
    assert table.chosen["y"] == "original [copy]"
    args = _args(1)
    np.testing.assert_allclose(_run(ex, args), _reference(args), rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_joint_build_matches_tvm_with_real_alternatives():
    """The Decider's alternatives (derived programs, library kernel when loaded) offered for a
    conv with an epilogue: the joint build computes what TVM computes."""
    ex, report, orch = joint_build(_conv_module(), "llvm", calibration=CALIB,
                                   check_untuned=False, search_time_s=1.0, max_depth=3)
    assert [d.var_name for d in report.decisions] == ["y"]
    assert orch is not None and orch.partitions
    args = _args(2)
    np.testing.assert_allclose(_run(ex, args), _reference(args), rtol=1e-4, atol=1e-4)


class _Const(CostModel):
    name = "const"

    def __init__(self, seconds):
        self.seconds = seconds

    def kernel_seconds(self, graph, cand):
        return self.seconds


def test_linear_measured_cost_routes_linear_candidates():
    from tvm_ollie.orchestrate.candidates import enumerate_candidates
    from tvm_ollie.orchestrate.cost import LinearMeasuredCost
    from tvm_ollie.orchestrate.graph import build_graph

    mod = tvm.transform.Sequential([relax.transform.LegalizeOps(),
                                    relax.transform.AnnotateTIROpPattern()])(_conv_module())
    graph = build_graph(mod["main"].body.blocks[0], mod)
    cost = LinearMeasuredCost(_Const(1.0), _Const(2.0))
    cands = enumerate_candidates(graph).candidates
    assert len(cands) > 3
    for cand in cands:
        linear = any(graph.nodes[i].kind == "linear" for i in cand.nodes)
        assert cost.kernel_seconds(graph, cand) == (1.0 if linear else 2.0)


def test_build_joint_option_reaches_the_joint_selection(caplog):
    """``build(..., orchestrate=True, joint=True)`` (the config's ``joint``) builds through the
    joint selection: its report lists the conv's decision and the output is TVM's."""
    from tvm_ollie.pipeline import build

    ex, report = build(_conv_module(), "llvm", orchestrate=True, joint=True, calibration=CALIB,
                       check_untuned=False, search_time_s=0.5, max_depth=1, derive=False)
    assert [d.var_name for d in report.decisions] == ["y"]
    assert "joint selection failed" not in caplog.text  # not the sequential fallback
    args = _args(3)
    np.testing.assert_allclose(_run(ex, args), _reference(args), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("picked", [0, 1])
def test_apply_picked_substitutes_the_picked_alternative(picked):
    """``apply_picked``: the picked alternative's result is what the call's reader reads (a
    dataflow variable, so it can fuse with the reader), the original call and the other
    alternatives are gone, and the module computes what TVM computes."""
    offered, table, _ = offer_alternatives(_conv_module(), _FakeDecider(sequential_alt=True))
    offered = offer_folded(offered, table)
    table.picked["y"] = picked
    assert table.agrees_with_sequential() == (picked == 1)  # the fake Decider chose the copy
    out = apply_picked(offered, table)
    given = {b.var.name: b.value for b in offered["main"].body.blocks[0].bindings}
    bindings = out["main"].body.blocks[0].bindings
    assert [b.var.name for b in bindings] == ["y", "z", "r"]
    assert bindings[0].value.same_as(given["y__alt1" if picked else "y"])
    assert isinstance(bindings[0].var, relax.DataflowVar)
    assert bindings[1].value.args[0].same_as(bindings[0].var)
    args = _args(4)
    np.testing.assert_allclose(_run(tvm.compile(out, "llvm"), args), _reference(args),
                               rtol=1e-4, atol=1e-4)


def test_keep_alternatives_leaves_the_given_module_alone():
    """The wrapper returns the alternatives from ``main`` only while ``inner`` runs, on a copy:
    the caller's module (the joint build keeps it for the refined plan) is unchanged."""
    from tvm_ollie.orchestrate.joint import keep_alternatives

    offered, _, _ = offer_alternatives(_conv_module(), _FakeDecider(sequential_alt=True))
    before = offered["main"]
    out = keep_alternatives(relax.transform.FoldConstant())(offered)
    assert offered["main"].same_as(before)
    assert [b.var.name for b in out["main"].body.blocks[0].bindings][:2] == ["y", "y__alt1"]


@pytest.mark.parametrize("only", ["all", "its signature", "another signature"])
def test_offer_alternatives_decides_only_the_given_signatures(only):
    """``only`` (the signatures of the module as given) limits what is decided and offered;
    signatures, not names: the regions pass renames the bindings it re-emits."""
    from tvm_ollie.transform.units import call_signature

    mod = _conv_module()
    sig = call_signature(mod["main"].body.blocks[0].bindings[0].value)
    given = {"all": None, "its signature": {sig}, "another signature": {sig + " other"}}[only]
    offered, table, decided = offer_alternatives(mod, _FakeDecider(True), only=given)
    wanted = only != "another signature"
    assert [name for name, _, _ in decided] == (["y"] if wanted else [])
    assert bool(table) == wanted
