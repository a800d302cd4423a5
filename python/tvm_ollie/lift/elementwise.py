"""Lifts of elementwise Relax ops: broadcasting binary arithmetic and unary activations.

The output scope has one loop per output dimension (``i0, i1, ...``). An operand is read with
numpy broadcasting: its dimensions align with the trailing output dimensions and a dimension of
extent 1 against a larger output extent is read at index 0. One-element constants are inlined as
scalars. Composite activations (``gelu``, ``silu``, ...) are written exactly as TVM's legalizer
computes them, so that the lifted body and TVM's kernel round the same way.
"""

from __future__ import annotations

import math
from typing import Callable, Dict, List, Sequence

from ..ir.nodes import Access, BinOp, Call, Const, IterVar, Node, Scope, Tensor
from .common import IterNames, cast_to, float_const, op_name, require_float
from .errors import LiftError
from .registry import Operands, register_lift


def _loops(names: Operands, shape: Sequence[int]) -> List[IterVar]:
    gen = IterNames(names.names)
    return gen.iters([f"i{k}" for k in range(len(shape))], shape)


def broadcast_read(names: Operands, arg, loops: Sequence[IterVar], dtype: str) -> Node:
    """The value of operand ``arg`` at the output position ``loops`` (numpy broadcasting)."""
    value = names.scalar(arg)
    if value is not None:
        return float_const(value, dtype)
    t = names.tensor(arg)
    if t.dtype != dtype:
        raise LiftError(f"{names.op}: operand dtype {t.dtype} differs from result dtype {dtype}")
    return Access(t, broadcast_index(names, t, loops))


def broadcast_index(names: Operands, t: Tensor, loops: Sequence[IterVar]) -> List[Node]:
    """Indices reading ``t`` at output position ``loops`` under numpy broadcasting."""
    out_rank = len(loops)
    if t.ndim > out_rank:
        raise LiftError(f"{names.op}: operand of rank {t.ndim} wider than the result")
    idx: List[Node] = []
    for d, extent in enumerate(t.shape):
        iv = loops[out_rank - t.ndim + d]
        if extent == iv.extent:
            idx.append(iv.var)
        elif extent == 1:
            idx.append(Const(0))
        else:
            raise LiftError(f"{names.op}: cannot broadcast shape {t.shape} to the result")
    return idx


def _elementwise(call, names: Operands, body_of: Callable[[List[Node], str], Node]) -> Scope:
    shape = names.out_shape()
    dtype = names.out_dtype()
    require_float(dtype, names.op)
    loops = _loops(names, shape)
    args = [broadcast_read(names, a, loops, dtype) for a in call.args]
    return Scope(loops, (), body_of(args, dtype))


_BINARY: Dict[str, Callable[[Node, Node], Node]] = {
    "relax.add": lambda a, b: BinOp("+", a, b),
    "relax.subtract": lambda a, b: BinOp("-", a, b),
    "relax.multiply": lambda a, b: BinOp("*", a, b),
    "relax.divide": lambda a, b: BinOp("/", a, b),
    "relax.maximum": lambda a, b: Call("max", (a, b)),
    "relax.minimum": lambda a, b: Call("min", (a, b)),
    "relax.power": lambda a, b: Call("pow", (a, b)),
}


def _lift_binary(call, names: Operands) -> Scope:
    make = _BINARY[op_name(call)]
    if len(call.args) != 2:
        raise LiftError(f"{names.op}: expected two operands")
    return _elementwise(call, names, lambda args, _: make(args[0], args[1]))


for _name in _BINARY:
    register_lift(_name, _lift_binary)


_UNARY_FUNCS = {
    "relax.nn.relu": "relu",
    "relax.tanh": "tanh",
    "relax.sigmoid": "sigmoid",
    "relax.exp": "exp",
    "relax.log": "log",
    "relax.sqrt": "sqrt",
    "relax.rsqrt": "rsqrt",
    "relax.erf": "erf",
    "relax.abs": "abs",
    "relax.negative": "neg",
}


