"""The timing protocol (tune.compare): interleaved rounds, separation, tie-break, budgets."""

from __future__ import annotations

import json
import math

import pytest

from tvm_ollie.tune.compare import (PAIRED_MIN, Comparison, Timing, beats, calls_per_sample,
                                    clocked, compare, from_seconds, judge, median_interval,
                                    paired_ratio_interval)
from tvm_ollie.transform.measuring import CLEAR, PROTOCOL


def _series(values, outliers=None):
    """A sampler returning ``values`` in turn (cycling), ``outliers[i]`` at call ``i``."""
    calls = [0]

    def sample():
        i = calls[0]
        calls[0] += 1
        if outliers and i in outliers:
            return outliers[i]
        return values[i % len(values)]

    sample.calls = calls
    return sample


def test_median_interval_is_the_order_statistic_interval():
    assert median_interval([3.0, 1.0, 2.0, 5.0, 4.0]) == (1.0, 5.0)  # n=5: min, max (94%)
    assert median_interval(list(range(8))) == (1, 6)  # n=8: one sample off each end (93%)
    assert median_interval(list(range(20))) == (5, 14)
    # a lower confidence narrows it
    assert median_interval(list(range(20)), confidence=0.5) > (5, 14)
    assert all(math.isnan(v) for v in median_interval([]))


def test_beats_needs_disjoint_intervals_and_the_margin():
    a, b = Timing("a", [1.0] * 5), Timing("b", [2.0] * 5)
    assert beats(a, b) and beats(a, b, 0.4) and not beats(a, b, 0.6) and not beats(b, a)
    overlapping = Timing("c", [1.5, 1.5, 1.5, 1.5, 0.9])
    assert not beats(a, overlapping)


def test_separated_leaders_stop_early():
    samplers = {"slow": _series([2e-3]), "fast": _series([1e-3])}
    res = compare(samplers, min_rounds=5, max_rounds=50)
    assert res.separated and res.winner == res.fastest == "fast"
    assert res.stop == "separated" and res.rounds == 5
    assert samplers["fast"].calls[0] == 5
    assert res.medians() == {"slow": 2e-3, "fast": 1e-3}


def test_one_outlier_does_not_flip_the_decision():
    """The faster alternative's second sample is 100x slow and the slower one's third sample
    is 100x fast: the medians and intervals ignore them, and it takes a few more rounds."""
    fast = _series([1.0e-3, 1.02e-3, 0.98e-3], outliers={1: 0.1})
    slow = _series([2.0e-3, 2.04e-3, 1.96e-3], outliers={2: 2e-5})
    res = compare({"a": slow, "b": fast}, min_rounds=5, max_rounds=30)
    assert res.winner == "b" and res.separated and res.stop == "separated"
    assert res.rounds == 8  # n=5 and 7 keep the extremes; n=8 drops one at each end
    # the luckier sample alone would have picked "a"
    assert min(res.timings["a"].samples) < min(res.timings["b"].samples)


def test_near_ties_go_to_the_stated_tie_break():
    # 1% apart with a 3% margin: a tie; the preferred ("original") wins, not the faster
    samplers = {"original": _series([1.01e-3, 1.00e-3]), "prog": _series([1.00e-3, 0.99e-3])}
    res = compare(samplers, prefer=["original", "prog"], margin=0.03, min_rounds=3,
                  max_rounds=9)
    assert res.fastest == "prog" and res.winner == "original"
    assert not res.separated and res.stop == "rounds" and res.rounds == 9
    assert sorted(res.tied) == ["original", "prog"]
    assert "tie of" in res.to_text() and "-> original" in res.to_text()
    # the other order of preference picks the other one
    samplers = {"original": _series([1.01e-3, 1.00e-3]), "prog": _series([1.00e-3, 0.99e-3])}
    assert compare(samplers, prefer=["prog"], margin=0.03, max_rounds=6).winner == "prog"


def _burst_then_near(first, later, switch):
    """A sampler returning ``first`` for its first ``switch`` samples, then ``later``."""
    calls = [0]

    def sample():
        calls[0] += 1
        return first if calls[0] <= switch else later

    return sample


