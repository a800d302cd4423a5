"""The products of a guarded sum that can be nonzero: a flop floor for padded expressions.

A convolution lifts to a sum of products whose data read is padded (``x<pad>[h + r - 1]``),
a strided transposed convolution to one whose data factor is behind a ``select`` on the stride
(``select((h - r + 1) % 2 == 0, x[(h - r + 1) // 2], 0)``). Derivation may skip the products
whose factor is such a zero (a tightened boundary leaves the margins out; the sub-pixel forms
skip the false taps), so the expression's flops are no lower bound of its programs'
(:func:`tvm_ollie.derive.cost.least_work`). The products that read data are: a derived program
computes the same values, every rule reorders, splits or regroups the sum's products without
dropping one that can be nonzero (no rule factors a sum algebraically), and instantiation
computes each in one of its stages (a matched operator, or an eOperator where a reduction is
left unmatched). So ::

    useful_products(expr) = #{points p of the iteration space : every guard holds at p}

where the guards are, for each read of a zero-padded tensor, ``0 <= index_d(p) < size_d`` on
each padded dimension ``d``, and for each factor ``select(c, read, 0)``, ``c(p)``. Each
product costs one multiply per factor beyond the first and one add into the sum, as
:func:`~tvm_ollie.derive.cost.expr_cost` counts a plain sum.

Counting: the guards are grouped into components of the iterators they share (a convolution's
``(h, r)`` and ``(w, s)``), each component is enumerated (numpy, floor ``//`` and ``%`` as the
IR's semantics) and the counts multiply, times the extents of the iterators no guard uses.
None where the expression is not such a guarded product, or where a component has more than
:data:`MAX_POINTS` points.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import numpy as np

from ..ir.nodes import Access, BinOp, Call, Const, Node, Scope, Tensor, Var, iter_nodes

__all__ = ["MAX_POINTS", "useful_flops"]

#: The most points of one guard component that are enumerated (a 224x224 output with a 7x7
#: kernel is 2.5M points per spatial dimension pair; the usual components are thousands).
MAX_POINTS = 1 << 22

_NUMPY_OPS = {
    "+": np.add, "-": np.subtract, "*": np.multiply, "//": np.floor_divide, "%": np.mod,
    "<": np.less, "<=": np.less_equal, ">": np.greater, ">=": np.greater_equal,
    "==": np.equal, "!=": np.not_equal, "and": np.logical_and, "or": np.logical_or,
}


def useful_flops(expr: Scope) -> Optional[float]:
    """The flops of the products of ``expr`` that can be nonzero (module docstring), or None
    when ``expr`` is not one summing scope of a product of reads, guarded reads and
    constants."""
    if expr.reducer != "sum" or not expr.reduce or any(lo or hi for lo, hi in expr.pad):
        return None
    guards: List[Node] = []
    factors = _factors(expr.body, guards)
    if factors is None:
        return None
    extents = {iv.var: iv for iv in expr.loops + expr.reduce}
    points = _count(guards, extents)
    if points is None:
        return None
    return float(points) * max(factors, 1)


def _factors(body: Node, guards: List[Node]) -> Optional[int]:
    """The non-constant factors of the product ``body`` (None: not a guarded product), with
    the guards of its reads appended to ``guards``."""
    if isinstance(body, BinOp) and body.op == "*":
        a, b = _factors(body.a, guards), _factors(body.b, guards)
        return None if a is None or b is None else a + b
    if isinstance(body, Const):
        return 0
    if isinstance(body, Call) and body.func == "select":
        cond, then, other = body.args
        if not (isinstance(other, Const) and other.value == 0) or _reads_data(cond):
            return None
        guards.append(cond)
        return _read(then, guards)
    return _read(body, guards)


def _read(node: Node, guards: List[Node]) -> Optional[int]:
    """One factor that reads a tensor (1), its padded dimensions' bounds added to ``guards``."""
    if not isinstance(node, Access) or not isinstance(node.source, Tensor):
        return None
    src = node.source
    if any(_reads_data(i) for i in node.indices):
        return None
    if any(lo or hi for lo, hi in src.pad):
        if src.pad_value != 0:
            return None
        for index, (lo, hi), size in zip(node.indices, src.pad, src.shape):
            if lo or hi:
                guards.append(BinOp("and", BinOp("<=", Const(0), index),
                                    BinOp("<", index, Const(int(size)))))
    return 1


def _reads_data(node: Node) -> bool:
    return any(isinstance(n, (Access, Scope)) for n in iter_nodes(node))


def _free(node: Node) -> Tuple[Var, ...]:
    return tuple(dict.fromkeys(n for n in iter_nodes(node) if isinstance(n, Var)))


def _count(guards: List[Node], extents: Dict[Var, object]) -> Optional[int]:
    """Points of the iteration space where every guard holds (None: too many to count)."""
    comps: List[Tuple[set, List[Node]]] = []
    for guard in guards:
        used = set(_free(guard))
        if not used <= set(extents):
            return None
        joined = [c for c in comps if c[0] & used]
        for c in joined:
            comps.remove(c)
            used |= c[0]
        comps.append((used, [g for c in joined for g in c[1]] + [guard]))
    total = 1
    for used, comp_guards in comps:
        try:
            count = _enumerate(sorted(used, key=lambda v: v.name), comp_guards, extents)
        except ValueError:  # a guard this counter does not evaluate (a scalar function)
            return None
        if count is None:
            return None
        total *= count
    guarded = set().union(*(c[0] for c in comps)) if comps else set()
    for var, iv in extents.items():
        if var not in guarded:
            total *= iv.extent
    return total


def _enumerate(variables, guards, extents) -> Optional[int]:
    """Points of ``variables``' ranges where every guard holds."""
    size = 1
    for v in variables:
        size *= extents[v].extent
    if size > MAX_POINTS:
        return None
    grids = np.meshgrid(*[np.arange(extents[v].begin, extents[v].end, dtype=np.int64)
                          for v in variables], indexing="ij", sparse=True)
    env = dict(zip(variables, grids))
    ok = np.ones([extents[v].extent for v in variables], dtype=bool)
    for guard in guards:
        ok &= np.broadcast_to(np.asarray(_eval(guard, env), dtype=bool), ok.shape)
    return int(ok.sum())


def _eval(node: Node, env):
    if isinstance(node, Var):
        return env[node]
    if isinstance(node, Const):
        return node.value
    if isinstance(node, BinOp) and node.op in _NUMPY_OPS:
        return _NUMPY_OPS[node.op](_eval(node.a, env), _eval(node.b, env))
    raise ValueError(f"useful_flops: cannot evaluate {node!r}")
