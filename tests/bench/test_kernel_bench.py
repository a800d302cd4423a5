"""The native kernel benchmark (tvm_ollie.bench.kernel_bench): table output and a tiny run."""

import pytest

from tvm_ollie import native
from tvm_ollie.bench import kernel_bench


def test_print_table_marks_missing_cells(capsys):
    kernel_bench._print_table("T", [("a", {"x": 1.0, "y": 2.5}), ("b", {"y": 3.0, "z": 0.25})],
                              "{:.1f}")
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "### T"
    assert "| shape | x | y | z |" in out
    assert "| a | 1.0 | 2.5 | - |" in out
    assert "| b | - | 3.0 | 0.2 |" in out


@pytest.mark.slow
def test_gemm_runs_execute():
    if not native.available():
        pytest.skip(f"native library unavailable: {native.unavailable_reason()}")
    skip = []
    runs = kernel_bench._gemm_runs(9, 7, 5, 1, skip)
    for name in ("ollie-onednn", "ollie-openblas", "ollie-default", "numpy"):
        runs[name]()
    assert "tvm-untuned" in runs or skip


@pytest.mark.slow
def test_main_tiny_shapes(monkeypatch, capsys):
    monkeypatch.setattr(kernel_bench, "GEMM_SHAPES", [(8, 8, 8, "tiny")])
    monkeypatch.setattr(kernel_bench, "CONV_SHAPES", [(1, 4, 6, 6, 4, 3, 1, 1, "tiny conv")])
    assert kernel_bench.main(["--threads", "1", "--budget-s", "0.05"]) == 0
    out = capsys.readouterr().out
    assert "| tiny (M,K,N=8,8,8) |" in out and "| tiny conv |" in out
