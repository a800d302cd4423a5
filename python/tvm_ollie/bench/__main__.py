"""``python -m tvm_ollie.bench``: the benchmark command line (also ``tvm-ollie bench``)."""

from __future__ import annotations

import argparse
import os
import sys
from typing import List, Optional

from ..models import list_models
from .env import ADDED_VAR, PASSIVE_WAIT, configure_threads
from .harness import run_bench
from .systems import list_systems


def build_parser(parser: Optional[argparse.ArgumentParser] = None) -> argparse.ArgumentParser:
    """Add the bench options to ``parser`` (or a new one); the CLI reuses this."""
    parser = parser or argparse.ArgumentParser(
        prog="python -m tvm_ollie.bench",
        description="Compare TVM, ONNX Runtime, PyTorch and torch.compile on the model zoo.",
    )
    parser.add_argument("--models", nargs="+", help="model names (default: all)")
    parser.add_argument("--quick", action="store_true", help="small sizes and time budget")
    parser.add_argument("--trials", type=int, default=0,
                        help="MetaSchedule trials per model for TVM (0: untuned default pipeline)")
    parser.add_argument("--target", choices=("llvm", "cuda"), default="llvm")
    parser.add_argument("--out", default="bench_results", help="output directory")
    parser.add_argument("--work-dir", help="tuning database directory (default OUT/work)")
    parser.add_argument("--systems", nargs="+", help="systems to compare (default: all baselines)")
    parser.add_argument("--reference", default="ollie", help="system the ratios are relative to")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--weights", choices=("constants", "params"), default="constants",
                        help="TVM-based systems: weights bound as constants (default), as "
                             "TVM's importers and tvm-ollie compile give them (transformations "
                             "of them fold at compile time), or runtime parameters of main")
    parser.add_argument("--mode", choices=("isolated", "interleaved"), default="isolated",
                        help="isolated (default): each system prepared and timed in a worker "
                             "process of its own, the workers taking turns; interleaved: all "
                             "systems in one process, every thread pool waiting passively")
    parser.add_argument("--cold", action="store_true",
                        help="time one call per sample right after the other systems ran (a "
                             "call after idle time), not the default warm steady state "
                             "(untimed warm-up calls, then at least 20 ms of back-to-back calls)")
    parser.add_argument("--threads", type=int, help="threads per system (default: all cores)")
    parser.add_argument("--budget", type=float, help="timing budget per model in seconds")
    parser.add_argument("--min-rounds", type=int,
                        help="timing rounds per model at least, whatever the budget (default 5, "
                        "3 when one round outlasts the budget)")
    parser.add_argument("--slow-call-s", type=float,
                        help="a system whose one call lasts at least this long is timed once "
                             "(one call after an untimed one) instead of in the rounds "
                             "(default: a fifth of the budget, at least 1 s; 0: never)")
    parser.add_argument("--no-plot", action="store_true")
    parser.add_argument("--list", action="store_true", help="list models and systems and exit")
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    """Parse ``argv`` and run the benchmark; returns the exit status."""
    restart = ["-m", "tvm_ollie.bench", *sys.argv[1:]] if argv is None else None
    return run_from_args(build_parser().parse_args(argv), restart_argv=restart)


def restart_with_thread_env(threads: int, restart_argv: Optional[List[str]]) -> None:
    """Restart the process when torch was loaded before the thread environment was set.

    OpenMP reads its wait policy when torch loads it, and ``import tvm`` (hence ``import
    tvm_ollie``) already imports torch when it is installed, so a command line cannot set the
    policy in time from inside the process. The restarted process inherits the variables from
    its start; a marker variable prevents a second restart. Library calls (``restart_argv`` is
    None) never restart.
    """

    if (restart_argv is None or "torch" not in sys.modules
            or all(key in os.environ for key in PASSIVE_WAIT)
            or os.environ.get("TVM_OLLIE_BENCH_RESTARTED")):
        return
    env = dict(os.environ, TVM_OLLIE_BENCH_RESTARTED="1")
    env.setdefault("TVM_NUM_THREADS", str(int(threads)))
    env[ADDED_VAR] = ",".join(key for key in PASSIVE_WAIT if key not in env)
    for key, value in PASSIVE_WAIT.items():
        env.setdefault(key, value)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *restart_argv], env)


def run_from_args(args: argparse.Namespace, restart_argv: Optional[List[str]] = None) -> int:
    """Run the benchmark for parsed arguments (shared with the ``tvm-ollie`` CLI).

    The thread environment must be set before torch starts OpenMP (see :mod:`.env`): from a
    command line (``restart_argv``: the arguments after the interpreter that rerun the same
    command) the process restarts itself with it set when torch is already loaded.
    """

    restart_with_thread_env(args.threads or os.cpu_count() or 1, restart_argv)
    configure_threads(args.threads or os.cpu_count() or 1)

    if args.list:
        print("models: " + " ".join(list_models()))
        print("systems: " + " ".join(list_systems()))
        return 0
    unknown = set(args.models or []) - set(list_models())
    if unknown:
        print(f"unknown models: {', '.join(sorted(unknown))}", file=sys.stderr)
        return 2
    results = run_bench(
        models=args.models, quick=args.quick, trials=args.trials, target=args.target,
        out_dir=args.out, systems=args.systems, reference=args.reference, batch=args.batch,
        work_dir=args.work_dir, threads=args.threads, time_budget_s=args.budget,
        min_rounds=getattr(args, "min_rounds", None), plot=not args.no_plot,
        weights=getattr(args, "weights", "constants"), mode=getattr(args, "mode", "isolated"),
        protocol="cold" if getattr(args, "cold", False) else "warm",
        slow_call_s=getattr(args, "slow_call_s", None),
    )  # fmt: skip
    print(f"\nwrote {args.out}/results.json, results.md")
    failed = [(m, s) for m, e in results["models"].items() for s, r in e["systems"].items()
              if r.get("status") in ("error", "mismatch")]  # fmt: skip
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
