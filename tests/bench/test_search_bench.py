"""The search benchmark's table: runs on small shapes and reports found + verified rows."""

from tvm_ollie.bench import search_bench


def test_quick_rows_are_found_and_verified():
    row = search_bench.run_case("g2bmm", depth=3, quick=True, budget=60)
    assert row["found"] and row["verified"], row
    assert row["first_depth"] is not None and row["first_depth"] <= 3
    assert row["stop"] in ("max_depth", "exhausted")
    assert "g2bmm" in row["program"] and "d=1" in row["program"]
    row = search_bench.run_case("conv3x3", depth=3, quick=True, budget=60)
    assert row["found"] and row["program"] == "matmul[16x8 @ 8x72] -> eop[offset-add 1x4x4x8]"


def test_table_prints_every_requested_case(capsys):
    assert search_bench.main(["--quick", "--depth", "2", "--cases", "g2bmm", "--phases"]) == 0
    out = capsys.readouterr().out
    lines = [ln for ln in out.splitlines() if ln.startswith("g2bmm")]
    assert len(lines) == 1 and "True" in lines[0]
    assert "phases:" in out


def test_lifted_conv_transpose_row_is_found():
    # the guarded gather form of the lifter: solved eagerly, then matmul + offset-add
    row = search_bench.run_case("convtranspose-lifted", depth=3, quick=True, budget=60)
    assert row["found"] and row["verified"], row
    assert "matmul" in row["program"] and "offset-add" in row["program"]
