"""bench/orch_costs: the table and the command line (the builds are exercised by hand)."""

from tvm_ollie.bench.orch_costs import MODELS, SYSTEMS, OrchCostRow, build_parser, format_table
from tvm_ollie.config import OrchestrateConfig


def test_table_has_a_row_per_model_with_ratios_to_tvm():
    row = OrchCostRow("candy", candidates=10, eligible=5, profiled=3, cached=1, failed=0,
                      profile_s=2.5, solve_s={"analytic": 0.1, "profiled": 0.2},
                      quartiles=(0.5, 0.8, 1.0, 1.2, 3.0), kernels={"analytic": 20,
                                                                   "profiled": 18},
                      latency_s=dict(zip(SYSTEMS, (1e-3, 1.1e-3, 0.9e-3))))
    lines = format_table([row, OrchCostRow("bert")]).splitlines()
    assert len(lines) == 4 and lines[0].count("|") == lines[1].count("|") == lines[2].count("|")
    assert "| candy | 10 | 5 | 3 | 1 | 0 | 2.5 |" in lines[2]
    assert "0.50 0.80 1.00 1.20 3.00" in lines[2] and "1.10 (1.10) | 0.90 (0.90) |" in lines[2]


def test_parser_defaults_are_the_orchestration_defaults():
    args = build_parser().parse_args([])
    assert args.models == list(MODELS)
    assert args.budget_s == OrchestrateConfig().profile_budget_s
    assert args.max_kernels == OrchestrateConfig().profile_max_kernels
