"""``python -m tvm_ollie.bench.orch_costs``: the orchestration's ablations (Korch's section 7).

For Korch's quick models (and BERT) it builds, per model, from the same imported module
(weights as constants, as TVM's importers give them):

* ``tvm``: TVM's default pipeline (greedy ``FuseOps``);
* one ``orch`` build per *variant*: the same pipeline with kernel orchestration in place of
  ``FuseOps`` (:func:`~tvm_ollie.orchestrate.pipeline.orchestrate_pipeline`, no derivation,
  as the ``tvm-orch`` bench system), for every combination of

  - ``--costs``: kernels chosen on the roofline (``analytic``) or on profiled costs
    (``profiled``, the default of orchestration, :mod:`tvm_ollie.orchestrate.profiled`);
  - ``--fission``: ``off`` (as ``tvm-orch``) or ``on`` (the operator fission that
    ``ollie-orch`` runs first: softmax, layer norm, gelu... split into primitives,
    :func:`~tvm_ollie.orchestrate.fission.fission`);
  - ``--library``: ``off`` (TVM kernels only) or ``on`` (library candidates: each eligible
    matmul/conv's native kernel with and without its folded epilogue,
    :mod:`tvm_ollie.pipeline.library_offers`);

then times them all, one at a time in interleaved rounds in this process, after all builds.
Each profiled variant profiles into its own fresh work dir with the process's cache of timed
kernels cleared first (unless ``--work-dir`` is given: then a second run profiles nothing), so
its profiling seconds are what that variant costs alone.

One row per model and system: latency (median over rounds) and ratio to ``tvm``, compile
seconds, kernels, the BLP's size (candidates, variables, constraints, summed over
partitions) and solve seconds, profiling seconds and candidates profiled (measured now / found
in the cache / to profile), library calls offered / chosen, and the measured/analytic
quartiles. The defaults (``--costs analytic profiled``) are the earlier three systems.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import List, Optional, Sequence

from ..compat import tvm
from ..compile_profile import profile_scope
from ..config import OrchestrateConfig
from ..models import get_model
from ..orchestrate import orchestrate_pipeline
from ..orchestrate.fission import fission
from ..orchestrate.profiled import forget_process_times
from ..pipeline.library_offers import library_offer
from .systems import BenchContext, prepare_tvm_executable
from .timing import measure_interleaved
from .tvm_build import build_tvm

__all__ = ["MODELS", "OrchCostRow", "Variant", "format_table", "main", "run_model",
           "variants"]

#: Korch's models, then BERT (the quick sizes are what this command runs by default).
MODELS = ("candy", "yolox", "segformer", "efficientvit", "bert")


@dataclass(frozen=True)
class Variant:
    """One orchestrated build: cost model, fission, library candidates."""

    costs: str = "profiled"
    fission: bool = False
    library: bool = False

    @property
    def name(self) -> str:
        """``orch analytic``, ``orch profiled+fission+library``..."""
        return "orch " + self.costs + "+fission" * self.fission + "+library" * self.library


def variants(costs: Sequence[str], fission_: Sequence[str], library: Sequence[str]
             ) -> List[Variant]:
    """Every combination of the command line's choices (``off``/``on``)."""
    return [Variant(c, f == "on", lib == "on")
            for f, lib, c in itertools.product(fission_, library, costs)]


@dataclass
class OrchCostRow:
    """One model and system's line of the table."""

    model: str
    system: str
    latency_s: Optional[float] = None
    ratio: Optional[float] = None  # latency / tvm's
    compile_s: float = 0.0
    kernels: int = 0
    candidates: int = 0
    variables: int = 0
    constraints: int = 0
    solve_s: float = 0.0
    profile_s: float = 0.0
    profiled: int = 0
    cached: int = 0
    eligible: int = 0
    failed: int = 0
    library: Optional[tuple] = None  # (calls offered a library kernel, calls that chose it)
    quartiles: Optional[tuple] = None  # measured/analytic min, q1, median, q3, max


def _split(mod):
    return fission(mod)[0]


def _orchestrated(mod, ctx: BenchContext, config: OrchestrateConfig, variant: Variant):
    """``(executable, report, compile seconds)`` of one variant."""
    reports: list = []
    with profile_scope():
        start = time.perf_counter()
        ex = tvm.compile(mod, target=ctx.target, relax_pipeline=orchestrate_pipeline(
            ctx.target, config=config, reports=reports,
            fission=_split if variant.fission else None,
            offer=library_offer(ctx.target) if variant.library else None))
        seconds = time.perf_counter() - start
    return ex, reports[-1], seconds


def _fill(row: OrchCostRow, rep) -> None:
    """The orchestration report's numbers into ``row``."""
    parts = rep.partitions
    row.kernels, row.candidates = rep.kernels, sum(p.candidates for p in parts)
    row.variables = sum(p.variables for p in parts)
    row.constraints = sum(p.constraints for p in parts)
    row.solve_s, row.library = sum(p.solve_s for p in parts), rep.library
    stats = rep.profile
    if stats is not None:
        row.profile_s, row.profiled, row.cached = stats.profile_s, stats.profiled, stats.cached
        row.eligible, row.failed, row.quartiles = stats.eligible, stats.failed, \
            stats.quartiles()


