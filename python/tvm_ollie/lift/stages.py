"""Stages of a TE graph or a PrimFunc, and their lift into (nested) scopes.

A :class:`Stage` is one computation ``out[axes] = value`` or ``out[axes] = reduce(value)``
(a TE ``ComputeOp`` or a PrimFunc block). :class:`StageLifter` turns the stage that produces the
result into a :class:`Scope`; every stage it reads becomes a nested scope, except a recognized
constant-padding stage ``if_then_else(bounds, X[i - p], c)``: reads of it become reads of ``X``
padded with ``c`` (a padded :class:`Tensor`, or a scope with output padding when ``X`` is itself
a stage and ``c == 0``). That is the form in which convolutions reach the derivation rules.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

from ..compat import tirx
from ..ir.nodes import Access, BinOp, IterVar, Node, Scope, Tensor
from .common import IterNames, is_identifier
from .errors import LiftError
from .tir_expr import ExprConverter, TirCall, is_tensor_load, load_parts, op_name_of


@dataclass
class Axis:
    """One iterator of a stage: the TIR variable and its range ``[begin, begin + extent)``."""

    var: object
    begin: int
    extent: int


@dataclass
class Stage:
    """``out[axes] = value`` (``reducer`` None) or ``out[axes] = reducer over reduce_axes``."""

    name: str
    axes: List[Axis]
    value: object
    reduce_axes: List[Axis] = field(default_factory=list)
    reducer: Optional[str] = None

    @property
    def shape(self) -> Tuple[int, ...]:
        """Extents of the stage's output."""
        return tuple(a.extent for a in self.axes)


#: What a read source resolves to: an input tensor or another stage.
Resolved = Union[Tensor, Stage]


@dataclass
class PadForm:
    """A stage that is ``source`` padded: ``stage[v] = source<pads, value>[v - offsets]``."""

    source: object
    offsets: List[int]
    pads: List[Tuple[int, int]]
    value: float


class StageLifter:
    """Lifts stages into scopes, memoized, resolving reads through ``resolve``.

    Parameters
    ----------
    resolve : callable
        ``resolve(source) -> Tensor | Stage`` for a TE tensor / buffer read in a stage.
    reserved : sequence of str
        Names iterators must not take (the input tensor names).
    """

    def __init__(self, resolve: Callable[[object], Resolved], reserved: Sequence[str] = ()):
        self.resolve = resolve
        self.reserved = tuple(reserved)
        self._scopes: Dict[int, Scope] = {}
        self._pads: Dict[int, Optional[PadForm]] = {}
        self._active: set = set()

    # ---- scopes ---------------------------------------------------------------------------

    def lift(self, stage: Stage) -> Scope:
        """The scope of ``stage``: its output as a closed expression (memoized)."""
        hit = self._scopes.get(id(stage))
        if hit is not None:
            return hit
        if id(stage) in self._active:
            raise LiftError(f"stage {stage.name} reads its own output")
        self._active.add(id(stage))
        try:
            pad = self.foldable_pad(stage)
            if pad is not None:
                scope = self._lift_padded(stage, pad)
            else:
                scope = self._lift_plain(stage)
        finally:
            self._active.discard(id(stage))
        self._scopes[id(stage)] = scope
        return scope

    def _iterators(self, stage: Stage) -> Tuple[List[IterVar], List[IterVar], Dict[int, Node]]:
        gen = IterNames(self.reserved)
        var_map: Dict[int, Node] = {}

        def make(axis: Axis) -> IterVar:
            name = str(axis.var.name)
            if name.startswith("v_") and is_identifier(name[2:]):
                name = name[2:]
            iv = IterVar(gen.take(name), axis.begin, axis.begin + axis.extent)
            var_map[hash(axis.var)] = iv.var
            return iv

        loops = [make(a) for a in stage.axes]
        reduce = [make(a) for a in stage.reduce_axes]
        return loops, reduce, var_map

    def _lift_plain(self, stage: Stage) -> Scope:
        loops, reduce, var_map = self._iterators(stage)
        conv = ExprConverter(var_map, self.read, f"stage {stage.name}")
        body = conv(stage.value)
        if any(iv.begin != 0 for iv in loops):
            raise LiftError(f"stage {stage.name}: output axes must start at 0")
        return Scope(loops, reduce, body, reducer=stage.reducer or "sum")

    def _lift_padded(self, stage: Stage, pad: PadForm) -> Scope:
        loops, _, _ = self._iterators(stage)
        return Scope(loops, (), self._padded_read(pad, [iv.var for iv in loops]))

    # ---- reads ----------------------------------------------------------------------------

    def read(self, source, indices: List[Node]) -> Node:
        """The IR read of ``source[indices]`` (a tensor, a nested scope, or a padded source)."""
        target = self.resolve(source)
        if isinstance(target, Tensor):
            return Access(target, indices)
        pad = self.foldable_pad(target)
        if pad is not None:
            return self._padded_read(pad, indices)
        return Access(self.lift(target), indices)

    def _padded_read(self, pad: PadForm, indices: Sequence[Node]) -> Node:
        inner = self.resolve(pad.source)
        idx = [BinOp("-", i, off) if off > 0 else BinOp("+", i, -off) if off < 0 else i
               for i, off in zip(indices, pad.offsets)]
        if isinstance(inner, Tensor):
            src = Tensor(inner.name, inner.shape, inner.dtype, pad.pads, pad.value)
            return Access(src, idx)
        scope = self.lift(inner)
        if any(lo or hi for lo, hi in scope.pad):  # lifted stages never carry output padding
            raise LiftError("padding of an already padded scope")
        return Access(scope.replace(pad=pad.pads), idx)

    # ---- constant-pad recognition ---------------------------------------------------------

    def foldable_pad(self, stage: Stage) -> Optional[PadForm]:
        """The pad form of ``stage`` when reads of it can read its source padded instead.

        A tensor source takes any pad value; a stage source only 0 (scope margins read 0).
        """
        pad = self.pad_form(stage)
        if pad is not None and (isinstance(self.resolve(pad.source), Tensor) or pad.value == 0):
            return pad
        return None

    def pad_form(self, stage: Stage) -> Optional[PadForm]:
        """``stage`` as a constant padding of another tensor/stage, or None (memoized)."""
        if id(stage) not in self._pads:
            self._pads[id(stage)] = _match_pad(stage, self.resolve)
        return self._pads[id(stage)]


