"""Each stage of the decision core alone (candidates, cost, check, choose), and the Decider
with every stage replaced by a fake."""

import json
import logging
import os

import pytest
from tvm import relax

import small_models as sm
from tvm_ollie.transform import decide as decide_mod
from tvm_ollie.transform.alternatives import Alternative, Candidates
from tvm_ollie.transform.checking import Checker, check_numerics, checked
from tvm_ollie.transform.choosing import (MARGIN, NATIVE_MARGIN, choose_analytic,
                                          choose_forced, choose_measured, kind_leaders,
                                          shortlist)
from tvm_ollie.transform.costing import (AnalyticUnitCost, CallableTiming, MeasureCache,
                                         UnitCostModel, UntunedTiming)
from tvm_ollie.transform.decide import Decider
from tvm_ollie.transform.emit import EmitError
from tvm_ollie.transform.twins import twins
from tvm_ollie.transform.units import call_signature, isolated_module
from tvm_ollie.tune import analytic
from tvm_ollie.tune.calibrate import Calibration

logging.getLogger("tvm_ollie.derive").setLevel(logging.CRITICAL)

BASE = Alternative(None, "tvm")


def _call(mod):
    return mod["main"].body.blocks[0].bindings[0].value


@pytest.fixture(scope="module", name="conv")
def _conv():
    """A conv2d 3x3 call and its alternatives (derived once for the module's tests)."""
    call = _call(sm.conv3x3())
    found = Candidates(library=False, derive=True, max_depth=2)(call, 2.0)
    return call, found


def _kinds(alt):
    return [s.kind for s in alt.program.stages if s.is_operator] if alt.program else []


class FakeCost(UnitCostModel):
    """Seconds by label (``default`` for the others); records what it was asked."""

    name = "fake"

    def __init__(self, times, default=5e-3):
        self.times, self.default, self.asked = dict(times), default, []

    def seconds(self, unit, alt):
        self.asked.append(alt.label)
        return self.times.get(alt.label, self.default)


class RejectOne(Checker):
    """Accepts everything but one label."""

    def __init__(self, label):
        super().__init__()
        self.label, self.asked = label, []

    def check(self, unit, alt):
        self.asked.append(alt.label)
        return (False, "rejected by the fake") if alt.label == self.label else (True, "")


# -- candidates ---------------------------------------------------------------------------


def test_candidates_baseline_first_then_derived_programs(conv):
    _, found = conv
    alts = found.alternatives
    assert alts[0].is_baseline and found.liftable and found.candidates >= 1
    assert all(a.program is not None and a.impl == "tvm" for a in alts[1:])
    assert len({a.label for a in alts}) == len(alts)
    assert "search stop=" in found.note
    assert any(_kinds(a) == ["matmul"] for a in alts)  # conv3x3 -> matmul + offset-add


def test_candidates_without_derivation_or_library():
    call = _call(sm.conv3x3())
    found = Candidates(library=False, derive=False, max_depth=2)(call, 1.0)
    assert [a.label for a in found.alternatives] == ["original"] and found.candidates == 0
    found = Candidates(library=True, derive=False, max_depth=2)(call, 1.0)
    assert [a.label for a in found.alternatives] == ["original", "original [native]"]


# -- cost ---------------------------------------------------------------------------------


def test_analytic_cost_is_the_calibrated_roofline(conv):
    call, found = conv
    cost = AnalyticUnitCost(sm.LLVM_CALIB)
    prog = next(a for a in found.alternatives if _kinds(a) == ["matmul"])
    assert cost.seconds(call, prog) == analytic.program_seconds(prog.program, sm.LLVM_CALIB)
    base = cost.seconds(call, BASE)
    assert base > 0 and not cost.measured
    # with the GPU efficiency table a GEMM beats a direct convolution
    assert cost.seconds(call, prog) < base
    # the original on the library at the library's calibrated efficiency
    fast_library = Calibration("llvm", sm.LLVM_CALIB.peak_flops, sm.LLVM_CALIB.bandwidth,
                               dict(sm.LLVM_CALIB.efficiency, native_conv2d=0.9), "given")
    native = AnalyticUnitCost(fast_library).seconds(call, Alternative(None, "native"))
    assert cost.seconds(call, Alternative(None, "native")) == base > native


