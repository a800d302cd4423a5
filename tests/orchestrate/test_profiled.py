"""Profiled kernel costs: what is measured first, the budget, the cache, failures, the report."""

import dataclasses
import time

import numpy as np
import pytest

from tvm_ollie.compat import relax, tvm
from tvm_ollie.codegen.builder import single_function_module, tensor_var
from tvm_ollie.compile_profile import profile_scope
from tvm_ollie.orchestrate import (AnalyticCost, OrchestrateConfig, ProfiledCost, build_graph,
                                   enumerate_candidates, orchestrate_module,
                                   orchestrate_pipeline)
from tvm_ollie.orchestrate.emit import kernel_name
from tvm_ollie.orchestrate.profiled import (SIMPLE_SAMPLES, UNCERTAINTY, ProfileLedger,
                                            cost_class, make_cost, needs_profile, timeable)

from orch_helpers import CALIB, const, random_args, run


def conv_softmax():
    """conv + bias + relu, a softmax over the last axis, a gate and a residual add."""
    def body(bb, x, w):
        c = bb.emit(relax.op.nn.conv2d(x, w, padding=1))
        r = bb.emit(relax.op.nn.relu(relax.op.add(c, const((1, 4, 1, 1), 1))))
        s = bb.emit(relax.op.nn.softmax(r, axis=-1))
        g = bb.emit(relax.op.multiply(s, relax.op.tanh(x)))
        return relax.op.add(g, x)

    return single_function_module([tensor_var("x", (1, 4, 8, 8)),
                                   tensor_var("w", (4, 4, 3, 3))], body)


class FakeTimer:
    """Times a kernel module by its PrimFuncs' names (no build): a kernel of several
    primitives (``orch_a_b``) costs ``fused_s``, one primitive (``orch_a``) ``single_s``; a
    name containing every part of ``fail`` raises."""

    def __init__(self, fused_s=1e-6, single_s=3e-6, fail=(), sleep_s=0.0):
        self.fused_s, self.single_s, self.fail, self.sleep_s = fused_s, single_s, fail, sleep_s
        self.calls = []

    def __call__(self, fused, _target, _rpc):
        names = [g.name_hint for g, f in fused.functions_items()
                 if isinstance(f, tvm.tirx.PrimFunc)]
        self.calls.append(names)
        time.sleep(self.sleep_s)
        if any(all(part in n for part in self.fail) for n in names) and self.fail:
            raise RuntimeError(f"kernel {names} crashed")
        return self.fused_s if any(n.count("_") > 1 for n in names) else self.single_s


def _config(tmp_path, **kwargs):
    return OrchestrateConfig(profile_floor_s=0.0, work_dir=str(tmp_path), **kwargs)


def _cost(tmp_path, timer, **kwargs):
    return ProfiledCost("llvm", _config(tmp_path, **kwargs), AnalyticCost("llvm", CALIB),
                        timer=timer, overhead_s=0.0)


def _graph_and_candidates():
    mod = conv_softmax()
    with tvm.target.Target("llvm"):
        mod = tvm.transform.Sequential([relax.transform.LegalizeOps(),
                                        relax.transform.AnnotateTIROpPattern()])(mod)
    graph = build_graph(mod["main"].body.blocks[0], mod)
    return graph, enumerate_candidates(graph, 8).candidates


def test_rule_keeps_single_elementwise_primitives_analytic():
    graph, cands = _graph_and_candidates()
    for cand in cands:
        kinds = {graph.nodes[i].kind for i in cand.nodes}
        profiled = needs_profile(graph, cand, 1.0, 0.0)
        if cand.size == 1 and kinds <= {"elementwise", "layout"}:
            assert not profiled and cost_class(graph, cand) == "simple"
        elif all(graph.nodes[i].fusable for i in cand.nodes):
            assert profiled
        assert not needs_profile(graph, cand, 1e-7, 1e-6)  # below the floor: analytic