def test_a_close_separation_is_confirmed_to_the_last_round():
    """The pattern of quick YOLOX's flipped decisions: five rounds in which a program reads
    21% under the original on its native kernel (a burst of slow samples of the latter), then
    a gain of 5%. Judged at every look, the rounds stop at 5 on the burst and take the
    program; confirmed (``clear``), they go on and the 5% ties under the 15% margin, so the
    stated tie-break keeps the preferred alternative, as the undisturbed build does."""
    def run(clear):
        samplers = {"native": _burst_then_near(12e-6, 10e-6, 5),  # slowed, then itself
                    "prog": _series([9.5e-6])}
        return compare(samplers, prefer=["native", "prog"], margin=0.15, min_rounds=5,
                       max_rounds=15, quantile=0.25, clear=clear)

    early = run(clear=1.0)
    assert early.winner == "prog" and early.separated and early.rounds == 5
    confirmed = run(clear=2.0)
    assert confirmed.rounds == 15 and confirmed.stop == "rounds"
    assert not confirmed.separated and confirmed.winner == "native"
    # the undisturbed build (no burst) decides the same
    steady = compare({"native": _series([10e-6]), "prog": _series([9.5e-6])},
                     prefer=["native", "prog"], margin=0.15, max_rounds=15, quantile=0.25,
                     clear=2.0)
    assert steady.winner == "native" and not steady.separated


def test_a_clear_gain_still_stops_at_the_first_look_and_a_close_one_at_the_end():
    clear_gain = compare({"a": _series([10e-6]), "b": _series([6e-6])}, margin=0.15,
                         min_rounds=5, max_rounds=15, clear=2.0)
    assert clear_gain.winner == "b" and clear_gain.stop == "separated"
    assert clear_gain.rounds == 5  # 40% > 2 x 15%: what it cost before
    close_gain = compare({"a": _series([10e-6]), "b": _series([8e-6])}, margin=0.15,
                         min_rounds=5, max_rounds=15, clear=2.0)
    # 20%: separated by the margin, judged once after the last round
    assert close_gain.winner == "b" and close_gain.separated and close_gain.rounds == 15
    assert close_gain.stop == "rounds"


def test_the_decisions_protocol_confirms_close_separations():
    assert PROTOCOL["clear"] == CLEAR == 2.0


def test_the_tie_break_never_picks_one_that_does_not_beat_a_preferred_outsider():
    """``g`` ties with the fastest ``f`` but not beats the original ``o``: ``f`` wins."""
    t = {"o": Timing("o", [0.52] * 5), "g": Timing("g", [0.51] * 5),
         "f": Timing("f", [0.50] * 5)}
    winner, fastest, separated, tied, rule = judge(t, ["o", "g", "f"], margin=0.03)
    assert (winner, fastest, separated, sorted(tied)) == ("f", "f", False, ["f", "g"])
    assert "beats those preferred" in rule
    # with a per-pair margin the original is tied as well: it wins
    winner, *_ = judge(t, ["o", "g", "f"], margin=lambda a, b: 0.1 if b == "o" else 0.03)
    assert winner == "o"


def test_the_budget_stops_the_rounds():
    now = [0.0]

    def tick(seconds):
        def sample():
            now[0] += seconds
            return seconds
        return sample

    # equal times never separate: the time budget stops them after min_rounds
    res = compare({"a": tick(1.0), "b": tick(1.0)}, min_rounds=3, max_rounds=100,
                  time_s=10.0, clock=lambda: now[0])
    assert res.stop == "time" and res.rounds == 5 and res.winner == "a"
    res = compare({"a": tick(1.0), "b": tick(1.0)}, min_rounds=3, max_rounds=4)
    assert res.stop == "rounds" and res.rounds == 4


def test_rounds_rotate_the_order():
    order = []

    def named(name, seconds):
        def sample():
            order.append(name)
            return seconds
        return sample

    compare({"a": named("a", 1), "b": named("b", 2), "c": named("c", 3)}, min_rounds=3,
            max_rounds=3)
    assert order == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]


def test_failures_and_hopeless_alternatives_leave_the_rounds():
    def boom():
        raise RuntimeError("no")

    res = compare({"a": _series([1.0]), "bad": boom, "none": lambda: None}, max_rounds=5)
    assert res.winner == "a" and res.stop == "single"
    assert res.timings["bad"].failed.startswith("RuntimeError") and \
        res.timings["none"].failed == "no time"
    slow = _series([1.0])
    res = compare({"fast": _series([1e-3]), "slow": slow}, min_rounds=6, max_rounds=6,
                  hopeless=3.0)
    # two samples, not one, retire it
    assert slow.calls[0] == 2 and res.timings["slow"].retired and res.winner == "fast"
    # one slow first sample is not enough
    unlucky = _series([1e-3], outliers={0: 1.0})
    res = compare({"fast": _series([1.1e-3]), "unlucky": unlucky}, min_rounds=8,
                  max_rounds=8, hopeless=3.0)
    assert not res.timings["unlucky"].retired and res.winner == "unlucky"


