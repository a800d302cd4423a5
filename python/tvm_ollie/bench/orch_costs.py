"""``python -m tvm_ollie.bench.orch_costs``: orchestration on analytic vs profiled kernel costs.

For Korch's quick models (and BERT) it builds, per model, three executables from the same
imported module (weights as constants, as TVM's importers give them):

* ``tvm``: TVM's default pipeline (greedy ``FuseOps``);
* ``tvm-orch analytic``: the same pipeline with kernel orchestration in place of ``FuseOps``
  (:func:`~tvm_ollie.orchestrate.pipeline.orchestrate_pipeline`, no derivation, as the
  ``tvm-orch`` bench system), kernels chosen on the roofline (``costs="analytic"``);
* ``tvm-orch profiled``: the same with profiled kernel costs (the default,
  :mod:`tvm_ollie.orchestrate.profiled`), profiling into a fresh work dir unless
  ``--work-dir`` is given (then a second run profiles nothing);

then times the three, one at a time in interleaved rounds in this process, after all builds.
Per model it prints the candidates costed, how many were profiled, the profiling and BLP solve
seconds, the measured/analytic quartiles, and the three latencies (median over rounds) with
the ratios to ``tvm``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

from ..compat import tvm
from ..compile_profile import profile_scope
from ..config import OrchestrateConfig
from ..models import get_model
from ..orchestrate import orchestrate_pipeline
from .systems import BenchContext, prepare_tvm_executable
from .timing import measure_interleaved
from .tvm_build import build_tvm

__all__ = ["MODELS", "OrchCostRow", "format_table", "main", "run_model"]

#: Korch's models, then BERT (the quick sizes are what this command runs by default).
MODELS = ("candy", "yolox", "segformer", "efficientvit", "bert")

SYSTEMS = ("tvm", "tvm-orch analytic", "tvm-orch profiled")


@dataclass
class OrchCostRow:
    """One model's line of the table."""

    model: str
    candidates: int = 0
    eligible: int = 0
    profiled: int = 0
    cached: int = 0
    failed: int = 0
    profile_s: float = 0.0
    solve_s: Dict[str, float] = field(default_factory=dict)  # per cost model
    compile_s: Dict[str, float] = field(default_factory=dict)  # per system
    quartiles: Optional[tuple] = None  # measured/analytic min, q1, median, q3, max
    latency_s: Dict[str, float] = field(default_factory=dict)  # median per system
    kernels: Dict[str, int] = field(default_factory=dict)  # per cost model


def _orchestrated(mod, ctx: BenchContext, config: OrchestrateConfig):
    """``(executable, report, compile seconds, profiling stage seconds)``."""
    reports: list = []
    with profile_scope() as prof:
        start = time.perf_counter()
        ex = tvm.compile(mod, target=ctx.target, relax_pipeline=orchestrate_pipeline(
            ctx.target, config=config, reports=reports))
        seconds = time.perf_counter() - start
    return ex, reports[-1], seconds, prof.seconds.get("orchestration profiling", 0.0)


def run_model(name: str, ctx: BenchContext, config: OrchestrateConfig,
              timing_s: float = 3.0, log=print) -> OrchCostRow:
    """Build and time the three systems of the module docstring on ``name`` (quick size)."""
    spec = get_model(name, quick=True)
    mod, params, _ = ctx.relax_module(spec)
    row = OrchCostRow(name)
    built = {}
    tvm_build = build_tvm(mod, ctx.target, 0)
    built["tvm"], row.compile_s["tvm"] = tvm_build.executable, tvm_build.compile_s
    log(f"{name}: tvm built in {tvm_build.compile_s:.1f} s")
    for costs in ("analytic", "profiled"):
        cfg = dataclasses.replace(config, costs=costs)
        ex, rep, seconds, _ = _orchestrated(mod, ctx, cfg)
        system = f"tvm-orch {costs}"
        built[system], row.compile_s[system] = ex, seconds
        row.solve_s[costs] = sum(p.solve_s for p in rep.partitions)
        row.kernels[costs] = rep.kernels
        log(f"{name}: {system} built in {seconds:.1f} s; "
            + rep.to_text(kernels=False).splitlines()[0])
        if rep.profile is not None:
            stats = rep.profile
            log("  " + stats.to_text())
            row.candidates, row.eligible = stats.candidates, stats.eligible
            row.profiled, row.cached, row.failed = stats.profiled, stats.cached, stats.failed
            row.profile_s, row.quartiles = stats.profile_s, stats.quartiles()
    runs = {s: prepare_tvm_executable(built[s], params, spec, ctx, row.compile_s[s]).run
            for s in SYSTEMS}
    samples = measure_interleaved(runs, budget_s=timing_s * len(runs))
    row.latency_s = {s: samples[s].median for s in SYSTEMS}
    return row


def format_table(rows: Sequence[OrchCostRow]) -> str:
    """The rows as a Markdown table (latencies in ms; ratios to ``tvm``)."""
    head = ("| model | candidates | to profile | profiled | cached | failed | profiling s | "
            "BLP solve s (analytic / profiled) | measured/analytic min q1 median q3 max | "
            "kernels (analytic / profiled) | tvm ms | tvm-orch analytic ms (/tvm) | "
            "tvm-orch profiled ms (/tvm) |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        q = " ".join(f"{v:.2f}" for v in r.quartiles) if r.quartiles else "-"
        base = r.latency_s.get("tvm")
        lat = ["-" if s not in r.latency_s else f"{r.latency_s[s] * 1e3:.2f}" + (
            "" if s == "tvm" or not base else f" ({r.latency_s[s] / base:.2f})")
            for s in SYSTEMS]
        lines.append(
            f"| {r.model} | {r.candidates} | {r.eligible} | {r.profiled} | {r.cached} | "
            f"{r.failed} | {r.profile_s:.1f} | {r.solve_s.get('analytic', 0):.2f} / "
            f"{r.solve_s.get('profiled', 0):.2f} | {q} | {r.kernels.get('analytic', 0)} / "
            f"{r.kernels.get('profiled', 0)} | " + " | ".join(lat) + " |")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    """The command line of the module docstring."""
    parser = argparse.ArgumentParser(prog="python -m tvm_ollie.bench.orch_costs",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    parser.add_argument("--budget-s", type=float, default=OrchestrateConfig.profile_budget_s,
                        help="profiling seconds per model (OrchestrateConfig.profile_budget_s)")
    parser.add_argument("--max-kernels", type=int,
                        default=OrchestrateConfig.profile_max_kernels,
                        help="kernels profiled per model at most")
    parser.add_argument("--work-dir", help="profiled-cost cache (default: a fresh temp dir)")
    parser.add_argument("--timing-s", type=float, default=3.0,
                        help="timing seconds per system and model")
    parser.add_argument("--threads", type=int, help="threads (default: all cores)")
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    """Run the comparison and print the table."""
    args = build_parser().parse_args(argv)
    work_dir = args.work_dir or tempfile.mkdtemp(prefix="orch_costs_")
    ctx = BenchContext("llvm", threads=args.threads, weights="constants",
                       work_dir=os.path.join(work_dir, "bench"))
    rows = []
    for name in args.models:
        config = OrchestrateConfig(profile_budget_s=args.budget_s,
                                   profile_max_kernels=args.max_kernels,
                                   work_dir=os.path.join(work_dir, name))
        rows.append(run_model(name, ctx, config, args.timing_s,
                              log=lambda m: print(m, file=sys.stderr, flush=True)))
    print(format_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
