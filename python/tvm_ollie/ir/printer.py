"""Canonical text of expressions, in the paper's notation.

::

    L<n:0:1, h:0:7, w:0:7, f:0:512> Σ<c:0:512, r:0:3, s:0:3> {
        A<pad=[0, 1, 1, 0]>[n, h + r - 1, w + s - 1, c] * K[r, s, f, c] }
      where A: float32[1, 7, 7, 512]; K: float32[3, 3, 512, 512]

(on one line). Iterators are ``name:begin:end``; ``Σ`` is a sum, ``Max`` a max reduction; a scope's
output padding is ``pad=[...]`` before its body; a tensor's padding is written at each subscript
(``lo:hi`` where the two sides differ) and its shape and dtype once, in the ``where`` clause.
Nested scopes appear in parentheses, subscripted. ``parser.parse`` reads this text back.
"""

from __future__ import annotations

import math
from typing import List

from .nodes import (DEFAULT_DTYPES, Access, BinOp, Call, Const, IterVar, Node, Scope, Tensor, Var,
                    input_tensors, install_printer)

# Binding strength of binary operators (higher binds tighter).
PRECEDENCE = {
    "or": 1, "and": 2,
    "<": 3, "<=": 3, ">": 3, ">=": 3, "==": 3, "!=": 3,
    "+": 4, "-": 4,
    "*": 5, "//": 5, "%": 5, "/": 5,
}
ATOM = 10


def to_text(node: Node, where: bool = True) -> str:
    """The canonical one-line text of ``node``; ``where`` appends the tensor declarations."""
    text, _ = _expr(node)
    if where:
        tensors = input_tensors(node) if not isinstance(node, Tensor) else (node,)
        if tensors:
            text += " where " + "; ".join(_declare(t) for t in tensors)
    return text


def _declare(t: Tensor) -> str:
    return f"{t.name}: {t.dtype}[{', '.join(str(s) for s in t.shape)}]"


def format_pad(pad) -> str:
    """``[0, 1, 2:3]``: symmetric sides as one number, asymmetric ones as ``lo:hi``."""
    return "[" + ", ".join(str(lo) if lo == hi else f"{lo}:{hi}" for lo, hi in pad) + "]"


def format_const(value, dtype: str) -> str:
    """Integers plainly; floats always with a point or exponent so they parse back as floats."""
    if dtype.startswith("int"):
        return str(value)
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if math.isnan(value):
        return "nan"
    text = repr(float(value))
    return text


def _iters(ivs) -> str:
    return ", ".join(f"{iv.var.name}:{iv.begin}:{iv.end}" for iv in ivs)


def _scope(s: Scope) -> str:
    parts: List[str] = [f"L<{_iters(s.loops)}>"]
    if s.reduce:
        parts.append(("Σ" if s.reducer == "sum" else "Max") + f"<{_iters(s.reduce)}>")
    if any(lo or hi for lo, hi in s.pad):
        parts.append(f"pad={format_pad(s.pad)}")
    body, _ = _expr(s.body)
    parts.append("{ " + body + " }")
    return " ".join(parts)


def _expr(node: Node):
    """Returns ``(text, precedence)`` of ``node``."""
    if isinstance(node, Var):
        return node.name, ATOM
    if isinstance(node, Const):
        text = format_const(node.value, node.dtype)
        if node.dtype not in DEFAULT_DTYPES:  # a typed literal reads as a cast of a literal
            return f"{node.dtype}({text})", ATOM
        return text, (ATOM if not text.startswith("-") else 6)
    if isinstance(node, BinOp):
        prec = PRECEDENCE[node.op]
        left, lp = _expr(node.a)
        right, rp = _expr(node.b)
        if lp < prec:
            left = f"({left})"
        if rp <= prec:  # left-associative: an equal-precedence right operand needs parentheses
            right = f"({right})"
        return f"{left} {node.op} {right}", prec
    if isinstance(node, Call):
        return f"{node.func}(" + ", ".join(_expr(a)[0] for a in node.args) + ")", ATOM
    if isinstance(node, Access):
        idx = ", ".join(_expr(i)[0] for i in node.indices)
        src = node.source
        if isinstance(src, Tensor):
            return f"{_tensor_ref(src)}[{idx}]", ATOM
        return f"({_scope(src)})[{idx}]", ATOM
    if isinstance(node, Scope):
        return _scope(node), 0
    if isinstance(node, Tensor):
        return _tensor_ref(node), ATOM
    if isinstance(node, IterVar):
        return f"{node.var.name}:{node.begin}:{node.end}", ATOM
    raise TypeError(f"cannot print {type(node).__name__}")


def _tensor_ref(t: Tensor) -> str:
    attrs = []
    if any(lo or hi for lo, hi in t.pad):
        attrs.append(f"pad={format_pad(t.pad)}")
    if t.pad_value != 0.0:
        attrs.append(f"value={format_const(t.pad_value, 'float32')}")
    return t.name + (f"<{', '.join(attrs)}>" if attrs else "")


install_printer(to_text)