def test_a_first_call_given_as_initial_is_no_evidence_of_hopelessness():
    """``initial`` samples (first calls) do not count towards the two samples that retire an
    alternative; they round-trip through the record."""
    slow = _series([1e-3, 1e-3], outliers={0: 0.2})
    res = compare({"fast": _series([1e-3]), "slow": slow}, min_rounds=6, max_rounds=6,
                  hopeless=3.0, initial={"fast": 1e-3, "slow": 0.3})
    # the first call (0.3 s) and one loaded sample (0.2 s): not retired, timed in every round
    assert not res.timings["slow"].retired and slow.calls[0] == 5
    assert Comparison.from_dict(json.loads(json.dumps(res.to_dict()))).timings["slow"].cold == 1
    worse = _series([0.2])
    res = compare({"fast": _series([1e-3]), "slow": worse}, min_rounds=6, max_rounds=6,
                  hopeless=3.0, initial={"fast": 1e-3, "slow": 0.3})
    assert res.timings["slow"].retired and worse.calls[0] == 2


def _clocked_series(now, values):
    """A sampler advancing the fake clock ``now`` by each sample it returns."""
    inner = _series(values)

    def sample():
        seconds = inner()
        now[0] += seconds
        return seconds

    sample.calls = inner.calls
    return sample


def test_slow_samples_end_the_rounds_at_the_time_cap_after_two_each():
    now = [0.0]
    a, b = _clocked_series(now, [12.0, 13.0]), _clocked_series(now, [12.5, 12.0])
    res = compare({"a": a, "b": b}, min_rounds=5, max_rounds=15, time_s=2.0,
                  clock=lambda: now[0], time_cap_s=20.0)
    # two samples each (48 s spent), not five rounds: the tie goes to the preferred "a"
    assert a.calls[0] == b.calls[0] == 2 and res.rounds == 2 and res.stop == "time"
    assert res.winner == "a" and not res.separated


def test_the_time_cap_waits_for_the_second_sample_and_spares_fast_decisions():
    now = [0.0]
    # the cap is spent in round 1, but nothing has a second sample yet
    res = compare({"a": _clocked_series(now, [30.0]), "b": _clocked_series(now, [31.0])},
                  min_rounds=5, max_rounds=15, clock=lambda: now[0], time_cap_s=20.0)
    assert res.rounds == 2
    # fast alternatives never reach it: min_rounds holds
    now[0] = 0.0
    res = compare({"a": _clocked_series(now, [1e-3]), "b": _clocked_series(now, [1e-3])},
                  min_rounds=5, max_rounds=5, clock=lambda: now[0], time_cap_s=20.0)
    assert res.rounds == 5
    # without a cap (the default) slow samples keep min_rounds
    now[0] = 0.0
    res = compare({"a": _clocked_series(now, [12.0]), "b": _clocked_series(now, [12.0])},
                  min_rounds=5, max_rounds=15, time_s=2.0, clock=lambda: now[0])
    assert res.rounds == 5


def test_one_long_hopeless_sample_retires_but_one_short_outlier_does_not():
    slow = _series([2.0])
    res = compare({"fast": _series([1e-3]), "slow": slow}, min_rounds=6, max_rounds=6,
                  hopeless=3.0, long_sample_s=1.0)
    assert slow.calls[0] == 1 and res.timings["slow"].retired and res.winner == "fast"
    # a short outlier (0.5 s, below long_sample_s) still needs its second sample
    unlucky = _series([1e-3], outliers={0: 0.5})
    res = compare({"fast": _series([1.1e-3]), "unlucky": unlucky}, min_rounds=8,
                  max_rounds=8, hopeless=3.0, long_sample_s=1.0)
    assert not res.timings["unlucky"].retired and res.winner == "unlucky"
    # a long sample that is not hopeless stays
    near = _series([1.2, 1.1])
    res = compare({"a": _series([1.0]), "near": near}, min_rounds=3, max_rounds=3,
                  hopeless=3.0, long_sample_s=1.0)
    assert near.calls[0] == 3 and not res.timings["near"].retired


