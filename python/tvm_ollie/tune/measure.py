"""Compile a Relax module (optionally with tuning records) and time it, here or on a remote device.

Builds are always local; :func:`time_main` times on this machine's device of the target's kind,
or, given an :class:`~.rpc.RPCConfig`, exports the executable and times it on a device behind
the RPC tracker (:func:`.rpc.time_remote`).
"""

from __future__ import annotations

import time
from typing import Callable, Optional, Sequence

import numpy as np

from ..compat import relax, tvm
from ..ir.nodes import numpy_dtype
from ..target import device_kind, normalize_target, target_device
from .compare import Sampler, calls_per_sample, clocked
from .metaschedule import Tuner, default_pipeline, legalize_and_fuse
from .rpc import RPCConfig, time_remote

__all__ = ["LONG_CALL_S", "calibrated_sampler", "compile_module", "device_kind", "main_sampler",
           "random_args", "target_device", "time_main"]

#: ``tuned_build(mod, target, tuner, trials) -> Executable``: a tuned build other than
#: legalize-fuse-tune-apply (kernel orchestration's).
TunedBuild = Callable[["tvm.IRModule", "tvm.target.Target", Tuner, int],
                      "tvm.runtime.Executable"]


def compile_module(mod: "tvm.IRModule", target, tuner: Optional[Tuner] = None,
                   trials: int = 0, pipeline: Optional["tvm.transform.Pass"] = None,
                   tuned_build: Optional[TunedBuild] = None) -> "tvm.runtime.Executable":
    """Legalize and fuse ``mod``, tune its untuned tasks (``trials``), apply the records, build.

    Without a tuner this is ``tvm.compile(mod, target)`` with ``pipeline`` (default:
    :func:`default_pipeline`, TVM's default pipeline; on llvm plus default CPU schedules for
    the kernels nothing scheduled). ``trials`` is the tuner's budget for all of ``mod``. With a
    tuner, ``tuned_build(mod, target, tuner, trials)`` replaces the fusion, tuning and build
    when given (kernel orchestration's: :func:`tvm_ollie.pipeline.compile_module` passes
    :func:`tvm_ollie.orchestrate.tuned.ollie_tuned_build`).
    """
    target = normalize_target(target)
    if tuner is None:
        return tvm.compile(mod, target=target,
                           relax_pipeline=pipeline if pipeline is not None
                           else default_pipeline(target))
    if tuned_build is not None:
        return tuned_build(mod, target, tuner, trials)
    fused = legalize_and_fuse(mod, target)
    if trials > 0:
        tuner.tune(fused, trials)
    fused = tuner.apply(fused)
    return tvm.compile(fused, target=target, relax_pipeline=default_pipeline(target))


def random_args(func: "relax.Function", seed: int = 0) -> list:
    """Random float arrays for every tensor parameter of a Relax function."""
    rng = np.random.default_rng(seed)
    out = []
    for p in func.params:
        shape = tuple(int(s) for s in p.ty.shape)
        out.append(rng.standard_normal(shape).astype(numpy_dtype(str(p.ty.dtype))))
    return out


def time_main(ex: "tvm.runtime.Executable", args: Sequence[np.ndarray], device=None,
              number: int = 5, repeat: int = 5, rpc: Optional[RPCConfig] = None,
              target=None, stat: str = "median") -> float:
    """Median (or fastest, ``stat="min"``) seconds of one call of ``main`` (Relax VM
    ``time_evaluator``).

    Parameters
    ----------
    ex : Executable
        The compiled module.
    args : sequence of ndarray
        Inputs of ``main``.
    device : Device, optional
        Local device to time on; default: device 0 of ``target``'s kind (the CPU without a
        target), so a CUDA executable is timed on the GPU and not on the host.
    number, repeat : int
        ``time_evaluator`` settings; the median of ``repeat`` averages of ``number`` runs.
    rpc : RPCConfig, optional
        Time on a device of ``target``'s kind behind this RPC tracker instead (the executable
        is exported, uploaded and loaded there); raises :class:`~.rpc.RPCError` on failure.
    target : str | dict | Target, optional
        The target ``ex`` was built for (selects the device kind).
    stat : str
        ``"median"`` of the ``repeat`` averages, or their ``"min"``: what the machine can reach,
        the robust choice for ranking implementations on a machine other processes share
        (remote timings always report the median).
    """
    if stat not in ("median", "min"):
        raise ValueError(f"time_main: stat must be 'median' or 'min', not {stat!r}")
    kind = device_kind(target) if target is not None else "cpu"
    if rpc is not None:
        if device is not None:
            raise ValueError("time_main: give either a local device or rpc, not both")
        return time_remote(ex, args, rpc, kind, number=number, repeat=repeat)
    dev = device if device is not None else target_device(target)
    vm = relax.VirtualMachine(ex, dev)
    targs = [tvm.runtime.tensor(a, dev) for a in args]
    vm["main"](*targs)
    res = vm.time_evaluator("main", dev, number=number, repeat=repeat, min_repeat_ms=0)(*targs)
    return float(res.min if stat == "min" else res.median)


def main_sampler(ex: "tvm.runtime.Executable", args: Sequence[np.ndarray], target=None,
                 device=None, floor_s: float = 1e-3, function: str = "main") -> Sampler:
    """A :data:`~.compare.Sampler` of ``main`` (or of ``function``: one function of an
    executable several share, :mod:`tvm_ollie.transform.batched`) for
    :func:`~.compare.compare`: one sample is an untimed warm-up call, then the seconds per
    call of enough calls to last about ``floor_s`` (counted on a timed call after a warm-up
    call), each ending with a device synchronization off the CPU; a call of
    :data:`LONG_CALL_S` or more is sampled alone (:func:`calibrated_sampler`)."""
    dev = device if device is not None else target_device(target)
    main = relax.VirtualMachine(ex, dev)[function]
    targs = [tvm.runtime.tensor(a, dev) for a in args]
    sync = dev.dlpack_device_type() != tvm.cpu(0).dlpack_device_type()

    def run():
        main(*targs)
        if sync:
            dev.sync()

    return calibrated_sampler(run, floor_s)


#: Seconds of a warm-up call from which :func:`calibrated_sampler` neither calls again to count
#: the calls per sample nor warms up before each sample: at paper size TVM's untuned
#: alternatives take 15-30 s a call (Longformer's attention projections, Segformer's decode
#: head, docs/benchmarks.md) and each of those calls cost a decision as much again; a call of
#: a second or more neither needs warm caches nor leaves a sample short of ``floor_s``.
LONG_CALL_S = 1.0


def calibrated_sampler(run: Callable[[], object], floor_s: float = 1e-3,
                       clock: Callable[[], float] = time.perf_counter,
                       long_call_s: float = LONG_CALL_S) -> Sampler:
    """The sampler of :func:`main_sampler` for ``run``: after a warm-up call, a timed call
    counts the calls per sample and each sample warms up once first; a warm-up call of
    ``long_call_s`` or more is followed by nothing, and each sample is one call."""
    start = clock()
    run()
    if clock() - start >= long_call_s:
        return clocked(run, 1, clock)
    start = clock()
    run()
    return clocked(run, calls_per_sample(clock() - start, floor_s), clock, warmup=1)
