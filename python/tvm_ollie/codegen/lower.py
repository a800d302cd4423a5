"""Lower an expression of the tensor-algebra IR back into TVM: TE stages, a PrimFunc, a module.

Every :class:`~tvm_ollie.ir.nodes.Scope` becomes one ``te.compute`` stage, materialized at its
padded shape (``end - begin + lo + hi`` per loop), so that the stage element at position ``p`` holds
the loop value ``v = p - lo + begin`` and the margins hold 0, exactly as ``nodes.py`` defines a
scope. A nested scope is a separate stage, built once however many accesses read it (nodes are
hash-consed, so the node itself is the memo key); an access of it at loop value ``v`` reads the
stage at ``v - begin + lo``. The outermost scope is the output stage.

Tensor padding does not get a stage: a read of a padded tensor becomes
``if_then_else(in_bounds, A[idx], pad_value)``. TVM documents that ``if_then_else``, unlike
``Select``, never evaluates the branch whose condition is false, and codegen (LLVM branches, C
``?:``) honours that, so the guarded load is not executed for out-of-range indices. The guard is
emitted only on the dimensions where the integer bound analysis cannot prove the index in range,
so the common unpadded reads stay plain affine loads that schedule rules (dlight, MetaSchedule)
recognise.

The lowering assumes the expression reads only inside the padded range of each source (what
``verify.bounds.check_bounds`` checks); reads beyond it are undefined here, as they are errors in
the reference interpreter.
"""

from __future__ import annotations

from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from ..compat import te, tirx, tvm
from ..ir.nodes import (CAST_DTYPES, Access, BinOp, Call, Const, Node, Scope, Tensor, Var,
                        numpy_dtype)
from ..target import target_device

#: dtype of every index expression and te axis.
INDEX_DTYPE = "int32"


class LoweringError(ValueError):
    """The expression cannot be lowered (unbound iterator, float index, mismatched input...)."""


def to_te(
    expr: Scope,
    placeholders: Optional[Mapping[str, "te.Tensor"]] = None,
    name: str = "ollie",
) -> Tuple[List["te.Tensor"], "te.Tensor"]:
    """Build the TE stages of ``expr``.

    Parameters
    ----------
    expr : Scope
        The expression; its loops are the output dimensions.
    placeholders : Mapping[str, te.Tensor], optional
        Existing tensors to read for some inputs (by tensor name), e.g. the arguments of a
        ``BlockBuilder.call_te``; the other inputs get fresh placeholders.
    name : str
        Name of the output stage; nested stages are named ``{name}_s{k}``.

    Returns
    -------
    inputs : list[te.Tensor]
        One tensor per ``expr.inputs``, in that order (names, shapes, dtypes of the inputs).
    output : te.Tensor
        The output stage, of shape ``expr.shape``.
    """
    if not isinstance(expr, Scope):
        raise TypeError(f"to_te lowers a Scope, not {type(expr).__name__}")
    builder = _StageBuilder(expr, placeholders or {}, name)
    return builder.inputs, builder.stage(expr, name)


def lower(expr: Scope, name: str = "main") -> "tirx.PrimFunc":
    """The PrimFunc of ``expr``: parameters ``expr.inputs`` then the output buffer.

    ``global_symbol`` is set to ``name``: ``te.create_prim_func`` always names its function
    "main", which collides as soon as two lowered functions share a module.
    """
    inputs, output = to_te(expr, name=name)
    func = te.create_prim_func(list(inputs) + [output])
    return func.with_attr("global_symbol", name)


def build(expr: Scope, target: object = "llvm", name: str = "main") -> "tvm.runtime.Executable":
    """Compile ``expr`` (unscheduled, TVM's default TIR pipeline) for ``target``.

    The result is called as ``ex[name](*input_tensors, output_tensor)`` (or ``ex(...)`` when
    ``name == "main"``) with ``tvm.runtime.tensor`` arguments in the order of :func:`lower`.
    """
    func = lower(expr, name=name)
    return tvm.compile(tvm.IRModule({name: func}), target=target)


