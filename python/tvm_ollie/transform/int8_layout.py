"""Keep chains of int8 convolutions channels-last (NHWC), reordering only at the chain's ends.

The int8 rewrite (:mod:`tvm_ollie.transform.int8_kernels`) gives every integer convolution an
NCHW ``tvm_ollie.cpu.conv2d_int8`` call, and oneDNN's int8 primitives run on ``nhwc`` on this
CPU (``conv2d_int8_preferred_format``): each call reordered its 8-bit source into ``nhwc`` and
its result back, two passes over a tensor per convolution, around a convolution of a few
microseconds at the zoo's sizes. ONNX Runtime keeps its quantized ResNet in NHWC throughout
(``NhwcMaxPool``, two ``Transpose`` in all). This pass does the same on a Relax module after
the int8 rewrite, as :mod:`~.blocked_layout` does for the float convolutions: it finds the
*chains*, connected groups of int8 convolutions linked directly or through layout-agnostic
operators, and writes every tensor inside a chain in NHWC::

    y1 = conv8(x, W1); a = astype(y1); b = subtract(a, 130); y2 = conv8(q, W2) ...
  ->
    x' = permute(x, NCHW -> NHWC)                          # entry
    y1' = conv8[layout=NHWC, klayout=OHWI](x', W1^T); a' = astype(y1'); ...
    z = permute(z', NHWC -> NCHW)                          # exit: a consumer outside needs NCHW

Nothing changes in value: every member computes the same numbers on permuted indices (the
int8 kernel's NHWC call is the same oneDNN primitive; the elementwise operators map each
element alone; a pooling window is the same set of elements), so the outputs stay bit-exact.

Rules (each a guard below, named):

* ``member_conv``: a ``conv2d_int8`` call in NCHW/OIHW whose weight is a constant (not yet
  packed: the packing follows this pass), every shape static, and whose primitive runs on
  ``nhwc`` (guard ``prefers_nhwc``: ``conv2d_int8_preferred_format`` gives ``nhwc`` for the
  destination; where it does not, an NHWC call would reorder inside just the same);
* ``member_elementwise``: an operator of :data:`UNARY`/:data:`BINARY`, a ``quantize``/
  ``dequantize`` with one scale and one zero point (a single value each, so its ``axis`` does
  not matter), or a ``take`` of a 1-D constant table at a chain value (``QLinearAdd``'s table,
  :func:`tvm_ollie.frontend.onnx_quant.qlinear_add_table`), whose output is 4-D of the shape
  of each chain operand it reads (no broadcast of a chain value), at least one operand in the
  chain, the others tensors of that shape (they enter the chain), tensors of one element
  (constants or not: they broadcast alike in both layouts) or per-channel constants
  (``[1, C, 1, 1]``, re-laid out);
* ``member_spatial``: pooling and resizing in NCHW on a chain value, rewritten with
  ``layout="NHWC"`` (:data:`~.blocked_layout.SPATIAL`);
* ``chain_length``: at least two convolutions;
* ``saves_reorders``: the in-call reorders removed (two per member convolution) outnumber the
  entry and exit permutes added, counted by rewriting the chain alone.

Exits: a chain value read outside the chain (or returned) is permuted back to NCHW right after
its binding, under its original variable.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Set, Tuple

import numpy as np

from .. import native
from ..codegen import library as lib
from ..compat import relax, tvm
from .blocked_layout import SPATIAL, constant_to_format, from_format, to_format

__all__ = ["CONV2D_INT8_PREFERRED_FORMAT", "Int8LayoutReport", "conv_int8_of", "find_chains",
           "int8_call_of", "int8_layout",
           "member_conv", "member_elementwise", "member_spatial", "preferred_format"]

_Constant = tvm.ir.expr.Constant

#: ``conv2d_int8_preferred_format(attrs, data, weight, Out) -> [src, dst]`` of the library.
CONV2D_INT8_PREFERRED_FORMAT = "tvm_ollie.cpu.conv2d_int8_preferred_format"

#: Unary operators a chain passes through (each element alone).
UNARY = ("relax.astype", "relax.nn.relu", "relax.clip", "relax.round", "relax.negative",
         "relax.abs")
#: Binary and ternary operators a chain passes through (each element alone; comparisons and
#: ``where`` come with the index normalization TVM's importer writes around a ``Gather``).
BINARY = ("relax.add", "relax.subtract", "relax.multiply", "relax.divide", "relax.maximum",
          "relax.minimum", "relax.less", "relax.greater", "relax.less_equal",
          "relax.greater_equal", "relax.equal", "relax.where")
#: Quantization operators a chain passes through when their parameters are single values.
QUANT = ("relax.quantize", "relax.dequantize")


@dataclass
class Int8LayoutReport:
    """The chains converted (convolutions each) and the permutes added."""

    chains: List[int] = field(default_factory=list)
    entries: int = 0
    exits: int = 0
    skipped: List[str] = field(default_factory=list)

    def counts(self) -> Dict[str, int]:
        """For the pass's fold counts (empty when nothing was converted)."""
        if not self.chains:
            return {}
        return {"int8_nhwc_chains": len(self.chains), "int8_nhwc_convs": sum(self.chains),
                "int8_nhwc_permutes": self.entries + self.exits}


