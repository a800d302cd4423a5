"""Small helpers shared by the op-family lifts: static shapes, attributes, iterators, indices."""

from __future__ import annotations

import keyword
from typing import Iterable, List, Optional, Sequence, Tuple

import numpy as np

from ..compat import relax, tirx
from ..ir.nodes import BinOp, Call, Const, IterVar, Node, Var, value_dtype
from .errors import LiftError

#: Element types the arithmetic lifts accept. The interpreter computes in floating point, so
#: integer arithmetic (truncating division, overflow) is left out.
FLOAT_DTYPES = ("float16", "float32", "float64", "bfloat16")


def op_name(call) -> str:
    """The name of a call's operator (``relax.nn.conv2d``) or ``<name>`` for non-Op callees."""
    op = call.op
    return getattr(op, "name", None) or getattr(op, "name_hint", None) or str(op)


def is_identifier(name: str) -> bool:
    """Names the IR text can carry: Python identifiers that are not keywords."""
    return isinstance(name, str) and name.isidentifier() and not keyword.iskeyword(name)


def prim_int(value, what: str) -> int:
    """A Python int from an int, ``IntImm`` or ``FloatImm`` holding an integer; else LiftError."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, tirx.IntImm):
        return int(value.value)
    raise LiftError(f"{what} is not a static integer: {value}")


def int_list(values, what: str) -> List[int]:
    """Static integers of an attribute array (``None`` gives ``[]``)."""
    if values is None:
        return []
    return [prim_int(v, what) for v in values]


def static_shape(ty, what: str) -> Tuple[int, ...]:
    """The static shape of a ``relax.TensorType``; symbolic or unknown shapes raise LiftError."""
    if not isinstance(ty, relax.TensorType):
        raise LiftError(f"{what} is not a tensor (type {ty})")
    shape = ty.shape
    if shape is None:
        raise LiftError(f"{what} has an unknown shape (rank {ty.ndim})")
    dims = []
    for s in shape.values:
        if not isinstance(s, tirx.IntImm):
            raise LiftError(f"{what} has a symbolic shape {shape}; only static shapes lift")
        dims.append(int(s.value))
    return tuple(dims)


def tensor_dtype(ty, what: str) -> str:
    """The element type of a ``relax.TensorType`` as a string."""
    dtype = str(ty.dtype)
    if not dtype or dtype == "void" or dtype.startswith("handle"):
        raise LiftError(f"{what} has an unknown dtype")
    return dtype


def require_float(dtype: str, what: str) -> None:
    """Arithmetic lifts accept floating types only (see :data:`FLOAT_DTYPES`)."""
    if dtype not in FLOAT_DTYPES:
        raise LiftError(f"{what}: dtype {dtype} is not supported (floating types only)")


def require_out_dtype(out_dtype, in_dtype: str, what: str) -> None:
    """An ``out_dtype`` attribute must be unset or equal the input type (for lifts that do not
    model an accumulation type; :func:`accumulation_dtype` for those that do)."""
    text = _dtype_attr(out_dtype)
    if text is None or text == in_dtype:
        return
    raise LiftError(f"{what}: out_dtype {text} differs from the input dtype {in_dtype}")


def accumulation_dtype(out_dtype, in_dtype: str, what: str) -> str:
    """The type a contraction multiplies and sums in: its float ``out_dtype`` attribute (TOPI
    casts both operands to it, e.g. float16 inputs summed in float32), else the input type."""
    text = _dtype_attr(out_dtype)
    if text is None:
        return in_dtype
    require_float(text, what)
    return text


def cast_to(node: Node, dtype: str) -> Node:
    """``dtype(node)``, or ``node`` when it already has that type."""
    return node if value_dtype(node) == dtype else Call(dtype, (node,))


def _dtype_attr(out_dtype) -> Optional[str]:
    if out_dtype is None:
        return None
    text = str(out_dtype)
    return None if text in ("", "void") else text


def normalize_axis(axis: int, ndim: int, what: str) -> int:
    """A non-negative axis; out-of-range axes raise LiftError."""
    if not -ndim <= axis < max(ndim, 1):
        raise LiftError(f"{what}: axis {axis} out of range for rank {ndim}")
    return axis + ndim if axis < 0 else axis


class IterNames:
    """Hands out distinct iterator names for one scope, avoiding a set of reserved names.

    Tensor names are reserved so that the canonical text never shows a tensor and an iterator
    under one name (``w[f, c, r, s]`` next to an iterator ``w`` reads badly and confuses people).
    """

    def __init__(self, reserved: Iterable[str] = ()):
        self.taken = set(reserved)

    def take(self, wanted: str) -> Var:
        """``wanted`` itself when free, else ``wanted0``, ``wanted1``, ..."""
        name = wanted if is_identifier(wanted) else "i"
        if name in self.taken:
            k = 0
            while f"{name}{k}" in self.taken:
                k += 1
            name = f"{name}{k}"
        self.taken.add(name)
        return Var(name)

    def iters(self, wanted: Sequence[str], extents: Sequence[int]) -> List[IterVar]:
        """One ``IterVar(name, 0, extent)`` per requested name."""
        return [IterVar(self.take(w), 0, e) for w, e in zip(wanted, extents)]


def affine(terms: Sequence[Tuple[Node, int]], const: int = 0) -> Node:
    """``Σ coeff·node + const`` as readable index arithmetic (``h * 2 + r - 1``).

    Zero coefficients are dropped, unit coefficients print bare, negative ones subtract; a
    leading negative term subtracts from the constant (``3 - r``).
    """
    out: Optional[Node] = None
    for node, coeff in terms:
        if coeff == 0:
            continue
        term = node if abs(coeff) == 1 else BinOp("*", node, Const(abs(coeff)))
        if out is None and coeff > 0:
            out = term
        elif out is None:
            out, const = BinOp("-", Const(const), term), 0
        else:
            out = BinOp("+" if coeff > 0 else "-", out, term)
    if out is None:
        return Const(const)
    if const > 0:
        out = BinOp("+", out, Const(const))
    elif const < 0:
        out = BinOp("-", out, Const(-const))
    return out


def conjunction(conds: Sequence[Node]) -> Optional[Node]:
    """``c0 and c1 and ...`` (``None`` for no conditions)."""
    out: Optional[Node] = None
    for c in conds:
        out = c if out is None else BinOp("and", out, c)
    return out


def float_const(value: float, dtype: str) -> Const:
    """A floating constant of the operator's element type."""
    return Const(float(value), dtype if dtype in FLOAT_DTYPES else "float32")


def read_padding(lo_read: int, hi_read: int, extent: int) -> Tuple[int, int]:
    """The padding a tensor of ``extent`` needs to be read at every index in ``[lo, hi]``."""
    return max(0, -lo_read), max(0, hi_read - (extent - 1))


def lowest_float(dtype: str) -> float:
    """The lowest finite value of a float type (``-inf`` for types numpy does not know)."""

    try:
        return float(np.finfo(np.dtype(dtype)).min)
    except (TypeError, ValueError):
        return float("-inf")
