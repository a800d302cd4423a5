"""The whole-model guard skips TVM's build of the original where the decisions' own timings
show it cannot win (:mod:`tvm_ollie.pipeline.hopeless`), and builds it everywhere else. Fake
timers and clocks: nothing here depends on this machine's speed."""

from types import SimpleNamespace

import pytest
import small_models as sm
import tvm
from tvm_ollie.frontend.explain import guard_line
from tvm_ollie.pipeline import build
from tvm_ollie.pipeline.build import _unless_hopeless
from tvm_ollie.pipeline.guard import PlanSkipped, guard_plans
from tvm_ollie.pipeline.hopeless import (ORIGINAL_HOPELESS, fastest_call, hopeless_original,
                                         original_lower_bound)
from tvm_ollie.transform.decision import Decision
from tvm_ollie.transform.measuring import HOPELESS

OPTS = dict(max_depth=2, search_time_s=1.0, calibration=sm.LLVM_CALIB, library=False,
            model_guard=True)


def _dec(name, before_s, measured=True, function="main"):
    return SimpleNamespace(function=function, var_name=name, before_s=before_s,
                           measured=measured)


def _report(*decisions):
    return SimpleNamespace(decisions=list(decisions))


def test_the_lower_bound_counts_each_timed_call_once():
    report = _report(_dec("a", 3e-3), _dec("a", 3e-3), _dec("b", 1e-3),
                     _dec("c", 5.0, measured=False), _dec("d", 0.0), _dec("a", 2e-3, True, "f"))
    assert original_lower_bound(report) == 3e-3 + 1e-3 + 2e-3


def _unit(kind, var_name, contents, before_s, measured=True):
    return Decision(function="main", var_name=var_name, kind=kind, contents=contents,
                    before_s=before_s, measured=measured)


def test_the_calls_of_a_unit():
    assert _unit("call", "lv3", "", 1.0).calls() == ["lv3"]
    assert _unit("region", "lv6", "lv=reshape, lv1=permute_dims, lv2=matmul, lv6=add",
                 1.0).calls() == ["lv", "lv1", "lv2", "lv6"]
    assert _unit("region", "lv9", "lv9=relax.call_tir:fused_add", 1.0).calls() == ["lv9"]
    assert _unit("group", "q, k", "q=matmul, k=matmul share x", 1.0).calls() == ["q", "k"]


def test_the_lower_bound_counts_regions_and_groups_each_call_once():
    """BERT quick's units are regions only (no call decided alone): each counts. A call also
    decided alone, or a group sharing a call with a region, is not counted again: the larger
    unit counts."""
    regions = [_unit("region", "lv6", "lv=reshape, lv2=matmul, lv6=add", 26e-3),
               _unit("region", "lv17", "lv15=matmul, lv17=multiply", 16e-3),
               _unit("group", "lv2, lv30", "lv2=matmul, lv30=matmul share x", 30e-3),
               _unit("region", "lv40", "lv40=matmul, lv41=add", 9.0, measured=False)]
    calls = [_unit("call", "lv15", "", 20e-3), _unit("call", "lv50", "", 1e-3)]
    report = SimpleNamespace(decisions=calls, regions=regions)
    # the group (30 ms) first, then lv15 alone (20 ms: the region lv17 shares it), then
    # lv50; the region lv6 shares lv2 with the group; lv40 was estimated
    assert original_lower_bound(report) == 30e-3 + 20e-3 + 1e-3
    only_regions = SimpleNamespace(decisions=[], regions=regions[:2])
    assert original_lower_bound(only_regions) == 26e-3 + 16e-3
    why = hopeless_original(only_regions, 1e-3)
    assert why is not None and "its units decided by timing alone measured 42.000ms" in why


def test_an_original_whose_regions_alone_are_hopeless_is_not_built(monkeypatch):
    """The guard's build step of the original: a report whose only timed units are regions
    (BERT quick's shape) skips the build against a rewritten module 3x faster, and builds
    it when the regions' originals are not."""
    mod = sm.conv1x1()
    ex = tvm.compile(mod, target="llvm")
    _rewritten_takes(monkeypatch, 1e-3)
    built = []

    def original():
        built.append(1)
        return ex

    for region_s, skipped in ((3e-3, True), (2.9e-3, False)):
        report = SimpleNamespace(decisions=[], regions=[
            _unit("region", "lv6", "lv=reshape, lv2=matmul, lv6=add", region_s)])
        step = _unless_hopeless(original, mod, {"rewritten": lambda: ex}, report, "llvm")
        if skipped:
            with pytest.raises(PlanSkipped, match="3.000ms"):
                step()
            assert built == []
        else:
            assert step() is ex and built == [1]


