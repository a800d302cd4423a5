"""Less work per cold compile: units too small to matter are skipped, a decision's modules are
built once together (checked and timed from that one build), the search shares go to the
units decided."""

import logging
import math

import numpy as np
import pytest
from tvm import relax

import small_models as sm
from tvm_ollie.codegen.builder import single_function_module as _module
from tvm_ollie.codegen.builder import tensor_var as _var
from tvm_ollie import native
from tvm_ollie.compat import tvm
from tvm_ollie.config import ConfigError, OllieConfig
from tvm_ollie.derive.cost import least_work
from tvm_ollie.lift import lift_relax_call
from tvm_ollie.transform import batched
from tvm_ollie.transform import checking
from tvm_ollie.transform.alternatives import (MEASURED_SEED_FLOPS, Alternative, Candidates,
                                            measured_original)
from tvm_ollie.transform.batched import UnitBuild, merged_module
from tvm_ollie.transform.checking import Checker
from tvm_ollie.transform.costing import CallableTiming, UntunedTiming
from tvm_ollie.transform.decide import Decider
from tvm_ollie.transform.optimize import _SearchShare, optimize_module
from tvm_ollie.transform.units import unit_module
from tvm_ollie.tune.budget import MIN_SHARE, PAYBACK_RUNS, SearchPayback, SmallUnitGuard
from tvm_ollie.tune.library_timing import library_seconds
from tvm_ollie.tune.measure import compile_module, random_args

logging.getLogger("tvm_ollie.derive").setLevel(logging.CRITICAL)

BASE = Alternative(None, "tvm")


def _call(mod):
    return mod["main"].body.blocks[0].bindings[0].value


@pytest.fixture(scope="module", name="conv")
def _conv():
    """A conv2d 3x3 call and a few of its alternatives (derived once for the module)."""
    call = _call(sm.conv3x3())
    found = Candidates(library=False, derive=True, max_depth=2)(call, 2.0)
    return call, found.alternatives[:4]


def _outputs(ex, name, args):
    vm = relax.VirtualMachine(ex, tvm.cpu())
    return vm[name](*[tvm.runtime.tensor(a) for a in args]).numpy()


# -- the guard ----------------------------------------------------------------------------


def test_guard_skips_below_the_share_and_never_an_unknown_signature():
    guard = SmallUnitGuard({"big": 98e-6, "small": 0.9e-6, "edge": 1.5e-6}, 100e-6)
    assert guard.skip("big") is None and guard.skip("edge") is None  # 1.5 %: decided
    why = guard.skip("small")
    assert why.startswith("skipped: too small to matter") and "0.90%" in why
    assert guard.skip("group") is None  # no weight: decided
    assert guard.kept(["big", "small", "group", "edge"]) == ["big", "group", "edge"]
    assert SmallUnitGuard({"a": 1e-9}, 0.0).skip("a") is None  # no estimate: decided
    assert SmallUnitGuard({"small": 0.9e-6}, 100e-6, 0.0).skip("small") is None
    assert MIN_SHARE == OllieConfig().min_share


def test_min_share_is_validated():
    for bad in (-0.1, 1.0, True, "1%"):
        with pytest.raises(ConfigError, match="min_share"):
            OllieConfig(min_share=bad)


def test_search_share_goes_to_the_decided_units_on_a_fake_clock():
    """A skipped signature holds no floor of the module's search time: the decided ones share
    all of it (each search spends its share on the fake clock)."""
    weights = {"big": 9e-3, "mid": 1e-3, "tiny": 1e-6}
    guard = SmallUnitGuard(weights, sum(weights.values()))
    share = _SearchShare(10.0, {s: weights[s] for s in guard.kept(weights)}, floor_s=2.0)
    clock, out = 0.0, {}
    for sig in ("mid", "big"):
        out[sig] = share.next(sig, clock)
        clock += out[sig]
    assert out["mid"] == pytest.approx(2.0 + 6.0 * 0.1)
    assert out["big"] == pytest.approx(10.0 - out["mid"]) and clock == pytest.approx(10.0)
    with_tiny = _SearchShare(10.0, weights, floor_s=2.0)
    assert with_tiny.next("mid", 0.0) < out["mid"]  # the tiny one's floor held back


