"""Timed decisions that hold: interleaved rounds until two agree, the original on native kernels
as the reference a program must beat, and a region kept when its heavy call on the library is
the fastest. Fakes only (no timing assertions)."""

import logging

import pytest
from tvm.script import relax as R

import small_models as sm
from tvm_ollie import native
from tvm_ollie.transform.alternatives import Alternative, Candidates
from tvm_ollie.transform.choosing import (MARGIN, choose_measured, measured_winner, shortlist,
                                          stable_winner)
from tvm_ollie.transform.costing import (FixedRounds, InterleavedRounds, MeasureCache, Rounds,
                                         UnitCostModel, UntunedTiming)
from tvm_ollie.transform.optimize import optimize_module
from tvm_ollie.transform.regions import find_regions
from tvm_ollie.tune.interleave import InterleavedTimer, relative_spread

logging.getLogger("tvm_ollie.derive").setLevel(logging.CRITICAL)

BASE = Alternative(None, "tvm")
NATIVE = Alternative(None, "native")


class _Prog:
    """Stands in for a derived program (only ``repr`` and ``stages`` are read)."""

    stages = ()

    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return self.name


P1, P2 = Alternative(_Prog("p1"), "tvm"), Alternative(_Prog("p2"), "native")


class Scripted(Rounds):
    """Rounds that return the given times, one list per round (the last one repeats)."""

    def __init__(self, times, spreads=None):
        self.times, self.n, self.finished = list(times), 0, None
        self._spreads = spreads or []

    def round(self):
        self.n += 1
        return list(self.times[min(self.n, len(self.times)) - 1])

    def spreads(self):
        return list(self._spreads)

    def finish(self, seconds):
        self.finished = list(seconds)


# -- the decision on one round's times ----------------------------------------------------


def test_measured_winner_margins_and_the_native_reference():
    alts = [BASE, NATIVE, P1]
    assert measured_winner(alts, [1.0, 1.0 - MARGIN / 2, 1.0 - MARGIN / 2]) == 0
    assert measured_winner(alts, [1.0, 0.5, None]) == 1
    # a program must beat the original on its native kernel, not only the TVM build
    assert measured_winner(alts, [1.0, 0.5, 0.49]) == 1
    assert measured_winner(alts, [1.0, 0.5, 0.4]) == 2
    assert measured_winner([BASE, P1, P2], [1.0, 0.6, 0.5]) == 2
    assert measured_winner(alts, [None, 0.5, 0.4]) == -1


def test_stable_winner_stops_when_two_rounds_agree():
    alts = [BASE, P1]
    rounds = Scripted([[1.0, 0.99], [1.0, 0.5], [1.0, 0.5]])
    winner, times, n, settled = stable_winner(alts, rounds)
    assert (winner, n, settled) == (1, 3, True) and times == [1.0, 0.5]
    # fixed seconds (an estimate, a cache, a fake) decide in one round
    assert stable_winner(alts, FixedRounds([1.0, 0.5]))[2:] == (1, True)


def test_an_unsettled_decision_that_involved_the_original_keeps_it():
    alts = [BASE, P1, P2]
    flip = Scripted([[1.0, 0.5, 2.0], [1.0, 2.0, 2.0]] * 10)
    winner, _, n, settled = stable_winner(alts, flip, max_rounds=5)
    assert (winner, n, settled) == (0, 5, False)
    # flipping between two programs that both beat the original: the last round's
    between = Scripted([[1.0, 0.5, 0.4], [1.0, 0.4, 0.5]] * 10)
    winner, _, n, settled = stable_winner(alts, between, max_rounds=4)
    assert (winner, n, settled) == (1, 4, False)
    # the time cap ends the rounds too
    ticks = iter(range(100))
    winner, _, n, _ = stable_winner(alts, Scripted([[1.0, 0.5, 2.0], [1.0, 2.0, 2.0]] * 10),
                                    cap_s=2.5, clock=lambda: float(next(ticks)))
    assert winner == 0 and n == 3


