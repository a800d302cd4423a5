"""Primitive kinds of Relax calls, the vocabulary of kernel orchestration.

Korch splits operators into four kinds of primitives and fuses them into kernels under one
rule: a kernel holds at most one *linear* primitive (the compute-bound one), and the others
are memory-bound. This module says which kind a call is, from a table of Relax operator names
(for modules before legalization) or from the PrimFunc of a ``call_tir`` (after legalization,
where the pass runs):

* ``elementwise``: each output element depends on the input elements at the same position
  (after broadcasting), e.g. ``add``, ``relu``, ``astype``, ``where``;
* ``reduce``: an output element aggregates a range of input elements (``sum``, ``max``, and
  composite operators that contain a reduction but are not yet fissioned: ``softmax``,
  ``layer_norm``, pooling ...);
* ``layout``: data movement without arithmetic (``permute_dims``, ``reshape``, ``concat``...);
* ``linear``: a contraction ``out += a * b`` over two different tensors (matmul, convolutions,
  a derived operator's ``call_tir``, a native library call ``tvm_ollie.*``);
* ``opaque``: anything else; orchestrated as a kernel of its own, never fused.

For a ``call_tir`` the kind follows TVM's ``op_pattern`` (set by ``AnnotateTIROpPattern``:
0/1 elementwise, 2 injective, 3 reduction, 4 "output-fusable", 8 opaque), refined by looking at
the blocks: a reduction block whose update is ``out + x * y`` with loads of two different
buffers is a contraction (linear), other reductions are ``reduce``.
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple

from ..compat import BufferLoadNode, relax, tirx, tvm

#: Class of a Relax constant in TVM 0.27 (``relax.Constant`` is gone; ``relax.const`` makes
#: one of these).
Constant = tvm.ir.expr.Constant

__all__ = ["Constant", "KINDS", "OP_KIND", "call_name", "callee_primfunc", "is_fusable_call",
           "kind_of", "primfunc_flops", "primfunc_kind"]

#: The primitive kinds, in the order the report prints them.
KINDS = ("elementwise", "reduce", "layout", "linear", "opaque")

_ELEMENTWISE_UNARY = (
    "abs", "acos", "acosh", "asin", "asinh", "atan", "atanh", "ceil", "cos", "cosh", "erf",
    "exp", "floor", "isfinite", "isinf", "isnan", "log", "logical_not", "negative", "round",
    "rsqrt", "sigmoid", "sign", "sin", "sinh", "sqrt", "square", "tan", "tanh", "trunc",
    "bitwise_not", "clip", "astype", "nn.relu", "nn.relu6", "nn.gelu", "nn.gelu_tanh", "nn.silu",
    "nn.leakyrelu", "nn.prelu", "nn.selu", "nn.softplus", "nn.dropout", "zeros_like",
    "ones_like", "full_like", "wrap_param")
_ELEMENTWISE_BINARY = (
    "add", "subtract", "multiply", "divide", "floor_divide", "power", "maximum", "minimum",
    "equal", "not_equal", "greater", "greater_equal", "less", "less_equal", "logical_and",
    "logical_or", "logical_xor", "bitwise_and", "bitwise_or", "bitwise_xor", "floor_mod",
    "mod", "atan2", "left_shift", "right_shift", "where")
_REDUCE = (
    "sum", "max", "min", "mean", "prod", "variance", "std", "argmax", "argmin", "cumsum",
    "cumprod",
    # composite operators not (yet) fissioned: one reduce primitive each
    "nn.softmax", "nn.log_softmax", "nn.layer_norm", "nn.group_norm", "nn.batch_norm",
    "nn.instance_norm", "nn.rms_norm", "nn.max_pool1d", "nn.max_pool2d", "nn.max_pool3d",
    "nn.avg_pool1d", "nn.avg_pool2d", "nn.avg_pool3d", "nn.adaptive_avg_pool1d",
    "nn.adaptive_avg_pool2d", "nn.adaptive_avg_pool3d", "nn.cross_entropy_with_logits",
    "nn.nll_loss")
_LAYOUT = (
    "permute_dims", "reshape", "strided_slice", "dynamic_strided_slice", "concat", "split",
    "nn.pad", "take", "broadcast_to", "expand_dims", "squeeze", "flatten", "image.resize2d",
    "layout_transform", "repeat", "tile", "flip", "gather_elements", "gather_nd",
    "collapse_sum_like", "collapse_sum_to", "one_hot", "tril", "triu", "arange", "full",
    "zeros", "ones", "nn.pixel_shuffle", "scatter_elements", "scatter_nd")
_LINEAR = (
    "matmul", "linear", "nn.conv1d", "nn.conv2d", "nn.conv3d", "nn.conv1d_transpose",
    "nn.conv2d_transpose", "nn.conv3d_transpose", "nn.attention", "nn.attention_bias",
    "einsum")


def _table() -> Dict[str, str]:
    table: Dict[str, str] = {}
    for names, kind in ((_ELEMENTWISE_UNARY, "elementwise"), (_ELEMENTWISE_BINARY, "elementwise"),
                        (_REDUCE, "reduce"), (_LAYOUT, "layout"), (_LINEAR, "linear")):
        for name in names:
            table[f"relax.{name}"] = kind
    return table


#: Kind of every standard Relax operator by its full name (``relax.nn.conv2d``); an operator
#: missing here is ``opaque``.
OP_KIND: Dict[str, str] = _table()

#: Native library calls (``R.call_dps_packed("tvm_ollie.cpu.conv2d", ...)``) are linear.
NATIVE_PREFIX = "tvm_ollie."

_OP_PATTERN_KIND = {0: "elementwise", 1: "elementwise", 2: "layout", 3: "reduce"}


def call_name(call: "relax.Call") -> str:
    """A short name of a call for reports: the operator, PrimFunc or packed function name."""
    op = call.op
    if isinstance(op, tvm.ir.Op):
        if op.name in ("relax.call_tir", "relax.call_tir_inplace") and call.args:
            return call.args[0].name_hint
        if op.name == "relax.call_dps_packed" and call.args:
            return str(getattr(call.args[0], "global_symbol", call.args[0]))
        return op.name.replace("relax.", "", 1)
    return str(getattr(op, "name_hint", type(op).__name__))


def callee_primfunc(call: "relax.Call", mod: Optional["tvm.IRModule"]):
    """The PrimFunc a ``call_tir`` calls (None when it is not one or ``mod`` lacks it)."""
    if not isinstance(call.op, tvm.ir.Op) or call.op.name != "relax.call_tir":
        return None
    if mod is None or not isinstance(call.args[0], tvm.ir.GlobalVar):
        return None
    if call.args[0] not in mod:
        return None
    func = mod[call.args[0]]
    return func if isinstance(func, tirx.PrimFunc) else None


def is_fusable_call(call: "relax.Expr") -> bool:
    """Whether ``call`` can share a kernel with others: a plain ``call_tir`` (``FuseTIR``
    merges only those) or a Relax operator call (before legalization)."""
    if not isinstance(call, relax.Call) or not isinstance(call.op, tvm.ir.Op):
        return False
    name = call.op.name
    if name == "relax.call_tir":
        return len(call.args) == 2  # no symbolic tir_vars
    return name in OP_KIND


# --- PrimFunc analysis -------------------------------------------------------------------

def _children(stmt):
    """Sub-statements of a TIR statement (loops, sequences, blocks, branches)."""
    kind = type(stmt).__name__
    if kind == "SeqStmt":
        return list(stmt.seq)
    if kind == "SBlockRealize":
        return [stmt.block]
    if kind == "SBlock":
        return [s for s in (stmt.init, stmt.body) if s is not None]
    if kind == "IfThenElse":
        return [s for s in (stmt.then_case, stmt.else_case) if s is not None]
    body = getattr(stmt, "body", None)
    return [body] if isinstance(body, tirx.Stmt) else []


def _blocks(stmt, out):
    if type(stmt).__name__ == "SBlock":
        out.append(stmt)
    for child in _children(stmt):
        _blocks(child, out)
    return out


def _count_ops(expr) -> int:
    """Arithmetic operations in a TIR expression (loads and their indices count zero)."""
    if isinstance(expr, BufferLoadNode) or isinstance(expr, (tirx.IntImm, tirx.FloatImm,
                                                             tirx.Var)):
        return 0
    if isinstance(expr, tirx.Cast):
        return _count_ops(expr.value)
    if isinstance(expr, tvm.ir.expr.Call):
        return 1 + sum(_count_ops(a) for a in expr.args)
    if hasattr(expr, "a") and hasattr(expr, "b"):
        return 1 + _count_ops(expr.a) + _count_ops(expr.b)
    if isinstance(expr, tirx.Select):
        return 1 + sum(_count_ops(e) for e in (expr.condition, expr.true_value,
                                                expr.false_value))
    return 1


def _extent(iv) -> int:
    ext = iv.dom.extent
    return int(ext.value) if isinstance(ext, tirx.IntImm) else 1


def _loads(expr, out):
    if isinstance(expr, BufferLoadNode):
        out.append(expr.source)
        return out
    if isinstance(expr, tirx.Cast):
        return _loads(expr.value, out)
    for name in ("a", "b"):
        sub = getattr(expr, name, None)
        if sub is not None and not isinstance(sub, str):
            _loads(sub, out)
    if isinstance(expr, tvm.ir.expr.Call):
        for arg in expr.args:
            _loads(arg, out)
    return out


def _is_contraction(block) -> bool:
    """``out = out + x * y`` under a reduction iterator, ``x``/``y`` loading two buffers."""
    if not any(int(iv.iter_type) == 2 for iv in block.iter_vars):
        return False
    store = block.body
    if type(store).__name__ != "BufferStore" or not isinstance(store.value, tirx.Add):
        return False
    for mine, term in ((store.value.a, store.value.b), (store.value.b, store.value.a)):
        if isinstance(mine, BufferLoadNode) and mine.source.same_as(store.buffer):
            while isinstance(term, tirx.Cast):
                term = term.value
            if isinstance(term, tirx.Mul):
                left, right = _loads(term.a, []), _loads(term.b, [])
                if left and right and not any(x.same_as(y) for x in left for y in right):
                    return True
    return False


def primfunc_kind(func: "tirx.PrimFunc") -> str:
    """The primitive kind of a PrimFunc (see the module docstring)."""
    blocks = _blocks(func.body, [])
    if any(_is_contraction(b) for b in blocks):
        return "linear"
    pattern = func.attrs.get("op_pattern") if func.attrs is not None else None
    if pattern is not None and int(pattern) in _OP_PATTERN_KIND:
        return _OP_PATTERN_KIND[int(pattern)]
    if any(any(int(iv.iter_type) == 2 for iv in b.iter_vars) for b in blocks):
        return "reduce"  # output-fusable or opaque pattern around a reduction
    plain = [b for b in blocks if b.iter_vars]
    if pattern is None and plain and all(type(b.body).__name__ == "BufferStore" for b in plain):
        return "layout"  # not annotated: spatial stores only, memory-bound either way
    return "opaque"


def primfunc_flops(func: "tirx.PrimFunc") -> Tuple[float, bool]:
    """Arithmetic operations of a PrimFunc (each block: iterations x operations per
    iteration, at least one) and whether every block has a static domain."""
    total, static = 0.0, True
    for block in _blocks(func.body, []):
        if not block.iter_vars:
            continue
        points = 1
        for iv in block.iter_vars:
            if not isinstance(iv.dom.extent, tirx.IntImm):
                static = False
            points *= _extent(iv)
        ops = _count_ops(block.body.value) if type(block.body).__name__ == "BufferStore" else 1
        total += float(points) * max(1, ops)
    return total, static


def kind_of(call: "relax.Expr", mod: Optional["tvm.IRModule"] = None) -> str:
    """The primitive kind of a Relax call (``"opaque"`` for anything that is not one).

    ``mod`` is needed for a ``call_tir`` (its PrimFunc decides the kind).
    """
    if not isinstance(call, relax.Call):
        return "opaque"
    op = call.op
    if not isinstance(op, tvm.ir.Op):
        return "opaque"
    if op.name == "relax.call_tir":
        func = callee_primfunc(call, mod)
        return primfunc_kind(func) if func is not None else "opaque"
    if op.name == "relax.call_dps_packed":
        target = call.args[0]
        name = str(getattr(target, "global_symbol", ""))
        return "linear" if name.startswith(NATIVE_PREFIX) else "opaque"
    return OP_KIND.get(op.name, "opaque")
