"""Cost of a candidate kernel: one interface, an analytic and a measured model.

* :class:`AnalyticCost`: the roofline of the whole kernel plus a launch overhead,
  ``launch + max(flops / (peak * eff), bytes / (bandwidth * eff_mem))`` where ``bytes`` counts
  only the kernel's external inputs and outputs (an intermediate inside a fused kernel never
  goes to memory: that is what fusion buys) and ``flops`` all its primitives (a recomputed
  primitive pays again). A kernel with a linear primitive runs at the efficiency TVM reaches
  on that kind (``matmul``/``conv2d`` in :mod:`tvm_ollie.tune.calibrate`), others at the
  bandwidth roof times the ``eop`` efficiency. A *view* alone (a reshape that TVM turns into
  ``vm.builtin.reshape``, :attr:`~.graph.Node.view`) moves no data: it costs the launch only,
  ``launch``; inside a fused kernel a reshape is an index remap, already free in the formula.
* :class:`MeasuredCost`: builds the candidate alone (one PrimFunc after ``FuseTIR``), times it
  with :func:`tvm_ollie.tune.measure.time_main`, and caches the time by the structural hash of
  that PrimFunc in ``work_dir/orchestrate_costs.json``, so repeated blocks are timed once.
"""

from __future__ import annotations

import json
import os
from typing import Dict, Optional

import numpy as np
import tvm_ffi

from ..compat import tvm
from ..target import normalize_target, target_kind
from ..tune.calibrate import Calibration, calibrate
from ..tune.measure import time_main
from ..tune.metaschedule import default_pipeline
from .candidates import Candidate
from .emit import kernel_module
from .graph import PrimitiveGraph

__all__ = ["AnalyticCost", "CostModel", "LinearMeasuredCost", "MeasuredCost", "LAUNCH_S",
           "kernel_traffic", "sample_args"]

#: Per-kernel launch overhead (seconds) by target kind: a CUDA kernel launch, a CPU parallel
#: region's fork/join.
LAUNCH_S = {"cuda": 4e-6, "llvm": 2e-6}


class CostModel:
    """Seconds of one candidate kernel; subclasses implement :meth:`kernel_seconds`."""

    name = "abstract"

    def kernel_seconds(self, graph: PrimitiveGraph, cand: Candidate) -> float:
        """Estimated or measured seconds of ``cand`` as one kernel."""
        raise NotImplementedError

    def costs(self, graph: PrimitiveGraph, cands) -> list:
        """Seconds of every candidate, in order."""
        return [self.kernel_seconds(graph, c) for c in cands]


def kernel_traffic(graph: PrimitiveGraph, cand: Candidate) -> tuple:
    """``(flops, bytes)`` of a candidate: all its primitives' operations; its external
    inputs, constants and outputs (each once)."""
    flops = sum(graph.nodes[i].flops for i in cand.nodes)
    moved = sum(graph.nbytes(v) for v in cand.inputs) + sum(graph.nbytes(v)
                                                            for v in cand.outputs)
    seen = set()
    for const in cand.constants:
        if const not in seen:
            seen.add(const)
            moved += graph.nbytes(const)
    return float(flops), float(moved)


def _linear_kind(graph: PrimitiveGraph, cand: Candidate) -> Optional[str]:
    for i in cand.nodes:
        node = graph.nodes[i]
        if node.kind == "linear":
            return "conv2d" if "conv" in node.name else "matmul"
    return None


class AnalyticCost(CostModel):
    """Roofline of a kernel plus a launch overhead (see the module docstring).

    Parameters
    ----------
    target : str | dict | Target
        The target (selects the calibration and launch overhead).
    calibration : Calibration, optional
        Roof and efficiencies; measured on llvm / defaults on cuda when None.
    launch_s : float, optional
        Per-kernel overhead (default :data:`LAUNCH_S` of the target kind).
    """

    name = "analytic"

    def __init__(self, target="llvm", calibration: Optional[Calibration] = None,
                 launch_s: Optional[float] = None):
        self.calib = calibration or calibrate(target)
        self.launch_s = LAUNCH_S[target_kind(target)] if launch_s is None else float(launch_s)

    def kernel_seconds(self, graph: PrimitiveGraph, cand: Candidate) -> float:
        if cand.size == 1 and graph.nodes[cand.nodes[0]].view:
            return self.launch_s  # a view: one VM call, no traffic (module docstring)
        flops, moved = kernel_traffic(graph, cand)
        calib = self.calib
        kind = _linear_kind(graph, cand)
        if kind is not None:
            body = max(flops / (calib.peak_flops * calib.eff(kind)), moved / calib.bandwidth)
        else:
            body = max(flops / calib.peak_flops, moved / (calib.bandwidth * calib.eff("eop")))
        return self.launch_s + body