def _split_select(value):
    """``(cond, true, false)`` of a Select / if_then_else, else None."""
    if isinstance(value, tirx.Select):
        return value.condition, value.true_value, value.false_value
    if isinstance(value, TirCall) and op_name_of(value) in ("prim.if_then_else",
                                                              "tirx.if_then_else"):
        return tuple(value.args)
    return None


def _conjuncts(cond) -> list:
    if isinstance(cond, tirx.And):
        return _conjuncts(cond.a) + _conjuncts(cond.b)
    if isinstance(cond, TirCall) and op_name_of(cond) in ("prim.likely", "tirx.likely"):
        return _conjuncts(cond.args[0])
    return [cond]


def _const_value(expr) -> Optional[float]:
    if isinstance(expr, (tirx.IntImm, tirx.FloatImm)):
        return expr.value
    if isinstance(expr, tirx.Cast) and isinstance(expr.value, (tirx.IntImm, tirx.FloatImm)):
        return expr.value.value
    return None


def _strip_cast(expr):
    while isinstance(expr, tirx.Cast):
        expr = expr.value
    return expr


def _axis_offset(expr, axis_var) -> Optional[int]:
    """``p`` when ``expr`` is ``axis_var - p`` (or ``axis_var + q``, ``axis_var``), else None."""
    expr = _strip_cast(expr)
    if isinstance(expr, tirx.Var):
        return 0 if expr.same_as(axis_var) else None
    if isinstance(expr, (tirx.Sub, tirx.Add)) and isinstance(_strip_cast(expr.a), tirx.Var) and \
            _strip_cast(expr.a).same_as(axis_var) and isinstance(expr.b, tirx.IntImm):
        return int(expr.b.value) if isinstance(expr, tirx.Sub) else -int(expr.b.value)
    return None


def _bound(cond, axes: List[Axis]):
    """``(axis index, lo, hi)`` meaning ``lo <= axis < hi`` for one bound conjunct, else None."""
    cmp = {tirx.LT: "<", tirx.LE: "<=", tirx.GT: ">", tirx.GE: ">="}
    flip = {"<": ">", "<=": ">=", ">": "<", ">=": "<="}
    op = next((s for c, s in cmp.items() if isinstance(cond, c)), None)
    if op is None:
        return None
    a, b = _strip_cast(cond.a), _strip_cast(cond.b)
    if isinstance(b, tirx.Var) and isinstance(a, tirx.IntImm):
        a, b, op = b, a, flip[op]
    if not (isinstance(a, tirx.Var) and isinstance(b, tirx.IntImm)):
        return None
    k = next((i for i, ax in enumerate(axes) if ax.var.same_as(a)), None)
    if k is None:
        return None
    c = int(b.value)
    big = 1 << 62
    return {"<": (k, -big, c), "<=": (k, -big, c + 1), ">": (k, c + 1, big),
            ">=": (k, c, big)}[op]


def _match_pad(stage: Stage, resolve) -> Optional[PadForm]:
    """Recognize ``out[v] = if_then_else(bounds(v), X[v - p], c)`` exactly."""
    if stage.reducer is not None or stage.reduce_axes:
        return None
    parts = _split_select(stage.value)
    if parts is None:
        return None
    cond, true, false = parts
    value = _const_value(false)
    if value is None or not is_tensor_load(true):
        return None
    source, indices = load_parts(true)
    target = resolve(source)
    src_shape = target.shape
    if len(indices) != len(stage.axes) or len(src_shape) != len(stage.axes):
        return None
    offsets = []
    for idx, axis in zip(indices, stage.axes):
        off = _axis_offset(idx, axis.var)
        if off is None or axis.begin != 0:
            return None
        offsets.append(off)
    lo = [0] * len(stage.axes)
    hi = [a.extent for a in stage.axes]
    for c in _conjuncts(cond):
        b = _bound(c, stage.axes)
        if b is None:
            return None
        k, blo, bhi = b
        lo[k], hi[k] = max(lo[k], blo), min(hi[k], bhi)
    pads = []
    for k, axis in enumerate(stage.axes):
        n, p, e = src_shape[k], offsets[k], axis.extent
        guarded = (max(lo[k], 0), min(hi[k], e))
        valid = (max(p, 0), min(p + n, e))
        if guarded != valid or valid[0] >= valid[1]:
            return None
        pads.append((max(0, p), max(0, e - p - n)))
    return PadForm(source, offsets, pads, float(value))
