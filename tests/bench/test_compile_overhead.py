"""The pure part of ``python -m tvm_ollie.bench.compile_overhead`` (its timing loop)."""

from tvm_ollie.bench import compile_overhead as co


def test_per_call_ms_is_the_mean_after_one_untimed_call():
    ticks = iter([0.0, 0.5])  # read once before and once after the timed calls
    calls = []
    ms = co.per_call_ms(lambda: calls.append(1), calls=5, clock=lambda: next(ticks))
    assert len(calls) == 6 and abs(ms - 100.0) < 1e-9  # 0.5 s over 5 calls