def test_largest_uncertainty_times_estimate_first_within_the_kernel_budget(tmp_path):
    graph, cands = _graph_and_candidates()
    timer = FakeTimer()
    cost = _cost(tmp_path, timer, profile_max_kernels=SIMPLE_SAMPLES + 3)
    costs = cost.costs(graph, cands)
    analytic = AnalyticCost("llvm", CALIB).costs(graph, cands)
    classes = [cost_class(graph, c) for c in cands]
    eligible = [k for k, c in enumerate(cands) if needs_profile(graph, c, analytic[k], 0.0)]
    simple = [k for k, c in enumerate(cands)
              if timeable(graph, c, analytic[k], 0.0) and classes[k] == "simple"]
    order = sorted(eligible, key=lambda k: -UNCERTAINTY[classes[k]] * analytic[k])
    assert len(eligible) > 3 and len(simple) > SIMPLE_SAMPLES
    stats = cost.stats
    # first the largest simple primitives (their class's scale), then by uncertainty x time
    assert len(timer.calls) == SIMPLE_SAMPLES + 3 and stats.samples == SIMPLE_SAMPLES
    samples = sorted(simple, key=lambda k: -analytic[k])[:SIMPLE_SAMPLES]
    assert [names[0] for names in timer.calls[:SIMPLE_SAMPLES]] == \
        [kernel_name(graph, cands[k]) for k in samples]
    assert (stats.profiled, stats.cached, stats.stopped) == (SIMPLE_SAMPLES + 3, 0, "budget")
    assert stats.scaled == len(eligible) - 3 and len(stats.ratios) == SIMPLE_SAMPLES + 3
    measured = {cost.launch_s + 1e-6, cost.launch_s + 3e-6}
    assert sorted(k for k in eligible if costs[k] in measured) == sorted(order[:3])
    assert all(costs[k] in measured for k in samples)
    # the rest: the analytic estimate times the median ratio of the measured ones of the class
    simple_ratio = float(np.median([(cost.launch_s + 3e-6) / analytic[k] for k in samples]))
    for k in order[3:]:
        assert costs[k] == pytest.approx(analytic[k] * cost._ratio(classes[k]))  # noqa: SLF001
    for k in set(simple) - set(samples):
        assert costs[k] == pytest.approx(analytic[k] * simple_ratio)
    # what is not timeable (views, glue) keeps the analytic cost
    for k, c in enumerate(cands):
        if not timeable(graph, c, analytic[k], 0.0):
            assert costs[k] == analytic[k]


def test_nothing_is_profiled_past_the_seconds_budget(tmp_path):
    graph, cands = _graph_and_candidates()
    timer = FakeTimer(sleep_s=0.03)
    cost = _cost(tmp_path, timer, profile_budget_s=0.05)
    cost.costs(graph, cands)
    # checked before each build: the first two start within the budget, none after it
    assert 1 <= len(timer.calls) <= 2 and cost.stats.stopped == "budget"
    assert cost.stats.profile_s >= 0.03 * len(timer.calls)


def test_second_orchestration_times_nothing(tmp_path):
    timer = FakeTimer()
    first = orchestrate_module(conv_softmax(), "llvm",
                               cost=_cost(tmp_path, timer, profile_max_kernels=6))[1]
    assert len(timer.calls) == 6 and first.profile.profiled == 6
    again = FakeTimer()
    second = orchestrate_module(conv_softmax(), "llvm",
                                cost=_cost(tmp_path, again, profile_max_kernels=6))[1]
    assert again.calls == []
    assert (second.profile.profiled, second.profile.cached) == (0, 6)
    assert [k.primitives for p in second.partitions for k in p.kernels] == \
        [k.primitives for p in first.partitions for k in p.kernels]


