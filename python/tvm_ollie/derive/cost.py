"""Analytic cost of programs: FLOPs and bytes per stage, roofline time.

Why analytic: the search ranks many candidates and measuring each is out of the question (a
MetaSchedule trial costs seconds here). The roofline ``max(flops / peak, bytes / bandwidth)``
per stage, summed over stages, is the first-order model in which derivation pays off: an
operator stage is compute-bound and an eOperator is memory-bound, so a candidate wins when it
trades arithmetic for a little extra memory traffic.

Counting rules:

* Matched operators use their own formula (``2*M*N*K`` for a GEMM, ``2*N*F*OH*OW*C*R*S`` for a
  convolution (``C`` per group for grouped ones), ``2*batch*length*(2W+1)*K`` for G2BMM and GBMM); bytes are the operands and the
  output, each moved once.
* An eOperator counts the arithmetic of its body at every point of its iteration space (loops
  times reductions), plus one operation per point for the reduction's accumulate, recursively
  for nested scopes; index arithmetic is free. It runs at :data:`EOP_COMPUTE_EFFICIENCY` of
  the compute roof. Bytes are its output plus, per input tensor, the
  smaller of the tensor's size and the number of reads (a gather of a few rows of a big tensor
  does not read all of it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import numpy as np

from ..ir.nodes import Access, BinOp, Call, Node, Scope, Tensor, is_index, iter_nodes
from .targets import operator_flops
from .useful import useful_flops

__all__ = ["EOP_COMPUTE_EFFICIENCY", "TARGET_DEFAULTS", "StageCost", "ProgramCost", "stage_cost",
           "program_cost", "expr_cost", "least_work"]

#: ``target -> (peak FLOP/s, bytes/s)``. "cuda" is H200-like fp32 without tensor cores; "llvm"
#: is a small multi-core CPU (what the 2-core development machines reach with a tuned GEMM).
TARGET_DEFAULTS: Dict[str, Tuple[float, float]] = {
    "cuda": (60e12, 4.8e12),
    "llvm": (100e9, 20e9),
}


#: Fraction of the compute roof an eOperator's arithmetic reaches: it is TE code without an
#: operator's schedule (the order of TVM's untuned efficiency, :mod:`tvm_ollie.tune.calibrate`).
#: At the full roof a program whose eOperator still computes convolutions (the phases of a
#: sub-pixel transposed convolution left unmatched) ranked above the one running them as
#: operators. Memory-bound eOperators (gathers, offset-adds) are unaffected.
EOP_COMPUTE_EFFICIENCY = 0.1


@dataclass(frozen=True)
class StageCost:
    """FLOPs, bytes and roofline time of one stage."""

    name: str
    kind: str
    flops: float
    bytes: float
    time_s: float

    compute_bound: bool = False

    @property
    def bound(self) -> str:
        """``"compute"`` or ``"memory"``: which roof limits the stage."""
        return "compute" if self.compute_bound else "memory"


@dataclass(frozen=True)
class ProgramCost:
    """Per-stage costs and their sums (``time_s`` is the roofline estimate)."""

    stages: Tuple[StageCost, ...]
    peak_flops: float
    bandwidth: float

    @property
    def flops(self) -> float:
        return sum(s.flops for s in self.stages)

    @property
    def bytes(self) -> float:
        return sum(s.bytes for s in self.stages)

    @property
    def time_s(self) -> float:
        return sum(s.time_s for s in self.stages)

    def __str__(self) -> str:
        parts = ", ".join(f"{s.name}:{s.kind} {s.flops:.3g}F {s.bytes:.3g}B" for s in self.stages)
        return f"{self.time_s * 1e6:.3f} us ({self.flops:.3g} FLOP, {self.bytes:.3g} B; {parts})"


def _itemsize(dtype: str) -> int:
    try:
        return np.dtype(dtype).itemsize
    except TypeError:
        return 4


def _size(shape) -> int:
    out = 1
    for s in shape:
        out *= int(s)
    return out


def _points(scope: Scope) -> int:
    return _size(iv.extent for iv in scope.loops + scope.reduce)


def _body_ops(node: Node) -> int:
    """Arithmetic operations of one evaluation of a body (index arithmetic is free)."""
    if isinstance(node, Access) or is_index(node):
        return 0
    if isinstance(node, BinOp):
        return 1 + _body_ops(node.a) + _body_ops(node.b)
    if isinstance(node, Call):
        return 1 + sum(_body_ops(a) for a in node.args)
    return 0


def _nested_flops(scope: Scope, seen: set) -> float:
    flops = _points(scope) * (_body_ops(scope.body) + (1 if scope.reduce else 0))
    for sub in _nested_scopes(scope.body):
        if id(sub) not in seen:
            seen.add(id(sub))
            flops += _nested_flops(sub, seen)
    return float(flops)


def _nested_scopes(node: Node):
    """Scopes read directly by ``node`` (not those inside them)."""
    stack = [node]
    while stack:
        cur = stack.pop()
        if isinstance(cur, Access):
            if isinstance(cur.source, Scope):
                yield cur.source
            stack.extend(cur.indices)
        elif isinstance(cur, Scope):
            yield cur
        else:
            stack.extend(cur.children)


def _reads(scope: Scope, counts: Dict[str, int], tensors: Dict[str, Tensor]) -> None:
    """Reads per input tensor name over the whole iteration space (nested scopes included)."""
    pts = _points(scope)
    stack = [scope.body]
    while stack:
        cur = stack.pop()
        if isinstance(cur, Access):
            src = cur.source
            if isinstance(src, Tensor):
                counts[src.name] = counts.get(src.name, 0) + pts
                tensors.setdefault(src.name, src)
            else:
                _reads(src, counts, tensors)
            stack.extend(cur.indices)
        elif not isinstance(cur, Scope):
            stack.extend(cur.children)


def expr_cost(expr: Scope) -> Tuple[float, float]:
    """``(flops, bytes)`` of a scope run as one memory-bound kernel (an eOperator)."""
    flops = _nested_flops(expr, set())
    counts: Dict[str, int] = {}
    tensors: Dict[str, Tensor] = {}
    _reads(expr, counts, tensors)
    item = _itemsize(expr.dtype)
    moved = _size(expr.shape) * item
    for name, n in counts.items():
        t = tensors[name]
        moved += min(n, _size(t.shape)) * _itemsize(t.dtype)
    return flops, float(moved)


def least_work(expr: Scope) -> Tuple[float, float]:
    """``(flops, bytes)`` that every program of ``expr`` does at least, in its stages.

    Bytes: the output written once and every input read once (at most its reads), as
    :func:`expr_cost` counts one kernel. Flops: the expression's arithmetic (:func:`expr_cost`)
    when it is a plain sum of products: one summing scope whose body is arithmetic on reads of
    unpadded tensors (the rules reorder, split and regroup such a sum, and instantiation
    computes its products in the matched operator or leaves them in an eOperator, so none
    drops a product; :func:`tvm_ollie.tune.analytic.least_seconds` charges them at the best
    rate any of those stages reaches). Derivation may
    skip work that the expression counts otherwise (the zero taps behind the ``select`` of a
    strided transposed convolution, the padded margins a tightened boundary leaves out, a
    nested stage computed once): a product of padded or ``select``-guarded reads is bounded by
    its products that can be nonzero (:func:`~tvm_ollie.derive.useful.useful_flops`), anything
    else by its bytes only (flops 0).
    """
    flops, moved = expr_cost(expr)
    if _plain_sum(expr):
        return flops, moved
    return (min(useful_flops(expr) or 0.0, flops)), moved


def _plain_sum(expr: Scope) -> bool:
    """Whether ``expr`` is one summing scope of arithmetic on reads of unpadded tensors."""
    if expr.reducer != "sum" or any(lo or hi for lo, hi in expr.pad):
        return False
    for node in iter_nodes(expr.body):
        if isinstance(node, (Call, Scope)):
            return False
        if isinstance(node, Access) and not (
                isinstance(node.source, Tensor) and not any(lo or hi for lo, hi in
                                                            node.source.pad)):
            return False
    return True


def stage_cost(stage, peak_flops: float, bandwidth: float) -> StageCost:
    """Cost of one :class:`~tvm_ollie.derive.program.Stage`."""
    expr = stage.expr
    if stage.is_operator:
        flops = operator_flops(stage.kind, stage.attrs)
        moved = _size(expr.shape) * _itemsize(expr.dtype)
        for t in expr.inputs:
            moved += _size(t.shape) * _itemsize(t.dtype)
        moved = float(moved)
    else:
        flops, moved = expr_cost(expr)
    compute, memory = flops / peak_flops, moved / bandwidth
    if not stage.is_operator:
        compute /= EOP_COMPUTE_EFFICIENCY
    return StageCost(stage.name, stage.kind, flops, moved, max(compute, memory),
                     compute >= memory)


def program_cost(program, target: str = "cuda", peak_flops: Optional[float] = None,
                 bandwidth: Optional[float] = None) -> ProgramCost:
    """Roofline cost of a :class:`~tvm_ollie.derive.program.Program` on ``target``.

    ``peak_flops``/``bandwidth`` override the target's defaults (:data:`TARGET_DEFAULTS`;
    unknown targets use the "cuda" numbers unless both are given).
    """
    dflt = TARGET_DEFAULTS.get(target, TARGET_DEFAULTS["cuda"])
    peak = float(peak_flops if peak_flops is not None else dflt[0])
    bw = float(bandwidth if bandwidth is not None else dflt[1])
    if peak <= 0 or bw <= 0:
        raise ValueError("peak_flops and bandwidth must be positive")
    return ProgramCost(tuple(stage_cost(s, peak, bw) for s in program.stages), peak, bw)
