"""``python -m tvm_ollie.bench.stability``: how far apart repeated builds of one model run.

The ollie build decides between alternatives by measuring them (untuned: timings of the
machine at build time), so two builds of the same model can differ. For each model this builds
it ``--builds`` times (default 3), each in a fresh process with a fresh work dir (nothing
measured by one build is reused by the next), exports each library, then loads every library
in a process of its own and times them in rotating rounds, one process at a time
(:mod:`.worker`, :func:`.timing.measure_rounds`, warm samples: :data:`.timing.WARM`), after
checking each one's outputs against
PyTorch eager. The table gives each build's median, the fastest and the slowest, and
slowest / fastest (1.00: the builds run alike)::

    python -m tvm_ollie.bench.stability --models resnet18 yolox --builds 3 --threads 2

With several systems (``--systems ollie ollie-joint``) every build of every system is timed in
the same rounds, and a second table compares each system with the first: the ratio of the
medians of their builds, and whether the two ranges of builds overlap ("beyond the spread":
the faster system's slowest build is faster than the other's fastest), which is how issue 28
asks that the joint build be never slower than derivation alone.

A build on a machine that built the model before reads back what that build measured and
decided (the per-machine records of :mod:`tvm_ollie.tune.records`), so it would repeat the
first build's decisions and the table would say nothing about them: each build therefore times
every decision and guard verdict anew (``TVM_OLLIE_REMEASURE`` = :data:`REMEASURED`) and reads
back only the machine's calibration (``--remeasure-calibration``: that too, ``1``);
``--reuse-records`` lets builds read everything back, which measures what a user's second build
gets. The derivation cache (search
results, not measurements) stays shared unless ``TVM_OLLIE_CACHE_DIR`` says otherwise. Each
build process has TVM's pool sleeping between kernels (:func:`~tvm_ollie.tune.machine.
sleeping_pool`, as ``tvm-ollie compile`` does) unless ``TVM_THREAD_POOL_SPIN_COUNT`` is set; the
libraries are timed with whatever the environment says (TVM's default: spinning).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import sys
import time
from typing import Callable, Dict, List, Optional

from ..models import get_model
from ..tune.machine import REMEASURE_ENV, sleeping_pool
from .check import as_numpy_list
from .exported import EXPORTABLE, build_and_export, load_exported
from .outcome import check_outcome
from .timing import WARM, measure_rounds
from .worker import Worker, WorkerFailed


#: What each build measures again (``TVM_OLLIE_REMEASURE``): every timed decision and guard
#: verdict, not the machine's calibration (its roofline and kernel efficiencies). A calibration
#: measured anew in each build differs with the load, and with it the analytic estimates that
#: order the alternatives, pick the few that are timed, and key the derivation cache: Segformer's
#: builds timed different alternatives for 5 of 55 units and searched again for minutes.
REMEASURED = "decisions,unit decisions,model guard"


def _ms(seconds: Optional[float]) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.3f}"


def stability_row(model: str, builds: List[dict], system: str = "ollie") -> dict:
    """The table's row of one model and system from its builds (each with ``median_s`` when
    timed)."""
    times = [b["median_s"] for b in builds if b.get("median_s")]
    digests = [b["library"] for b in builds if b.get("library")]
    row = {"model": model, "system": system, "builds": builds, "timed": len(times),
           "libraries": len(set(digests)), "built": len(digests)}
    if times:
        row.update(fastest_s=min(times), slowest_s=max(times), spread=max(times) / min(times),
                   median_s=statistics.median(times))  # fmt: skip
    return row


def library_digest(path: str) -> str:
    """The content of a built library (16 hex digits of its SHA-256): two builds that took the
    same decisions write the same bytes, whatever the machine's load when they are timed."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:16]


def stability_table(rows: List[dict], system: str, weights: str) -> str:
    """Markdown: per model (and system, when the rows have several) each build's median (ms),
    fastest, slowest, slowest / fastest, and how many distinct libraries the builds wrote."""
    width = max((len(r["builds"]) for r in rows), default=0)
    several = len({r.get("system", system) for r in rows}) > 1
    header = ["model"] + (["system"] if several else [])
    header += [f"build {i + 1} ms" for i in range(width)]
    header += ["fastest ms", "slowest ms", "slowest / fastest", "distinct libraries"]
    lines = [f"`{system}` builds, weights as {weights}; each library timed alone in its own "
             "process, the processes taking turns.", "",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]  # fmt: skip
    for row in rows:
        cells = [row["model"]] + ([row.get("system", system)] if several else [])
        for build in row["builds"]:
            cells.append(_ms(build["median_s"]) if build.get("median_s") else
                         build.get("status", "-"))  # fmt: skip
        cells += ["-"] * (width - len(row["builds"]))
        spread = row.get("spread")
        cells += [_ms(row.get("fastest_s")), _ms(row.get("slowest_s")),
                  "-" if spread is None else f"{spread:.2f}",
                  f"{row.get('libraries', '-')} of {row.get('built', '-')}"]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _same_library(row: dict, first: dict) -> bool:
    """Whether every build of both rows wrote one and the same library (by digest)."""
    digests = [b.get("library") for r in (row, first) for b in r["builds"]]
    return bool(digests) and None not in digests and len(set(digests)) == 1


