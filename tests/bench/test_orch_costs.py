"""bench/orch_costs: the variants, the table and the command line (the builds are exercised
by hand)."""

from tvm_ollie.bench.orch_costs import (MODELS, OrchCostRow, Variant, build_parser,
                                        format_table, variants)
from tvm_ollie.config import OrchestrateConfig


def test_table_has_a_row_per_model_and_system_with_ratios_to_tvm():
    rows = [OrchCostRow("candy", "tvm", latency_s=1e-3, ratio=1.0, compile_s=3.0),
            OrchCostRow("candy", "orch profiled+library", latency_s=0.9e-3, ratio=0.9,
                        compile_s=20.0, kernels=40, candidates=300, variables=300,
                        constraints=500, solve_s=0.25, profile_s=12.5, profiled=30, cached=2,
                        eligible=60, failed=1, library=(9, 4),
                        quartiles=(0.5, 0.8, 1.0, 1.2, 3.0)),
            OrchCostRow("candy", "orch analytic")]
    lines = format_table(rows).splitlines()
    assert len(lines) == 5
    assert len({line.count("|") for line in lines}) == 1
    assert lines[2].startswith("| candy | tvm | 1.00 | 3.0 |")
    assert ("| candy | orch profiled+library | 0.90 (0.90) | 20.0 | 40 | 300 / 300 / 500 | "
            "0.25 | 12.5 | 30 / 2 / 60 / 1 | 9 / 4 | 0.50 0.80 1.00 1.20 3.00 |") == lines[3]
    assert "| orch analytic | - |" in lines[4] and "| - | - | - |" in lines[4]


def test_variants_are_every_combination():
    got = variants(["analytic", "profiled"], ["off", "on"], ["on"])
    assert [v.name for v in got] == ["orch analytic+library", "orch profiled+library",
                                     "orch analytic+fission+library",
                                     "orch profiled+fission+library"]
    assert Variant("profiled").name == "orch profiled"


def test_parser_defaults_are_the_orchestration_defaults():
    args = build_parser().parse_args([])
    assert args.models == list(MODELS)
    assert args.budget_s == OrchestrateConfig().profile_budget_s
    assert args.max_kernels == OrchestrateConfig().profile_max_kernels
    assert (args.costs, args.fission, args.library) == (["analytic", "profiled"], ["off"],
                                                        ["off"])