def test_payback_bounds_the_module_search_by_what_it_could_gain():
    small = SearchPayback({"a": 50e-6, "b": 30e-6}, runs=1e4, least_s=2.0)
    assert small.gain_s == pytest.approx(80e-6)
    assert small.total(20.0) == pytest.approx(2.8)  # the floors, and 0.8 s that pays back
    assert small.note(20.0).startswith("search time 2.80s of 20s") and "80.0us" in small.note(20)
    mid = SearchPayback({"a": 400e-6, "b": 100e-6, "region": 0.0}, runs=1e4)
    assert mid.total(20.0) == pytest.approx(7.0) and mid.total(3.0) == 3.0
    assert mid.note(3.0) is None  # not binding
    assert SearchPayback({"a": 5e-3}).total(20.0) == 20.0  # 50 s would pay: the cap
    assert SearchPayback({"a": -1e-3}, least_s=0.5).total(20.0) == 0.5  # no gain: the least
    assert SearchPayback({"a": 1e-9}, runs=math.inf).total(20.0) == 20.0
    assert PAYBACK_RUNS == OllieConfig().search_payback_runs


def test_search_payback_runs_is_validated():
    for bad in (0, -1.0, True, "1e4"):
        with pytest.raises(ConfigError, match="search_payback_runs"):
            OllieConfig(search_payback_runs=bad)
    assert OllieConfig(search_payback_runs=math.inf).search_payback_runs == math.inf


def _big_and_tiny():
    """A 3x3 convolution of 64 channels, then a tiny 1x1 one (well under 1 % of it)."""

    def body(bb, x, w1, w2):
        y = bb.emit(relax.op.nn.conv2d(x, w1, padding=1))
        return relax.op.nn.conv2d(bb.emit(relax.op.nn.relu(y)), w2, strides=16)

    return _module([_var("x", (1, 64, 16, 16)), _var("w1", (64, 64, 3, 3)),
                    _var("w2", (1, 64, 1, 1))], body)


def test_the_pass_skips_a_unit_too_small_to_matter():
    opts = dict(library=False, max_depth=1, search_time_s=2.0, calibration=sm.LLVM_CALIB,
                derivation_cache=False, check_untuned=False)
    _, report = optimize_module(_big_and_tiny(), "llvm", **opts)
    by_op = {d.signature.split()[0]: d for d in report.decisions}
    assert len(report.decisions) == 2
    tiny = [d for d in report.decisions if "1x64x1x1" in d.signature][0]
    big = [d for d in report.decisions if "64x64x3x3" in d.signature][0]
    assert tiny.reason.startswith("skipped: too small to matter"), tiny.reason
    assert tiny.chosen == "original" and tiny.candidates == 0
    assert not big.reason.startswith("skipped"), by_op
    assert report.derivations["searched"] == 1
    _, every = optimize_module(_big_and_tiny(), "llvm", min_share=0.0, **opts)
    assert not any(d.reason.startswith("skipped") for d in every.decisions)
    assert every.derivations["searched"] == 2


# -- the merged build ---------------------------------------------------------------------


def test_merged_module_computes_what_each_module_computes(conv):
    call, alts = conv
    mods = [unit_module(call, a.program, None, a.impl) for a in alts]
    merged, mains = merged_module(mods)
    assert mains == [f"m{k}_main" for k in range(len(mods))]
    ex = compile_module(merged, "llvm")
    args = random_args(mods[0]["main"], seed=3)
    for mod, name in zip(mods, mains):
        alone = _outputs(compile_module(mod, "llvm"), "main", args)
        np.testing.assert_array_equal(_outputs(ex, name, args), alone)


def test_checker_gives_the_same_verdicts_from_one_build(conv, monkeypatch):
    call, alts = conv
    build = UnitBuild({a.label: unit_module(call, a.program, None, a.impl) for a in alts},
                      "llvm")
    alone = [Checker().check(call, a) for a in alts[1:]]
    runs = []
    monkeypatch.setattr(checking, "_run_llvm", lambda *a: runs.append(a) or (_ for _ in ()).throw(
        AssertionError("built alone")))
    shared = [Checker().check(call, a, build) for a in alts[1:]]
    assert shared == alone and all(ok for ok, _ in shared) and not runs
    assert build.builds == 1 and len(build.memo) == 1  # the reference ran once


def test_a_wrong_alternative_fails_from_the_merged_build_too(conv):
    call, alts = conv
    wrong = _module([_var("x", (1, 8, 8, 8)), _var("w", (16, 8, 3, 3))],
                    lambda bb, x, w: relax.op.nn.relu(relax.op.nn.conv2d(x, w, padding=1)))
    build = UnitBuild({"original": unit_module(call), alts[1].label: wrong}, "llvm")
    ok, why = Checker().check(call, alts[1], build)
    assert not ok and why.startswith("numerics differ")