def test_callable_timing_labels_and_failures():
    call = _call(sm.conv1x1())
    seen = []
    cost = CallableTiming(lambda mod, label: seen.append(label) or 2e-3)
    assert cost.seconds(call, BASE) == 2e-3
    assert seen == [f"{call_signature(call)}|original"]

    def boom(mod, label):
        raise RuntimeError("injected")

    assert CallableTiming(boom).seconds(call, BASE) is None
    conv1d = relax.op.nn.conv1d(relax.Var("x", relax.TensorType((1, 2, 8), "float32")),
                                relax.Var("w", relax.TensorType((3, 2, 3), "float32")))
    conv1d = relax.BlockBuilder().normalize(conv1d)
    # no native kernel for a conv1d: no module to time
    assert cost.seconds(conv1d, Alternative(None, "native")) is None
    assert len(seen) == 1


def test_untuned_timing_times_once_and_caches_in_work_dir(tmp_path):
    call = _call(sm.conv1x1())
    timing = UntunedTiming("llvm", str(tmp_path))
    mod = isolated_module(call)
    first = timing.measure(mod, "sig|original")
    assert first is not None and first > 0
    path = os.path.join(str(tmp_path), MeasureCache.FILE)
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    assert list(data.values()) == [first]
    # another model on the same work dir reads the cache instead of timing again
    with open(path, "w", encoding="utf-8") as f:
        json.dump({k: 123.0 for k in data}, f)
    assert UntunedTiming("llvm", str(tmp_path)).measure(mod, "sig|original") == 123.0
    assert UntunedTiming("llvm", str(tmp_path)).measure(mod, "other|original") != 123.0


# -- check --------------------------------------------------------------------------------


def test_checker_accepts_a_derived_program_and_rejects_a_wrong_comparison(conv):
    call, found = conv
    prog = next(a for a in found.alternatives if _kinds(a) == ["matmul"])
    assert Checker().check(call, prog) == (True, "")
    calls = []

    def differs(ref, cand):
        calls.append((ref, cand))
        return False, "differs by the fake"

    assert Checker(differs).check(call, prog) == (False, "differs by the fake")
    assert len(calls) == 1 and check_numerics(*calls[0]) == (True, "")


def test_checked_turns_failures_into_rejections(conv):
    call, found = conv

    class Raising(Checker):
        def __init__(self, error):
            super().__init__()
            self.error = error

        def check(self, unit, alt):
            raise self.error

    ok, why = checked(Raising(RuntimeError("boom\nmore")), call, found.alternatives[1])
    assert not ok and why == "RuntimeError: boom"
    ok, why = checked(Raising(EmitError("no stage form")), call, found.alternatives[1])
    assert not ok and why == "no Relax form: no stage form"


# -- choose -------------------------------------------------------------------------------


def _costed(found, cost):
    import dataclasses  # pylint: disable=import-outside-toplevel

    call_alts = [dataclasses.replace(a, estimate=cost(a)) for a in found.alternatives]
    return call_alts[0], sorted(call_alts[1:], key=lambda a: (a.estimate, a.label))


def test_shortlist_margin_depends_on_measuring(conv):
    _, found = conv
    base, others = _costed(found, lambda a: 1.0 if a.program is None else 1.0 - MARGIN / 2)
    # within the margin: worth measuring, not enough to choose by the estimate
    assert shortlist(base, others, region=False, measures=True) == others
    assert shortlist(base, others, region=False, measures=False) == []
    base, others = _costed(found, lambda a: 1.0 if a.program is None else 2.0)
    assert shortlist(base, others, region=False, measures=True) == []
    # a region measures the cheapest of every operator kind whatever its estimate
    leaders = kind_leaders(others)
    assert leaders and shortlist(base, others, region=True, measures=True) == leaders


def test_choose_measured_takes_the_fastest_beyond_the_margin(conv):
    _, found = conv
    base, others = _costed(found, lambda a: 1.0 if a.program is None else 0.5)
    times = {"original": 1.0, others[0].label: 0.6, others[1].label: 0.4}

    def measure(alt):
        return times.get(alt.label, 0.9)

    def accept(alt):
        return True, ""

    choice = choose_measured(base, others, ["x", "w"], 5, accept, measure, 3, "measured")
    assert choice.label == others[1].label and choice.measured
    assert (choice.before_s, choice.after_s) == (1.0, 0.4)
    assert choice.reason.startswith("measured: original 1000.00ms")
    times = {"original": 1.0}
    choice = choose_measured(base, others, [], 5, accept,
                             lambda a: times.get(a.label, 1.0 - MARGIN / 2), 3, "measured")
    assert not choice.rewritten
    choice = choose_measured(base, others, [], 5, accept, lambda a: None, 3, "measured")
    assert not choice.rewritten and choice.reason == "the original operator failed to build or run"


