"""Output agreement and interleaved timing."""

import numpy as np
import pytest

from tvm_ollie.bench.check import as_numpy_list, compare_outputs
from tvm_ollie.bench.timing import (Samples, measure_interleaved, paired_ratio,
                                    paired_ratio_quartiles)


def test_agreement_is_relative_to_output_scale():
    ref = np.array([1000.0, -2000.0, 0.5])
    assert compare_outputs([ref + 1.0], [ref]).ok  # 1.0 <= 1e-3 * 2000
    bad = compare_outputs([ref + np.array([0, 0, 5.0])], [ref])
    assert not bad.ok and "max error" in bad.reason
    small = np.array([1e-6, 2e-6])
    assert not compare_outputs([small * 1.1], [small]).ok
    assert compare_outputs([small * 1.0001], [small]).ok


def test_agreement_rejects_shape_count_and_nonfinite():
    ref = np.zeros((2, 3))
    assert "shape" in compare_outputs([np.zeros((3, 2))], [ref]).reason
    assert "outputs" in compare_outputs([ref, ref], [ref]).reason
    assert "non-finite" in compare_outputs([np.full((2, 3), np.nan)], [ref]).reason
    assert compare_outputs([ref], [ref]).ok  # all-zero reference uses scale 1


def test_as_numpy_list_flattens_nested_outputs():
    out = as_numpy_list((np.ones(2), [np.zeros(3), 4.0]))
    assert [a.shape for a in out] == [(2,), (3,), ()]


def test_interleaved_timing_ratios_and_bounds(fake_clock):
    clock = fake_clock

    def sleeper(seconds):
        return lambda: clock.sleep(seconds)

    samples = measure_interleaved(
        {"fast": sleeper(0.002), "slow": sleeper(0.006)},
        budget_s=0.05, min_rounds=3, max_rounds=8, min_sample_s=0.0, gap_s=0.0,
    )  # fmt: skip
    # rounds of 8 ms: the 0.05 s budget ends the loop after the 7th
    assert len(samples["fast"].seconds) == len(samples["slow"].seconds) == 7
    assert samples["slow"].median == pytest.approx(0.006)
    assert samples["fast"].median == pytest.approx(0.002)
    assert paired_ratio(samples["slow"], samples["fast"]) == pytest.approx(3.0)


def test_interleaved_timing_stops_on_budget_and_batches_fast_calls():
    counter = {"n": 0}

    def tick():
        counter["n"] += 1

    samples = measure_interleaved({"t": tick}, budget_s=0.0, min_rounds=2, min_sample_s=1e-3)
    assert len(samples["t"].seconds) == 2
    assert samples["t"].number > 1  # sub-microsecond calls are repeated within one sample
    # calibration: one untimed call and three timed ones; no warm-up with a caller's length
    assert samples["t"].warmup == 0
    assert counter["n"] == 4 + 2 * samples["t"].number
    assert measure_interleaved({}) == {}


def test_paired_ratio_is_median_of_pairs():
    a, b = Samples(1, [2.0, 4.0, 100.0]), Samples(1, [1.0, 2.0, 1.0])
    assert paired_ratio(a, b) == 2.0


def test_paired_ratio_quartiles():
    a = Samples(1, [1.0, 2.0, 3.0, 4.0, 5.0])
    b = Samples(1, [1.0] * 5)
    assert paired_ratio_quartiles(a, b) == (2.0, 4.0)
    assert paired_ratio_quartiles(Samples(1, [1.0]), Samples(1, [1.0])) is None