def test_a_failed_merged_build_falls_back_to_one_build_each(conv, monkeypatch):
    call, alts = conv

    def broken(mod, target):
        raise RuntimeError("injected")

    monkeypatch.setattr(batched, "compile_module", broken)
    build = UnitBuild({a.label: unit_module(call, a.program, None, a.impl) for a in alts},
                      "llvm")
    assert Checker().check(call, alts[1], build) == (True, "")
    assert build.failed and build.function(alts[1].label) is None
    timing = UntunedTiming("llvm")
    timing.use_build(call, build)
    sample = timing.sampler(call, alts[1])  # built alone
    assert sample is not None and sample() > 0


def test_untuned_timing_samples_from_the_merged_build(conv, monkeypatch):
    call, alts = conv
    build = UnitBuild({a.label: unit_module(call, a.program, None, a.impl) for a in alts},
                      "llvm")
    timing = UntunedTiming("llvm")
    assert timing.shares_builds and not CallableTiming(lambda m, l: 1.0).shares_builds
    timing.use_build(call, build)
    monkeypatch.setattr(timing, "compile", lambda *a: (_ for _ in ()).throw(
        AssertionError("built alone")))
    samples = [timing.sampler(call, a)() for a in alts]
    assert all(s > 0 for s in samples) and build.builds == 1
    timing.use_build(None, None)
    assert timing.build_of(call) is None


def test_a_decision_builds_its_modules_once(monkeypatch):
    """The untuned decision of a convolution: one TVM build for the checks and the timings
    of all its alternatives, none built alone."""
    builds = []
    real = batched.compile_module
    monkeypatch.setattr(batched, "compile_module",
                        lambda mod, target: builds.append(mod) or real(mod, target))
    monkeypatch.setattr(checking, "_run_llvm", lambda *a: (_ for _ in ()).throw(
        AssertionError("built alone")))
    monkeypatch.setattr(UntunedTiming, "sample", lambda *a: (_ for _ in ()).throw(
        AssertionError("built alone")))
    decider = Decider("llvm", calibration=sm.LLVM_CALIB, library=False, max_depth=2,
                      check_untuned=True, derivation_cache=False, max_measured=2)
    choice = decider.decide(_call(sm.conv3x3()), 2.0)
    assert choice.measured, choice.reason
    assert len(builds) == 1
    assert len([f for f in builds[0].functions if f.name_hint.endswith("_main")]) == 3


def test_the_pass_shares_the_paid_back_search_time(monkeypatch):
    """The pass hands its signatures the payback's total, not ``search_time_s`` (each search
    spends its budget on a fake clock)."""
    budgets = []

    def fake_search(self, expr, budget_s, constants=frozenset(), known_s=None, gain_cap=None,
                    measured_s=None):
        budgets.append(budget_s)
        self.search_s += budget_s
        self.searched += 1
        return [], ", search stop=time_budget"

    monkeypatch.setattr(Candidates, "search", fake_search)
    opts = dict(library=False, max_depth=1, search_time_s=20.0, calibration=sm.LLVM_CALIB,
                derivation_cache=False, check_untuned=False, min_share=0.0)
    _, report = optimize_module(_big_and_tiny(), "llvm", search_payback_runs=1.0, **opts)
    # two signatures: each its floor (MIN_SEARCH_S), whatever little they could gain
    assert len(budgets) == 2 and sum(budgets) == pytest.approx(4.0, rel=1e-3)
    assert budgets[0] >= 2.0 and report.search_note.startswith("search time 4.00s of 20s")
    budgets.clear()
    _, report = optimize_module(_big_and_tiny(), "llvm", search_payback_runs=math.inf, **opts)
    assert sum(budgets) == pytest.approx(20.0) and report.search_note == ""


def test_the_original_seeds_a_measured_search_only_when_it_is_large():
    cands = Candidates(library=False, derive=True, max_depth=1, calibration=sm.LLVM_CALIB,
                       margin=0.03)
    # by the estimate: its margin, the original's estimate whatever its size
    assert cands._margin(50e-6, 1.0) == (0.03, 50e-6) and cands._margin(None, 1e9)[1] is None
    cands.measured_margin = 0.15
    assert cands._margin(5e-3, MEASURED_SEED_FLOPS / 2) == (0.03, None)  # small: as before
    assert cands._margin(5e-6, MEASURED_SEED_FLOPS) == (0.15, 5e-6)
    call = _call(sm.conv3x3())
    expr = lift_relax_call(call)
    known = cands.original_seconds(call, expr)
    big = least_work(expr)[0] >= MEASURED_SEED_FLOPS
    bound = cands.bound(expr, frozenset(), known)
    assert bound.known_s == (known if big else None) and bound.margin == (0.15 if big else 0.03)