def test_choose_measured_times_the_native_original_besides_max_measured_programs():
    others = [Alternative(_Prog(f"p{k}"), "tvm", 0.1 * k) for k in range(1, 5)]
    better = shortlist(Alternative(None, "tvm", 1.0), [NATIVE] + others, region=False,
                       measures=True)
    asked = []

    def rounds(alts):
        asked.append([a.label for a in alts])
        return Scripted([[1.0, 0.5, 0.45, 0.3, 0.6]] * 3, spreads=[0.01, 0.02, 0.1, 0.05, 0.0])

    choice = choose_measured(BASE, better, ["x"], 4, lambda a: (True, ""), None, 3, "untuned",
                             rounds=rounds)
    assert asked == [["original", "original [native]", "p1", "p2", "p3"]]
    assert choice.label == "p2" and (choice.before_s, choice.after_s) == (1.0, 0.3)
    assert (choice.rounds, choice.spread) == (2, 0.1)
    assert choice.reason.startswith("untuned (2 interleaved rounds): original 1000.00ms ±1%, ")


def test_choose_measured_finishes_with_the_deciding_times():
    rounds = Scripted([[1.0, 0.5], [1.0, 0.5]])
    choose_measured(BASE, [P1], [], 1, lambda a: (True, ""), None, 3, "m",
                    rounds=lambda alts: rounds)
    assert rounds.finished == [1.0, 0.5]


# -- interleaved timing ----------------------------------------------------------------------


def test_interleaved_timer_rotates_warms_up_and_takes_the_fastest_call():
    clock, calls = [0.0], []

    def runner(name, seconds):
        def run():
            calls.append(name)
            clock[0] += seconds.pop(0) if seconds else 1.0

        return run

    def broken():
        raise RuntimeError("boom")

    # a: warm-up, then calls of 3 and 2 (block 4 s); b: warm-up, then 5 (over the block)
    timer = InterleavedTimer([runner("a", [9.0, 3.0, 2.0]), runner("b", [9.0, 5.0]), broken,
                              None], block_s=4.0, clock=lambda: clock[0])
    assert timer.round() == [2.0, 5.0, None, None]
    assert calls == ["a"] * 3 + ["b"] * 2
    calls.clear()
    timer.round()  # the second round starts with the second runner
    assert calls[0] == "b" and timer.rounds == 2
    assert timer.medians() == [1.5, 3.0, None, None]
    assert relative_spread([1.0, 2.0]) == pytest.approx(0.5 / 1.5)
    assert relative_spread([1.0]) == 0.0


class _Timed(UntunedTiming):
    """Untuned timing whose executables are Python callables (no build)."""

    def __init__(self, work_dir, seconds):
        super().__init__("llvm", work_dir)
        self.built, self.tick = [], seconds

    def labelled_module(self, unit, alt):
        return object(), f"sig|{alt.label}"

    def _runner(self, module, label):
        self.built.append(label)
        return lambda: None


def test_untuned_rounds_interleave_cache_and_reuse(tmp_path):
    timing = _Timed(str(tmp_path), 0.0)
    rounds = timing.rounds(None, [BASE, P1])
    assert isinstance(rounds, InterleavedRounds) and timing.built == ["sig|original", "sig|p1"]
    rounds.finish([2.0, 1.0])
    again = _Timed(str(tmp_path), 0.0)
    cached = again.rounds(None, [BASE, P1])
    assert isinstance(cached, FixedRounds) and cached.round() == [2.0, 1.0] and not again.built
    # one alternative not cached: all are timed again (other sessions' times do not compare)
    assert isinstance(again.rounds(None, [BASE, P2]), InterleavedRounds)
    assert len(MeasureCache(str(tmp_path)).data) == 2


class ByLabel(UnitCostModel):
    """Seconds by label prefix (``default`` for the others)."""

    name = "by-label"

    def __init__(self, times, default=0.9):
        self.times, self.default = times, default

    def seconds(self, unit, alt):
        return next((t for k, t in self.times.items() if alt.label.startswith(k)), self.default)