def test_skipped_at_the_guards_own_factor_and_not_below():
    assert ORIGINAL_HOPELESS == HOPELESS
    report = _report(_dec("a", 2e-3), _dec("b", 1e-3))  # L = 3 ms
    why = hopeless_original(report, 1e-3)  # exactly HOPELESS x: skipped
    assert why is not None and "3.000ms" in why and "the rewritten plan's 1.000ms" in why
    assert "the library plan's" in hopeless_original(report, 1e-3, "library")
    assert hopeless_original(report, 1.01e-3) is None
    assert hopeless_original(report, None) is None and hopeless_original(report, 0.0) is None
    # only estimates: nothing measured bounds the original
    assert hopeless_original(_report(_dec("a", 1.0, measured=False)), 1e-6) is None


def test_fastest_call_on_a_fake_clock():
    ticks = iter([0.0, 5.0, 10.0, 12.0, 20.0, 21.0])
    calls = []
    best = fastest_call(lambda: calls.append(1), calls=3, clock=lambda: next(ticks))
    assert best == 1.0 and len(calls) == 4  # one untimed call, then three timed


def test_the_reference_falls_back_in_order():
    """Without the original the library plan is the reference the others must match."""
    import numpy as np
    from tvm import relax
    import tvm

    mod = sm.conv1x1()
    ex = tvm.compile(mod, target="llvm")
    args = sm.random_inputs(mod, seed=1)

    def skipped():
        from tvm_ollie.pipeline.guard import PlanSkipped
        raise PlanSkipped("hopeless")

    plans = [("rewritten", lambda: ex), ("library", lambda: ex), ("original", skipped)]
    _, winner, report = guard_plans(plans, [np.asarray(a) for a in args],
                                    reference=("original", "library"),
                                    timer=lambda runs: {n: 1e-3 for n in runs},
                                    prefer=("original", "rewritten", "library"))
    assert report.reference == "library" and winner == "rewritten"
    assert any("library" in n and "original did not run" in n for n in report.notes)
    assert next(p for p in report.plans if p.name == "original").dropped == \
        "skipped: hopeless"
    del relax


def _unit_timer(original_s, other_s):
    """A decision timer: the original on TVM ``original_s``, every alternative ``other_s``
    (``label``: ``<signature>|<alternative>``)."""
    return lambda _mod, label: original_s if label.endswith("|original") else other_s


def _plan_timer():
    def timer(runs):
        timer.seen.append(sorted(runs))
        return {name: 2e-3 if name == "original" else 1e-3 for name in runs}

    timer.seen = []
    return timer


def _rewritten_takes(monkeypatch, seconds):
    """The rewritten module's timing before the original's build (a fake: ``seconds``)."""
    build_mod = __import__("tvm_ollie.pipeline.build", fromlist=["fastest_call"])
    monkeypatch.setattr(build_mod, "fastest_call", lambda run: (run(), seconds)[1])


def test_a_hopeless_original_is_not_built(monkeypatch):
    """The decision timed TVM's build of the call at 10 ms, the rewritten module takes 1 ms:
    the original is neither built nor timed."""
    _rewritten_takes(monkeypatch, 1e-3)
    plans = _plan_timer()
    _, report = build(sm.conv1x1(), "llvm", timer=_unit_timer(1e-2, 1e-4),
                      plan_timer=plans, **OPTS)
    (d,) = report.decisions
    assert d.rewritten and d.measured and d.before_s == 1e-2
    guard = report.model_guard
    assert guard.winner == "rewritten" and plans.seen == []  # one plan: nothing to time
    original = next(p for p in guard.plans if p.name == "original")
    assert original.dropped.startswith("skipped: hopeless")
    assert "10.000ms" in original.dropped and "1.000ms" in original.dropped
    assert "rewritten (not timed: nothing else ran)" in guard.to_text()
    assert guard_line(report).startswith(
        "whole-model guard: kept rewritten (original skipped: hopeless:")


def test_an_original_that_could_win_is_built_and_timed(monkeypatch):
    """The decision timed the original at 2 ms, under 3x the rewritten module's 1 ms: the
    original is built and timed as before (and is the reference)."""
    _rewritten_takes(monkeypatch, 1e-3)
    plans = _plan_timer()
    _, report = build(sm.conv1x1(), "llvm", timer=_unit_timer(2e-3, 1e-4),
                      plan_timer=plans, **OPTS)
    (d,) = report.decisions
    assert d.rewritten and d.measured, d.reason
    assert plans.seen == [["original", "rewritten"]]
    assert report.model_guard.winner == "rewritten"
    assert report.model_guard.reference == "original"