def run(expr: Scope, inputs: Mapping[str, np.ndarray], target: object = "llvm") -> np.ndarray:
    """Build ``expr`` for ``target`` and run it on numpy ``inputs`` (keyed by tensor name), on
    the target's device."""
    ex = build(expr, target=target, name="main")
    device = target_device(target)
    args = []
    for tensor in expr.inputs:
        if tensor.name not in inputs:
            raise KeyError(f"missing input {tensor.name!r}")
        array = np.ascontiguousarray(inputs[tensor.name], dtype=numpy_dtype(tensor.dtype))
        if array.shape != tensor.shape:
            raise ValueError(f"input {tensor.name}: shape {array.shape}, expected {tensor.shape}")
        args.append(tvm.runtime.tensor(array, device))
    out = tvm.runtime.tensor(np.zeros(expr.shape, dtype=numpy_dtype(expr.dtype)), device)
    ex["main"](*args, out)
    return out.numpy()


# ----------------------------------------------------------------------------------------------
# Stages


class _StageBuilder:
    """Creates the placeholders and one memoized stage per distinct scope node."""

    def __init__(self, expr: Scope, given: Mapping[str, "te.Tensor"], name: str) -> None:
        self.inputs: List["te.Tensor"] = []
        self.tensors: Dict[str, "te.Tensor"] = {}
        for tensor in expr.inputs:
            self.tensors[tensor.name] = self._placeholder(tensor, given.get(tensor.name))
            self.inputs.append(self.tensors[tensor.name])
        if name in self.tensors:
            raise LoweringError(f"stage name {name!r} is also the name of an input tensor")
        self.stages: Dict[Scope, "te.Tensor"] = {}
        self.taken = set(self.tensors) | {name}
        self.name = name

    @staticmethod
    def _placeholder(tensor: Tensor, given: Optional["te.Tensor"]) -> "te.Tensor":
        if given is None:
            return te.placeholder(tensor.shape, tensor.dtype, tensor.name)
        shape = tuple(int(s) for s in given.shape)
        if shape != tensor.shape or str(given.dtype) != tensor.dtype:
            raise LoweringError(
                f"placeholder for {tensor.name} is {given.dtype}{list(shape)}, the expression "
                f"reads {tensor.dtype}{list(tensor.shape)}"
            )
        return given

    def tensor(self, tensor: Tensor) -> "te.Tensor":
        found = self.tensors.get(tensor.name)
        if found is None:  # cannot happen for tensors below the lowered scope
            raise LoweringError(f"tensor {tensor.name} is not an input of the expression")
        if tuple(int(s) for s in found.shape) != tensor.shape or str(found.dtype) != tensor.dtype:
            raise LoweringError(f"tensor {tensor.name} is read with two different shapes/dtypes")
        return found

    def stage(self, scope: Scope, name: Optional[str] = None) -> "te.Tensor":
        """The materialized (padded) stage of ``scope``, built on first use."""
        found = self.stages.get(scope)
        if found is None:
            found = self._build(scope, name or self._fresh_name())
            self.stages[scope] = found
        return found

    def _fresh_name(self) -> str:
        k = 0
        while f"{self.name}_s{k}" in self.taken:
            k += 1
        self.taken.add(f"{self.name}_s{k}")
        return f"{self.name}_s{k}"

    def _build(self, scope: Scope, name: str) -> "te.Tensor":
        loop_names = [iv.var.name for iv in scope.loops]
        if scope.reduce and any(lo or hi for lo, hi in scope.pad):
            # A reduction stage cannot carry zero margins itself: a Reduce must be the top of a
            # TE body, ``where=`` would leave the reducer's identity (-inf for max) there, and
            # te.create_prim_func in TVM 0.27 drops ``where`` anyway. So reduce in an unpadded
            # stage and pad in a second one.
            core = self.stage(scope.replace(pad=None))
            return te.compute(
                scope.shape,
                lambda *p: _guard_margins(scope, p, core(*_core_positions(scope, p)),
                                          _zero(scope.dtype)),
                name=name,
                varargs_names=loop_names,
            )
        return te.compute(
            scope.shape, lambda *p: self._body(scope, p), name=name, varargs_names=loop_names
        )

    def _body(self, scope: Scope, positions: Sequence["tirx.Var"]) -> "tirx.PrimExpr":
        """The te body at stage ``positions``: loop values are ``p - lo + begin``."""
        analyzer = tvm.sym.Analyzer()
        env: Dict[Var, "tirx.PrimExpr"] = {}
        for p, iv, (lo, _) in zip(positions, scope.loops, scope.pad):
            # The body is evaluated only inside the margins (see _guard_margins), so the bound
            # analysis of its reads may assume the unpadded range.
            analyzer.bind(p, tvm.ir.Range(lo, lo + iv.extent))
            env[iv.var] = _shift(p, iv.begin - lo)
        axes = []
        for iv in scope.reduce:
            axis = te.reduce_axis((0, iv.extent), name=iv.var.name)
            analyzer.bind(axis.var, tvm.ir.Range(0, iv.extent))
            env[iv.var] = _shift(axis.var, iv.begin)
            axes.append(axis)
        fdtype = scope.dtype if _is_float_dtype(scope.dtype) else "float32"
        iter_vars = [p for p, iv in zip(positions, scope.loops) if iv.extent > 1]
        iter_vars += [axis.var for axis, iv in zip(axes, scope.reduce) if iv.extent > 1]
        value = _ExprLowering(self, env, analyzer, fdtype, iter_vars).value(scope.body)
        value = _cast(value, scope.dtype)
        if axes:  # unpadded (see _build)
            return (te.sum if scope.reducer == "sum" else _max_reducer)(value, axis=axes)
        return _guard_margins(scope, positions, value, _zero(scope.dtype))


