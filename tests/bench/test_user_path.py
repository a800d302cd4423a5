"""The pure parts of ``python -m tvm_ollie.bench.user_path`` (the table of the user paths)."""

import json

import numpy as np

from tvm_ollie.bench import user_path as up


def test_dynamic_axes_name_batch_and_image_sides():
    axes = up.dynamic_axes(["input0", "input1"], [4, 3])
    assert axes == {"input0": {0: "batch", 2: "height", 3: "width"}, "input1": {0: "batch"}}


def test_compare_scales_the_tolerance_and_names_the_failure():
    ref = [np.full((2, 3), 100.0, "float32"), np.zeros(4, "float32")]
    ok, err, why = up.compare([ref[0] + 5e-3, ref[1]], ref)
    assert ok and err > 0 and not why  # 5e-3 < 1e-4 * 100
    ok, err, why = up.compare([ref[0] + 0.1, ref[1]], ref)
    assert not ok and "output 0" in why and abs(err - 0.1) < 1e-4
    assert not up.compare([ref[0]], ref)[0]
    assert "shape" in up.compare([ref[0].T, ref[1]], ref)[2]
    assert not up.compare([ref[0] * np.nan, ref[1]], ref)[0]


def test_flatten_median_and_one_line():
    assert [a.shape for a in up.flatten((np.ones(2), [np.ones((1, 3))]))] == [(2,), (1, 3)]
    calls = []
    assert up.median_ms(lambda: calls.append(1), runs=3, warmup=2) >= 0 and len(calls) == 5
    msg = up.one_line(ValueError("first line\nsecond"), limit=40)
    assert msg == "ValueError: first line"
    assert len(up.one_line(ValueError("x" * 500))) == 120


def test_render_orders_rows_and_table_round_trips(tmp_path):
    rows = [up.Row("m", "torch.compile", "yes", "yes", 1e-6, 2.0, 1.0, 3.0),
            up.Row("m", "onnx-13", "no", note="import failed: X | Y")]
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r.__dict__) + "\n" for r in rows))
    table = up.render(up.load_rows(str(path)))
    lines = table.splitlines()
    assert len(lines) == 4 and lines[2].startswith("| m | onnx-13 | no |")
    assert "X / Y" in lines[2]  # a '|' in a reason does not break the table
    assert "| yes (1.0e-06) | 2.00 | 1.00 | 2.00x | 3 |" in lines[3]


def test_paired_ms_alternates_in_blocks():
    calls = []
    a, b = up.paired_ms(lambda: calls.append("a"), lambda: calls.append("b"), runs=4, block=2)
    # per block: one untimed switch-over call, then two timed calls; two blocks of each
    assert calls == (["a"] * 3 + ["b"] * 3) * 2 and a >= 0 and b >= 0


def test_latencies_use_the_chosen_clock(monkeypatch):
    ticks = iter(range(1000))  # a clock that advances one second per reading
    monkeypatch.setitem(up.CLOCK, "now", lambda: float(next(ticks)))
    assert up.median_ms(lambda: None, runs=3, warmup=1) == 1000.0
    assert up.paired_ms(lambda: None, lambda: None, runs=2, block=2) == (1000.0, 1000.0)
    assert set(up.CLOCKS) == {"wall", "cpu"}
