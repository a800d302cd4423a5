"""The stability benchmark: a model built N times in fresh processes, each library timed alone."""

import argparse

import pytest

from tvm_ollie.bench.stability import (build_parser, compare_systems, comparison_table,
                                       library_digest, run_stability, stability_row,
                                       stability_table)


def test_table_gives_fastest_slowest_and_their_ratio():
    rows = [stability_row("m1", [{"median_s": 2e-3}, {"median_s": 3e-3}, {"median_s": 2.5e-3}]),
            stability_row("m2", [{"median_s": 1e-3}, {"status": "error"}])]  # fmt: skip
    assert rows[0]["spread"] == pytest.approx(1.5) and rows[1]["timed"] == 1
    table = stability_table(rows, "ollie", "constants")
    assert "| m1 | 2.000 | 3.000 | 2.500 | 2.000 | 3.000 | 1.50 | 0 of 0 |" in table
    assert "| m2 | 1.000 | error | - | 1.000 | 1.000 | 1.00 | 0 of 0 |" in table
    assert "weights as constants" in table
    args = build_parser().parse_args(["--models", "infogan"])
    assert args.builds == 3 and args.weights == "constants" and args.systems == ["ollie"]
    args = build_parser().parse_args(["--models", "candy", "--system", "ollie", "ollie-joint"])
    assert args.systems == ["ollie", "ollie-joint"] and not args.reuse_records


def _row(model, system, *medians):
    return stability_row(model, [{"median_s": m * 1e-3} for m in medians], system)


def test_systems_compared_with_the_first_beyond_or_within_the_spread():
    rows = [_row("a", "ollie", 2.0, 2.2, 2.1), _row("a", "ollie-joint", 2.5, 2.6, 2.4),
            _row("b", "ollie", 2.0, 3.0, 2.5), _row("b", "ollie-joint", 2.9, 2.2, 2.4),
            _row("c", "ollie", 4.0, 4.1), _row("c", "ollie-joint", 3.0, 3.1)]  # fmt: skip
    found = {c["model"]: c for c in compare_systems(rows)}
    assert found["a"]["verdict"] == "slower beyond the spread"
    assert found["a"]["ratio"] == pytest.approx(2.5 / 2.1)
    assert found["b"]["verdict"] == "within spread" and found["b"]["against"] == "ollie"
    assert found["c"]["verdict"] == "faster beyond the spread"
    assert "| a | ollie-joint | ollie | 1.19 | slower beyond the spread |" in comparison_table(
        compare_systems(rows))
    table = stability_table(rows, "ollie / ollie-joint", "constants")
    assert "| a | ollie-joint | 2.500 | 2.600 | 2.400 | 2.400 | 2.600 | 1.08 |" in table


def test_systems_whose_builds_wrote_the_same_library_are_not_ranked():
    rows = [stability_row("candy", [{"median_s": 65.0e-3, "library": "abc"}], "ollie"),
            stability_row("candy", [{"median_s": 95.9e-3, "library": "abc"}], "ollie-joint")]
    found = compare_systems(rows)[0]
    assert found["verdict"] == "same library" and found["ratio"] == pytest.approx(95.9 / 65.0)
    rows[1]["builds"][0]["library"] = "def"  # another library: ranked by its timings
    assert compare_systems(rows)[0]["verdict"] == "slower beyond the spread"


def test_builds_that_wrote_the_same_bytes_count_as_one_library(tmp_path):
    paths = []
    for i, content in enumerate([b"same", b"same", b"other"]):
        paths.append(tmp_path / f"{i}.so")
        paths[-1].write_bytes(content)
    digests = [library_digest(str(p)) for p in paths]
    assert digests[0] == digests[1] != digests[2]
    row = stability_row("m", [{"median_s": 1e-3, "library": d} for d in digests])
    assert (row["libraries"], row["built"]) == (2, 3)
    assert "| 2 of 3 |" in stability_table([row], "ollie", "constants")


@pytest.mark.slow
def test_two_builds_of_a_tiny_model_each_timed_in_its_own_process(tmp_path):
    pytest.importorskip("torch")
    args = argparse.Namespace(models=["infogan"], builds=2, systems=["tvm"], weights="params",
                              threads=1, trials=0, budget=0.05, min_rounds=3, reuse_records=False,
                              remeasure_calibration=False,
                              out=str(tmp_path))  # fmt: skip
    results = run_stability(args, log=lambda _: None)
    (row,) = results["models"]
    assert row["timed"] == 2 and row["slowest_s"] >= row["fastest_s"] > 0
    builds = row["builds"]
    assert [b["status"] for b in builds] == ["ok", "ok"] and builds[0]["rel_err"] < 1e-4
    assert builds[0]["path"] != builds[1]["path"]  # fresh work dirs, one library each
    assert all(b["rounds"] >= 3 and b["compile_s"] > 0 for b in builds)
    assert builds[0]["library"] == library_digest(builds[0]["path"])
    text = (tmp_path / "stability.md").read_text()
    assert "| infogan |" in text and "weights as params" in text


def test_the_report_says_the_protocol_and_the_load():
    from tvm_ollie.bench import stability  # pylint: disable=import-outside-toplevel

    args = build_parser().parse_args(["--models", "m1", "--weights", "params"])
    results = {"models": [_row("m1", "ollie", 1.0, 1.1)], "load": [0.5, 2.25], "comparisons": []}
    text = stability._tables(results, args)  # pylint: disable=protected-access
    assert text.startswith("Timed under the warm protocol: samples of at least 20 ms")
    assert "load average 0.50-2.25" in text and "weights as params" in text
