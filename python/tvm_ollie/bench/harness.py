"""``run_bench``: build every model in every system, check outputs, time them in rounds.

For each model: PyTorch eager on CPU gives the reference outputs; every system is prepared
(a missing package or device marks its column skipped; any other failure is recorded as an
error and the run goes on); each system's outputs are compared with the reference
(:mod:`.check`) and only systems that agree are timed, in rounds with rotating order
(:mod:`.timing`). In the isolated mode (the default) each system is prepared and timed in a
worker process of its own, the workers taking turns (:mod:`.isolated`); in the interleaved
mode all systems share this process. Each system's ratio to the reference system is the median
of per-round ratios.
The model's FLOPs and bytes come from its Relax module (:mod:`.roofline`); the machine's peaks
are measured once at the start. Results are written after every model (JSON + Markdown) and
plotted at the end.
"""

from __future__ import annotations

import gc
import os
import platform
import time
from typing import Callable, Dict, Iterable, List, Optional

from ..models import get_model, list_models
from . import report
from .check import as_numpy_list
from .env import configure_threads, runtime_default_environ
from .isolated import bench_systems_isolated
from .outcome import check_outcome, prepare_outcome
from ..tune.evidence import machine_load
from .roofline import count_module, measure_cpu_peaks, measure_cuda_peaks
from .systems import BenchContext, get_system
from .timing import (PROTOCOLS, Protocol, measure_interleaved, paired_ratio,
                     paired_ratio_quartiles)

DEFAULT_SYSTEMS = ("ollie", "ollie-lib", "tvm", "onnxruntime", "torch", "torch_compile")

#: How systems are timed: each in a worker process of its own, or all in this process.
MODES = ("isolated", "interleaved")

#: By default a system whose one call lasts this share of the timing budget or more is timed
#: once instead of in the rounds (:func:`.timing.measure_rounds`' ``slow_call_s``): 4 s at paper
#: sizes (20 s budget), where TVM's untuned kernels take 1-55 s a call; the rounds' five
#: samples of it would outlast the budget alone.
SLOW_CALL_SHARE = 0.2

#: ... and never below this many seconds: with a short budget (0.05 s in a test) a share of it
#: is a call that a load spike can stretch, and a system timed once has no quartiles.
SLOW_CALL_FLOOR_S = 1.0


