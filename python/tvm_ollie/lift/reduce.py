"""Lifts of ``relax.sum``, ``relax.mean`` and ``relax.max`` over any axes, with ``keepdims``.

``sum``/``max`` are one scope: a loop per kept (or kept-as-1) dimension and a reduction iterator
per reduced dimension, ``Σ`` or ``Max``. ``mean`` is TOPI's two stages, the sum and then a
division by the number of reduced elements: ``L<...> { (L<...> Σ<...> {x[...]})[...] / N }``.
Reduced dimensions of extent 1 need no iterator (they are read at 0). With no ``axis`` every
dimension is reduced; a result with no dimension left is a scope with no loops.
"""

from __future__ import annotations

from typing import List

from ..ir.nodes import Access, BinOp, IterVar, Node, Scope
from .common import IterNames, float_const, int_list, normalize_axis, require_float
from .errors import LiftError
from .registry import Operands, register_lift


def _reduction(call, names: Operands, reducer: str) -> Scope:
    x = names.tensor(call.args[0], "data")
    require_float(x.dtype, names.op)
    axes = call.attrs.axis
    if axes is None:
        reduced = set(range(x.ndim))
    else:
        reduced = {normalize_axis(a, x.ndim, names.op) for a in int_list(axes, "axis")}
    keep = bool(call.attrs.keepdims)
    gen = IterNames(names.names)
    loops: List[IterVar] = []
    reduce: List[IterVar] = []
    idx: List[Node] = []
    for d, extent in enumerate(x.shape):
        if d not in reduced:
            iv = IterVar(gen.take(f"i{d}"), 0, extent)
            loops.append(iv)
            idx.append(iv.var)
            continue
        if keep:
            loops.append(IterVar(gen.take(f"i{d}"), 0, 1))
        if extent == 1:
            idx.append(0)
        else:
            rv = IterVar(gen.take(f"r{d}"), 0, extent)
            reduce.append(rv)
            idx.append(rv.var)
    if tuple(iv.extent for iv in loops) != tuple(names.out_shape()):
        raise LiftError(f"{names.op}: result shape {names.out_shape()} does not match the axes")
    return Scope(loops, reduce, Access(x, idx), reducer=reducer)


@register_lift("relax.sum")
def lift_sum(call, names: Operands) -> Scope:
    """Lift ``relax.sum``."""
    return _reduction(call, names, "sum")


@register_lift("relax.max")
def lift_max(call, names: Operands) -> Scope:
    """Lift ``relax.max``."""
    return _reduction(call, names, "max")


@register_lift("relax.mean")
def lift_mean(call, names: Operands) -> Scope:
    """Lift ``relax.mean`` as the sum divided by the number of reduced elements."""
    total = _reduction(call, names, "sum")
    count = 1
    for iv in total.reduce:
        count *= iv.extent
    if count == 1:
        return total
    value = Access(total, [iv.var for iv in total.loops])
    return Scope(total.loops, (), BinOp("/", value, float_const(count, total.dtype)))