def compare_systems(rows: List[dict]) -> List[dict]:
    """Each model's rows of the second and later systems against its first system's row:
    ``ratio`` (median of the other's builds / median of the first's; above 1: the other is
    slower) and ``verdict``: ``same library`` when every build of both systems wrote the same
    bytes (the difference is then the machine's: quick Candy's ``ollie`` and ``ollie-joint``
    builds, one library, timed 65.0 and 95.9 ms at load 5), else ``slower``/``faster`` beyond
    the spread when the ranges of builds do not overlap, else ``within spread``."""
    firsts: Dict[str, dict] = {}
    out = []
    for row in rows:
        first = firsts.setdefault(row["model"], row)
        if first is row or "median_s" not in row or "median_s" not in first:
            continue
        if _same_library(row, first):
            verdict = "same library"
        elif row["fastest_s"] > first["slowest_s"]:
            verdict = "slower beyond the spread"
        elif row["slowest_s"] < first["fastest_s"]:
            verdict = "faster beyond the spread"
        else:
            verdict = "within spread"
        out.append({"model": row["model"], "system": row["system"], "against": first["system"],
                    "ratio": row["median_s"] / first["median_s"], "verdict": verdict})
    return out


def comparison_table(comparisons: List[dict]) -> str:
    """Markdown of :func:`compare_systems`."""
    lines = ["| model | system | against | median / median | verdict |", "|---|---|---|---|---|"]
    lines += [f"| {c['model']} | {c['system']} | {c['against']} | {c['ratio']:.2f} | "
              f"{c['verdict']} |" for c in comparisons]  # fmt: skip
    return "\n".join(lines) + "\n"


def _build_all(model: str, system: str, args, out: str,
               log: Callable[[str], None]) -> List[dict]:  # fmt: skip
    builds = []
    for i in range(args.builds):
        base = os.path.join(out, "work", model, system, f"build-{i + 1}")
        shutil.rmtree(base, ignore_errors=True)  # a fresh work dir: nothing reused
        kwargs = dict(system=system, model=model, path=os.path.join(base, "model.so"),
                      work_dir=os.path.join(base, "work"), quick=True, weights=args.weights,
                      threads=args.threads, trials=args.trials)  # fmt: skip
        env = dict(os.environ)
        if not args.reuse_records:
            env[REMEASURE_ENV] = "1" if args.remeasure_calibration else REMEASURED
        sleeping_pool(env)  # the build process times decisions and runs nothing afterwards
        worker = Worker(f"{model}-{system}-build-{i + 1}", build_and_export, kwargs, env=env)
        try:
            result = worker.ready()[0]
        except WorkerFailed as err:
            result = {"status": "error", "reason": str(err)}
        finally:
            worker.close()
        if result.get("status") == "built" and os.path.exists(result.get("path", "")):
            result["library"] = library_digest(result["path"])
        log(f"  {model} {system} build {i + 1}: {result.get('status')} "
            f"({result.get('compile_s', 0):.1f} s)")  # fmt: skip
        builds.append(result)
    return builds


