"""Conversion of TIR scalar expressions (TE bodies, PrimFunc block values) into IR nodes.

Only what the IR expresses exactly is converted; anything else raises :class:`LiftError`:

* ``+ - *``, floor division/modulo (``//``, ``%``), float division ``/``; integer ``Div`` and
  ``Mod`` truncate towards zero in TIR and are rejected (the IR's ``//`` floors);
* comparisons, ``and``/``or``; ``not`` is pushed into comparisons (De Morgan);
* ``Min``/``Max``, ``Select``/``if_then_else`` (→ ``select``), ``likely(x)`` (→ ``x``);
* the intrinsics ``exp tanh sigmoid log sqrt rsqrt erf fabs pow``;
* ``Cast`` between integer types (index arithmetic) and to the same type vanish; a cast of a
  constant folds; a cast to or from a float type is an IR cast (``float32(x)``);
* ``Let`` (substituted), constants, the iterators bound by the enclosing stage;
* tensor reads (``te.tensor_load`` calls in TE, ``TensorLoad`` in PrimFuncs), resolved by a
  callback so that TE and PrimFunc lifts share this converter; an index that itself reads a
  tensor (gathers such as ``take``) is rejected: the IR's indices are iterator arithmetic.
"""

from __future__ import annotations

from typing import Callable, Dict, List

from ..compat import TENSOR_LOAD, BufferLoadNode, tirx, tvm
from ..ir.nodes import CAST_DTYPES, Access, BinOp, Call, Const, Node, is_float_dtype, iter_nodes
from .errors import LiftError

#: Class of calls in TIR (intrinsics, ``te.tensor_load``): the same class as ``relax.Call``.
TirCall = tvm.ir.expr.Call

_INTRINSICS = {
    "tirx.exp": "exp", "tirx.tanh": "tanh", "tirx.sigmoid": "sigmoid", "tirx.log": "log",
    "tirx.sqrt": "sqrt", "tirx.rsqrt": "rsqrt", "tirx.erf": "erf", "tirx.fabs": "abs",
    "tirx.pow": "pow",
}
_ARITH = ((tirx.Add, "+"), (tirx.Sub, "-"), (tirx.Mul, "*"), (tirx.FloorDiv, "//"),
          (tirx.FloorMod, "%"))
_COMPARE = ((tirx.LT, "<"), (tirx.LE, "<="), (tirx.GT, ">"), (tirx.GE, ">="), (tirx.EQ, "=="),
            (tirx.NE, "!="), (tirx.And, "and"), (tirx.Or, "or"))
_NEGATED = {tirx.LT: ">=", tirx.LE: ">", tirx.GT: "<=", tirx.GE: "<", tirx.EQ: "!=",
            tirx.NE: "=="}


def dtype_of(expr) -> str:
    """The element type of a TIR expression as a string."""
    return str(expr.ty)


def is_int_type(dtype: str) -> bool:
    """Integer (or boolean) element types: the ones of index arithmetic."""
    return dtype.startswith("int") or dtype.startswith("uint") or dtype == "bool"


def op_name_of(call) -> str:
    """Name of a TIR call's operator."""
    return getattr(call.op, "name", str(call.op))


def is_tensor_load(expr) -> bool:
    """Whether ``expr`` reads a tensor (TE ``tensor_load`` or a PrimFunc ``TensorLoad``)."""
    if isinstance(expr, BufferLoadNode):
        return True
    return isinstance(expr, TirCall) and expr.op.same_as(TENSOR_LOAD)


def load_parts(expr):
    """``(source, indices)`` of a tensor read."""
    if isinstance(expr, BufferLoadNode):
        return expr.source, list(expr.indices)
    return expr.args[0], list(expr.args[1:])