def _lowest(dtype: str) -> "tirx.PrimExpr":
    """Identity of max: -inf for floats (``te.max`` starts at the lowest finite value, so a max
    over only ``-inf`` reads, e.g. a pool window inside -inf padding, would not give -inf)."""
    dtype = str(dtype)
    return tirx.const(-np.inf, dtype) if _is_float_dtype(dtype) else tirx.min_value(dtype)


_max_reducer = te.comm_reducer(lambda x, y: tirx.max(x, y), _lowest, name="max")


def _core_positions(scope: Scope, positions: Sequence["tirx.Var"]) -> List["tirx.PrimExpr"]:
    """Positions in the unpadded stage of ``scope`` for positions in its padded stage."""
    return [_shift(p, -lo) for p, (lo, _) in zip(positions, scope.pad)]


def _margin_condition(scope: Scope, positions: Sequence["tirx.Var"]) -> Optional["tirx.PrimExpr"]:
    """``lo <= p < lo + extent`` on every padded dimension; None without padding."""
    conds = []
    for p, iv, (lo, hi) in zip(positions, scope.loops, scope.pad):
        if lo:
            conds.append(p >= lo)
        if hi:
            conds.append(p < lo + iv.extent)
    return tirx.all(*conds) if conds else None


def _guard_margins(
    scope: Scope, positions: Sequence["tirx.Var"], value: "tirx.PrimExpr", zero: "tirx.PrimExpr"
) -> "tirx.PrimExpr":
    inside = _margin_condition(scope, positions)
    return value if inside is None else tirx.if_then_else(inside, value, zero)


def _shift(expr: "tirx.PrimExpr", offset: int) -> "tirx.PrimExpr":
    return expr if offset == 0 else expr + offset


# ----------------------------------------------------------------------------------------------
# Scalar expressions


def _dtype(expr: "tirx.PrimExpr") -> str:
    return str(expr.ty)


def _is_float_dtype(dtype: str) -> bool:
    return dtype.startswith(("float", "bfloat"))


def _zero(dtype: str) -> "tirx.PrimExpr":
    return tirx.const(0, dtype)


def _cast(expr: "tirx.PrimExpr", dtype: str) -> "tirx.PrimExpr":
    return expr if _dtype(expr) == dtype else tirx.Cast(dtype, expr)


def _bits(dtype: str) -> int:
    return tvm.DataType(dtype).bits


def _common_dtype(a: str, b: str) -> str:
    """The type two operands meet at: float over int over bool, then the wider one."""
    if a == b:
        return a
    rank = {True: 2, False: 1}
    ka = 0 if a == "bool" else rank[_is_float_dtype(a)]
    kb = 0 if b == "bool" else rank[_is_float_dtype(b)]
    if ka != kb:
        return a if ka > kb else b
    return a if _bits(a) >= _bits(b) else b


def _unify(a: "tirx.PrimExpr", b: "tirx.PrimExpr") -> Tuple["tirx.PrimExpr", "tirx.PrimExpr"]:
    dtype = _common_dtype(_dtype(a), _dtype(b))
    return _cast(a, dtype), _cast(b, dtype)