def test_a_plan_built_before_the_original_is_built_once():
    from tvm_ollie.pipeline.build import _once

    calls = []
    build_once = _once(lambda: calls.append(1) or "ex")
    assert build_once() == "ex" and build_once() == "ex" and calls == [1]

    def broken():
        calls.append(2)
        raise RuntimeError("no build")

    failing = _once(broken)
    for _ in range(2):
        try:
            failing()
        except RuntimeError as err:
            assert str(err) == "no build"
    assert calls == [1, 2]


def test_the_leader_is_the_fastest_plan_that_runs(monkeypatch):
    """The original is judged against the fastest plan built before it (the guard retires a
    plan against its leader); a plan that does not build is passed over."""
    import tvm

    build_mod = __import__("tvm_ollie.pipeline.build", fromlist=["_fastest_plan"])
    mod = sm.conv1x1()
    ex = tvm.compile(mod, target="llvm")
    seconds = iter([3e-3, 1e-3])
    monkeypatch.setattr(build_mod, "fastest_call", lambda run: (run(), next(seconds))[1])

    def broken():
        raise RuntimeError("no build")

    leader = build_mod._fastest_plan(mod, {"rewritten": lambda: ex, "broken": broken,
                                           "library": lambda: ex})
    assert leader == (1e-3, "library")


def test_a_verdict_without_the_original_is_read_back_only_when_it_was_skipped(tmp_path):
    """Warm builds: a verdict recorded with the original skipped (:mod:`.hopeless`) is read
    back (the kept plan alone built); one that merely lacks the original's timing is not."""
    from tvm_ollie.config import OllieConfig
    from tvm_ollie.pipeline.build import RecordedVerdict
    from tvm_ollie.transform.measuring import DecisionRecords

    class Shared(dict):
        def put(self, key, entry):
            self[key] = entry

    mods = {"original": sm.conv1x1(), "rewritten": sm.conv3x3(), "library": sm.conv3x3()}
    cfg = OllieConfig(target="llvm")
    for skipped, read_back in (("hopeless: ...", True), (None, False)):
        shared = Shared()
        verdict = RecordedVerdict(DecisionRecords(str(tmp_path), shared), mods, cfg,
                                  timer=lambda runs: {n: 1e-3 if n == "library" else 2e-3
                                                      for n in runs},
                                  load=lambda: 0.1)
        verdict.skipped = skipped
        res = verdict({"rewritten": None, "library": None})
        assert res.winner == "library"
        again = RecordedVerdict(DecisionRecords(None, shared), mods, cfg, load=lambda: 0.1)
        known = again.known()
        assert (known is not None and known.winner == "library") == read_back


def test_a_hopeless_verdict_with_nothing_timed_is_kept_for_the_next_build(monkeypatch,
                                                                            tmp_path):
    """The original skipped and no library plan: one plan ran and nothing was timed. The
    verdict is still kept, so the next build neither builds the original nor asks again
    whether it is hopeless (there, in a loaded moment, the rewritten module's calls took 5 ms
    and the original would have been built and timed)."""
    _rewritten_takes(monkeypatch, 1e-3)
    mod = sm.conv1x1()
    _, report = build(mod, "llvm", timer=_unit_timer(1e-2, 1e-4), plan_timer=_plan_timer(),
                      work_dir=str(tmp_path), **OPTS)
    assert report.model_guard.winner == "rewritten"
    _rewritten_takes(monkeypatch, 5e-3)
    build_mod = __import__("tvm_ollie.pipeline.build", fromlist=["guard_plans"])
    built = []
    real = build_mod._compile_final  # pylint: disable=protected-access
    monkeypatch.setattr(build_mod, "_compile_final", lambda module, *args: (
        built.append("original" if module is mod else "rewritten"), real(module, *args))[1])

    def refused(*_args, **_kwargs):
        raise AssertionError("the guard built its plans again")

    monkeypatch.setattr(build_mod, "guard_plans", refused)
    plans = _plan_timer()
    _, again = build(mod, "llvm", timer=_unit_timer(1e-2, 1e-4), plan_timer=plans,
                     work_dir=str(tmp_path), **OPTS)
    assert built == ["rewritten"] and plans.seen == []
    assert again.model_guard.winner == "rewritten"
    assert any("read back" in n for n in again.model_guard.notes)
