"""Generic lift of a ``te.Tensor`` computed by a ``te.ComputeOp``.

The tensor's ComputeOp becomes the result scope (spatial axes → loops, reduce axes → ``Σ`` or
``Max`` iterators); placeholders become input tensors; other ComputeOps it reads become nested
scopes, except constant-padding stages (TOPI's ``pad_temp``), which become padded tensors. See
:mod:`.stages` and :mod:`.tir_expr` for what is recognized.

Input tensors are named after their placeholder when that name is an identifier that no other
placeholder of the graph uses, else ``in<k>`` (``k`` = order of first use, depth first);
``names`` overrides this per placeholder.
"""

from __future__ import annotations

from typing import Dict, List, Mapping, Optional

from ..compat import te, tirx
from ..ir.nodes import Scope, Tensor
from .common import is_identifier, lowest_float
from .errors import LiftError
from .stages import Axis, Stage, StageLifter


def _op_key(t) -> tuple:
    return hash(t.op), int(t.value_index)


def _static(value, what: str) -> int:
    if isinstance(value, tirx.IntImm):
        return int(value.value)
    if isinstance(value, int):
        return value
    raise LiftError(f"{what} is not static: {value}")


def _axis(iv, what: str) -> Axis:
    return Axis(iv.var, _static(iv.dom.min, what), _static(iv.dom.extent, what))


def _placeholders(root) -> List:
    """Placeholders reachable from ``root``, depth first, each once."""
    seen, out, stack = set(), [], [root]
    visited = set()
    while stack:
        t = stack.pop()
        if _op_key(t) in visited:
            continue
        visited.add(_op_key(t))
        if isinstance(t.op, te.PlaceholderOp):
            if _op_key(t) not in seen:
                seen.add(_op_key(t))
                out.append(t)
            continue
        stack.extend(reversed(list(t.op.input_tensors)))
    return out


def _compute_stage(t) -> Stage:
    op = t.op
    what = f"te.compute {op.name}"
    if len(op.body) != 1 or int(t.value_index) != 0:
        raise LiftError(f"{what}: multi-output compute ops are unsupported")
    body = op.body[0]
    axes = [_axis(iv, what) for iv in op.axis]
    if isinstance(body, tirx.Reduce):
        reducer = reducer_of(body.combiner, what)
        if len(body.source) != 1 or int(body.value_index) != 0:
            raise LiftError(f"{what}: multi-value reductions are unsupported")
        if body.init is not None and len(body.init) > 0:
            raise LiftError(f"{what}: reductions with an explicit init are unsupported")
        cond = body.condition
        if not (isinstance(cond, tirx.IntImm) and int(cond.value) == 1):
            raise LiftError(f"{what}: conditional reductions are unsupported")
        return Stage(op.name, axes, body.source[0], [_axis(iv, what) for iv in body.axis],
                     reducer)
    return Stage(op.name, axes, body)


def reducer_of(combiner, what: str) -> str:
    """``"sum"`` or ``"max"`` for a ``CommReducer`` computing ``x + y`` or ``max(x, y)``."""
    if len(combiner.result) != 1:
        raise LiftError(f"{what}: multi-value reductions are unsupported")
    res, lhs, rhs = combiner.result[0], combiner.lhs[0], combiner.rhs[0]
    operands = (res.a, res.b) if isinstance(res, (tirx.Add, tirx.Max)) else None
    if operands is None or not (
        (operands[0].same_as(lhs) and operands[1].same_as(rhs))
        or (operands[0].same_as(rhs) and operands[1].same_as(lhs))
    ):
        raise LiftError(f"{what}: unsupported reduction combiner {res}")
    reducer = "sum" if isinstance(res, tirx.Add) else "max"
    ident = combiner.identity_element[0]
    value = ident.value if isinstance(ident, (tirx.IntImm, tirx.FloatImm)) else None
    if value is None or (reducer == "sum" and value != 0) or \
            (reducer == "max" and value > lowest_float(str(ident.ty))):
        raise LiftError(f"{what}: the reduction's identity {ident} is not that of {reducer}")
    return reducer


def lift_te(tensor, names: Optional[Mapping] = None) -> Scope:
    """Lift a ``te.Tensor`` computed by a ``te.ComputeOp`` into a scope.

    Parameters
    ----------
    tensor : te.Tensor
        The result tensor.
    names : Mapping[te.Tensor, str], optional
        Names for (some of) the placeholders it reads.

    Returns
    -------
    Scope
        The expression of ``tensor``; its inputs are the placeholders, named as the module
        docstring says.

    Raises
    ------
    LiftError
        For placeholders as results, extern/scan ops, symbolic shapes, and any TIR construct
        :mod:`.tir_expr` does not convert.
    """
    if not isinstance(tensor, te.Tensor):
        raise LiftError(f"expected a te.Tensor, got {type(tensor).__name__}")
    if not isinstance(tensor.op, te.ComputeOp):
        raise LiftError(f"{tensor.op.name} is a {type(tensor.op).__name__}, not a ComputeOp")
    given: Dict[tuple, str] = {}
    for t, name in (names or {}).items():
        given[_op_key(t)] = name
    holders = _placeholders(tensor)
    counts: Dict[str, int] = {}
    for t in holders:
        counts[t.op.name] = counts.get(t.op.name, 0) + 1
    taken = set(given.values()) | {n for n, c in counts.items() if c == 1 and is_identifier(n)}
    tensors: Dict[tuple, Tensor] = {}
    for pos, t in enumerate(holders):
        name = given.get(_op_key(t))
        if name is None and counts[t.op.name] == 1 and is_identifier(t.op.name):
            name = t.op.name
        if name is None:
            name, k = f"in{pos}", 0
            while name in taken:
                name, k = f"in{pos}_{k}", k + 1
            taken.add(name)
        shape = [_static(s, f"shape of {t.op.name}") for s in t.shape]
        tensors[_op_key(t)] = Tensor(name, shape, str(t.dtype))
    stages: Dict[tuple, Stage] = {}

    def resolve(t):
        key = _op_key(t)
        if key in tensors:
            return tensors[key]
        if not isinstance(t.op, te.ComputeOp):
            raise LiftError(f"{t.op.name}: {type(t.op).__name__} stages are unsupported")
        if key not in stages:
            stages[key] = _compute_stage(t)
        return stages[key]

    lifter = StageLifter(resolve, [t.name for t in tensors.values()])
    return lifter.lift(resolve(tensor))
