"""``python -m tvm_ollie.bench.crowded``: ollie's library in a process shared with other runtimes.

A user's process often holds PyTorch or ONNX Runtime beside the model tvm-ollie compiled, and
their thread pools compete for the same cores: ONNX Runtime's intra-op threads spin after every
run by default, PyTorch's OpenMP threads wait actively for a while, TVM's pool spins between
kernels. This benchmark builds a model's ollie library once (in a fresh process), then, for
each thread setting, starts a fresh process with that environment which loads the library and
times one call of it in these situations (rotating rounds, :func:`.timing.measure_rounds`):

* ``alone``: nothing else runs;
* ``after torch``: PyTorch eager runs the same model right before each of our calls;
* ``beside a torch thread``: a thread runs PyTorch eager in a loop while we are timed;
* ``after ORT (spinning)``: an ONNX Runtime session (its defaults) runs right before each call;
* ``after ORT (no spinning)``: the same with ``session.intra_op.allow_spinning=0``;
* ``after ORT (spin stops at return)``: the same with ``session.force_spinning_stop=1`` (its
  workers spin during its call, and stop when the call returns);
* ``after a cache sweep``: one thread writes a buffer larger than the last-level cache
  (``--sweep-mb``) right before each call: what any call pays when another model ran before
  it and evicted its weights and activations, with no thread of anyone else's awake;
* ``ORT alone``, ``ORT after torch``, ``ORT after a cache sweep``: ONNX Runtime's own call (its
  defaults) in the same situations, the yardstick: a ratio that ONNX Runtime pays too is the
  caches', not our thread pool's.

Then each runtime's call once more, followed by a pause: the CPU time the process's other
threads burn in the pause (:func:`.spin_after.spin_after`) is what that runtime's idle
workers spin, a number that holds on a loaded machine too.

Only the subject's call is timed, under the benchmark's warm protocol (:data:`.timing.WARM`: untimed
warm-up calls, each with its ``before``, then at least 20 ms of calls). The settings
(:data:`SETTINGS`) are the runtimes' defaults, OpenMP's workers sleeping at once
(``OMP_WAIT_POLICY=PASSIVE``) or after a short spin (``GOMP_SPINCOUNT=10000``: GNU OpenMP's
default is 300,000 polls), and the cores split between us and the others (half the threads
each: "alone" is then our call on our half); ``docs/threads.md`` says what to set::

    python -m tvm_ollie.bench.crowded --model resnet18 --threads 2
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import threading
import time
from typing import Callable, Dict, List, Optional

from ..models import get_model, to_onnx
from .exported import build_and_export, load_exported
from .spin_after import spin_after, spin_table
from .systems import ort_runner
from .timing import calls_for, measure_rounds
from .worker import Worker, WorkerFailed, wait_idle

#: Thread settings, each timed in a fresh process: name -> the variables set (None: removed) and
#: ``others``, the thread count of PyTorch and ONNX Runtime (``"all"``: ``--threads``; ``"rest"``:
#: the cores ours do not take). Since ollie's executables run TVM's kernels on the native
#: library's OpenMP threads (one pool, docs/threads.md), OpenMP's waiting is what our library's
#: workers do between calls, and TVM's pool no longer runs in our calls.
SETTINGS = {
    "defaults": {"env": {"OMP_WAIT_POLICY": None, "GOMP_SPINCOUNT": None}, "others": "all"},
    "OpenMP passive": {"env": {"OMP_WAIT_POLICY": "PASSIVE"}, "others": "all"},
    "OpenMP spin 10k": {"env": {"OMP_WAIT_POLICY": None, "GOMP_SPINCOUNT": "10000"},
                        "others": "all"},
    "cores split": {"env": {"OMP_WAIT_POLICY": None, "GOMP_SPINCOUNT": None}, "split": True,
                    "others": "rest"},
    # the defaults before the native library's stall fallback (docs/threads.md, "Stalled
    # workers"): parallel calls stay parallel after one waited for a descheduled worker
    "no stall fallback": {"env": {"OMP_WAIT_POLICY": None, "GOMP_SPINCOUNT": None,
                                  "TVM_OLLIE_STALL_FALLBACK": "0"}, "others": "all"},
}

#: What a sample's calls are timed with: ``wall`` (the default) or ``thread``, the CPU time of
#: the calling thread (``time.thread_time``). With one thread (``--threads 1``: ours and the
#: others' calls run on the calling thread) the CPU time leaves out the moments another process
#: held the core, so the cache part of a ratio can be measured on a loaded machine; with more
#: threads it misses the workers' time and counts the caller's spinning: use ``wall``.
CLOCKS = {"wall": time.perf_counter, "thread": time.thread_time}

SCENARIOS = ("alone", "after torch", "beside a torch thread", "after ORT (spinning)",
             "after ORT (no spinning)", "after ORT (spin stops at return)", "after a cache sweep",
             "ORT alone", "ORT after torch", "ORT after a cache sweep")  # fmt: skip
#: ONNX Runtime's sessions, by their workers' spinning (session config entries): its default
#: (spin during and after a call), never, or during its call only (``force_spinning_stop``:
#: "forces any thread-pool threads spinning stop immediately when the last of concurrent Run()
#: calls returns", ONNX Runtime's session_options_config_keys.h).
ORT_SESSIONS = {
    "spinning": {},
    "no spinning": {"session.intra_op.allow_spinning": "0"},
    "spin stops at return": {"session.force_spinning_stop": "1"},
}
#: The scenario each row's ratio is taken to (``alone`` for the rest).
BASELINES = {"ORT after torch": "ORT alone", "ORT after a cache sweep": "ORT alone"}
#: Default size of the cache sweep, MiB: above the last-level cache of the development machine
#: (32 MiB L3) and of most servers' per-socket share.
DEFAULT_SWEEP_MB = 64


def cache_sweep(megabytes: int) -> Callable[[], None]:
    """A function that writes every byte of a ``megabytes`` MiB buffer on the calling thread
    (numpy, no OpenMP): it evicts what the caches held, and wakes no worker thread."""
    # lazy: numpy is always installed with the benchmark, but this module's import stays light
    import numpy as np  # pylint: disable=import-outside-toplevel

    buffer = np.zeros(megabytes << 20, np.uint8)

    def sweep() -> None:
        buffer[:] += 1

    return sweep


class BesideSampler:
    """Samples of ``run`` with ``before()`` called (untimed) before each call, or with
    ``background()`` looping on a thread for the whole sample."""

    def __init__(self, run: Callable[[], object], before: Optional[Callable[[], object]] = None,
                 background: Optional[Callable[[], object]] = None,
                 clock: Callable[[], float] = time.perf_counter):  # fmt: skip
        self.run, self.before, self.background = run, before, background
        self.clock = clock

    def calibrate(self, min_sample_s: float) -> int:
        """Calls per sample that last at least ``min_sample_s`` (:func:`.timing.calls_for`;
        ``before`` runs before each call, untimed)."""
        return calls_for(self._timed_call, min_sample_s)

    def _timed_call(self) -> None:
        if self.before is not None:
            self.before()
        self.run()

    def sample(self, number: int, warmup: int = 0) -> float:
        """Mean seconds of our ``number`` calls (only they are timed), after ``warmup``
        untimed ones (each with its ``before``, and in the background's company)."""
        stop = threading.Event()
        thread = None
        if self.background is not None:
            thread = threading.Thread(target=self._loop, args=(stop,), daemon=True)
            thread.start()
        total = 0.0
        try:
            for _ in range(warmup):
                self._timed_call()
            for _ in range(number):
                if self.before is not None:
                    self.before()
                start = self.clock()
                self.run()
                total += self.clock() - start
        finally:
            stop.set()
            if thread is not None:
                thread.join()
        return total / number

    def _loop(self, stop: threading.Event) -> None:
        while not stop.is_set():
            self.background()


def crowded_outcome(path: str, onnx_path: str, model: str, threads: int, budget_s: float,
                    min_rounds: int, others: Optional[int] = None,
                    sweep_mb: int = DEFAULT_SWEEP_MB, clock: str = "wall") -> tuple:  # fmt: skip
    """A worker's factory: load the library, PyTorch's model and two ONNX Runtime sessions in
    this process, time our call (and ONNX Runtime's) in every scenario; ``(result, None,
    None)``. ``others``: the threads of PyTorch and ONNX Runtime (default ``threads``);
    ``clock``: a key of :data:`CLOCKS`."""
    # pylint: disable=import-outside-toplevel
    # lazy: onnxruntime is an optional dependency; torch is a heavy, optional dependency
    import onnxruntime as ort
    import torch

    result, run, _ = load_exported(path, model)
    spec = get_model(model, quick=True)
    others = others or threads
    torch.set_num_threads(others)

    def torch_run():
        with torch.inference_mode():
            spec.module(*spec.example_inputs)

    ort_runs = {}
    for name, config in ORT_SESSIONS.items():
        options = ort.SessionOptions()
        options.intra_op_num_threads = others
        for key, value in config.items():
            options.add_session_config_entry(key, value)
        session = ort.InferenceSession(onnx_path, options, providers=["CPUExecutionProvider"])
        ort_runs[name] = ort_runner(session, spec.example_inputs)
    sweep = cache_sweep(sweep_mb)
    sampler = functools.partial(BesideSampler, clock=CLOCKS[clock])
    samplers = {
        "alone": sampler(run),
        "after torch": sampler(run, before=torch_run),
        "beside a torch thread": sampler(run, background=torch_run),
        "after ORT (spinning)": sampler(run, before=ort_runs["spinning"]),
        "after ORT (no spinning)": sampler(run, before=ort_runs["no spinning"]),
        "after ORT (spin stops at return)": sampler(run, before=ort_runs["spin stops at return"]),
        "after a cache sweep": sampler(run, before=sweep),
        "ORT alone": sampler(ort_runs["spinning"]),
        "ORT after torch": sampler(ort_runs["spinning"], before=torch_run),
        "ORT after a cache sweep": sampler(ort_runs["spinning"], before=sweep),
    }
    samples = measure_rounds(samplers, budget_s=budget_s, min_rounds=min_rounds,
                             settle=lambda _: wait_idle(os.getpid()))  # fmt: skip
    result["median_s"] = {name: s.median for name, s in samples.items()}
    result["rounds"] = min(len(s.seconds) for s in samples.values())
    result["env"] = {k: os.environ.get(k, "unset") for k in
                     ("TVM_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT",
                      "TVM_OLLIE_PARALLEL_RUNTIME", "TVM_OLLIE_STALL_FALLBACK")}
    result["others_threads"] = others
    result["clock"] = clock
    spinners = {"ours": run, "torch": torch_run}
    spinners.update({f"ORT ({name})": call for name, call in ort_runs.items()})
    result["spin_ms"] = {name: spin_after(call) for name, call in spinners.items()}
    return result, None, None


def crowded_table(rows: Dict[str, dict]) -> str:
    """Markdown: a row per scenario, a column per setting: median ms (and x its baseline,
    :data:`BASELINES`: ``alone`` for our call, ``ORT alone`` for ONNX Runtime's)."""
    names = list(rows)
    lines = ["| our call | " + " | ".join(names) + " |", "|" + "---|" * (len(names) + 1)]
    for scenario in SCENARIOS:
        cells = []
        for name in names:
            medians = rows[name].get("median_s") or {}
            value, alone = medians.get(scenario), medians.get(BASELINES.get(scenario, "alone"))
            text = "-" if value is None else f"{value * 1e3:.3f}"
            cells.append(text + (f" ({value / alone:.2f}x)" if value and alone else ""))
        lines.append(f"| {scenario} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _environment(changes: Dict[str, Optional[str]], threads: int) -> Dict[str, str]:
    env = dict(os.environ)
    env["TVM_NUM_THREADS"] = str(threads)
    for key, value in changes.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def split_threads(threads: int, setting: dict) -> tuple:
    """``(ours, others)`` thread counts of a setting: all ``threads`` each, or (``split``) half
    of them ours (at least one) and the rest, at least one, the others'."""
    if not setting.get("split"):
        return threads, threads
    ours = max(1, threads // 2)
    return ours, max(1, threads - ours)


def run_crowded(args: argparse.Namespace, log: Callable[[str], None] = print) -> dict:
    """Build once, time every setting in its own process; writes crowded.json / crowded.md."""

    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    lib = os.path.join(out, "work", f"{args.model}.so")
    build = Worker("build", build_and_export,
                   dict(system="ollie", model=args.model, path=lib, threads=args.threads,
                        work_dir=os.path.join(out, "work", "ollie")),
                   env=_environment({}, args.threads))  # fmt: skip
    try:
        built = build.ready()[0]
    finally:
        build.close()
    log(f"built {args.model} in {built['compile_s']:.1f} s")
    onnx_path = to_onnx(get_model(args.model, quick=True),
                        os.path.join(out, "work", f"{args.model}.onnx"))  # fmt: skip
    rows: Dict[str, dict] = {}
    for name, setting in SETTINGS.items():
        if args.settings and name not in args.settings:
            continue
        ours, others = split_threads(args.threads, setting)
        worker = Worker(name, crowded_outcome,
                        dict(path=lib, onnx_path=onnx_path, model=args.model,
                             threads=ours, budget_s=args.budget,
                             min_rounds=args.min_rounds, others=others,
                             sweep_mb=args.sweep_mb, clock=args.clock),
                        env=_environment(setting["env"], ours))  # fmt: skip
        try:
            rows[name] = worker.ready()[0]
        except WorkerFailed as err:
            rows[name] = {"status": "error", "reason": str(err)}
        finally:
            worker.close()
        log(f"{name}: {rows[name].get('median_s', rows[name].get('reason'))}")
    results = {"config": vars(args), "started": time.strftime("%Y-%m-%d %H:%M:%S"),
               "build": built, "settings": rows}  # fmt: skip
    table = crowded_table(rows) + "\n" + spin_table(rows)
    with open(os.path.join(out, "crowded.json"), "w", encoding="utf-8") as f:
        json.dump(results, f, indent=1, default=str)
    with open(os.path.join(out, "crowded.md"), "w", encoding="utf-8") as f:
        f.write(f"# {args.model} (quick) in a crowded process, {args.threads} threads\n\n"
                + table)
    log(table)
    return results


def build_parser() -> argparse.ArgumentParser:
    """The command line's options."""
    parser = argparse.ArgumentParser(prog="python -m tvm_ollie.bench.crowded",
                                     description=__doc__.split("\n\n")[0])  # fmt: skip
    parser.add_argument("--model", default="resnet18", help="zoo model (quick size)")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                        help="threads of every runtime (default: all cores)")
    parser.add_argument("--budget", type=float, default=3.0, help="timing seconds per setting")
    parser.add_argument("--min-rounds", type=int, default=15, help="timing rounds at least")
    parser.add_argument("--settings", nargs="*", choices=list(SETTINGS), default=None,
                        help="time only these settings (default: all)")
    parser.add_argument("--clock", choices=list(CLOCKS), default="wall",
                        help="wall time, or the calling thread's CPU time (--threads 1 only)")
    parser.add_argument("--sweep-mb", type=int, default=DEFAULT_SWEEP_MB,
                        help="MiB written by the cache sweep (above the last-level cache)")
    parser.add_argument("--out", default="bench_crowded", help="output directory")
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    """Run the crowded-process benchmark; 1 when a setting failed."""
    results = run_crowded(build_parser().parse_args(argv))
    return 1 if any("median_s" not in r for r in results["settings"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
