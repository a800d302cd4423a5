"""The isolated mode: every system prepared and timed in a fresh process of its own.

In one process the runtimes' thread pools get in each other's way (ONNX Runtime's workers spin
after every run by default, TVM's pool, oneDNN's and PyTorch's OpenMP all live together): on
the 2-core machine ResNet-18 took 0.57 ms alone in ollie and 2.57 ms interleaved with the
others in one process. Here each system of a model gets its own worker (:mod:`.worker`),
prepared one after the other (so builds and the ollie build's own measurements run on an idle
machine); the coordinator checks the outputs each worker ships back against PyTorch eager and
then times the workers in rotating rounds (:func:`.timing.measure_rounds`): worker A takes a
sample while the others block on their pipes, the coordinator waits until A's threads are idle,
then B takes one, and so on, the order rotating every round. Machine drift is shared as in the
interleaved mode and the per-round ratios are computed the same way, but no runtime runs, or
spins, while another is timed, and every runtime keeps its own defaults (ONNX Runtime spins,
TVM's pool spins, OpenMP waits as configured) as in a user's process.
"""

from __future__ import annotations

from typing import Callable, Dict, List, Optional

from ..models import get_model
from .outcome import Outcome, check_outcome, prepare_outcome
from .systems import BenchContext, get_system
from .timing import Samples, measure_rounds
from .worker import Worker, WorkerFailed


def system_outcome(system: str, model: str, quick: bool, batch: int, ctx_kwargs: dict) -> Outcome:
    """The worker's factory: build the model (seeded: the coordinator's weights and inputs)
    and prepare ``system`` on it (:func:`.outcome.prepare_outcome`)."""

    spec = get_model(model, quick=quick, batch=batch)
    return prepare_outcome(system, spec, BenchContext(**ctx_kwargs))


def registering_modules(system: str) -> List[str]:
    """Modules a worker must import to know ``system``: where its prepare function is defined,
    when that is outside the package (a system registered by a script or a test)."""
    module = get_system(system).prepare.__module__
    return [] if module.startswith("tvm_ollie.") else [module]


def bench_systems_isolated(
    spec, systems: List[str], ctx_kwargs: dict, ref_outputs: list, timing: dict,
    log: Callable[[str], None] = print, env: Optional[Dict[str, str]] = None,
) -> tuple:  # fmt: skip
    """Prepare, check and time ``systems`` on ``spec``, each in its own worker.

    Parameters
    ----------
    spec : ModelSpec
        The model (its name, size and batch are rebuilt in each worker).
    systems : list of str
    ctx_kwargs : dict
        :class:`.BenchContext` arguments for every worker.
    ref_outputs : list of numpy arrays
        PyTorch eager's outputs.
    timing : dict
        Keyword arguments of :func:`.timing.measure_rounds` (budget, rounds).
    log : callable
    env : dict, optional
        The workers' environment (default: this process's).

    Returns
    -------
    (dict, dict)
        Per system its result entry, and the samples of those timed.
    """
    results: Dict[str, dict] = {}
    workers: Dict[str, Worker] = {}
    try:
        for name in systems:
            worker = Worker(name, system_outcome,
                            dict(system=name, model=spec.name, quick=spec.quick, batch=spec.batch,
                                 ctx_kwargs=ctx_kwargs),
                            modules=registering_modules(name), env=env)  # fmt: skip
            try:
                result, outputs = worker.ready()
            except WorkerFailed as err:
                log(f"  {spec.name}/{name}: {err}")
                result, outputs = {"status": "error", "reason": str(err)}, None
            results[name] = result
            if outputs is not None and check_outcome(result, outputs, ref_outputs):
                workers[name] = worker
            else:
                worker.close()
        failures: Dict[str, str] = {}

        def settle(previous: Optional[str]) -> None:
            if previous in workers:
                workers[previous].settle()

        samples: Dict[str, Samples] = measure_rounds(workers, settle=settle, failures=failures,
                                                     **timing)  # fmt: skip
        for name, reason in failures.items():
            log(f"  {spec.name}/{name}: timing failed: {reason}")
            results[name].update(status="error", reason=f"timing failed: {reason}")
    finally:
        for worker in workers.values():
            worker.close()
    return results, samples