def _pad_conv():
    @R.function
    def main(x: R.Tensor((1, 4, 10, 10), "float32"), w: R.Tensor((8, 4, 3, 3), "float32"),
             b: R.Tensor((1, 8, 1, 1), "float32")):
        with R.dataflow():
            p = R.nn.pad(x, [0, 0, 0, 0, 1, 1, 1, 1])
            c = R.nn.conv2d(p, w)
            y = R.add(c, b)
            R.output(y)
        return y

    import tvm  # pylint: disable=import-outside-toplevel

    return tvm.IRModule({"main": main})


@pytest.mark.skipif(not native.load(), reason="native library not loaded")
def test_region_kept_when_its_heavy_call_on_the_library_wins():
    mod = _pad_conv()
    (region,) = [r for r in find_regions(mod, 16) if r.size > 1]
    found = Candidates(library=True, derive=False, max_depth=2)(region, 1.0)
    assert [a.label for a in found.alternatives] == ["original", "original [native]"]
    cost = ByLabel({"original [native]": 0.2, "original": 1.0}, default=0.5)
    _, report = optimize_module(mod, "llvm", time_budget_s=1.0, library=True,
                                calibration=sm.LLVM_CALIB, cost_model=cost,
                                checker=lambda ref, cand: (True, ""))
    (reg,) = report.regions
    assert not reg.rewritten
    assert reg.reason.startswith("the heavy call on its native kernel wins, decided alone")
    (conv,) = report.decisions
    assert conv.chosen == "original [native]"


@pytest.mark.slow
@pytest.mark.skipif(not native.load(), reason="native library not loaded")
def test_untuned_rounds_time_real_builds_interleaved(tmp_path):
    """Real builds of a call and of its native kernel, timed in rounds, cached on finish."""
    call = sm.conv1x1()["main"].body.blocks[0].bindings[0].value
    timing = UntunedTiming("llvm", str(tmp_path))
    rounds = timing.rounds(call, [BASE, NATIVE])
    assert isinstance(rounds, InterleavedRounds)
    winner, times, n, _ = stable_winner([BASE, NATIVE], rounds, max_rounds=3)
    assert n >= 2 and all(t is not None and t > 0 for t in times) and winner in (0, 1)
    assert len(rounds.spreads()) == 2
    rounds.finish(times)
    assert isinstance(UntunedTiming("llvm", str(tmp_path)).rounds(call, [BASE, NATIVE]),
                      FixedRounds)


def test_a_regions_library_reference_is_not_checked():
    """It is never emitted: the region is kept and its heavy call checked when decided alone."""
    from tvm_ollie.transform.decide import Decider  # pylint: disable=import-outside-toplevel

    class Refuse:
        is_region = True

    seen = []

    def refuse(ref, cand):
        seen.append(cand)
        return False, "no"

    decider = Decider("llvm", calibration=sm.LLVM_CALIB, library=False, checker=refuse)
    assert decider.check(Refuse(), NATIVE) == (True, "")
    assert not seen


def test_checker_builds_a_units_reference_once(monkeypatch):
    import numpy as np  # pylint: disable=import-outside-toplevel

    from tvm_ollie.transform import checking  # pylint: disable=import-outside-toplevel

    runs = []

    def fake_run(mod, args):  # noqa: ARG001
        runs.append(mod)
        return np.ones((2, 2)), ["float32"]

    monkeypatch.setattr(checking, "_run_llvm", fake_run)
    call = sm.conv1x1()["main"].body.blocks[0].bindings[0].value
    checker = checking.Checker(exact=False)
    assert checker.check(call, BASE) == (True, "") and checker.check(call, BASE) == (True, "")
    assert len(runs) == 3  # one reference, two candidates
    other = sm.conv3x3()["main"].body.blocks[0].bindings[0].value
    checker.check(other, BASE)
    assert len(runs) == 5  # another unit: its own reference
