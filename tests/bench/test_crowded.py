"""The crowded-process benchmark's parts: timing beside another runtime, and its table."""

import numpy as np

from tvm_ollie.bench.crowded import SCENARIOS, BesideSampler, cache_sweep, crowded_table


def test_only_our_call_is_timed_beside_the_others():
    calls = []
    sampler = BesideSampler(lambda: calls.append("run"), before=lambda: calls.append("other"))
    assert sampler.calibrate(0.0) == 1
    assert sampler.sample(2) >= 0
    assert calls == ["other", "run", "other", "run", "other", "run"]
    busy = []
    beside = BesideSampler(lambda: busy.append("run"), background=lambda: busy.append("bg"))
    beside.sample(3)
    assert busy.count("run") == 3


def test_table_has_a_row_per_scenario_and_ratios_to_alone():
    medians = {name: 1e-3 * (i + 1) for i, name in enumerate(SCENARIOS)}
    table = crowded_table({"defaults": {"median_s": medians}, "other": {"status": "error"}})
    assert "| alone | 1.000 (1.00x) | - |" in table
    assert "| after torch | 2.000 (2.00x) | - |" in table
    ort_alone = medians["ORT alone"]  # ONNX Runtime's rows: ratios to its own call alone
    after = medians["ORT after torch"]
    assert f"| ORT after torch | {after * 1e3:.3f} ({after / ort_alone:.2f}x) | - |" in table
    assert len(table.strip().splitlines()) == 2 + len(SCENARIOS)
    lonely = crowded_table({"x": {"median_s": {"after torch": 1e-3}}})  # no "alone" measured
    assert "| after torch | 1.000 |" in lonely and "| alone | - |" in lonely


def test_cache_sweep_writes_the_whole_buffer():
    """The sweep touches every byte (so it evicts as much as its size) on the calling thread."""
    sweep = cache_sweep(1)
    buffer = next(c.cell_contents for c in sweep.__closure__ if isinstance(c.cell_contents,
                                                                            np.ndarray))
    assert buffer.nbytes == 1 << 20
    sweep()
    sweep()
    assert int(buffer.min()) == int(buffer.max()) == 2


def test_sample_is_timed_with_the_given_clock():
    """Only the subject's calls are read off the clock: two readings per call."""
    ticks = iter(range(100))
    sampler = BesideSampler(lambda: None, before=lambda: None, clock=lambda: float(next(ticks)))
    assert sampler.sample(3, warmup=2) == 1.0  # each call spans one tick
    assert next(ticks) == 6