def test_choose_measured_keeps_the_native_kernel_within_its_margin(conv):
    _, found = conv
    base, others = _costed(found, lambda a: 1.0 if a.program is None else 0.5)
    native = Alternative(None, "native", 0.5)
    derived = others[0]

    def accept(alt):
        return True, ""

    for t_derived, winner in ((0.5 * (1 - NATIVE_MARGIN / 2), native.label),
                              (0.5 * (1 - 2 * NATIVE_MARGIN), derived.label)):
        times = {"original": 1.0, native.label: 0.5, derived.label: t_derived}
        choice = choose_measured(base, [native, derived], [], 5, accept,
                                 lambda a, times=times: times[a.label], 3, "measured")
        assert choice.label == winner


def test_choose_analytic_skips_what_does_not_hold_up(conv):
    _, found = conv
    base, others = _costed(found, lambda a: 1.0 if a.program is None else 0.5)
    rejected = others[0].label

    def check(alt):
        return (False, "no") if alt.label == rejected else (True, "")

    choice = choose_analytic(base, others, [], 5, check)
    assert choice.label == others[1].label and not choice.measured
    choice = choose_analytic(base, others, [], 5, lambda alt: (False, "no"))
    assert not choice.rewritten and choice.reason.startswith("no cheaper candidate held up: ")
    assert choose_forced(base, BASE, [], 5, check).reason == "forced: original"
    assert "rejected: no" in choose_forced(base, others[0], [], 5, check).reason


# -- the Decider with fakes ---------------------------------------------------------------


def test_decider_with_a_fake_cost_model_and_checker(conv):
    call, found = conv
    prog = next(a for a in found.alternatives if _kinds(a) == ["matmul"])
    cost = FakeCost({"original": 10e-3, prog.label: 1e-3}, 8e-3)
    checker = RejectOne("")
    decider = Decider("llvm", calibration=sm.LLVM_CALIB, library=False, max_depth=2,
                      max_measured=len(found.alternatives), cost_model=cost, checker=checker)
    decider.candidates = lambda unit, budget_s: found  # (the fixture's programs)
    # the fastest: a shortlisted program other than ``prog`` and not the original's twin
    # (never checked, .twins)
    base, *others = decider.estimated(call, found)
    copies = twins(Decider.unit_modules(call, found.alternatives))
    fastest = next(a for a in sorted(others, key=lambda a: (a.estimate, a.label))
                   if a.program is not None and a.label not in (prog.label, *copies)
                   and a.estimate < base.estimate * (1 + MARGIN))
    cost.times[fastest.label], checker.label = 0.5e-3, fastest.label
    choice = decider.decide(call, 2.0)
    assert choice.label == prog.label and choice.measured, choice.reason
    assert f"{fastest.label}: rejected by the fake" in choice.reason
    assert choice.reason.startswith("untuned, measured: original 10.00ms")
    assert fastest.label not in cost.asked  # rejected alternatives are never timed
    # decided once per signature
    asked = len(cost.asked)
    assert decider.decide(call, 2.0) is choice and len(cost.asked) == asked


def test_decider_analytic_cost_model_decides_by_estimate(conv):
    call, _ = conv
    decider = Decider("llvm", calibration=sm.LLVM_CALIB, library=False, max_depth=2,
                      cost_model=AnalyticUnitCost(sm.LLVM_CALIB))
    assert not decider.measures and decider.cost_model is None
    choice = decider.decide(call, 2.0)
    assert choice.rewritten and choice.reason.startswith("analytic "), choice.reason
    with pytest.raises(ValueError, match="not both"):
        Decider("llvm", calibration=sm.LLVM_CALIB, timer=lambda m, l: 1.0,
                cost_model=FakeCost({}))


def test_decide_module_keeps_its_exports():
    for name in decide_mod.__all__:
        assert hasattr(decide_mod, name), name
    assert isinstance(Decider("llvm", calibration=sm.LLVM_CALIB, checker=lambda r, c: (True, ""),
                              check_untuned=False).checker, decide_mod.Checker)