def _time_all(model: str, builds: List[dict], args, log: Callable[[str], None]) -> None:
    """Load every built library in its own worker, check it, time the workers in turns."""
    # lazy: torch is a heavy, optional dependency
    import torch  # pylint: disable=import-outside-toplevel

    spec = get_model(model, quick=True)
    with torch.inference_mode():
        reference = as_numpy_list(spec.module(*spec.example_inputs))
    workers: Dict[int, Worker] = {}
    try:
        for i, build in enumerate(builds):
            if build.get("status") != "built":
                continue
            worker = Worker(f"{model}-{i + 1}", load_exported,
                            dict(path=build["path"], model=model, weights=args.weights))
            try:
                result, outputs = worker.ready()
            except WorkerFailed as err:
                result, outputs = {"status": "error", "reason": str(err)}, None
            build.update(load_s=result.get("load_s"))
            if outputs is not None and check_outcome(result, outputs, reference):
                workers[i] = worker
            else:
                worker.close()
            build.update(status=result["status"], rel_err=result.get("rel_err"),
                         reason=result.get("reason"))  # fmt: skip
        failures: Dict[int, str] = {}

        def settle(previous):
            if previous in workers:
                workers[previous].settle()

        samples = measure_rounds(workers, budget_s=args.budget, min_rounds=args.min_rounds,
                                 settle=settle, failures=failures, protocol=WARM)  # fmt: skip
        for i, sample in samples.items():
            builds[i].update(median_s=sample.median, rounds=len(sample.seconds))
        for i, reason in failures.items():
            builds[i].update(status="error", reason=f"timing failed: {reason}")
            log(f"  {model} build {i + 1}: timing failed: {reason}")
    finally:
        for worker in workers.values():
            worker.close()


def run_stability(args: argparse.Namespace, log: Callable[[str], None] = print) -> dict:
    """Build, time and tabulate every model of ``args``; writes ``stability.json`` and
    ``stability.md`` into ``args.out`` and returns what the JSON holds."""
    os.environ.setdefault("TVM_NUM_THREADS", str(args.threads))  # the workers inherit it
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    results = {"config": {k: v for k, v in vars(args).items() if k != "func"},
               "protocol": WARM.to_dict(), "load": _load(),
               "started": time.strftime("%Y-%m-%d %H:%M:%S"), "models": []}  # fmt: skip
    for model in args.models:
        builds = {system: _build_all(model, system, args, out, log) for system in args.systems}
        _time_all(model, [b for system in args.systems for b in builds[system]], args, log)
        results["models"] += [stability_row(model, builds[system], system)
                              for system in args.systems]  # fmt: skip
        results["comparisons"] = compare_systems(results["models"])
        results["load"] += _load()
        with open(os.path.join(out, "stability.json"), "w", encoding="utf-8") as f:
            json.dump(results, f, indent=1, default=str)
        with open(os.path.join(out, "stability.md"), "w", encoding="utf-8") as f:
            f.write("# Build stability\n\n" + _tables(results, args))
    log(_tables(results, args))
    return results


def _load() -> list:
    """The 1-minute load average now (empty where there is none): the stability run records
    it at its start and after each model, since a loaded machine spreads the builds' times."""
    try:
        return [round(os.getloadavg()[0], 2)]
    except (AttributeError, OSError):
        return []


def _tables(results: dict, args: argparse.Namespace) -> str:
    loads = results.get("load") or []
    text = f"Timed under the {WARM.describe()}"
    text += f"; load average {min(loads):.2f}-{max(loads):.2f}.\n\n" if loads else ".\n\n"
    text += stability_table(results["models"], " / ".join(args.systems), args.weights)
    if results.get("comparisons"):
        text += "\n" + comparison_table(results["comparisons"])
    return text


def build_parser() -> argparse.ArgumentParser:
    """The command line's options."""
    parser = argparse.ArgumentParser(prog="python -m tvm_ollie.bench.stability",
                                     description=__doc__.split("\n\n")[0])  # fmt: skip
    parser.add_argument("--models", nargs="+", required=True, help="zoo models (quick sizes)")
    parser.add_argument("--builds", type=int, default=3, help="builds per model (default 3)")
    parser.add_argument("--systems", "--system", nargs="+", choices=EXPORTABLE, default=["ollie"],
                        help="systems whose builds are compared (default ollie); the first is "
                        "the one the others are compared with")
    parser.add_argument("--weights", choices=("constants", "params"), default="constants")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--trials", type=int, default=0, help="tuning trials per build")
    parser.add_argument("--budget", type=float, default=20.0,
                        help="timing seconds per model (2 s left identical libraries 1.15-1.3x "
                        "apart on this machine: docs/measuring.md)")
    parser.add_argument("--min-rounds", type=int, default=10, help="timing rounds at least")
    parser.add_argument("--remeasure-calibration", action="store_true",
                        help="every build measures this machine's roofline again too (default: "
                        "the first build measures it, the others read it back, as a user's "
                        "second build does)")
    parser.add_argument("--reuse-records", action="store_true",
                        help="builds read back what earlier builds on this machine measured and "
                        "decided (default: every build measures anew)")
    parser.add_argument("--out", default="bench_stability", help="output directory")
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    """Run the stability benchmark; 1 when a build failed or disagreed with eager."""
    results = run_stability(build_parser().parse_args(argv))
    bad = [b for r in results["models"] for b in r["builds"] if not b.get("median_s")]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
