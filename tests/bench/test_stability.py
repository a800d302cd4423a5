"""The stability benchmark: a model built N times in fresh processes, each library timed alone."""

import argparse

import pytest

from tvm_ollie.bench.stability import build_parser, run_stability, stability_row, stability_table


def test_table_gives_fastest_slowest_and_their_ratio():
    rows = [stability_row("m1", [{"median_s": 2e-3}, {"median_s": 3e-3}, {"median_s": 2.5e-3}]),
            stability_row("m2", [{"median_s": 1e-3}, {"status": "error"}])]  # fmt: skip
    assert rows[0]["spread"] == pytest.approx(1.5) and rows[1]["timed"] == 1
    table = stability_table(rows, "ollie", "constants")
    assert "| m1 | 2.000 | 3.000 | 2.500 | 2.000 | 3.000 | 1.50 |" in table
    assert "| m2 | 1.000 | error | - | 1.000 | 1.000 | 1.00 |" in table
    assert "weights as constants" in table
    args = build_parser().parse_args(["--models", "infogan"])
    assert args.builds == 3 and args.weights == "constants" and args.system == "ollie"


@pytest.mark.slow
def test_two_builds_of_a_tiny_model_each_timed_in_its_own_process(tmp_path):
    pytest.importorskip("torch")
    args = argparse.Namespace(models=["infogan"], builds=2, system="tvm", weights="params",
                              threads=1, trials=0, budget=0.05, min_rounds=3,
                              out=str(tmp_path))  # fmt: skip
    results = run_stability(args, log=lambda _: None)
    (row,) = results["models"]
    assert row["timed"] == 2 and row["slowest_s"] >= row["fastest_s"] > 0
    builds = row["builds"]
    assert [b["status"] for b in builds] == ["ok", "ok"] and builds[0]["rel_err"] < 1e-4
    assert builds[0]["path"] != builds[1]["path"]  # fresh work dirs, one library each
    assert all(b["rounds"] >= 3 and b["compile_s"] > 0 for b in builds)
    text = (tmp_path / "stability.md").read_text()
    assert "| infogan |" in text and "weights as params" in text
