"""Measured decisions (transform.measuring): alternatives timed together under the protocol,
outliers and near-ties, the evidence recorded in work_dir and reused without timing."""

import dataclasses
import json
import logging
import os

import pytest

import small_models as sm
from tvm_ollie.transform import optimize_module
from tvm_ollie.transform.alternatives import Alternative, Candidates
from tvm_ollie.transform.choosing import (MARGIN, NATIVE_MARGIN, REPRODUCIBLE_MARGIN,
                                          choose_measured, decision_margin, preference)
from tvm_ollie.transform.costing import CallableTiming, UntunedTiming
from tvm_ollie.transform.int8_choice import INT8_PROTOCOL
from tvm_ollie.transform.measuring import (HOPELESS, PROTOCOL, DecisionRecords,
                                           DecisionTiming)
from tvm_ollie.tune.compare import PAIRED_MIN

logging.getLogger("tvm_ollie.derive").setLevel(logging.CRITICAL)

OPTS = dict(max_depth=2, search_time_s=4.0, calibration=sm.LLVM_CALIB)


def _call(mod):
    return mod["main"].body.blocks[0].bindings[0].value


@pytest.fixture(scope="module", name="conv")
def _conv():
    call = _call(sm.conv3x3())
    found = Candidates(library=False, derive=True, max_depth=2)(call, 2.0)
    base = found.alternatives[0]
    progs = [a for a in found.alternatives[1:] if a.program is not None][:2]
    return call, base, progs


def _accept(_alt):
    return True, ""


class Outliers:
    """``measure(alt)``: ``times[label]``, except that sample ``i`` of ``label`` is
    ``outliers[(label, i)]``; counts samples."""

    def __init__(self, times, outliers=None):
        self.times, self.outliers, self.calls = dict(times), dict(outliers or {}), {}

    def __call__(self, alt):
        i = self.calls.get(alt.label, 0)
        self.calls[alt.label] = i + 1
        return self.outliers.get((alt.label, i), self.times[alt.label])


def test_one_outlier_does_not_flip_a_decision(conv):
    _, base, (prog, _) = conv
    # the program's first sample is 100x slow, the original's first 50x fast: a decision on
    # the first timing of each would keep the original
    measure = Outliers({"original": 1e-3, prog.label: 0.5e-3},
                       {(prog.label, 0): 50e-3, ("original", 0): 2e-5})
    choice = choose_measured(base, [prog], [], 3, _accept, measure, 3, "measured")
    assert choice.label == prog.label and (choice.before_s, choice.after_s) == (1e-3, 0.5e-3)
    # judged on the first quartile, whose interval trims a sample too fast (which the machine
    # cannot produce, unlike a slow one) only from 15 samples on; the per-round ratios (0.5 in
    # every round but the first) separate from PAIRED_MIN rounds, the outlying round trimmed
    assert "stop: separated" in choice.reason and measure.calls["original"] == PAIRED_MIN


def test_near_ties_keep_the_original_and_say_so(conv):
    _, base, (prog, other) = conv
    measure = Outliers({"original": 1e-3, prog.label: 1e-3 * (1 - MARGIN / 2),
                        other.label: 2e-3})
    choice = choose_measured(base, [prog, other], [], 3, _accept, measure, 3, "measured")
    assert not choice.rewritten and choice.measured
    assert f"tie of original, {prog.label} -> original" in choice.reason, choice.reason


def test_preference_and_margins(conv):
    _, base, (p1, p2) = conv
    native = Alternative(None, "native", 2.0)
    cheap, dear = dataclasses.replace(p2, estimate=1.0), dataclasses.replace(p1, estimate=2.0)
    # the original, its native kernel, then the lower estimate
    assert preference([base, dear, native, cheap]) == [base, native, cheap, dear]
    margin = decision_margin([base, native, cheap])
    # every pair needs at least the build-to-build noise of unit timings
    floor = REPRODUCIBLE_MARGIN
    assert margin(native.label, base.label) == max(MARGIN, floor) == margin(cheap.label, base.label)
    assert margin(cheap.label, native.label) == max(NATIVE_MARGIN, floor)


def test_a_derived_program_within_the_native_margin_keeps_the_native_kernel(conv):
    _, base, (prog, _) = conv
    native = Alternative(None, "native", 0.5)
    assert decision_margin([base, native, prog])(prog.label, native.label) >= NATIVE_MARGIN
    measure = Outliers({"original": 1.0, native.label: 0.5,
                        prog.label: 0.5 * (1 - NATIVE_MARGIN / 2)})
    choice = choose_measured(base, [native, prog], [], 3, _accept, measure, 3, "measured")
    assert choice.label == native.label and "tie of" in choice.reason


