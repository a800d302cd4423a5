"""Compile a Relax module (optionally with tuning records) and time it on this machine."""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from ..compat import relax, tvm
from .metaschedule import Tuner, default_pipeline, legalize_and_fuse, normalize_target

__all__ = ["compile_module", "random_args", "time_main"]


def compile_module(mod: "tvm.IRModule", target, tuner: Optional[Tuner] = None,
                   trials: int = 0) -> "tvm.runtime.Executable":
    """Legalize and fuse ``mod``, tune its untuned tasks (``trials``), apply the records, build.

    Without a tuner this is ``tvm.compile(mod, target)`` with :func:`default_pipeline` (TVM's
    default pipeline; on llvm plus default CPU schedules for the kernels nothing scheduled).
    """
    target = normalize_target(target)
    if tuner is None:
        return tvm.compile(mod, target=target, relax_pipeline=default_pipeline(target))
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
        out.append(rng.standard_normal(shape).astype(str(p.ty.dtype)))
    return out


def time_main(ex: "tvm.runtime.Executable", args: Sequence[np.ndarray], device=None,
              number: int = 5, repeat: int = 5) -> float:
    """Median seconds of one call of ``main`` (Relax VM ``time_evaluator``)."""
    dev = device if device is not None else tvm.cpu()
    vm = relax.VirtualMachine(ex, dev)
    targs = [tvm.runtime.tensor(a, dev) for a in args]
    vm["main"](*targs)
    res = vm.time_evaluator("main", dev, number=number, repeat=repeat, min_repeat_ms=0)(*targs)
    return float(res.median)
