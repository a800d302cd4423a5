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
import math
import os
import time
from typing import Callable, Dict, Optional, Tuple

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

__all__ = ["AnalyticCost", "CostModel", "KernelTimer", "LinearMeasuredCost", "MeasuredCost",
           "LAUNCH_S", "build_and_time", "kernel_traffic", "sample_args"]

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


#: ``timer(fused_module, target, rpc) -> seconds``: builds and times a one-kernel module
#: (raises when it cannot); :func:`build_and_time` by default, a fake in tests.
KernelTimer = Callable[["tvm.IRModule", object, object], float]


def build_and_time(fused: "tvm.IRModule", target, rpc=None, number: int = 3,
                   repeat: int = 3) -> float:
    """Seconds of ``main`` of a fused one-kernel module, built untuned with the project's
    default pipeline for ``target`` and timed here (or through ``rpc``)."""
    tgt = normalize_target(target)
    ex = tvm.compile(fused, target=tgt, relax_pipeline=default_pipeline(tgt))
    return float(time_main(ex, sample_args(fused["main"]), number=number, repeat=repeat,
                           target=tgt, rpc=rpc))


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
    rpc : RPCConfig, optional
        Time through this RPC tracker (the cache key says so: remote times are not local ones).
    timer : KernelTimer, optional
        Builds and times one fused kernel module (default :func:`build_and_time`).

    The cache maps a key to seconds; ``inf`` marks a kernel that failed to build or run (the
    profiled costs ban it, :mod:`.profiled`; here it falls back). ``spent`` (saved beside it,
    ``orchestrate_profile_s.json``) is what building and timing each key took, so that a
    profiling budget can be charged the same from the cache as when measuring.
    """

    name = "measured"
    FILE = "orchestrate_costs.json"
    SPENT_FILE = "orchestrate_profile_s.json"

    def __init__(self, target="llvm", work_dir: Optional[str] = None,
                 fallback: Optional[CostModel] = None, number: int = 3, repeat: int = 3,
                 rpc=None, timer: Optional[KernelTimer] = None):
        self.target = target
        self.work_dir = work_dir
        self.fallback = fallback
        self.number, self.repeat = number, repeat
        self.rpc, self.timer = rpc, timer
        self.cache: Dict[str, float] = self._load(self.FILE)
        self.spent: Dict[str, float] = self._load(self.SPENT_FILE)
        self.hits = self.builds = 0
        self.failures: list = []  # why a candidate fell back to the analytic cost

    def _path(self, name: Optional[str] = None) -> str:
        return os.path.join(self.work_dir or ".", name or self.FILE)

    def _load(self, name: str) -> Dict[str, float]:
        if not self.work_dir or not os.path.exists(self._path(name)):
            return {}
        with open(self._path(name), encoding="utf-8") as fh:
            return {str(k): float(v) for k, v in json.load(fh).items()}

    def _save(self) -> None:
        if not self.work_dir:
            return
        os.makedirs(self.work_dir, exist_ok=True)
        for name, table in ((self.FILE, self.cache), (self.SPENT_FILE, self.spent)):
            tmp = self._path(name) + ".tmp"
            with open(tmp, "w", encoding="utf-8") as fh:
                json.dump(table, fh, indent=0, sort_keys=True)
            os.replace(tmp, self._path(name))

    def prepare(self, graph: PrimitiveGraph, cand: Candidate) -> Tuple[str, "tvm.IRModule"]:
        """``(cache key, fused module)`` of a candidate built alone (raises when it does not
        fuse): the target kind (and RPC key) and the structural hashes of its PrimFuncs."""
        fused = tvm.relax.transform.FuseTIR()(kernel_module(graph, cand))
        prims = [f for _, f in fused.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]
        if not prims:  # a library call alone (:func:`~.emit.library_module`): its main
            prims = [fused["main"]]
        where = target_kind(self.target) + (f"@rpc:{self.rpc.key}" if self.rpc else "")
        return f"{where}:" + ":".join(str(tvm_ffi.structural_hash(p)) for p in prims), fused

    def measure(self, key: str, fused: "tvm.IRModule") -> float:
        """Build and time ``fused`` and cache it under ``key``; a failure is cached as ``inf``
        and raised again."""
        start = time.perf_counter()
        try:
            if self.timer is not None:
                seconds = float(self.timer(fused, self.target, self.rpc))
            else:
                seconds = build_and_time(fused, self.target, self.rpc, self.number,
                                         self.repeat)
        except Exception:
            self.cache[key] = math.inf
            raise
        else:
            self.cache[key] = seconds
        finally:
            self.spent[key] = time.perf_counter() - start
            self.builds += 1
            self._save()
        return seconds

    def kernel_seconds(self, graph: PrimitiveGraph, cand: Candidate) -> float:
        try:
            key, fused = self.prepare(graph, cand)
        except Exception as err:  # pylint: disable=broad-except
            return self._fallback(graph, cand, err)
        if key in self.cache and math.isfinite(self.cache[key]):
            self.hits += 1
            return self.cache[key]
        if key in self.cache:
            return self._fallback(graph, cand, RuntimeError("failed to build or run before"))
        try:
            return self.measure(key, fused)
        except Exception as err:  # pylint: disable=broad-except
            return self._fallback(graph, cand, err)

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