def test_failing_candidate_is_banned_and_the_build_completes(tmp_path):
    mod = conv_softmax()
    timer = FakeTimer(fused_s=1e-9, fail=("orch_", "_relu"))  # every fused kernel with relu
    reports = []
    ex = tvm.compile(mod, "llvm", relax_pipeline=orchestrate_pipeline(
        "llvm", cost=_cost(tmp_path, timer), reports=reports))
    rep = reports[-1]
    assert rep.profile.failed > 0 and rep.profile.failures
    assert any("banned" in f for p in rep.partitions for f in p.fallbacks), rep.to_text()
    kernels = [k.primitives for p in rep.partitions for k in p.kernels]
    assert not any(len(k) > 1 and "relu" in k for k in kernels), rep.to_text()
    assert any(len(k) > 1 for k in kernels)  # the other fused kernels (nearly free) stay
    args = random_args(mod)
    for got, want in zip(run(ex, args), run(tvm.compile(mod, "llvm"), args)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_analytic_costs_are_unchanged():
    config = OrchestrateConfig(costs="analytic")
    assert type(make_cost("llvm", config)) is AnalyticCost  # pylint: disable=C0123
    _, report = orchestrate_module(conv_softmax(), "llvm", config=config)
    assert report.cost_model == "analytic" and report.profile is None
    _, given = orchestrate_module(conv_softmax(), "llvm", cost=AnalyticCost("llvm"))
    assert [k.primitives for p in report.partitions for k in p.kernels] == \
        [k.primitives for p in given.partitions for k in p.kernels]


def test_report_counts_and_profile_stage(tmp_path):
    timer = FakeTimer(fail=("orch_", "softmax"))
    with profile_scope() as prof:
        _, report = orchestrate_module(conv_softmax(), "llvm", cost=_cost(tmp_path, timer))
    stats = report.profile
    assert stats.profiled == len(timer.calls) == stats.eligible - stats.cached
    assert stats.failed > 0 and len(stats.ratios) == stats.profiled - stats.failed
    assert stats.samples == SIMPLE_SAMPLES
    q = stats.quartiles()
    assert q[0] <= q[1] <= q[2] <= q[3] <= q[4]
    text = report.to_text()
    assert f"{stats.profiled} profiled" in text and "measured/analytic min" in text
    assert "orchestration profiling" in prof.seconds


def test_default_costs_build_and_time_real_kernels(tmp_path):
    """The default timer: builds untuned kernels and times them here (four, the budget)."""
    config = _config(tmp_path, profile_max_kernels=SIMPLE_SAMPLES + 1)
    _, report = orchestrate_module(conv_softmax(), "llvm", config=config)
    stats = report.profile
    # (an earlier test of this process may have timed one of them: the process cache)
    assert report.cost_model == "profiled"
    assert stats.profiled + stats.cached == SIMPLE_SAMPLES + 1 and stats.profiled > 0
    assert not stats.failed and all(r > 0 for r in stats.ratios) and stats.overhead_s > 0
    _, again = orchestrate_module(conv_softmax(), "llvm", config=config)
    assert (again.profile.profiled, again.profile.cached) == (0, SIMPLE_SAMPLES + 1)


def test_no_device_and_no_rpc_falls_back_to_analytic_with_a_note():
    if tvm.cuda(0).exist:
        pytest.skip("a GPU is present: cuda kernels can be profiled here")
    notes = []
    cost = make_cost("cuda", OrchestrateConfig(), notes)
    assert type(cost) is AnalyticCost and "analytic" in notes[0]  # pylint: disable=C0123


def test_rpc_and_work_dir_reach_the_profiled_costs(tmp_path):
    from tvm_ollie.config import OllieConfig  # pylint: disable=C0415
    from tvm_ollie.tune.rpc import RPCConfig  # pylint: disable=C0415

    rpc = RPCConfig("127.0.0.1", 9190, "board")
    orch = OllieConfig(work_dir=str(tmp_path), rpc=rpc).orchestrate_config()
    assert (orch.work_dir, orch.rpc) == (str(tmp_path), rpc)
    assert isinstance(make_cost("cuda", orch), ProfiledCost)  # timed remotely: no GPU needed
    seen = []

    def remote(fused, target, given):
        seen.append(given)
        return 1e-6

    graph, cands = _graph_and_candidates()
    cost = ProfiledCost("llvm", dataclasses.replace(orch, profile_floor_s=0.0),
                        AnalyticCost("llvm", CALIB), timer=remote, overhead_s=0.0)
    cost.costs(graph, cands)
    assert seen and all(r is rpc for r in seen)
    assert all("@rpc:board" in k for k in cost.measured.cache)
    assert "profiled costs through rpc" in cost.stats.to_text()


def test_a_cost_asked_again_is_not_costed_twice(tmp_path):
    graph, cands = _graph_and_candidates()
    timer = FakeTimer()
    cost = _cost(tmp_path, timer)
    costs = cost.costs(graph, cands)
    calls, counted = len(timer.calls), cost.stats.candidates
    assert [cost.kernel_seconds(graph, c) for c in cands] == costs
    assert (len(timer.calls), cost.stats.candidates) == (calls, counted)


def _kernels(report):
    return [k.primitives for p in report.partitions for k in p.kernels]


def test_plans_of_one_build_share_one_budget(tmp_path):
    """Two orchestrations of one build (the joint build's plans) on one ledger: the first gets
    half the kernels, the second the rest, and what the first measured is free for it."""
    ledger = ProfileLedger(60.0, 10)
    first_timer, second_timer = FakeTimer(), FakeTimer()
    account = ledger.account("joint", 2)
    assert (account.seconds, account.kernels) == (30.0, 5)
    first = orchestrate_module(conv_softmax(), "llvm", cost=ProfiledCost(
        "llvm", _config(tmp_path), AnalyticCost("llvm", CALIB), timer=first_timer,
        overhead_s=0.0, account=account))[1]
    assert len(first_timer.calls) == 5 and first.profile.stopped == "budget"
    assert (ledger.kernels, first.profile.max_kernels) == (5, 5)
    second = orchestrate_module(conv_softmax(), "llvm", cost=ProfiledCost(
        "llvm", _config(tmp_path), AnalyticCost("llvm", CALIB), timer=second_timer,
        overhead_s=0.0, account=ledger.account("sequential", 1)))[1]
    # the same module: the first plan's five kernels from the cache at no charge, five new
    assert (second.profile.cached, second.profile.profiled) == (5, 5)
    assert not {tuple(c) for c in second_timer.calls} & {tuple(c) for c in first_timer.calls}
    assert ledger.kernels == 0 and ledger.seconds < 60.0


def test_a_plan_orchestrated_again_repeats_its_selection(tmp_path):
    """The tuned build orchestrates the kept plan again: the same account, the same kernels
    charged as the first time, nothing timed, the same kernels chosen."""
    ledger = ProfileLedger(60.0, 8)

    def orchestrate(plan, share, timer):
        return orchestrate_module(conv_softmax(), "llvm", cost=ProfiledCost(
            "llvm", _config(tmp_path), AnalyticCost("llvm", CALIB), timer=timer,
            overhead_s=0.0, account=ledger.account(plan, share)))[1]

    first = orchestrate("joint", 2, FakeTimer(fused_s=1e-7))
    orchestrate("sequential", 1, FakeTimer(fused_s=1e-7))
    again_timer = FakeTimer(fused_s=1e-7)
    again = orchestrate("joint", 2, again_timer)
    assert again_timer.calls == [] and again.profile.cached == first.profile.profiled
    assert _kernels(again) == _kernels(first)


def test_a_cost_keeps_its_value_once_the_budget_is_spent(tmp_path):
    """A candidate measured in one call keeps its measured cost in a later call for the same
    graph, after the budget is spent (not the class's scaled estimate): the joint
    selection's corrections are differences of the costs of nodes costed alone first."""
    graph, cands = _graph_and_candidates()
    analytic = AnalyticCost("llvm", CALIB).costs(graph, cands)
    linear = [k for k, c in enumerate(cands) if cost_class(graph, c) == "linear"
              and needs_profile(graph, c, analytic[k], 0.0)]
    single = next(k for k in linear if cands[k].size == 1)
    fused = next(k for k in linear if cands[k].size > 1)
    timer = FakeTimer(fused_s=1e-6, single_s=3e-5)
    cost = _cost(tmp_path, timer, profile_max_kernels=2)
    first = cost.costs(graph, [cands[single], cands[fused]])
    assert len(timer.calls) == 2
    scaled = analytic[single] * cost._ratio("linear")  # noqa: SLF001
    assert scaled != pytest.approx(first[0])  # what the spent budget would have priced it at
    again = cost.costs(graph, cands)
    assert len(timer.calls) == 2 and cost.stats.stopped == "budget"
    assert again[single] == first[0] and again[fused] == first[1]