def sample_args(func) -> list:
    """Inputs of a kernel or module (static shapes): normal floats, zero integers (valid
    indices for take/gather)."""

    rng = np.random.default_rng(0)
    out = []
    for p in func.params:
        shape = tuple(int(s) for s in p.ty.shape)
        dtype = str(p.ty.dtype)
        if dtype.startswith("float"):
            out.append(rng.standard_normal(shape).astype(dtype))
        else:
            out.append(np.zeros(shape, dtype=dtype))
    return out


class MeasuredCost(CostModel):
    """Time of the candidate built alone, cached by the structural hash of its PrimFunc.

    Parameters
    ----------
    target : str | dict | Target
        Build target (timed on this machine's device of its kind).
    work_dir : str, optional
        Directory of the JSON cache (``orchestrate_costs.json``); in memory only when None.
    fallback : CostModel, optional
        Used when a candidate cannot be built alone (default: :class:`AnalyticCost`).
    number, repeat : int
        ``time_main`` settings.
    """

    name = "measured"
    FILE = "orchestrate_costs.json"

    def __init__(self, target="llvm", work_dir: Optional[str] = None,
                 fallback: Optional[CostModel] = None, number: int = 3, repeat: int = 3):
        self.target = target
        self.work_dir = work_dir
        self.fallback = fallback
        self.number, self.repeat = number, repeat
        self.cache: Dict[str, float] = {}
        self.hits = self.builds = 0
        self.failures: list = []  # why a candidate fell back to the analytic cost
        if work_dir and os.path.exists(self._path()):
            with open(self._path(), encoding="utf-8") as fh:
                self.cache = {str(k): float(v) for k, v in json.load(fh).items()}

    def _path(self) -> str:
        return os.path.join(self.work_dir or ".", self.FILE)

    def _save(self) -> None:
        if not self.work_dir:
            return
        os.makedirs(self.work_dir, exist_ok=True)
        tmp = self._path() + ".tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(self.cache, fh, indent=0, sort_keys=True)
        os.replace(tmp, self._path())

    def kernel_seconds(self, graph: PrimitiveGraph, cand: Candidate) -> float:
        try:
            mod = kernel_module(graph, cand)
            fused = tvm.relax.transform.FuseTIR()(mod)
            prims = [f for _, f in fused.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]
            key = f"{target_kind(self.target)}:" + ":".join(
                str(tvm_ffi.structural_hash(p)) for p in prims)
        except Exception as err:  # pylint: disable=broad-except
            return self._fallback(graph, cand, err)
        if key in self.cache:
            self.hits += 1
            return self.cache[key]
        try:
            tgt = normalize_target(self.target)
            ex = tvm.compile(fused, target=tgt, relax_pipeline=default_pipeline(tgt))
            seconds = time_main(ex, sample_args(fused["main"]), number=self.number,
                                repeat=self.repeat, target=tgt)
        except Exception as err:  # pylint: disable=broad-except
            return self._fallback(graph, cand, err)
        self.builds += 1
        self.cache[key] = float(seconds)
        self._save()
        return float(seconds)

    def _fallback(self, graph: PrimitiveGraph, cand: Candidate, err: Exception) -> float:
        self.failures.append(f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"
                             if str(err) else type(err).__name__)
        if self.fallback is None:
            self.fallback = AnalyticCost(self.target)
        return self.fallback.kernel_seconds(graph, cand)


class LinearMeasuredCost(CostModel):
    """``measured`` for candidates with a linear primitive (where the analytic roofline of an
    untuned TVM kernel is least reliable and a fused epilogue changes the loop nest), ``rest``
    for the others (memory-bound kernels, which the roofline ranks well and which are many).

    Parameters
    ----------
    measured, rest : CostModel
        Typically :class:`MeasuredCost` with a ``work_dir`` and :class:`AnalyticCost`.
    """

    def __init__(self, measured: CostModel, rest: CostModel):
        self.measured, self.rest = measured, rest
        self.name = f"{measured.name} linear+{rest.name}"

    def kernel_seconds(self, graph: PrimitiveGraph, cand: Candidate) -> float:
        if any(graph.nodes[i].kind == "linear" and graph.nodes[i].fusable for i in cand.nodes):
            return self.measured.kernel_seconds(graph, cand)
        return self.rest.kernel_seconds(graph, cand)