def test_clocked_samples_and_calls_per_sample():
    now = [0.0]

    def run():
        now[0] += 2e-4

    assert clocked(run, 5, lambda: now[0])() == pytest.approx(2e-4)
    # warm-up calls run, untimed
    calls = []
    assert clocked(lambda: calls.append(1) or run(), 2, lambda: now[0], warmup=1)() == \
        pytest.approx(2e-4)
    assert len(calls) == 3
    assert calls_per_sample(2e-4) == 5 and calls_per_sample(1.0) == 1
    assert calls_per_sample(1e-9) == 100


def test_comparison_round_trips_and_given_seconds_are_judged_alike():
    res = compare({"a": _series([1e-3]), "b": _series([3e-3])}, max_rounds=5)
    back = Comparison.from_dict(json.loads(json.dumps(res.to_dict())))
    assert back.recorded and not res.recorded
    assert (back.winner, back.separated, back.rounds, back.stop, back.medians()) == \
        (res.winner, res.separated, res.rounds, res.stop, res.medians())
    assert "recorded" in back.to_text()
    given = from_seconds({"x": 2.0, "y": 1.0, "z": None}, margin=0.1)
    assert given.winner == "y" and given.separated and given.timings["z"].failed
    assert from_seconds({"x": 1.0, "y": 1.0}).winner == "x"  # a tie: the first


def test_quantile_interval_is_the_narrowest_order_statistic_interval():
    from tvm_ollie.tune.compare import quantile_interval  # pylint: disable=import-outside-toplevel

    xs = [float(i) for i in range(1, 16)]
    assert quantile_interval(xs, 0.5) == median_interval(xs)
    # first quartile, 15 samples at 90%: ranks 2..8 (P(2 <= Bin(15, 1/4) < 8) = 0.903)
    assert quantile_interval(xs, 0.25) == (2.0, 8.0)
    assert quantile_interval(xs[:8], 0.25) == (1.0, 8.0)  # too few samples: the range
    assert all(math.isnan(v) for v in quantile_interval([], 0.25))


def test_a_low_quantile_separates_through_one_sided_noise():
    # the faster alternative slowed 10x in a third of its samples: the median's interval
    # reaches the slow samples, the first quartile's does not
    fast = [1.0, 10.0, 1.0] * 5
    slow = [2.0] * 15
    for quantile, separated in ((0.5, False), (0.25, True)):
        res = compare({"slow": _series(slow), "fast": _series(fast)}, margin=0.15,
                      min_rounds=15, max_rounds=15, quantile=quantile)
        assert res.separated == separated and res.winner == ("fast" if separated else "slow")
    again = Comparison.from_dict(json.loads(json.dumps(res.to_dict())))
    assert again.timings["fast"].quantile == 0.25 and again.winner == "fast"
    assert "judged on the 25% quantile" in res.to_text()


DRIFT = [1.0, 2.2, 1.3, 2.5, 1.1, 1.9, 1.4, 2.4, 1.0, 2.0]


def test_paired_rounds_separate_what_the_drift_hides():
    """The machine's speed drifts 2.5x between rounds, alike for both: a is 20% faster in every
    round. The marginal intervals overlap; the per-round ratios (0.8 each) do not."""
    a = Timing("a", [0.8e-3 * d for d in DRIFT])
    b = Timing("b", [1.0e-3 * d for d in DRIFT])
    assert a.interval[1] >= b.interval[0]
    assert paired_ratio_interval(a, b) == pytest.approx((0.8, 0.8))
    assert beats(a, b, 0.03) and not beats(b, a, 0.03)
    # without pairs (a round missing: a retired or failed alternative) the drift hides it
    assert paired_ratio_interval(Timing("a", a.samples[:-1]), b) is None
    assert not beats(Timing("a", a.samples[:-1]), b, 0.03)


def test_paired_rounds_keep_the_margin_and_ignore_one_round():
    """A 1% gain in every round stays a tie under a 3% margin; a 2x gain in one round of ten
    (the others equal) is one outlying ratio, not a verdict."""
    b = Timing("b", [1.0e-3 * d for d in DRIFT])
    assert not beats(Timing("a", [0.99e-3 * d for d in DRIFT]), b, 0.03)
    one = [1.0e-3 * d for d in DRIFT]
    one[3] *= 0.5
    assert not beats(Timing("a", one), b, 0.0)
    assert paired_ratio_interval(Timing("a", one[:PAIRED_MIN - 1]),
                                 Timing("b", b.samples[:PAIRED_MIN - 1])) is None