def run_bench(
    models: Optional[Iterable[str]] = None,
    quick: bool = False,
    trials: int = 0,
    target: str = "llvm",
    out_dir: str = "bench_results",
    systems: Optional[Iterable[str]] = None,
    reference: str = "ollie",
    batch: int = 1,
    work_dir: Optional[str] = None,
    threads: Optional[int] = None,
    time_budget_s: Optional[float] = None,
    min_rounds: Optional[int] = None,
    plot: bool = True,
    log: Callable[[str], None] = print,
    weights: str = "constants",
    mode: str = "isolated",
    protocol: str = "warm",
    slow_call_s: Optional[float] = None,
) -> dict:
    """Run the benchmark and write ``results.json``, ``results.md`` (and ``speedups.png``).

    Parameters
    ----------
    models : iterable of str, optional
        Model names (default: all registered models).
    quick : bool
        Use the small model sizes.
    trials : int
        MetaSchedule trials per model for TVM-based systems (0: TVM's untuned default pipeline).
    target : str
        ``"llvm"`` or ``"cuda"``.
    out_dir : str
        Where the results go.
    systems : iterable of str, optional
        System names (default :data:`DEFAULT_SYSTEMS`).
    reference : str
        System every other one is compared with, pair by pair.
    batch : int
        Batch size.
    work_dir : str, optional
        Persistent directory for tuning databases and exported files (default
        ``<out_dir>/work``); reusing it skips re-tuning.
    threads : int, optional
        Threads for every system (default: all cores). Sets ``TVM_NUM_THREADS`` and passive
        waiting for the thread pools if unset (see :mod:`.env`); the isolated mode's workers
        get the thread count but keep each runtime's own waiting.
    time_budget_s : float, optional
        Timing budget per model (default 10 s quick, 20 s full: the machine's speed drifts
        over seconds, and 2 s left the same library 1.15-1.3x apart, docs/measuring.md).
    min_rounds : int, optional
        Timing rounds per model at least, whatever the budget (more rounds: a narrower spread of
        the per-round ratios, reported as their quartiles). Default: 5, or 3 when one round
        alone outlasts the budget (:func:`.timing.measure_interleaved`).
    plot : bool
        Write the matplotlib plot (skipped with a note if matplotlib is missing).
    log : callable
        Progress messages.
    weights : str
        How the TVM-based systems get the weights: ``"constants"`` (the default: bound into the
        module, as TVM's importers and ``tvm-ollie compile`` give them; the compiler folds what
        is computed from them) or ``"params"`` (runtime parameters of ``main``, fed on every
        call).
    mode : str
        ``"isolated"`` (the default): each system prepared and timed in a fresh worker process
        of its own, one worker running at a time, each runtime with its own thread defaults
        (:mod:`.isolated`); ``"interleaved"``: all systems in this process, with passive
        waiting for every thread pool (:mod:`.env`).
    protocol : str
        What a sample measures (:mod:`.timing`): ``"warm"`` (the default: untimed warm-up
        calls, then at least 20 ms of back-to-back calls; the warm steady state) or ``"cold"``
        (one call right after the other systems ran). Recorded in ``results.json``.
    slow_call_s : float, optional
        A system whose one call lasts at least this long is timed once (one call after an
        untimed one, ``timed_once`` in its result, no quartiles) instead of in the rounds.
        Default: :data:`SLOW_CALL_SHARE` of the budget, at least :data:`SLOW_CALL_FLOOR_S`;
        0: every system in the rounds.

    Returns
    -------
    dict
        The results (as written to ``results.json``).
    """

    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol must be one of {sorted(PROTOCOLS)}, not {protocol!r}")
    proto = PROTOCOLS[protocol]
    models = list(models) if models else list_models()
    systems = list(systems) if systems else list(DEFAULT_SYSTEMS)
    for name in systems:
        get_system(name)  # unknown names fail early
    threads = int(threads or os.cpu_count() or 1)
    thread_env = configure_threads(threads)
    budget = time_budget_s if time_budget_s is not None else (10.0 if quick else 20.0)
    slow_call_s = default_slow_call_s(budget) if slow_call_s is None else slow_call_s
    os.makedirs(out_dir, exist_ok=True)
    ctx = BenchContext(target, threads, trials, work_dir or os.path.join(out_dir, "work"),
                       weights=weights, ort_spinning=mode == "isolated")
    worker_env = runtime_default_environ() if mode == "isolated" else None

    peaks = measure_cuda_peaks() if target == "cuda" else measure_cpu_peaks()
    results = {
        "config": {
            "models": models, "systems": systems, "reference": reference, "quick": quick,
            "trials": trials, "target": target, "batch": batch, "threads": threads,
            "weights": weights, "mode": mode, "protocol": proto.to_dict(),
            "thread_env": thread_env,
            "worker_thread_env": None if worker_env is None else {
                k: worker_env[k] for k in thread_env if k in worker_env},
            "time_budget_s": budget, "min_rounds": min_rounds, "slow_call_s": slow_call_s,
            "machine": platform.machine(),
            "processor": platform.processor(), "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        },
        "peaks": None if peaks is None else vars(peaks),
        "models": {},
    }  # fmt: skip
    log(f"peaks: {report.describe_peaks(peaks)}")
    for name in models:
        start, load_before = time.perf_counter(), machine_load()
        spec = get_model(name, quick=quick, batch=batch)
        entry = bench_model(spec, systems, reference, ctx, peaks, budget, log, min_rounds,
                            worker_env=worker_env, protocol=proto, slow_call_s=slow_call_s)
        entry["wall_s"] = time.perf_counter() - start
        entry["load"] = [v for v in (load_before, machine_load()) if v is not None]
        results["models"][name] = entry
        report.write_results(results, out_dir)
        log(report.model_line(name, entry, reference))
        del spec
        gc.collect()
    results["config"]["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
    report.write_results(results, out_dir)
    if plot:
        note = report.plot_ratios(results, os.path.join(out_dir, "speedups.png"))
        if note:
            log(note)
    return results


def default_slow_call_s(budget_s: float) -> float:
    """The call length from which a system is timed once (``slow_call_s``) for a timing
    budget of ``budget_s``: :data:`SLOW_CALL_SHARE` of it, at least :data:`SLOW_CALL_FLOOR_S`."""
    return max(SLOW_CALL_SHARE * budget_s, SLOW_CALL_FLOOR_S)


def bench_model(spec, systems: List[str], reference: str, ctx: BenchContext, peaks,
                budget_s: float, log: Callable[[str], None],
                min_rounds: Optional[int] = None,
                worker_env: Optional[Dict[str, str]] = None,
                protocol: Optional[Protocol] = None,
                slow_call_s: Optional[float] = None) -> dict:  # fmt: skip
    """Prepare, check and time ``systems`` on one model; returns the model's result entry.

    ``worker_env`` given: the isolated mode (each system in a worker with that environment,
    :func:`.isolated.bench_systems_isolated`); None: every system in this process.
    ``protocol``: what a sample measures (default :data:`.timing.WARM`); ``slow_call_s``: a
    system with calls at least this long is timed once (:func:`.timing.measure_rounds`).
    """
    # lazy: torch is a heavy, optional dependency
    import torch  # pylint: disable=import-outside-toplevel

    with torch.inference_mode():
        ref_outputs = as_numpy_list(spec.module(*spec.example_inputs))
    entry: dict = {"description": spec.description, "input_shapes": spec.input_shapes,
                   "paper": spec.paper, "systems": {}}  # fmt: skip
    counts = None
    try:
        mod = ctx.relax_module(spec)[0]
        counts = count_module(mod)
        entry.update(flops=counts.flops, bytes=counts.bytes, bytes_min=counts.bytes_min)
        if peaks is not None:
            entry.update(bound_s=counts.bound_s(peaks), bound_min_s=counts.bound_min_s(peaks))
    except Exception as err:  # pylint: disable=broad-except
        entry["counts_error"] = f"{type(err).__name__}: {err}"
    rounds = {} if min_rounds is None else dict(
        min_rounds=min_rounds, hard_min_rounds=min_rounds, max_rounds=max(200, min_rounds))
    rounds["protocol"] = protocol
    rounds["slow_call_s"] = slow_call_s
    if worker_env is not None:
        ctx_kwargs = dict(target=ctx.target_kind, threads=ctx.threads, trials=ctx.trials,
                          work_dir=ctx.work_dir, weights=ctx.weights,
                          ort_spinning=ctx.ort_spinning)  # fmt: skip
        entry["systems"], samples = bench_systems_isolated(
            spec, systems, ctx_kwargs, ref_outputs, dict(budget_s=budget_s, **rounds), log,
            env=worker_env)  # fmt: skip
    else:
        runs: Dict[str, Callable] = {}
        for name in systems:
            result, run, outputs = prepare_outcome(name, spec, ctx, log)
            entry["systems"][name] = result
            if outputs is not None and check_outcome(result, outputs, ref_outputs):
                runs[name] = run
        samples = measure_interleaved(runs, budget_s=budget_s, **rounds) if runs else {}
    for name, sample in samples.items():
        result = entry["systems"][name]
        result["median_s"] = sample.median
        result["rounds"] = len(sample.seconds)
        result["calls_per_sample"] = sample.number
        result["warmup_calls"] = sample.warmup
        if sample.once:
            result["timed_once"] = True
        if reference in samples:
            result["ratio_to_ref"] = paired_ratio(sample, samples[reference])
            result["ratio_quartiles"] = paired_ratio_quartiles(sample, samples[reference])
        if "bound_s" in entry:
            result["roofline_fraction"] = entry["bound_s"] / sample.median
            result["roofline_min_fraction"] = entry["bound_min_s"] / sample.median
        guard_agreement(result)
    return entry


def guard_agreement(result: dict) -> None:
    """Set ``guard_vs_fresh`` (per guard of the build: ``{"plans": ratio, "model_guard":
    ratio}``) to the guard's timing of the plan it kept (``kept_s``) over the benchmark's fresh
    timing of the finished executable (``median_s``): near 1 when the guard's rounds measured
    what the benchmark measures; far from 1, the guard decided on other conditions (load, a
    cold machine, tuning after the guard), and its verdict is to be read with that in mind."""
    fresh = result.get("median_s")
    ratios = {key: result[key]["kept_s"] / fresh for key in ("plans", "model_guard")
              if fresh and isinstance(result.get(key), dict) and result[key].get("kept_s")}
    if ratios:
        result["guard_vs_fresh"] = ratios