# --- guards ----------------------------------------------------------------------------------


def _shape(expr) -> Optional[Tuple[int, ...]]:
    ty = getattr(expr, "ty", None)
    if not isinstance(ty, relax.TensorType) or ty.shape is None:
        return None
    dims = list(ty.shape.values) if hasattr(ty.shape, "values") else None
    if dims is None or not all(isinstance(d, tvm.tirx.IntImm) for d in dims):
        return None
    return tuple(int(d) for d in dims)


def _dtype(expr) -> str:
    return str(expr.ty.dtype)


def _op_name(value) -> str:
    if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op):
        return value.op.name
    return ""


@functools.lru_cache(maxsize=4096)
def preferred_format(attrs: str, data_shape: Tuple[int, ...], data_dtype: str,
                     weight_shape: Tuple[int, ...], out_shape: Tuple[int, ...], out_dtype: str
                     ) -> Tuple[str, str]:  # fmt: skip
    """The activation formats (``"nchw"``, ``"nhwc"`` or ``"other"``) oneDNN's int8 primitive
    for a ``conv2d_int8`` call of ``attrs`` and these shapes runs on, source and destination
    (the library's ``conv2d_int8_preferred_format``; only the shapes and types of its operands
    are read)."""
    make = tvm.runtime.tensor
    src, dst = tvm.get_global_func(CONV2D_INT8_PREFERRED_FORMAT)(
        attrs, make(np.zeros(data_shape, data_dtype)), make(np.zeros(weight_shape, "int8")),
        make(np.zeros(out_shape, out_dtype)))
    return str(src), str(dst)


def int8_call_of(expr, kernel: str = lib.CONV2D_INT8) -> Optional[Tuple[lib.LibCall, list]]:
    """``(LibCall, operands)`` when ``expr`` is a call of the int8 ``kernel`` written by
    :func:`lib.emit_call` (:func:`lib.lib_call_of` knows the float kernels only), else None."""
    if _op_name(expr) != "relax.call_dps_packed":
        return None
    func, args = expr.args[0], expr.args[1]
    if str(getattr(func, "global_symbol", "") or "") != kernel or not isinstance(
            args, relax.Tuple) or not args.fields or not isinstance(args.fields[0],
                                                                    tvm.ir.StringImm):
        return None
    attrs = tuple(lib.parse_attrs(str(args.fields[0].value)).items())
    return lib.LibCall(kernel, attrs), list(args.fields[1:])


def conv_int8_of(expr) -> Optional[Tuple[lib.LibCall, list]]:
    """:func:`int8_call_of` for ``conv2d_int8``."""
    return int8_call_of(expr, lib.CONV2D_INT8)


def member_conv(var, value) -> Optional[Tuple[lib.LibCall, list]]:
    """``(call, operands)`` when ``var = value`` is an NCHW int8 convolution with a constant
    unpacked weight, static shapes and an ``nhwc`` primitive (guards ``member_conv``,
    ``prefers_nhwc``), else None."""
    found = conv_int8_of(value)
    if found is None:
        return None
    call, ops = found
    if call.get("layout", "NCHW") != "NCHW" or call.get("klayout", "OIHW") != "OIHW":
        return None
    if call.get("wpacked", "0") == "1" or not isinstance(ops[1], _Constant):
        return None
    data_shape, out_shape = _shape(ops[0]), _shape(var)
    if data_shape is None or out_shape is None or len(data_shape) != 4:
        return None
    fmt = preferred_format(call.text(), data_shape, _dtype(ops[0]),
                           tuple(int(d) for d in ops[1].value.shape), out_shape, _dtype(var))
    return (call, ops) if fmt[1] == "nhwc" else None


def _single(expr) -> bool:
    return isinstance(expr, _Constant) and int(np.prod(expr.value.shape)) == 1


def _one_value(expr) -> bool:
    """A tensor of one element (a constant or a value): it broadcasts the same way against
    NCHW and NHWC, so it stays as it is."""
    shape = _shape(expr)
    return shape is not None and len(shape) <= 4 and int(np.prod(shape)) == 1


def _channel_constant(expr, channels: int) -> bool:
    return isinstance(expr, _Constant) and constant_to_format(
        expr.value.numpy(), "nhwc", channels) is not None