class ExprConverter:
    """Converts the TIR expressions of one stage.

    Parameters
    ----------
    var_map : dict
        Maps ``hash(tvm Var)`` to the IR node that replaces it (the stage's iterators).
    load : callable
        ``load(source, indices) -> Node`` builds the read of a tensor/buffer ``source`` at IR
        ``indices``.
    what : str
        Names the stage in error messages.
    """

    def __init__(self, var_map: Dict[int, Node], load: Callable[[object, List[Node]], Node],
                 what: str):
        self.var_map = dict(var_map)
        self.load = load
        self.what = what

    def fail(self, expr, why: str) -> LiftError:
        """A LiftError naming the stage and the offending expression."""
        text = str(expr)
        if len(text) > 200:
            text = text[:197] + "..."
        return LiftError(f"{self.what}: {why}: {text}")

    def __call__(self, expr) -> Node:
        return self.convert(expr)

    def convert(self, expr) -> Node:  # pylint: disable=too-many-return-statements,too-many-branches
        """The IR node of ``expr``."""
        if isinstance(expr, tirx.IntImm):
            return Const(int(expr.value))
        if isinstance(expr, tirx.FloatImm):
            return Const(float(expr.value), dtype_of(expr))
        if isinstance(expr, tirx.Var):
            node = self.var_map.get(hash(expr))
            if node is None:
                raise self.fail(expr, "free variable (symbolic shape or unbound iterator)")
            return node
        if is_tensor_load(expr):
            source, indices = load_parts(expr)
            idx = [self.convert(i) for i in indices]
            if any(isinstance(n, Access) for i in idx for n in iter_nodes(i)):
                raise self.fail(expr, "data-dependent indexing (an index reads a tensor)")
            return self.load(source, idx)
        for cls, op in _ARITH:
            if isinstance(expr, cls):
                return BinOp(op, self.convert(expr.a), self.convert(expr.b))
        if isinstance(expr, tirx.Div):
            if is_int_type(dtype_of(expr)):
                raise self.fail(expr, "integer division truncates (the IR's // floors)")
            return BinOp("/", self.convert(expr.a), self.convert(expr.b))
        if isinstance(expr, tirx.Mod):
            raise self.fail(expr, "truncated modulo has no IR equivalent")
        if isinstance(expr, tirx.Min):
            return Call("min", (self.convert(expr.a), self.convert(expr.b)))
        if isinstance(expr, tirx.Max):
            return Call("max", (self.convert(expr.a), self.convert(expr.b)))
        for cls, op in _COMPARE:
            if isinstance(expr, cls):
                return BinOp(op, self.convert(expr.a), self.convert(expr.b))
        if isinstance(expr, tirx.Not):
            return self.negate(expr.a)
        if isinstance(expr, tirx.Select):
            return Call("select", (self.convert(expr.condition), self.convert(expr.true_value),
                                   self.convert(expr.false_value)))
        if isinstance(expr, tirx.Cast):
            return self.cast(expr)
        if isinstance(expr, tirx.Let):
            inner = ExprConverter(self.var_map, self.load, self.what)
            inner.var_map[hash(expr.var)] = self.convert(expr.value)
            return inner.convert(expr.body)
        if isinstance(expr, TirCall):
            return self.call(expr)
        if isinstance(expr, tirx.Reduce):
            raise self.fail(expr, "a reduction nested inside an expression")
        raise self.fail(expr, f"unsupported TIR node {type(expr).__name__}")

    def call(self, expr) -> Node:
        """Intrinsic calls."""
        name = op_name_of(expr)
        if name in ("prim.if_then_else", "tirx.if_then_else"):
            c, t, f = expr.args
            return Call("select", (self.convert(c), self.convert(t), self.convert(f)))
        if name in ("prim.likely", "tirx.likely"):
            return self.convert(expr.args[0])
        func = _INTRINSICS.get(name)
        if func is None:
            raise self.fail(expr, f"unsupported intrinsic {name}")
        return Call(func, tuple(self.convert(a) for a in expr.args))

    def cast(self, expr) -> Node:
        """Integer-to-integer casts (index arithmetic) and casts to the same type change no value
        and vanish; a cast of a constant folds; casts to or from a float type become IR casts."""
        src, dst = dtype_of(expr.value), dtype_of(expr)
        value = expr.value
        if src == dst or (is_int_type(src) and is_int_type(dst) and dst != "bool"):
            return self.convert(value)
        if isinstance(value, (tirx.IntImm, tirx.FloatImm)):
            if is_int_type(dst):
                return Const(int(value.value))
            return Const(float(value.value), dst)
        if dst in CAST_DTYPES and (is_float_dtype(dst) or is_float_dtype(src)):
            return Call(dst, (self.convert(value),))
        raise self.fail(expr, f"cast from {src} to {dst} (not an IR cast type)")

    def negate(self, expr) -> Node:
        """``not expr`` pushed into comparisons."""
        for cls, op in _NEGATED.items():
            if isinstance(expr, cls):
                return BinOp(op, self.convert(expr.a), self.convert(expr.b))
        if isinstance(expr, tirx.And):
            return BinOp("or", self.negate(expr.a), self.negate(expr.b))
        if isinstance(expr, tirx.Or):
            return BinOp("and", self.negate(expr.a), self.negate(expr.b))
        if isinstance(expr, tirx.Not):
            return self.convert(expr.a)
        raise self.fail(expr, "negation of a non-comparison")