def test_the_bound_carries_the_payback_runs_of_the_config():
    """The decider's searches stop when what is left to gain cannot repay them over
    ``search_payback_runs`` (``CostBound.paid_back``); ``math.inf`` turns that off."""
    expr = lift_relax_call(_call(sm.conv3x3()))
    for runs, expect in ((1e5, 1e5), (math.inf, None)):
        decider = Decider("llvm", calibration=sm.LLVM_CALIB, library=False, max_depth=1,
                          derivation_cache=False, search_payback_runs=runs)
        assert decider.candidates.bound(expr).payback_runs == expect
    assert Candidates(False, True, 1).payback_runs is None


def test_a_search_gains_at_most_the_original_on_its_library_kernel():
    """With the library, a unit's search is bounded by its original timed on the library
    kernel (``library_timer``, measured once, at the first state the estimates do not stop): a
    kernel measured at no time is below the bound of every program (``near_measured``) and
    leaves nothing to repay, and the search stops after its first state; without the timer,
    the estimated gain over 10^12 runs never stops it."""
    if not native.load():
        pytest.skip("native library unavailable")
    call, timed = _call(sm.conv3x3()), []

    def timer(unit):
        timed.append(unit)
        return 0.0

    opts = dict(calibration=sm.LLVM_CALIB, margin=0.03, payback_runs=1e12)
    capped = Candidates(True, True, 2, library_timer=timer, **opts)
    found = capped(call, 30.0)
    assert "stop=near_measured" in found.note and timed == [call]
    plain = Candidates(True, True, 2, **opts)(call, 30.0)
    assert "paid_back" not in plain.note and found.candidates < plain.candidates
    # no payback, or no library form: never timed
    Candidates(True, True, 1, library_timer=timer, calibration=sm.LLVM_CALIB,
               margin=0.03)(call, 30.0)
    Candidates(False, True, 1, library_timer=timer, **opts)(call, 30.0)
    assert timed == [call]


def test_the_decider_times_the_library_kernels_on_a_cpu_with_the_library():
    for library, expect in ((True, library_seconds), (False, None)):
        if library and not native.load():
            continue
        decider = Decider("llvm", calibration=sm.LLVM_CALIB, library=library, max_depth=1,
                          derivation_cache=False)
        assert decider.candidates.library_timer is expect


def test_a_forced_choice_is_checked_from_one_build(monkeypatch):
    """The library plan's decisions (a chooser forcing one alternative): its check runs the
    original and the forced alternative from one merged build, not two builds alone; a
    forced original builds nothing."""
    builds = []
    real = batched.compile_module
    monkeypatch.setattr(batched, "compile_module",
                        lambda mod, target: builds.append(mod) or real(mod, target))
    monkeypatch.setattr(checking, "_run_llvm", lambda *a: (_ for _ in ()).throw(
        AssertionError("built alone")))
    forced = Decider("llvm", calibration=sm.LLVM_CALIB, library=False, max_depth=2,
                     derivation_cache=False, chooser=lambda sig, others: others[0])
    choice = forced.decide(_call(sm.conv3x3()), 2.0)
    assert choice.rewritten and choice.reason == "forced by the chooser"
    assert len(builds) == 1
    assert len([f for f in builds[0].functions if f.name_hint.endswith("_main")]) == 2
    kept = Decider("llvm", calibration=sm.LLVM_CALIB, library=False, max_depth=2,
                   derivation_cache=False, chooser=lambda sig, others: BASE)
    assert not kept.decide(_call(sm.conv3x3()), 2.0).rewritten and len(builds) == 1


def test_a_forced_choice_that_computes_something_else_is_rejected(monkeypatch):
    """The merged build checks as strictly as the builds alone: a forced alternative whose
    module computes another function is rejected and the original kept."""
    call = _call(sm.conv3x3())
    wrong = _module([_var("x", (1, 8, 8, 8)), _var("w", (16, 8, 3, 3))],
                    lambda bb, x, w: relax.op.nn.relu(relax.op.nn.conv2d(x, w, padding=1)))
    decide_mod = __import__("tvm_ollie.transform.decide", fromlist=["unit_module"])
    real = decide_mod.unit_module
    monkeypatch.setattr(decide_mod, "unit_module",
                        lambda unit, program=None, *a: real(unit, program, *a)
                        if program is None else wrong)
    forced = Decider("llvm", calibration=sm.LLVM_CALIB, library=False, max_depth=2,
                     derivation_cache=False, chooser=lambda sig, others: others[0])
    choice = forced.decide(call, 2.0)
    assert not choice.rewritten and "rejected: numerics differ" in choice.reason