def member_elementwise(var, value, members: Set["relax.Var"]) -> bool:
    """Guard ``member_elementwise`` (module docstring) of ``var = value``."""
    name = _op_name(value)
    out = _shape(var)
    if out is None or len(out) != 4:
        return False
    if name in QUANT:
        data, scale, zero_point = value.args
        return data in members and _single(scale) and _single(zero_point)
    if name == "relax.take":  # a table read per element (the QLinearAdd table)
        table, index = value.args
        return (index in members and isinstance(table, _Constant) and len(table.value.shape) == 1
                and int(value.attrs.axis or 0) == 0 and _shape(index) == out)
    if name not in UNARY and name not in BINARY:
        return False
    if not any(a in members for a in value.args):
        return False
    for arg in value.args:
        if isinstance(arg, relax.Var) and _shape(arg) == out or _one_value(arg):
            continue
        if not _channel_constant(arg, out[1]):
            return False
    return True


def member_spatial(var, value, members: Set["relax.Var"]) -> bool:
    """Guard ``member_spatial`` (module docstring) of ``var = value``."""
    name = _op_name(value)
    if name not in SPATIAL or not value.args or value.args[0] not in members:
        return False
    at = value.attrs
    out = _shape(var)
    return out is not None and len(out) == 4 and str(at.layout) == "NCHW" and str(
        getattr(at, "out_layout", "NCHW") or "NCHW") == "NCHW"


# --- chains ----------------------------------------------------------------------------------


@dataclass
class _Chain:
    members: List["relax.Var"]
    convs: int = 0


def _bindings(func: "relax.Function") -> Dict["relax.Var", "relax.Expr"]:
    return {b.var: b.value for block in func.body.blocks for b in block.bindings
            if isinstance(b, relax.VarBinding)}


def _links(value, arg) -> bool:
    """Whether a member reads ``arg`` in the chain's layout (a conv's data, never its weight or
    quantization operands)."""
    conv = conv_int8_of(value)
    if conv is not None:
        return arg.same_as(conv[1][0])
    return True


def find_chains(func: "relax.Function") -> Tuple[List[_Chain], Set["relax.Var"]]:
    """The chains of ``func`` (before ``chain_length`` and ``saves_reorders``), and which of
    their members are convolutions."""
    members: Set["relax.Var"] = set()
    convs: Set["relax.Var"] = set()
    order: List["relax.Var"] = []
    bindings = _bindings(func)
    for var, value in bindings.items():
        if member_conv(var, value) is not None:
            convs.add(var)
        elif not (member_elementwise(var, value, members) or
                  member_spatial(var, value, members)):
            continue
        members.add(var)
        order.append(var)
    parent = {v: v for v in order}

    def root(v):
        while parent[v] is not v:
            parent[v] = parent[parent[v]]
            v = parent[v]
        return v

    for var in order:
        value = bindings[var]
        operands = member_conv(var, value)[1][:1] if var in convs else list(value.args)
        for arg in operands:
            if isinstance(arg, relax.Var) and arg in members and _links(value, arg):
                parent[root(arg)] = root(var)
    groups: Dict["relax.Var", _Chain] = {}
    for var in order:
        chain = groups.setdefault(root(var), _Chain([]))
        chain.members.append(var)
        chain.convs += var in convs
    return list(groups.values()), convs


# --- rewriting -------------------------------------------------------------------------------


def _users(func: "relax.Function") -> Dict["relax.Var", Set[object]]:
    users: Dict["relax.Var", Set[object]] = defaultdict(set)
    for block in func.body.blocks:
        for b in block.bindings:
            for v in relax.analysis.free_vars(b.value):
                users[v].add(b.var)
    for v in relax.analysis.free_vars(func.body.body):
        users[v].add("<body>")
    return users


