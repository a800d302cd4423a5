"""The timing protocol: untimed warm-up calls before each sample, samples of a least length."""

import math

import pytest

from tvm_ollie.bench.timing import (COLD, WARM, CallSampler, Protocol, measure_interleaved,
                                    measure_rounds, paired_ratio, paired_ratio_quartiles,
                                    resolve_protocol)


class FakeSampler:
    """A sampler whose calls the test counts: a call is ``cold_s`` right after another system
    (the first call of a sample's batch), ``warm_s`` once warm; it records each sample's
    arguments."""

    def __init__(self, warm_s=0.001, cold_s=0.004):
        self.warm_s, self.cold_s = warm_s, cold_s
        self.calls, self.samples = 0, []

    def calibrate(self, min_sample_s):
        self.calls += 1
        return max(1, math.ceil(min_sample_s / self.warm_s - 1e-9)) if min_sample_s > 0 else 1

    def sample(self, number, warmup=0):
        self.samples.append((number, warmup))
        self.calls += number + warmup
        times = [self.cold_s] + [self.warm_s] * (number + warmup - 1)
        return sum(times[warmup:]) / number


def test_warm_protocol_takes_untimed_warm_up_calls_before_each_sample():
    fake = FakeSampler()
    samples = measure_rounds({"a": fake}, budget_s=0.0, min_rounds=3, protocol=WARM)["a"]
    number = int(WARM.min_sample_s / fake.warm_s)  # 20 calls of 1 ms
    warmup = int(WARM.warmup_s / fake.warm_s)  # 10 calls of 1 ms
    assert samples.number == number and samples.warmup == warmup
    assert fake.samples == [(number, warmup)] * 3
    # the cold first call went into the untimed warm-up: every sample reads the warm time
    assert samples.seconds == [pytest.approx(fake.warm_s)] * 3


def test_a_sample_lasts_at_least_min_sample_s():
    for warm_s in (1e-5, 3e-4, 0.007, 0.05):
        fake = FakeSampler(warm_s=warm_s, cold_s=warm_s)
        samples = measure_rounds({"a": fake}, budget_s=0.0, min_rounds=1, protocol=WARM)["a"]
        assert samples.number * warm_s >= WARM.min_sample_s - 1e-12
        assert samples.warmup >= 1 and samples.warmup * warm_s >= min(WARM.warmup_s, warm_s)


def test_cold_protocol_times_one_call_with_no_warm_up():
    fake = FakeSampler()
    samples = measure_rounds({"a": fake}, budget_s=0.0, min_rounds=2, protocol=COLD)["a"]
    assert samples.number == 1 and samples.warmup == 0
    assert fake.samples == [(1, 0)] * 2
    assert samples.seconds == [fake.cold_s] * 2


def test_protocol_resolution_keeps_callers_sample_length():
    assert resolve_protocol() is WARM
    fixed = resolve_protocol(min_sample_s=0.0)
    assert fixed.min_sample_s == 0.0 and fixed.warmup_calls(1) == 0  # kernel benches: as before
    longer = resolve_protocol(WARM, min_sample_s=0.05)
    assert longer.name == "warm" and longer.min_sample_s == 0.05
    assert Protocol(**WARM.to_dict()) == WARM
    assert "one call per sample" in COLD.describe() and "20 ms" in WARM.describe()


def test_call_sampler_runs_warm_up_calls_untimed(fake_clock):
    calls = []

    def run():
        # the first call of every batch after a pause is slow
        cold = not calls or calls[-1] == "pause"
        calls.append("call")
        fake_clock.sleep(0.004 if cold else 0.001)

    sampler = CallSampler(run)
    number = sampler.calibrate(0.01)
    assert number == 10  # from the warm calls, not the first (cold) one
    calls.append("pause")
    assert sampler.sample(number, warmup=1) == pytest.approx(0.001)
    calls.append("pause")
    assert sampler.sample(number) == pytest.approx(0.0013)  # cold call timed: 13 ms / 10


def test_interleaved_mode_uses_the_protocol(fake_clock):
    samples = measure_interleaved({"a": lambda: fake_clock.sleep(0.002)}, budget_s=0.0,
                                  min_rounds=2, gap_s=0.0)["a"]
    assert samples.number == 10 and samples.warmup == 5


class SlowFakeSampler(FakeSampler):
    """A :class:`FakeSampler` whose calibration reports the seconds of one call (``call_s``),
    as :class:`CallSampler` and the isolated mode's workers do."""

    def calibrate(self, min_sample_s):
        self.call_s = self.warm_s
        return super().calibrate(min_sample_s)


def test_a_slow_sampler_is_timed_once_by_its_calibration():
    fast, slow = SlowFakeSampler(warm_s=0.001), SlowFakeSampler(warm_s=5.0, cold_s=5.0)
    samples = measure_rounds({"fast": fast, "slow": slow}, budget_s=0.0, min_rounds=3,
                             protocol=WARM, slow_call_s=4.0)  # fmt: skip
    assert list(samples) == ["fast", "slow"]
    assert samples["slow"].once and samples["slow"].seconds == [5.0]
    assert samples["slow"].warmup == 0 and slow.samples == []  # never in the rounds
    assert not samples["fast"].once and len(fast.samples) == 3
    # the ratio of medians, no quartiles (there are no rounds to pair)
    assert paired_ratio(samples["slow"], samples["fast"]) == pytest.approx(5.0 / 0.001)
    assert paired_ratio(samples["fast"], samples["slow"]) == pytest.approx(0.001 / 5.0)
    assert paired_ratio_quartiles(samples["slow"], samples["fast"]) is None


def test_without_slow_call_s_every_sampler_takes_the_rounds():
    slow = SlowFakeSampler(warm_s=5.0, cold_s=5.0)
    for limit in (None, 0.0, 6.0):
        samples = measure_rounds({"slow": slow}, budget_s=0.0, min_rounds=2, protocol=WARM,
                                 slow_call_s=limit)["slow"]  # fmt: skip
        assert not samples.once and len(samples.seconds) == 2


def test_call_sampler_keeps_the_calibrated_call_time(fake_clock):
    sampler = CallSampler(lambda: fake_clock.sleep(0.25))
    assert sampler.call_s is None
    assert sampler.calibrate(0.02) == 1
    assert sampler.call_s == pytest.approx(0.25)
    sampler.calibrate(0.0)  # one untimed call only: nothing timed
    assert sampler.call_s is None