def _as_bool(expr: "tirx.PrimExpr") -> "tirx.PrimExpr":
    if _dtype(expr) == "bool":
        return expr
    return tirx.NE(expr, _zero(_dtype(expr)))


_COMPARE: Dict[str, Callable] = {
    "<": tirx.LT, "<=": tirx.LE, ">": tirx.GT, ">=": tirx.GE, "==": tirx.EQ, "!=": tirx.NE,
}
_UNARY_FLOAT: Dict[str, Callable] = {
    "tanh": tirx.tanh, "sigmoid": tirx.sigmoid, "exp": tirx.exp, "log": tirx.log,
    "erf": tirx.erf, "sqrt": tirx.sqrt, "rsqrt": tirx.rsqrt,
}


class _ExprLowering:
    """Lowers the body of one scope, with its iterators bound to TE expressions in ``env``."""

    def __init__(
        self,
        stages: _StageBuilder,
        env: Mapping[Var, "tirx.PrimExpr"],
        analyzer: "tvm.sym.Analyzer",
        float_dtype: str,
        iter_vars: Sequence["tirx.Var"],
    ) -> None:
        self.stages = stages
        self.iter_vars = list(iter_vars)
        self.env = env
        self.analyzer = analyzer
        self.float_dtype = float_dtype
        self.memo: Dict[Node, "tirx.PrimExpr"] = {}

    def value(self, node: Node) -> "tirx.PrimExpr":
        found = self.memo.get(node)
        if found is None:
            found = self._lower(node)
            self.memo[node] = found
        return found

    def _lower(self, node: Node) -> "tirx.PrimExpr":
        if isinstance(node, Var):
            if node not in self.env:
                raise LoweringError(f"iterator {node.name} is not bound by the enclosing scope")
            return self.env[node]
        if isinstance(node, Const):
            if node.dtype.startswith("int"):
                return tirx.const(node.value, node.dtype)
            return tirx.const(node.value, self.float_dtype)
        if isinstance(node, BinOp):
            return self._binop(node)
        if isinstance(node, Call):
            return self._call(node)
        if isinstance(node, Access):
            return self._access(node)
        raise LoweringError(f"cannot lower a {type(node).__name__} inside a scope body")

    def _to_float(self, expr: "tirx.PrimExpr") -> "tirx.PrimExpr":
        return expr if _is_float_dtype(_dtype(expr)) else _cast(expr, self.float_dtype)

    def _binop(self, node: BinOp) -> "tirx.PrimExpr":
        a, b = self.value(node.a), self.value(node.b)
        op = node.op
        if op in ("and", "or"):
            return (tirx.And if op == "and" else tirx.Or)(_as_bool(a), _as_bool(b))
        if op in _COMPARE:
            a, b = _unify(a, b)
            return _COMPARE[op](a, b)
        if op == "/":
            a, b = _unify(self._to_float(a), self._to_float(b))
            return a / b
        a, b = _unify(a, b)
        if _dtype(a) == "bool":  # arithmetic on truth values counts them as integers
            a, b = _cast(a, INDEX_DTYPE), _cast(b, INDEX_DTYPE)
        if op == "+":
            return a + b
        if op == "-":
            return a - b
        if op == "*":
            return a * b
        if _is_float_dtype(_dtype(a)):
            # TVM's floordiv/floormod are integer-only; keep the IR's floor semantics.
            quotient = tirx.floor(a / b)
            return quotient if op == "//" else a - quotient * b
        return self._floor_divmod(op, a, b)

    def _floor_divmod(self, op: str, a: "tirx.PrimExpr", b: "tirx.PrimExpr") -> "tirx.PrimExpr":
        """Integer floor ``a // b`` or ``a % b``, in a form TVM 0.27 compiles correctly.

        ``FlattenBuffer`` runs ``IterMapSimplify`` on every buffer index, and in TVM 0.27 that
        mishandles floor division by ``k`` of a dividend with a constant offset or a negative
        iterator coefficient: ``(1 - i) % 2`` becomes ``-(i % -2)`` (the 1 is lost) and
        ``(i + 1) % 2 * 2 + i % 2`` becomes ``(i + 1) % 2 * 3``. Those divisions are written with
        truncating division of a dividend shifted to be non-negative (``a // k == trunc(a + k*m,
        k) - m``), which the iterator-map analysis does not touch and the simplifier keeps.
        Offset-free divisions with non-negative coefficients (reshapes, splits) stay floor
        divisions, the form schedules recognise.
        """
        floor = tirx.floordiv(a, b) if op == "//" else tirx.floormod(a, b)
        if not isinstance(b, tirx.IntImm) or b.value <= 0 or self._iter_map_safe(a, b):
            return floor
        low = self.analyzer.const_int_bound(a).min_value
        if low == tvm.sym.ConstIntBound.NEG_INF:
            return floor  # unbounded dividend: no shift makes it non-negative
        k = int(b.value)
        shift = max(0, -(low // k))  # k * shift >= -low
        if shift:
            a = a + tirx.const(k * shift, _dtype(a))
        if op == "%":
            return tirx.truncmod(a, b)
        quotient = tirx.truncdiv(a, b)
        return quotient - tirx.const(shift, _dtype(a)) if shift else quotient

    def _iter_map_safe(self, dividend: "tirx.PrimExpr", divisor: "tirx.PrimExpr") -> bool:
        """``dividend`` is ``sum(c_i * iter_i) + base``, every ``c_i >= 0`` and ``base % k == 0``.

        Iterators of extent 1 are folded into ``base`` first: TVM drops them too, so
        ``(j - i) % 2`` with ``j`` of extent 1 reaches the iterator map as ``(0 - i) % 2``.
        """
        dividend = self.analyzer.simplify(dividend)  # folds iterators of extent 1
        coeffs = list(tvm.sym.detect_linear_equation(dividend, self.iter_vars))
        if not coeffs or not all(isinstance(c, tirx.IntImm) for c in coeffs):
            return False
        *scales, base = (int(c.value) for c in coeffs)
        return all(c >= 0 for c in scales) and base % int(divisor.value) == 0

    def _call(self, node: Call) -> "tirx.PrimExpr":
        args = [self.value(a) for a in node.args]
        func = node.func
        if func in _UNARY_FLOAT:
            return _UNARY_FLOAT[func](self._to_float(args[0]))
        if func == "relu":
            return tirx.max(args[0], _zero(_dtype(args[0])))
        if func == "abs":
            return tirx.abs(args[0])
        if func == "neg":
            return _zero(_dtype(args[0])) - args[0]
        if func in ("max", "min"):
            a, b = _unify(args[0], args[1])
            return tirx.max(a, b) if func == "max" else tirx.min(a, b)
        if func == "pow":
            a, b = _unify(self._to_float(args[0]), self._to_float(args[1]))
            return tirx.power(a, b)
        if func == "select":
            t, f = _unify(args[1], args[2])
            return tirx.if_then_else(_as_bool(args[0]), t, f)
        if func in CAST_DTYPES:
            return _cast(args[0], func)
        raise LoweringError(f"no lowering for scalar function {func!r}")

    def _index(self, node: Node) -> "tirx.PrimExpr":
        expr = self.value(node)
        dtype = _dtype(expr)
        if dtype == "bool":
            return _cast(expr, INDEX_DTYPE)
        if not dtype.startswith("int"):
            raise LoweringError(f"index {node} has type {dtype}, not an integer")
        return self.analyzer.simplify(expr)

    def _access(self, node: Access) -> "tirx.PrimExpr":
        indices = [self._index(i) for i in node.indices]
        source = node.source
        if isinstance(source, Scope):
            stage = self.stages.stage(source)
            positions = [
                self.analyzer.simplify(_shift(idx, lo - iv.begin))
                for idx, iv, (lo, _) in zip(indices, source.loops, source.pad)
            ]
            return stage(*positions)
        placeholder = self.stages.tensor(source)
        load = placeholder(*indices)
        conds = []
        for idx, extent, (lo, hi) in zip(indices, source.shape, source.pad):
            if not (lo or hi):
                continue
            bound = self.analyzer.const_int_bound(idx)
            if bound.min_value < 0:
                conds.append(idx >= 0)
            if bound.max_value >= extent:
                conds.append(idx < extent)
        if not conds:
            return load
        fill = source.pad_value if _is_float_dtype(source.dtype) else int(source.pad_value)
        return tirx.if_then_else(tirx.all(*conds), load, tirx.const(fill, source.dtype))
