"""time_main: local timing statistics."""

import pytest
import tvm
from tvm import relax

from tvm_ollie.codegen.builder import single_function_module, tensor_var
from tvm_ollie.tune.measure import calibrated_sampler, random_args, time_main


def _module():
    return single_function_module([tensor_var("x", (64, 64)), tensor_var("y", (64, 64))],
                                  lambda bb, x, y: relax.op.add(x, y))


def test_min_and_median_statistics_and_bad_stat_raises():
    mod = _module()
    ex = tvm.compile(mod, target="llvm")
    args = random_args(mod["main"])
    fastest = time_main(ex, args, number=1, repeat=9, stat="min")
    median = time_main(ex, args, number=1, repeat=9)
    assert 0 < fastest < 1 and 0 < median < 1
    with pytest.raises(ValueError, match="stat"):
        time_main(ex, args, stat="mean")


def _fake_run(now, seconds):
    """A call that advances the fake clock ``now`` by ``seconds`` and counts itself."""
    calls = []

    def run():
        calls.append(1)
        now[0] += seconds

    return run, calls


def test_calibrated_sampler_short_calls_warm_up_and_batch():
    """A 0.2 ms call: warm-up and a counting call, then 5 calls per 1 ms sample after a
    warm-up call each."""
    now = [0.0]
    run, calls = _fake_run(now, 2e-4)
    sample = calibrated_sampler(run, floor_s=1e-3, clock=lambda: now[0])
    assert len(calls) == 2
    assert sample() == pytest.approx(2e-4) and len(calls) == 2 + 1 + 5


def test_calibrated_sampler_long_calls_are_sampled_alone():
    """A 20 s call (an untuned TVM alternative at paper size): no counting call after the
    warm-up, and each sample is that one call."""
    now = [0.0]
    run, calls = _fake_run(now, 20.0)
    sample = calibrated_sampler(run, floor_s=1e-3, clock=lambda: now[0], long_call_s=1.0)
    assert len(calls) == 1
    assert sample() == pytest.approx(20.0) and len(calls) == 2