class _Rewriter:
    """Rewrites the chains of one function into NHWC (module docstring)."""

    def __init__(self, func, chains: List[_Chain], convs: Set["relax.Var"],
                 report: Int8LayoutReport):
        self.func, self.convs, self.report = func, convs, report
        self.bindings = _bindings(func)
        self.users = _users(func)
        self.members = {v for c in chains for v in c.members}
        self.new: Dict["relax.Var", "relax.Var"] = {}
        self.entries: Dict["relax.Var", "relax.Var"] = {}

    def run(self) -> "relax.Function":
        blocks = []
        for block in self.func.body.blocks:
            dataflow = isinstance(block, relax.DataflowBlock)
            out: List["relax.Binding"] = []
            for b in block.bindings:
                if isinstance(b, relax.VarBinding) and b.var in self.members:
                    self._rewrite(b.var, b.value, out, dataflow)
                else:
                    out.append(b)
            blocks.append(relax.DataflowBlock(out) if dataflow else relax.BindingBlock(out))
        body = relax.SeqExpr(blocks, self.func.body.body)
        return relax.Function(self.func.params, body, self.func.ret_ty, self.func.is_pure,
                              self.func.attrs)

    def _bind(self, out, name: str, value, dataflow: bool) -> "relax.Var":
        normalized = relax.BlockBuilder().normalize(value)
        var = (relax.DataflowVar if dataflow else relax.Var)(name, normalized.ty)
        out.append(relax.VarBinding(var, normalized))
        return var

    def _nhwc(self, expr, out, dataflow: bool):
        """``expr`` (NCHW) in NHWC: the member's own value, or an entry permute."""
        if expr in self.new:
            return self.new[expr]
        if expr not in self.entries:
            self.entries[expr] = self._bind(out, f"{expr.name}_nhwc", to_format(expr, "nhwc"),
                                            dataflow)
            self.report.entries += 1
        return self.entries[expr]

    def _rewrite(self, var, value, out, dataflow: bool) -> None:
        if var in self.convs:
            new_value = self._conv(var, value, out, dataflow)
        elif _op_name(value) in SPATIAL:
            new_value = SPATIAL[_op_name(value)](value, self._nhwc(value.args[0], out, dataflow))
        elif _op_name(value) == "relax.take":
            new_value = relax.Call(value.op, [value.args[0], self._nhwc(value.args[1], out,
                                                                          dataflow)],
                                   value.attrs, value.ty_args)
        elif _op_name(value) in QUANT:
            data, scale, zero_point = value.args
            make = relax.op.quantize if _op_name(value) == "relax.quantize" else \
                relax.op.dequantize
            new_value = make(self._nhwc(data, out, dataflow), scale, zero_point, axis=3,
                             out_dtype=str(value.attrs.out_dtype))
        else:
            channels = _shape(var)[1]
            args = [a if _one_value(a) else
                    relax.const(constant_to_format(a.value.numpy(), "nhwc", channels))
                    if isinstance(a, _Constant) else self._nhwc(a, out, dataflow)
                    for a in value.args]
            new_value = relax.Call(value.op, args, value.attrs, value.ty_args)
        new = self._bind(out, f"{var.name}_nhwc", new_value, dataflow)
        self.new[var] = new
        outside = [u for u in self.users.get(var, ()) if u not in self.members
                   or not _links(self.bindings[u], var)]
        if outside or not isinstance(var, relax.DataflowVar):
            out.append(relax.VarBinding(var, relax.BlockBuilder().normalize(
                from_format(new, "nhwc"))))
            self.report.exits += 1

    def _conv(self, var, value, out, dataflow: bool):
        call, ops = conv_int8_of(value)
        weight = np.ascontiguousarray(ops[1].value.numpy().transpose(0, 2, 3, 1))  # OHWI
        new_ops = [self._nhwc(ops[0], out, dataflow), relax.const(weight)] + list(ops[2:])
        n, c, h, w = _shape(var)
        return lib.emit_call(call.with_attrs(layout="NHWC", klayout="OHWI"), new_ops,
                             (n, h, w, c), _dtype(var))


def _kept_chains(func, report: Int8LayoutReport):
    chains, convs = find_chains(func)
    kept = []
    for chain in chains:
        if chain.convs < 2:
            continue  # chain_length
        dry = Int8LayoutReport()
        _Rewriter(func, [chain], convs, dry).run()
        if 2 * chain.convs <= dry.entries + dry.exits:  # saves_reorders
            report.skipped.append(f"a chain of {chain.convs} int8 convs: {dry.entries} entries "
                                  f"and {dry.exits} exits for {2 * chain.convs} reorders")
            continue
        kept.append(chain)
    return kept, convs


def int8_layout(mod: "tvm.IRModule") -> Tuple["tvm.IRModule", Int8LayoutReport]:
    """``mod`` with its chains of int8 convolutions in NHWC (module docstring), and what was
    done; ``mod`` itself when the library cannot say which format its primitives prefer."""
    report = Int8LayoutReport()
    if not native.provides(CONV2D_INT8_PREFERRED_FORMAT):
        report.skipped.append("the native library has no conv2d_int8_preferred_format")
        return mod, report
    updates = {}
    for gv, func in mod.functions_items():
        if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
            continue
        chains, convs = _kept_chains(func, report)
        if chains:
            report.chains.extend(c.convs for c in chains)
            updates[gv] = _Rewriter(func, chains, convs, report).run()
    if not updates:
        return mod, report
    out = mod.shallow_copy() if hasattr(mod, "shallow_copy") else tvm.IRModule(
        dict(mod.functions_items()), attrs=mod.attrs)
    for gv, func in updates.items():
        out[gv] = func
    return relax.transform.Normalize()(out), report
