"""Derivation through widening casts of input reads (float16 data summed in float32).

A mixed-precision contraction reads its inputs under a widening cast,
``Σ float32(A[..]) * float32(K[..])`` for float16 ``A`` and ``K``. The derivation rules and
operator matchers look for products of tensor reads, which a cast hides. A widening float cast
changes no value (every float16 value is a float32 value, zero padding included), so reading
``float32(A[idx])`` is reading element ``idx`` of the float32 copy of ``A``, whatever ``idx`` is.
The search therefore runs on the expression with each such input retyped to the cast's type
(:func:`widen_reads`), and every derived program is mapped back (:func:`restore_program`): each
read of a retyped input becomes the cast of a read of the original input. Both maps are exact, so
a program verified on the widened expression computes the original one (its stages accumulate in
the widened type, as the original does).

An input is retyped only when every read of it is under the same widening cast; inputs read both
with and without a cast keep their type (the search then sees the casts as they are).
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple

from ..ir.nodes import (Access, Call, Node, Scope, Tensor, dtype_bits, is_cast,
                        is_float_dtype, iter_nodes)
from ..ir.rewrite import rewrite
from .program import Program, Stage, map_accesses

__all__ = ["widen_reads", "restore_program", "widens"]

#: name -> (original dtype, widened dtype) of the retyped inputs
Retyped = Dict[str, Tuple[str, str]]


def widens(src: str, dst: str) -> bool:
    """Every value of float type ``src`` is a value of float type ``dst`` (``dst`` wider)."""
    if not (is_float_dtype(src) and is_float_dtype(dst)) or src == dst:
        return False
    if {src, dst} == {"float16", "bfloat16"}:
        return False
    return dtype_bits(dst) > dtype_bits(src)


def _read_types(expr: Scope) -> Dict[str, set]:
    """Per input tensor name, how it is read: the widening cast type, or None for a plain read."""
    seen: Dict[str, set] = {}
    for node in iter_nodes(expr):
        for child in node.children:
            if not (isinstance(child, Access) and isinstance(child.source, Tensor)):
                continue
            t = child.source
            how = node.func if is_cast(node) and widens(t.dtype, node.func) else None
            seen.setdefault(t.name, set()).add(how)
    return seen


def widen_reads(expr: Scope) -> Tuple[Scope, Retyped]:
    """``expr`` with every input read only under one widening cast retyped to that cast's type
    (the casts removed), and the retyped inputs; ``(expr, {})`` when there is none."""
    retyped: Retyped = {}
    for name, hows in _read_types(expr).items():
        if len(hows) == 1 and None not in hows:
            retyped[name] = ("", next(iter(hows)))
    if not retyped:
        return expr, {}

    def retype(cur: Node) -> Optional[Node]:
        if not (is_cast(cur) and isinstance(cur.args[0], Access) and
                isinstance(cur.args[0].source, Tensor) and cur.args[0].source.name in retyped):
            return None
        acc = cur.args[0]
        t = acc.source
        retyped[t.name] = (t.dtype, cur.func)
        return Access(Tensor(t.name, t.shape, cur.func, t.pad, t.pad_value), acc.indices)

    return rewrite(expr, pre=retype), retyped


def restore_reads(node: Node, retyped: Retyped) -> Node:
    """``node`` with every read of a retyped input read from the original input and cast."""

    def fn(acc: Access) -> Optional[Node]:
        t = acc.source
        if not isinstance(t, Tensor) or t.name not in retyped:
            return None
        orig, wide = retyped[t.name]
        if t.dtype != wide:
            return None
        read = Access(Tensor(t.name, t.shape, orig, t.pad, t.pad_value), acc.indices)
        return Call(wide, (read,))

    return map_accesses(node, fn)


def restore_program(program: Program, original: Scope, retyped: Retyped) -> Program:
    """A program derived from :func:`widen_reads`'s expression, over the original inputs."""
    stages = [Stage(s.name, s.kind, restore_reads(s.expr, retyped), dict(s.attrs), s.label)
              for s in program.stages]
    derived = restore_reads(program.derived, retyped)
    return Program(stages, original, program.output, program.steps, derived)
