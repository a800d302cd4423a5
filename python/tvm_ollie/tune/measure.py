"""Compile a Relax module (optionally with tuning records) and time it, here or on a remote device.

Builds are always local; :func:`time_main` times on this machine's device of the target's kind,
or, given an :class:`~.rpc.RPCConfig`, exports the executable and times it on a device behind
the RPC tracker (:func:`.rpc.time_remote`).
"""

from __future__ import annotations

import time
from typing import Optional, Sequence

import numpy as np

from ..compat import relax, tvm
from ..ir.nodes import numpy_dtype
from .compare import Sampler, calls_per_sample, clocked
from .metaschedule import Tuner, default_pipeline, legalize_and_fuse, normalize_target
from .rpc import RPCConfig, time_remote

__all__ = ["compile_module", "device_kind", "main_sampler", "random_args", "target_device",
           "time_main"]


def compile_module(mod: "tvm.IRModule", target, tuner: Optional[Tuner] = None,
                   trials: int = 0, orchestrate: bool = False,
                   orchestrate_config=None) -> "tvm.runtime.Executable":
    """Legalize and fuse ``mod``, tune its untuned tasks (``trials``), apply the records, build.

    Without a tuner this is ``tvm.compile(mod, target)`` with :func:`default_pipeline` (TVM's
    default pipeline; on llvm plus default CPU schedules for the kernels nothing scheduled;
    with ``orchestrate``, kernel orchestration instead of TVM's greedy fusion, limited by
    ``orchestrate_config``). ``trials`` is the tuner's budget for all of ``mod``. With a tuner
    and ``orchestrate``, the kernels tuned and built are the ones orchestration chose
    (:func:`tvm_ollie.orchestrate.tuned.ollie_tuned_build`: the same fission and CPU
    schedules as the untuned build).
    """
    target = normalize_target(target)
    if tuner is None:
        return tvm.compile(mod, target=target,
                           relax_pipeline=default_pipeline(
                               target, orchestrate=orchestrate,
                               orchestrate_config=orchestrate_config))
    if orchestrate:
        from ..orchestrate.tuned import ollie_tuned_build  # pylint: disable=C0415

        return ollie_tuned_build(mod, target, tuner, trials, config=orchestrate_config)
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


def device_kind(target) -> str:
    """The runtime device name of a target (``"cpu"`` for llvm/c, else the target kind)."""
    kind = normalize_target(target).kind.name
    return "cpu" if kind in ("llvm", "c") else kind


def target_device(target=None) -> "tvm.runtime.Device":
    """Device 0 of ``target``'s kind (:func:`device_kind`; the CPU without a target): where an
    executable built for ``target`` runs, so that a CUDA build is never run on the host."""
    return tvm.device(device_kind(target) if target is not None else "cpu", 0)


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
                 device=None, floor_s: float = 1e-3) -> Sampler:
    """A :data:`~.compare.Sampler` of ``main`` for :func:`~.compare.compare`: one sample is
    an untimed warm-up call, then the seconds per call of enough calls to last about
    ``floor_s`` (counted on a timed call after a warm-up call), each ending with a device
    synchronization off the CPU."""
    dev = device if device is not None else target_device(target)
    main = relax.VirtualMachine(ex, dev)["main"]
    targs = [tvm.runtime.tensor(a, dev) for a in args]
    sync = dev.dlpack_device_type() != tvm.cpu(0).dlpack_device_type()

    def run():
        main(*targs)
        if sync:
            dev.sync()

    run()
    start = time.perf_counter()
    run()
    return clocked(run, calls_per_sample(time.perf_counter() - start, floor_s), warmup=1)