class CountingTimer:
    """``timer(module, label)``: 1 ms for the original, 0.5 ms for the rest; counts calls."""

    def __init__(self):
        self.calls = 0

    def __call__(self, _mod, label):
        self.calls += 1
        return 1e-3 if label.endswith("|original") else 0.5e-3 + 1e-6 * len(label)


def test_a_second_build_reuses_the_recorded_evidence(tmp_path):
    timer = CountingTimer()
    _, first = optimize_module(sm.conv3x3(), "llvm", library=False, timer=timer,
                               max_measured=2, work_dir=str(tmp_path), **OPTS)
    assert timer.calls > 0 and first.rewritten
    with open(os.path.join(str(tmp_path), DecisionRecords.FILE), encoding="utf-8") as f:
        records = json.load(f)
    (entry,) = records.values()
    comparison = entry["comparison"]
    assert comparison["rounds"] >= 5 and comparison["winner"] != "original"
    assert all(len(t["samples"]) == comparison["rounds"] for t in comparison["timings"])
    again = CountingTimer()
    _, second = optimize_module(sm.conv3x3(), "llvm", library=False, timer=again,
                                max_measured=2, work_dir=str(tmp_path), **OPTS)
    assert again.calls == 0
    assert [d.chosen for d in second.decisions] == [d.chosen for d in first.decisions]
    assert [d.after_s for d in second.decisions] == [d.after_s for d in first.decisions]
    assert "recorded" in second.decisions[0].reason and "rounds" in first.decisions[0].reason
    # the report's text shows the evidence whole
    assert "timed decisions" in second.to_text() and second.decisions[0].reason in \
        second.to_text()
    # another work dir times again
    fresh = CountingTimer()
    optimize_module(sm.conv3x3(), "llvm", library=False, timer=fresh, max_measured=2,
                    work_dir=str(tmp_path / "other"), **OPTS)
    assert fresh.calls == timer.calls


def test_decision_timing_builds_once_and_samples(conv, tmp_path):
    call, base, (prog, _) = conv
    built = []

    class Timing(CallableTiming):
        def sample(self, module, label):
            built.append(label)
            return super().sample(module, label)

    timing = DecisionTiming(Timing(lambda m, label: 1e-3 if "original" in label else 2e-3),
                            DecisionRecords(str(tmp_path)))
    res = timing.step(call, "sig")([base, prog], ["original"], MARGIN)
    assert res.winner == "original" and res.separated and len(built) == 2
    assert timing.seconds[("sig", prog.label)] == 2e-3
    again = DecisionTiming(Timing(None), DecisionRecords(str(tmp_path)))
    assert again.step(call, "sig")([base, prog], ["original"], MARGIN).recorded
    # another set of alternatives (the search is time-bounded) with the recorded winner in it:
    # the record decides; without it, the decision is timed again
    _, _, (_, other) = conv
    assert again.step(call, "sig")([base, other], ["original"], MARGIN).recorded
    built.clear()
    res = DecisionTiming(Timing(lambda m, label: 1e-3), DecisionRecords(str(tmp_path))).step(
        call, "sig")([prog, other], [prog.label], MARGIN)
    assert not res.recorded and len(built) == 2


def test_a_hopeless_alternative_leaves_after_two_rounds(conv, tmp_path):
    """PROTOCOL's ``hopeless``: an alternative over HOPELESS x the leader's slowest sample in
    two samples is timed no more, and is still judged beaten (the same winner, separated)."""
    call, base, (prog, other) = conv
    times = {base.label: 50e-3, prog.label: 1e-3, other.label: 1.2e-3}

    def seconds(_module, label):  # the label is "<unit signature>|<alternative>"
        return times[label.split("|", 1)[1]]

    res = DecisionTiming(CallableTiming(seconds), DecisionRecords(str(tmp_path))).step(
        call, "sig")([base, prog, other], ["original"], MARGIN)
    assert res.winner == prog.label and res.separated
    assert res.timings[base.label].retired and len(res.timings[base.label].samples) == 2
    assert len(res.timings[prog.label].samples) >= PROTOCOL["min_rounds"]
    assert PROTOCOL["hopeless"] == HOPELESS and INT8_PROTOCOL["hopeless"] == float("inf")


def test_untuned_timing_samples_a_built_module(conv):
    call, base, _ = conv
    sampler = UntunedTiming("llvm").sampler(call, base)
    assert sampler() > 0 and sampler() > 0