def _lift_unary(call, names: Operands) -> Scope:
    func = _UNARY_FUNCS[op_name(call)]
    return _elementwise(call, names, lambda args, _: Call(func, (args[0],)))


for _name in _UNARY_FUNCS:
    register_lift(_name, _lift_unary)


@register_lift("relax.nn.gelu")
def _lift_gelu(call, names: Operands) -> Scope:
    """``x * (0.5 + erf(x * sqrt(1/2)) * 0.5)``, TVM's legalized form."""

    def body(args, dtype):
        x = args[0]
        half = float_const(0.5, dtype)
        erf = Call("erf", (BinOp("*", x, float_const(0.5 ** 0.5, dtype)),))
        return BinOp("*", x, BinOp("+", half, BinOp("*", erf, half)))

    return _elementwise(call, names, body)


@register_lift("relax.nn.gelu_tanh")
def _lift_gelu_tanh(call, names: Operands) -> Scope:
    """``0.5 * x * (1 + tanh(sqrt(2/pi) * x * (1 + 0.044715 * x * x)))`` as TVM computes it."""

    def body(args, dtype):
        x = args[0]
        c = float_const(math.sqrt(2.0 / math.pi), dtype)
        inner = BinOp("*", BinOp("*", c, x),
                      BinOp("+", float_const(1.0, dtype),
                            BinOp("*", BinOp("*", float_const(0.044715, dtype), x), x)))
        tanh = Call("tanh", (inner,))
        return BinOp("*", BinOp("*", float_const(0.5, dtype), x),
                     BinOp("+", float_const(1.0, dtype), tanh))

    return _elementwise(call, names, body)


@register_lift("relax.nn.silu")
def _lift_silu(call, names: Operands) -> Scope:
    """``x * sigmoid(x)``."""
    return _elementwise(call, names, lambda args, _: BinOp("*", args[0],
                                                           Call("sigmoid", (args[0],))))


@register_lift("relax.clip")
def _lift_clip(call, names: Operands) -> Scope:
    """``max(min(x, hi), lo)`` (topi.clip's order)."""
    lo, hi = names.scalar(call.args[1]), names.scalar(call.args[2])
    if lo is None or hi is None:
        raise LiftError(f"{names.op}: clip bounds must be static scalars")
    shape = names.out_shape()
    dtype = names.out_dtype()
    require_float(dtype, names.op)
    loops = _loops(names, shape)
    x = broadcast_read(names, call.args[0], loops, dtype)
    body = Call("max", (Call("min", (x, float_const(hi, dtype))), float_const(lo, dtype)))
    return Scope(loops, (), body)


@register_lift("relax.nn.leakyrelu")
def _lift_leakyrelu(call, names: Operands) -> Scope:
    """``select(x > 0, x, x * alpha)`` (topi.nn.leaky_relu)."""
    alpha = float(call.attrs.alpha)

    def body(args, dtype):
        x = args[0]
        return Call("select", (BinOp(">", x, float_const(0.0, dtype)), x,
                               BinOp("*", x, float_const(alpha, dtype))))

    return _elementwise(call, names, body)


@register_lift("relax.astype")
def _lift_astype(call, names: Operands) -> Scope:
    """``dtype(x)``: a float-to-float conversion (TOPI's ``astype``)."""
    dtype = names.out_dtype()
    require_float(dtype, names.op)
    x = names.tensor(call.args[0])
    require_float(x.dtype, names.op)
    loops = _loops(names, names.out_shape())
    if tuple(iv.extent for iv in loops) != x.shape:
        raise LiftError(f"{names.op}: result shape differs from the operand's")
    return Scope(loops, (), cast_to(Access(x, [iv.var for iv in loops]), dtype))


@register_lift("relax.square")
def _lift_square(call, names: Operands) -> Scope:
    """``x * x``."""
    return _elementwise(call, names, lambda args, _: BinOp("*", args[0], args[0]))
