"""The named benchmarks behind the docs' numbers run on their smallest configuration.

Each test runs a module's ``main`` as ``python -m tvm_ollie.bench.NAME`` would, with the
fewest rounds and shapes, and checks the table it prints (no timed assertions: the numbers
are the benchmark's to report, not the test's to judge).
"""

import importlib.util

import pytest

from tvm_ollie import native
from tvm_ollie.bench import dilated_conv, native_band, native_choice, native_deconv, omp_wait
from tvm_ollie.bench import rpc_wall, shared_inputs
from tvm_ollie.bench.table import markdown_table, pivot_table

needs_native = pytest.mark.skipif(
    not native.available(), reason=f"native library unavailable: {native.unavailable_reason()}")


def _table(out: str, header: str):
    """The data rows (lists of cells) of the Markdown table whose header starts with ``header``."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    assert set(lines[start + 1]) <= set("|-")
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def test_pivot_table_fills_missing_cells():
    text = pivot_table("shape", [("a", {"x": 1.0}), ("b", {"y": 2.5, "x": 3.0})], "{:.1f}")
    assert text.splitlines() == ["| shape | x | y |", "|---|---|---|", "| a | 1.0 | - |",
                                 "| b | 3.0 | 2.5 |"]
    assert markdown_table(["n"], []) == "| n |\n|---|"


@needs_native
def test_native_choice_quick_both(capsys):
    assert native_choice.main(["both", "--quick", "--budget-s", "0.01"]) == 0
    out = capsys.readouterr().out
    gemm = _table(out, "| shape | onednn | openblas |")
    conv = _table(out, "| shape | default | plain | blocked | packed |")
    assert [r[0] for r in gemm] == ["square 256"]
    assert [r[0].split()[-1] for r in conv] == ["NCHW", "NHWC"]
    assert all(cell.endswith(")") for row in gemm + conv for cell in row[1:])


@needs_native
@pytest.mark.parametrize("what, header, first", [
    ("deconv", "| shape | default | plain | blocked | gemm |",
     native_choice.DECONV_SHAPES[0][0]),
    ("deconv-epilogue", "| shape | bias | bias+relu | bias+residual |",
     native_choice.EPILOGUE_SHAPES[0][0]),
])
def test_native_choice_deconv_tables(capsys, what, header, first):
    if not native.provides(native.CONV2D_TRANSPOSE):
        pytest.skip("the native library has no conv2d_transpose")
    assert native_choice.main([what, "--quick", "--budget-s", "0.01"]) == 0
    rows = _table(capsys.readouterr().out, header)
    assert [r[0] for r in rows] == [first]


def test_native_choice_rejects_an_unknown_benchmark(capsys):
    with pytest.raises(SystemExit):
        native_choice.main(["matmul"])
    assert "invalid choice" in capsys.readouterr().err


@needs_native
def test_native_deconv_one_round(capsys):
    if not native.provides(native.CONV2D_TRANSPOSE):
        pytest.skip("the native library has no conv2d_transpose")
    assert native_deconv.main(["--quick", "--rounds", "1"]) == 0
    out = capsys.readouterr().out
    header = "| workload | ollie-native | tvm-untuned"
    rows = _table(out, header)
    assert [r[0] for r in rows] == [native_deconv.WORKLOADS[0][0]]
    header_line = next(line for line in out.splitlines() if line.startswith(header))
    assert header_line.endswith("| torch |") != ("torch: not installed" in out)


@needs_native
@pytest.mark.slow
def test_native_band_quick(capsys):
    if not native.provides(native.G2BMM):
        pytest.skip("the native library has no band kernels")
    assert native_band.main(["--quick", "--rounds", "1", "--budget", "2"]) == 0
    rows = _table(capsys.readouterr().out, "| workload | expr (TE) |")
    assert [r[0] for r in rows] == [w[0] for w in native_band.WORKLOADS[:2]]


def test_omp_wait_child_environment(monkeypatch):
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    monkeypatch.setenv("TVM_THREAD_POOL_SPIN_COUNT", "7")
    unset = omp_wait.child_env("unset", 2, None)
    assert "OMP_WAIT_POLICY" not in unset and "TVM_THREAD_POOL_SPIN_COUNT" not in unset
    assert unset["TVM_OLLIE_OMP_WAIT_POLICY"] == "unset" and unset["TVM_NUM_THREADS"] == "2"
    passive = omp_wait.child_env("PASSIVE", 1, "0")
    assert passive["OMP_WAIT_POLICY"] == "PASSIVE"
    assert passive["TVM_THREAD_POOL_SPIN_COUNT"] == "0"


@needs_native
def test_omp_wait_child_in_process():
    medians = omp_wait.child(32, 1)
    assert sorted(medians) == sorted(omp_wait.PARTS)
    assert all(ms > 0 for ms in medians.values())


@needs_native
@pytest.mark.slow
def test_omp_wait_main_runs_children(capsys):
    assert omp_wait.main(["--sizes", "32", "--policies", "unset,PASSIVE", "--rounds", "1",
                          "--threads", "1"]) == 0
    rows = _table(capsys.readouterr().out, "| n | OMP_WAIT_POLICY |")
    assert [r[:2] for r in rows] == [["32", "unset"], ["32", "PASSIVE"]]


@pytest.mark.slow
def test_rpc_wall_smallest_conv(capsys):
    if importlib.util.find_spec("tornado") is None:
        pytest.skip("the RPC tracker needs tornado (the rpc extra)")
    assert rpc_wall.main(["--channels", "4", "--size", "8", "--trials", "2",
                          "--servers", "1"]) == 0
    rows = _table(capsys.readouterr().out, "| servers (RPCRunner workers) |")
    assert [r[:2] for r in rows] == [["1", "2"]]
    assert sum(int(n) for n in rows[0][4].split(",")) >= 1


@pytest.mark.slow
def test_shared_inputs_reports_the_group(capsys):
    pytest.importorskip("torch")
    assert shared_inputs.main(["--search-s", "2", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("bert_separate_qkv, weights as constants:")
    assert "calls rewritten" in out and "regions rewritten" in out
    # the q/k/v projections of one input are one group (a region of three matmuls)
    assert any(line.startswith("region") and line.count("=matmul") == 3
               for line in out.splitlines())


@needs_native
@pytest.mark.slow
def test_dilated_conv_tiny(capsys):
    """Three systems on a tiny CSRNet back end (8x8, dilation 2: the rule applies)."""
    assert dilated_conv.main(["--size", "8", "--widths", "8,8,4", "--rounds", "2"]) == 0
    rows = _table(capsys.readouterr().out, "| system |")
    names = [r[0] for r in rows]
    assert names[:2] == ["ollie (dilated)", "ollie (sub-grids)"]
    assert rows[0][4].startswith("1.000")