# -- programs far behind the library kernel -------------------------------------------------

def _alts(**estimates):
    """Alternatives by name -> estimate: ``native`` the original on its library kernel, the
    others derived programs (a stand-in program per name)."""
    from types import SimpleNamespace
    out = []
    for name, est in estimates.items():
        if name == "native":
            out.append(Alternative(None, "native", est))
        else:
            out.append(Alternative(SimpleNamespace(name=name), "tvm", est))
    return out


def test_far_behind_leaves_out_programs_a_hundred_times_the_library_kernel():
    from tvm_ollie.transform.choosing import FAR_BEHIND, far_behind
    assert FAR_BEHIND == 100.0
    alts = _alts(native=1e-4, near=9.9e-3, edge=1e-2, far=1.18)
    assert [a.estimate for a in far_behind(alts)] == [1e-2, 1.18]  # at or above 100x
    assert far_behind(_alts(native=1e-4, gemm=1.9e-3)) == []  # 19x: kept (the calibration)
    assert far_behind(_alts(near=1.0, far=100.0)) == []  # no library form: nothing left out
    assert far_behind([]) == []


def test_a_measured_decision_never_builds_a_program_far_behind(monkeypatch):
    """The untuned decision of a convolution whose library kernel is estimated 1000x cheaper
    than every derived program: the programs are neither checked, built nor timed (the merged
    build holds the original and its library kernel); with the library kernel estimated as
    slow as the programs they are kept."""
    if not native.load():
        pytest.skip("the native library is not built here")
    builds = []
    real = batched.compile_module
    monkeypatch.setattr(batched, "compile_module",
                        lambda mod, target: builds.append(mod) or real(mod, target))

    class Estimates:
        measured = False

        def __init__(self, native_s):
            self.native_s = native_s

        def seconds(self, unit, alt):
            if alt.program is None:
                return 1.0 if alt.impl == "tvm" else self.native_s
            # (the depth-0 programs, the original's twins, last: never built, .twins)
            return 0.5 if alt.label.startswith("conv2d[") else 1e-2

    for native_s, programs in ((1e-5, 0), (1e-2, 1)):
        builds.clear()
        decider = Decider("llvm", calibration=sm.LLVM_CALIB, max_depth=2, check_untuned=True,
                          derivation_cache=False, max_measured=1,
                          estimator=Estimates(native_s))
        choice = decider.decide(_call(sm.conv3x3()), 2.0)
        assert choice.measured, choice.reason
        (mod,) = builds
        mains = [f for f in mod.functions if f.name_hint.endswith("_main")]
        assert len(mains) == 2 + programs  # the original, its library kernel, the programs


def test_the_measured_original_is_put_on_the_bounds_scale(monkeypatch):
    """``measured_original``: the one-thread seconds of the library kernel over the kernels'
    threads (the roof's scale; by default ``TVM_NUM_THREADS``'s); None without a cap or a
    time."""
    timed = []

    def cap():
        timed.append(1)
        return 8e-4

    measured = measured_original(cap, threads=2)
    assert measured() == pytest.approx(4e-4) and measured() == pytest.approx(4e-4)
    assert len(timed) == 2  # (the cap itself keeps its first timing: Candidates.measured_cap)
    assert measured_original(None) is None
    assert measured_original(lambda: None, threads=2)() is None
    assert measured_original(cap, threads=1)() == pytest.approx(8e-4)
    monkeypatch.setenv("TVM_NUM_THREADS", "4")
    assert measured_original(cap)() == pytest.approx(2e-4)


def test_a_unit_with_a_library_form_bounds_its_search_by_the_measured_original(monkeypatch):
    """The candidates stage hands the search's bound the original's measured seconds over
    the kernels' threads, from the same timing as the payback's cap (one timer call)."""
    if not native.load():
        pytest.skip("native library unavailable")
    call, timed, bounds = _call(sm.conv3x3()), [], []
    monkeypatch.setenv("TVM_NUM_THREADS", "2")

    def timer(unit):
        timed.append(unit)
        return 6e-4

    cands = Candidates(True, True, 1, library_timer=timer, calibration=sm.LLVM_CALIB,
                       margin=0.03, payback_runs=1e5)
    real_bound = cands.bound

    def spy(*args):
        bounds.append(real_bound(*args))
        return bounds[-1]

    monkeypatch.setattr(cands, "bound", spy)
    cands(call, 30.0)
    (bound,) = bounds
    assert bound.measured_s() == pytest.approx(3e-4) and bound.gain_cap() == 6e-4
    assert timed == [call]