def run_model(name: str, ctx: BenchContext, config: OrchestrateConfig,
              chosen: Sequence[Variant], timing_s: float = 3.0, fresh: bool = True,
              log=print) -> List[OrchCostRow]:
    """Build and time ``tvm`` and every variant on ``name`` (quick size); ``fresh``: each
    profiled variant starts from an empty cache in its own work dir."""
    spec = get_model(name, quick=True)
    mod, params, _ = ctx.relax_module(spec)
    rows = {"tvm": OrchCostRow(name, "tvm")}
    built = {}
    tvm_build = build_tvm(mod, ctx.target, 0)
    built["tvm"], rows["tvm"].compile_s = tvm_build.executable, tvm_build.compile_s
    log(f"{name}: tvm built in {tvm_build.compile_s:.1f} s")
    for variant in chosen:
        cfg = dataclasses.replace(config, costs=variant.costs)
        if fresh and config.work_dir:
            cfg = dataclasses.replace(cfg, work_dir=os.path.join(
                config.work_dir, variant.name.replace(" ", "_").replace("+", "_")))
            forget_process_times()
        ex, rep, seconds = _orchestrated(mod, ctx, cfg, variant)
        row = rows[variant.name] = OrchCostRow(name, variant.name, compile_s=seconds)
        built[variant.name] = ex
        _fill(row, rep)
        log(f"{name}: {variant.name} built in {seconds:.1f} s; "
            + rep.to_text(kernels=False).splitlines()[0])
        if rep.profile is not None:
            log("  " + rep.profile.to_text())
    runs = {s: prepare_tvm_executable(built[s], params, spec, ctx, rows[s].compile_s).run
            for s in rows}
    samples = measure_interleaved(runs, budget_s=timing_s * len(runs))
    base = samples["tvm"].median
    for system, row in rows.items():
        row.latency_s = samples[system].median
        row.ratio = row.latency_s / base if base else None
    return list(rows.values())


HEAD = ("| model | system | ms (/tvm) | compile s | kernels | BLP candidates / variables / "
        "constraints | solve s | profiling s | profiled / cached / to profile / failed | "
        "library offered / chosen | measured/analytic min q1 median q3 max |")


def format_table(rows: Sequence[OrchCostRow]) -> str:
    """The rows as a Markdown table (latencies in ms; ratios to ``tvm``)."""
    lines = [HEAD, "|" + "---|" * (HEAD.count("|") - 1)]
    for r in rows:
        ms = "-" if r.latency_s is None else f"{r.latency_s * 1e3:.2f}" + (
            "" if r.system == "tvm" or r.ratio is None else f" ({r.ratio:.2f})")
        if r.system == "tvm":
            lines.append(f"| {r.model} | tvm | {ms} | {r.compile_s:.1f} |" + " - |" * 7)
            continue
        q = " ".join(f"{v:.2f}" for v in r.quartiles) if r.quartiles else "-"
        lib = "-" if r.library is None else f"{r.library[0]} / {r.library[1]}"
        prof = "-" if "profiled" not in r.system else \
            f"{r.profiled} / {r.cached} / {r.eligible} / {r.failed}"
        lines.append(
            f"| {r.model} | {r.system} | {ms} | {r.compile_s:.1f} | {r.kernels} | "
            f"{r.candidates} / {r.variables} / {r.constraints} | {r.solve_s:.2f} | "
            f"{r.profile_s:.1f} | {prof} | {lib} | {q} |")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    """The command line of the module docstring."""
    parser = argparse.ArgumentParser(prog="python -m tvm_ollie.bench.orch_costs",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    parser.add_argument("--costs", nargs="+", default=["analytic", "profiled"],
                        choices=["analytic", "profiled"], help="cost models to compare")
    parser.add_argument("--fission", nargs="+", default=["off"], choices=["off", "on"],
                        help="orchestrate without and/or with operator fission")
    parser.add_argument("--library", nargs="+", default=["off"], choices=["off", "on"],
                        help="without and/or with library candidates")
    parser.add_argument("--budget-s", type=float, default=OrchestrateConfig.profile_budget_s,
                        help="profiling seconds per variant (OrchestrateConfig.profile_budget_s)")
    parser.add_argument("--max-kernels", type=int,
                        default=OrchestrateConfig.profile_max_kernels,
                        help="kernels profiled per variant at most")
    parser.add_argument("--work-dir", help="profiled-cost cache, shared by the variants "
                                           "(default: a fresh temp dir per variant)")
    parser.add_argument("--timing-s", type=float, default=3.0,
                        help="timing seconds per system and model")
    parser.add_argument("--threads", type=int, help="threads (default: all cores)")
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    """Run the comparison and print the table (each model's rows also as they finish)."""
    args = build_parser().parse_args(argv)
    work_dir = args.work_dir or tempfile.mkdtemp(prefix="orch_costs_")
    ctx = BenchContext("llvm", threads=args.threads, weights="constants",
                       work_dir=os.path.join(work_dir, "bench"))
    chosen = variants(args.costs, args.fission, args.library)
    rows: List[OrchCostRow] = []
    for name in args.models:
        config = OrchestrateConfig(profile_budget_s=args.budget_s,
                                   profile_max_kernels=args.max_kernels,
                                   work_dir=os.path.join(work_dir, name))
        got = run_model(name, ctx, config, chosen, args.timing_s, fresh=not args.work_dir,
                        log=lambda m: print(m, file=sys.stderr, flush=True))
        print(format_table(got), file=sys.stderr, flush=True)
        rows.extend(got)
    print(format_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
