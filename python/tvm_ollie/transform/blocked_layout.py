"""Keep chains of native convolutions in the activation format oneDNN prefers.

Each native convolution (``tvm_ollie.cpu.conv2d``, :mod:`tvm_ollie.codegen.library`) takes and
returns NCHW, and oneDNN reorders its source and destination into its own format (nhwc or
nChw{B}c) on every call. ONNX Runtime keeps whole chains in that format. This pass does the same
on a Relax module after the rewrite: it finds the *chains*, connected groups of native
convolutions linked directly or through layout-agnostic elementwise operators, and writes every
tensor inside a chain in one format ``F``::

    y1 = conv(x, w1); y2 = relu(y1); y3 = conv(y2, w2); z = f(y3)
  ->
    x' = layout_transform(x, NCHW -> F)                 # entry (or the conv reads x as NCHW)
    y1' = conv[src_fmt=F, dst_fmt=F](x', w1); y2' = relu(y1')
    y3' = conv[src_fmt=F, dst_fmt=F](y2', w2)
    y3 = layout_transform(y3', F -> NCHW); z = f(y3)    # exit: a consumer needs NCHW

Rules (each a guard below, named):

* ``member_conv``: a native NCHW conv2d, weights not pre-packed, every shape static;
* ``member_elementwise``: an elementwise operator of :data:`UNARY` or :data:`BINARY` whose
  output has the shape of each chain operand it reads (no broadcast of a chain value), at least
  one operand in the chain, the others tensors of the same shape (they enter the format) or
  per-channel constants ``[1, C, 1, 1]``/``[C, 1, 1]``/scalars (re-laid out with numpy; the
  padding channels zero). The operators commute with a layout change: ``f(T(x)) = T(f(x))`` for
  every element, and map 0 to a finite value, so a blocked tensor's padding channels stay
  finite; the next convolution's weights are zero there and the exit drops them.
* ``member_spatial`` (channels-last chains only): ``max_pool2d``/``avg_pool2d``/
  ``adaptive_avg_pool2d``/``image.resize2d`` in NCHW, rewritten with ``layout="NHWC"``, and
  ``concat`` along channels (axis 1 -> 3), every operand a 4-D float32 tensor, at least one in
  the chain. In ``nChw{B}c`` a concatenation would mix padding into the channels, so a chain
  whose format is blocked is found again without these operators.
* ``member_deconv`` (channels-last chains only, as ``member_spatial``): a native NCHW
  ``conv2d_transpose`` (static float32 shapes) whose data or residual is in the chain, rewritten
  with ``src_fmt``/``dst_fmt`` (the kernel reads a data operand from outside the chain as NCHW,
  so it needs no entry). Without it each transposed convolution splits the chain with an exit
  and an entry (GCN quick: five of them, 13 of its 14 transforms).
* ``member_norm`` (any format): a native NCHW ``instance_norm`` (static float32 4-D shapes)
  whose data or residual is in the chain, rewritten with ``fmt=F`` (and ``c=C`` for
  ``nChw{B}c``): its statistics are per ``(n, c)`` plane in every format, its scale and bias
  stay ``[C]``, its residual is in the chain's format. Candy's convolutions are separated by
  instance norms and mirror pads: without this member and the next no two convolutions touch.
* ``member_pad`` (any format): ``nn.pad`` of a chain value on the spatial axes only, rewritten
  with the pad widths moved to the format's spatial axes. A constant pad by a non-zero value
  is channels-last only (in ``nChw{B}c`` it would write that value into the padding channels
  of the new border; reflect, replicate and circular pads copy the zeros there).
* ``member_take`` (any format): ``take`` of a chain value along a spatial axis (H or W) by a
  1-D integer index tensor, rewritten along the format's axis. The PyTorch exporter writes a
  reflection pad as two of them (indices ``63 - |63 - |arange(-4, 68)||``, Candy quick); they
  copy positions, so a blocked format's zero padding channels stay zero.
* ``chain_length``: a chain with fewer than two convolutions is left alone (it would only move
  the reorder out of the call).
* ``saves_reorders`` (:func:`saves_reorders`; not when the caller forces a format): the chain
  removes more reorders than the entry and exit transforms it adds.
* ``format``: the chain's format is the destination format oneDNN prefers
  (:func:`tvm_ollie.native.conv2d_preferred_format`, ``format_tag::any``) for most of its
  convolutions; none (every conv prefers NCHW or another format): the chain is left alone. A
  convolution whose input comes from outside the chain reads it in its own preferred source
  format (an entry transform) or, when that is NCHW (a 3-channel image), as it is. A format
  forced by the caller (``fmt``) holds for the entries too.

Exits: a chain value used by anything outside the chain (or returned) is transformed back to
NCHW right after its binding, under its original variable, so nothing outside changes. A
member convolution that no member reads, whose value only the function's result or library
calls read, writes NCHW itself instead (``exit_in_kernel``, :func:`exits_in_kernel`): no
transform after it.
"""

from __future__ import annotations

import functools
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Set, Tuple

import numpy as np
import tvm_ffi

from .. import native
from ..codegen import library as lib
from ..compat import relax, tvm
from .epilogue import static_shape
from .tir_pads import pads_as_ops

__all__ = ["BINARY", "SPATIAL", "UNARY", "Chain", "LayoutReport", "blocked_layout",
           "choose_format", "constant_to_format", "deconv_takes_formats", "exits_in_kernel",
           "find_chains", "formatted_shape", "from_format", "member_conv", "member_deconv",
           "member_elementwise", "member_norm", "member_pad", "member_spatial", "member_take",
           "norm_takes_formats", "pack_lone_weights", "pack_weight", "preferred",
           "saves_reorders", "to_format", "unpad"]

#: Unary elementwise operators a chain passes through (finite at 0).
UNARY = ("relax.nn.relu", "relax.nn.relu6", "relax.clip", "relax.sigmoid", "relax.tanh",
         "relax.nn.silu", "relax.nn.gelu", "relax.nn.gelu_tanh", "relax.nn.leakyrelu",
         "relax.negative", "relax.abs")
#: Binary elementwise operators a chain passes through.
BINARY = ("relax.add", "relax.subtract", "relax.multiply", "relax.maximum", "relax.minimum")

_FORMATS = ("nhwc", "nChw4c", "nChw8c", "nChw16c")


def _pool_nhwc(value, data):
    at = value.attrs
    make = {"relax.nn.max_pool2d": relax.op.nn.max_pool2d,
            "relax.nn.avg_pool2d": relax.op.nn.avg_pool2d}[value.op.name]
    return make(data, [int(v) for v in at.pool_size], [int(v) for v in at.strides],
                [int(v) for v in at.padding], [int(v) for v in at.dilation], bool(at.ceil_mode),
                bool(at.count_include_pad), layout="NHWC", out_layout="NHWC")


def _adaptive_nhwc(value, data):
    size = value.attrs.output_size
    return relax.op.nn.adaptive_avg_pool2d(
        data, None if size is None else [int(v) for v in size], layout="NHWC", out_layout="NHWC")


def _resize_nhwc(value, data):
    at = value.attrs
    return relax.op.image.resize2d(
        data, value.args[1], [float(v) for v in at.roi], "NHWC", str(at.method),
        str(at.coordinate_transformation_mode), str(at.rounding_method), float(at.cubic_alpha),
        int(at.cubic_exclude), float(at.extrapolation_value),
        None if at.out_dtype is None or str(at.out_dtype) in ("", "None", "void")
        else str(at.out_dtype))


def _pad_in_format(value, data, fmt: str):
    """``value`` (an ``nn.pad`` of NCHW spatial axes) on ``data`` in ``fmt``: the widths of H
    and W moved to the format's spatial axes."""
    widths = _pad_widths(value)
    spatial = widths[4:]
    moved = [0, 0] + spatial + [0, 0] if fmt == "nhwc" else [0, 0, 0, 0] + spatial + [0, 0]
    at = value.attrs
    return relax.op.nn.pad(data, moved, str(at.pad_mode), float(at.pad_value))


#: Spatial operators a channels-last chain passes through: name -> ``(call, data in NHWC) ->
#: the call on NHWC data``.
SPATIAL = {"relax.nn.max_pool2d": _pool_nhwc, "relax.nn.avg_pool2d": _pool_nhwc,
           "relax.nn.adaptive_avg_pool2d": _adaptive_nhwc, "relax.image.resize2d": _resize_nhwc}


@dataclass
class LayoutReport:
    """What the pass did: the chains converted (convolutions each, format) and the entry and
    exit transforms it inserted."""

    chains: List[Tuple[int, str]] = field(default_factory=list)
    entries: int = 0
    exits: int = 0
    #: member convolutions that still read NCHW (and reorder it inside the call)
    plain_sources: int = 0
    #: member convolutions that write NCHW in place of an exit (``exit_in_kernel``)
    plain_dests: int = 0
    #: convolutions outside every chain whose constant weights were packed (``pack_weights``)
    lone_packed: int = 0
    #: the ONNX importer's PrimFunc pads rewritten as ``nn.pad`` to join a chain (.tir_pads)
    tir_pads: int = 0
    skipped: List[str] = field(default_factory=list)

    def to_text(self) -> str:
        """One line."""
        lone = f"; {self.lone_packed} lone convs' weights packed" if self.lone_packed else ""
        if not self.chains:
            return "layouts: no chain converted" + (
                f" ({'; '.join(self.skipped)})" if self.skipped else "") + lone
        convs = ", ".join(f"{n} convs in {f}" for n, f in self.chains)
        in_kernel = f" ({self.plain_dests} exits written by their conv)" \
            if self.plain_dests else ""
        return f"layouts: {len(self.chains)} chains ({convs}); {self.entries} entry and " \
               f"{self.exits} exit transforms{in_kernel}" + lone


# ---------------------------------------------------------------------------------------------
# Formats as shapes and index maps.

def _block(fmt: str) -> int:
    """The channel block of ``nChw{B}c``; 0 for nhwc."""
    return 0 if fmt == "nhwc" else int(fmt[4:-1])


def formatted_shape(shape: Sequence[int], fmt: str) -> Tuple[int, ...]:
    """The shape of an NCHW tensor of ``shape`` in ``fmt``."""
    n, c, h, w = (int(s) for s in shape)
    if fmt == "nhwc":
        return (n, h, w, c)
    b = _block(fmt)
    return (n, -(-c // b), h, w, b)


def to_format(x: "relax.Expr", fmt: str) -> "relax.Expr":
    """``layout_transform`` NCHW -> ``fmt`` (padding channels zero)."""
    if fmt == "nhwc":
        return relax.op.layout_transform(x, lambda n, c, h, w: (n, h, w, c))
    b = _block(fmt)
    return relax.op.layout_transform(x, lambda n, c, h, w: (n, c // b, h, w, c % b),
                                     pad_value=0.0)


def from_format(x: "relax.Expr", fmt: str) -> "relax.Expr":
    """``layout_transform`` ``fmt`` -> NCHW (with the padding channels of ``nChw{B}c``: take the
    first C with :func:`unpad`)."""
    if fmt == "nhwc":
        return relax.op.layout_transform(x, lambda n, h, w, c: (n, c, h, w))
    b = _block(fmt)
    return relax.op.layout_transform(x, lambda n, c1, h, w, c0: (n, c1 * b + c0, h, w))


def unpad(x: "relax.Expr", channels: int) -> "relax.Expr":
    """The first ``channels`` channels of an NCHW ``x``."""
    return relax.op.strided_slice(x, axes=[1], begin=[0], end=[channels])


def constant_to_format(value: np.ndarray, fmt: str, channels: int) -> Optional[np.ndarray]:
    """A per-channel constant (``[1, C, 1, 1]``, ``[C, 1, 1]``, or one element) broadcast
    against an NCHW tensor of ``channels`` channels, in ``fmt``; None for other shapes."""
    if value.size == 1:
        return value
    if value.shape not in ((1, channels, 1, 1), (channels, 1, 1)):
        return None
    vec = value.reshape(channels)
    if fmt == "nhwc":
        return np.ascontiguousarray(vec.reshape(1, 1, 1, channels))
    b = _block(fmt)
    cb = -(-channels // b)
    padded = np.zeros(cb * b, value.dtype)
    padded[:channels] = vec
    return np.ascontiguousarray(padded.reshape(1, cb, 1, 1, b))


# ---------------------------------------------------------------------------------------------
# Finding the chains.

def _f32_4d(expr) -> bool:
    shape = static_shape(expr)
    return shape is not None and len(shape) == 4 and str(expr.ty.dtype) == "float32"


def member_conv(value) -> Optional[Tuple[lib.LibCall, list]]:
    """``(call, operands)`` of a native NCHW conv2d whose shapes are static (guard
    ``member_conv``), else None."""
    found = lib.lib_call_of(value)
    if found is None or found[0].func != lib.CONV2D:
        return None
    call, ops = found
    if call.get("layout", "NCHW") != "NCHW" or call.get("wpacked", "0") == "1":
        return None
    if call.get("fmt", "auto") == "plain" or call.get("src_fmt") or call.get("dst_fmt"):
        return None
    if not (_f32_4d(ops[0]) and _f32_4d(value) and static_shape(ops[1]) is not None):
        return None
    return call, ops


def exits_in_kernel(call: lib.LibCall) -> bool:
    """Guard ``exit_in_kernel`` on the call: a member convolution writes NCHW itself (no
    ``dst_fmt``) instead of the chain's format followed by an exit ``layout_transform``,
    ``from_format(conv[dst_fmt=F](x')) = conv(x')``, when no member reads its value and its
    exit would be a kernel of its own (every reader is the function's result or a library
    call; the rewriter checks both). oneDNN then writes its preferred destination and reorders
    it into NCHW inside the call, on every thread; the exit was one TVM kernel (Segformer
    paper's classifier output ``[1, 128, 128, 150]``: 34.6-39.1 ms, docs/profiling.md). An
    exit read by a TVM operator stays: TVM fuses it into that kernel (or the orchestration
    places it, docs/orchestration.md). Not with a residual (``res=1``): it would have to be
    read in NCHW, and a member value has no NCHW copy."""
    return call.get("res", "0") != "1"


def _accepts(func: str, attrs: str, operands: int) -> bool:
    """Whether the loaded native library's ``func`` accepts ``attrs`` (a library built before
    those keys rejects them): one call on 1x1x1x1 operands."""
    if not native.available() or not native.provides(func):
        return False
    one = [np.ones((1, 1, 1, 1), "float32") for _ in range(operands)]
    try:
        tvm_ffi.get_global_func(func)(attrs, *[tvm_ffi.from_dlpack(a) for a in one])
    except (ValueError, TypeError, RuntimeError):
        return False
    return True


@functools.lru_cache(maxsize=None)
def deconv_takes_formats() -> bool:
    """Whether the loaded native library's conv2d_transpose takes ``src_fmt``/``dst_fmt``
    (asked once)."""
    return _accepts(native.CONV2D_TRANSPOSE, "src_fmt=nhwc;dst_fmt=nhwc", 3)


def member_deconv(value) -> Optional[Tuple[lib.LibCall, list]]:
    """``(call, operands)`` of a native NCHW conv2d_transpose in plain formats whose shapes are
    static (guard ``member_deconv``, before the chain test), else None (also when the library
    predates the kernel's formats)."""
    found = lib.lib_call_of(value)
    if found is None or found[0].func != lib.CONV2D_TRANSPOSE or not deconv_takes_formats():
        return None
    call, ops = found
    if call.get("layout", "NCHW") != "NCHW" or call.get("src_fmt") or call.get("dst_fmt"):
        return None
    if not (_f32_4d(ops[0]) and _f32_4d(value) and static_shape(ops[1]) is not None):
        return None
    return call, ops


@functools.lru_cache(maxsize=None)
def norm_takes_formats() -> bool:
    """Whether the loaded native library's instance_norm takes ``fmt`` (asked once)."""
    return _accepts(lib.INSTANCE_NORM, "fmt=nhwc", 2)


def member_norm(value) -> Optional[Tuple[lib.LibCall, list]]:
    """``(call, operands)`` of a native instance norm in NCHW whose data and result are static
    float32 4-D tensors (guard ``member_norm``, before the chain test), else None (also when
    the library predates the norm's formats)."""
    found = lib.lib_call_of(value)
    if found is None or found[0].func != lib.INSTANCE_NORM:
        return None
    call, ops = found
    if call.get("fmt", "nchw") != "nchw" or not (_f32_4d(ops[0]) and _f32_4d(value)):
        return None
    if not norm_takes_formats():
        return None
    return call, ops


def _pad_widths(value) -> Optional[List[int]]:
    """The pad widths of an ``nn.pad`` of a 4-D float32 tensor that pads its spatial axes
    only, else None."""
    if _op_name(value) != "relax.nn.pad" or not (_f32_4d(value) and _f32_4d(value.args[0])):
        return None
    widths = [int(v) for v in value.attrs.pad_width]
    return widths if len(widths) == 8 and not any(widths[:4]) else None


def _pad_zero_border(value) -> bool:
    """Whether the pad writes no new value into padding channels (every mode but a constant
    pad by a non-zero value)."""
    return str(value.attrs.pad_mode) != "constant" or float(value.attrs.pad_value) == 0.0


def member_pad(value, members: Set["relax.Var"], spatial: bool = True) -> bool:
    """Guard ``member_pad`` (module docstring); ``spatial``: a constant pad by a non-zero
    value counts (channels-last chains only)."""
    if _pad_widths(value) is None or value.args[0] not in members:
        return False
    return spatial or _pad_zero_border(value)


def _take_axis(value) -> Optional[int]:
    """The NCHW axis (2 or 3) of a ``take`` of a 4-D float32 tensor along a spatial axis by a
    1-D integer index tensor, else None."""
    if _op_name(value) != "relax.take" or not (_f32_4d(value) and _f32_4d(value.args[0])):
        return None
    idx = value.args[1]
    if not isinstance(idx.ty, relax.TensorType) or idx.ty.ndim != 1 or \
            not str(idx.ty.dtype).startswith(("int", "uint")):
        return None
    axis = value.attrs.axis
    axis = None if axis is None else int(axis) % 4
    return axis if axis in (2, 3) else None


def member_take(value, members: Set["relax.Var"]) -> bool:
    """Guard ``member_take`` (module docstring)."""
    return _take_axis(value) is not None and value.args[0] in members


def _take_in_format(value, data, fmt: str):
    """``value`` (a ``take`` along NCHW axis 2 or 3) on ``data`` in ``fmt``: along H or W
    there (nhwc: axes 1, 2; nChw{B}c: axes 2, 3)."""
    axis = _take_axis(value)
    new_axis = axis - 1 if fmt == "nhwc" else axis
    return relax.op.take(data, value.args[1], axis=new_axis, mode=str(value.attrs.mode))


def _lib_member(value) -> Optional[Tuple[lib.LibCall, list]]:
    """The call and operands of a member convolution, transposed convolution or instance norm,
    else None."""
    return member_conv(value) or member_deconv(value) or member_norm(value)


def _op_name(value) -> str:
    if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op):
        return value.op.name
    return ""


def _is_channel_constant(expr, channels: int) -> bool:
    if not isinstance(expr, tvm.ir.expr.Constant) or str(expr.value.dtype) != "float32":
        return False
    shape = tuple(int(s) for s in expr.value.shape)
    return int(np.prod(shape)) == 1 or shape in ((1, channels, 1, 1), (channels, 1, 1))


def member_elementwise(value, members: Set["relax.Var"]) -> bool:
    """Guard ``member_elementwise`` (module docstring)."""
    name = _op_name(value)
    if name not in UNARY and name not in BINARY:
        return False
    if not _f32_4d(value):
        return False
    out = static_shape(value)
    tensors = [a for a in value.args if isinstance(a.ty, relax.TensorType)]
    if len(tensors) != len(value.args) or not any(a in members for a in tensors):
        return False
    for arg in tensors:
        if isinstance(arg, relax.Var) and _f32_4d(arg) and static_shape(arg) == out:
            continue
        if not _is_channel_constant(arg, out[1]):
            return False
    return True


def member_spatial(value, members: Set["relax.Var"]) -> bool:
    """Guard ``member_spatial`` (module docstring)."""
    name = _op_name(value)
    if not _f32_4d(value):
        return False
    if name == "relax.concat":
        fields = value.args[0].fields if isinstance(value.args[0], relax.Tuple) else []
        return (int(value.attrs.axis) in (1, -3) and bool(fields)
                and all(isinstance(f, relax.Var) and _f32_4d(f) for f in fields)
                and any(f in members for f in fields))
    if name not in SPATIAL or value.args[0] not in members:
        return False
    at = value.attrs
    return str(at.layout) == "NCHW" and str(getattr(at, "out_layout", "NCHW") or "NCHW") == "NCHW"


@dataclass
class Chain:
    """Bindings (variables) of one chain, its convolutions and format."""

    members: List["relax.Var"]
    convs: List["relax.Var"]
    fmt: str = ""
    spatial: int = 0  # members that need a channels-last format


def _bindings(func: "relax.Function") -> Dict["relax.Var", "relax.Expr"]:
    out = {}
    for block in func.body.blocks:
        for b in block.bindings:
            if isinstance(b, relax.VarBinding):
                out[b.var] = b.value
    return out


def _operand_vars(value) -> List["relax.Var"]:
    found = _lib_member(value)
    if found is not None:
        return [v for v in found[1] if isinstance(v, relax.Var)]
    args = list(getattr(value, "args", []))
    if _op_name(value) == "relax.concat":
        args = list(args[0].fields)
    return [a for a in args if isinstance(a, relax.Var)]


def find_chains(func: "relax.Function", spatial: bool = True) -> List[Chain]:
    """The chains of ``func`` (before the ``chain_length`` and ``format`` guards): members in
    binding order, grouped by connection; ``spatial``: with the channels-last-only members."""
    bindings = _bindings(func)
    members: Set["relax.Var"] = set()
    convs: Set["relax.Var"] = set()
    spatials: Set["relax.Var"] = set()
    order: List["relax.Var"] = []
    for var, value in bindings.items():
        if member_conv(value) is not None:
            convs.add(var)
        elif spatial and (member_spatial(value, members) or _deconv_member(value, members)):
            spatials.add(var)
        elif member_pad(value, members, spatial):
            if not _pad_zero_border(value):
                spatials.add(var)
        elif member_take(value, members):
            pass
        elif not (_norm_member(value, members) or member_elementwise(value, members)):
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
        for arg in _operand_vars(bindings[var]):
            if arg in members and _links(bindings[var], arg):
                parent[root(arg)] = root(var)
    groups: Dict["relax.Var", Chain] = {}
    for var in order:
        chain = groups.setdefault(root(var), Chain([], []))
        chain.members.append(var)
        if var in convs:
            chain.convs.append(var)
        chain.spatial += var in spatials
    return list(groups.values())


def _deconv_member(value, members: Set["relax.Var"]) -> bool:
    """Guard ``member_deconv``: a transposed convolution reading a chain value (data or
    residual)."""
    found = member_deconv(value)
    if found is None:
        return False
    return any(isinstance(a, relax.Var) and a in members and _links(value, a) for a in found[1])


def _norm_member(value, members: Set["relax.Var"]) -> bool:
    """Guard ``member_norm``: an instance norm reading a chain value (data or residual)."""
    found = member_norm(value)
    if found is None:
        return False
    return any(isinstance(a, relax.Var) and a in members and _links(value, a) for a in found[1])


def _links(value, arg: "relax.Var") -> bool:
    """Whether ``arg`` is an operand a member reads in the chain's format: a conv's or norm's
    data or residual, or an elementwise operand (never a weight, bias or scale)."""
    conv = _lib_member(value)
    if conv is None:
        return True
    call, ops = conv
    data = [ops[0]] + ([ops[-1]] if call.get("res", "0") == "1" else [])
    return any(arg.same_as(d) for d in data)


# ---------------------------------------------------------------------------------------------
# Choosing formats.

def preferred(value) -> Tuple[str, str]:
    """oneDNN's preferred (src, dst) formats of a member conv."""
    call, ops = member_conv(value)
    return native.conv2d_preferred_format(call.text(), static_shape(ops[0]),
                                          static_shape(ops[1]))


def choose_format(chain: Chain, bindings) -> str:
    """Guard ``format``: the dst format most of the chain's convolutions prefer, or ""."""
    votes = Counter(preferred(bindings[v])[1] for v in chain.convs)
    ranked = [f for f, _ in votes.most_common() if f in _FORMATS]
    return ranked[0] if ranked else ""


# ---------------------------------------------------------------------------------------------
# Rewriting.

def pack_weight(call: lib.LibCall, data_shape: Sequence[int], weight: "tvm.ir.expr.Constant"
                ) -> Tuple[lib.LibCall, "relax.Expr"]:
    """``call`` with ``wpacked=1`` and its constant weight packed now
    (``tvm_ollie.cpu.conv2d_pack_weight``: the blocked weight format of this very call, on this
    machine; a pack made elsewhere is rejected at run time with a clear error)."""
    w = np.ascontiguousarray(weight.value.numpy())
    text = call.text()
    packed = np.zeros(native.conv2d_packed_size(text, data_shape, w.shape), "float32")
    fmt = call.get("src_fmt", "nchw")
    shape = formatted_shape(data_shape, fmt) if fmt != "nchw" else tuple(data_shape)
    data = np.zeros(shape, "float32")  # (only its shape is read)
    tvm_ffi.get_global_func(native.CONV2D_PACK_WEIGHT)(
        text, tvm_ffi.from_dlpack(data), tvm_ffi.from_dlpack(w), tvm_ffi.from_dlpack(packed))
    kh, kw = (w.shape[2], w.shape[3]) if call.get("klayout", "OIHW") == "OIHW" else (
        (w.shape[0], w.shape[1]) if call.get("klayout") == "HWIO" else (w.shape[1], w.shape[2]))
    return call.with_attrs(wpacked=1, kernel=f"{kh},{kw}"), relax.const(packed)


def _users(func: "relax.Function") -> Dict["relax.Var", Set[object]]:
    """Variable -> the binding variables that read it (``"<body>"``: the function's result)."""
    users: Dict["relax.Var", Set[object]] = defaultdict(set)
    for block in func.body.blocks:
        for b in block.bindings:
            for v in relax.analysis.free_vars(b.value):
                users[v].add(b.var)
    for v in relax.analysis.free_vars(func.body.body):
        users[v].add("<body>")
    return users


class _Rewriter:
    """Rewrites one function's chains (module docstring)."""

    def __init__(self, func: "relax.Function", chains: List[Chain], report: LayoutReport,
                 forced: bool = False, pack_weights: bool = False):
        self.func = func
        self.pack_weights = pack_weights
        self.forced = forced  # entries in the chain's format too, whatever oneDNN prefers
        self.bindings = _bindings(func)
        self.users = _users(func)
        self.member_fmt: Dict["relax.Var", str] = {}
        for chain in chains:
            for var in chain.members:
                self.member_fmt[var] = chain.fmt
        self.new: Dict["relax.Var", "relax.Var"] = {}  # member -> its value in the format
        self.entries: Dict[Tuple["relax.Var", str], "relax.Var"] = {}
        self.report = report

    def run(self) -> "relax.Function":
        blocks = []
        for block in self.func.body.blocks:
            out: List["relax.Binding"] = []
            for b in block.bindings:
                if isinstance(b, relax.VarBinding) and b.var in self.member_fmt:
                    self._rewrite(b, out, isinstance(block, relax.DataflowBlock))
                else:
                    out.append(b)
            blocks.append(relax.DataflowBlock(out) if isinstance(block, relax.DataflowBlock)
                          else relax.BindingBlock(out))
        body = relax.SeqExpr(blocks, self.func.body.body)  # (typed by Normalize at the end)
        return relax.Function(self.func.params, body, self.func.ret_ty, self.func.is_pure,
                              self.func.attrs)

    def _bind(self, out, name: str, value, dataflow: bool) -> "relax.Var":
        normalized = relax.BlockBuilder().normalize(value)
        make = relax.DataflowVar if dataflow else relax.Var
        var = make(name, normalized.ty)
        out.append(relax.VarBinding(var, normalized))
        return var

    def _in_format(self, expr, fmt: str, out, dataflow: bool):
        """``expr`` (an NCHW tensor) in ``fmt``: the member's own value or an entry."""
        if expr in self.new and self.member_fmt.get(expr) == fmt:
            return self.new[expr]
        key = (expr, fmt)
        if key not in self.entries:
            self.entries[key] = self._bind(out, f"{expr.name}_{fmt}", to_format(expr, fmt),
                                           dataflow)
            self.report.entries += 1
        return self.entries[key]

    def _exit_in_kernel(self, var: "relax.Var", conv) -> bool:
        """Guard ``exit_in_kernel`` (:func:`exits_in_kernel`): no member reads ``var``, and
        every reader is the function's result or a library call (through aliases ``v = var``,
        as ``emit_output`` binds a block's result)."""
        if conv is None or not exits_in_kernel(conv[0]):
            return False
        return self._read_as_nchw_only(var)

    def _read_as_nchw_only(self, var: "relax.Var") -> bool:
        for user in self.users.get(var, ()):
            if user == "<body>":
                continue
            if user in self.member_fmt and _links(self.bindings[user], var):
                return False
            value = self.bindings.get(user)
            if isinstance(value, relax.Var) and self._read_as_nchw_only(user):
                continue
            if value is None or lib.lib_call_of(value) is None:
                return False
        return True

    def _rewrite(self, binding, out, dataflow: bool) -> None:
        var, value = binding.var, binding.value
        fmt = self.member_fmt[var]
        conv = member_conv(value)
        if self._exit_in_kernel(var, conv):
            # rule ``exit_in_kernel``: the convolution writes NCHW itself, under its variable
            new_value = self._conv(value, conv, fmt, out, dataflow, dst="nchw")
            out.append(relax.VarBinding(var, relax.BlockBuilder().normalize(new_value)))
            self.report.plain_dests += 1
            return
        if conv is not None:
            new_value = self._conv(value, conv, fmt, out, dataflow)
        elif (deconv := member_deconv(value)) is not None:
            new_value = self._deconv(value, deconv, fmt, out, dataflow)
        elif _op_name(value) == "relax.concat":
            fields = [self._in_format(f, fmt, out, dataflow) for f in value.args[0].fields]
            new_value = relax.op.concat(fields, axis=3)
        elif (norm := member_norm(value)) is not None:
            new_value = self._norm(value, norm, fmt, out, dataflow)
        elif _op_name(value) == "relax.nn.pad":
            new_value = _pad_in_format(value, self.new[value.args[0]], fmt)
        elif _op_name(value) == "relax.take":
            new_value = _take_in_format(value, self.new[value.args[0]], fmt)
        elif _op_name(value) in SPATIAL:
            new_value = SPATIAL[_op_name(value)](value, self.new[value.args[0]])
        else:
            new_value = self._elementwise(value, fmt, out, dataflow)
        new = self._bind(out, f"{var.name}_{fmt}", new_value, dataflow)
        self.new[var] = new
        outside = [u for u in self.users.get(var, ()) if u not in self.member_fmt
                   or not _links(self.bindings[u], var)]
        if outside or not isinstance(var, relax.DataflowVar):
            back = relax.BlockBuilder().normalize(from_format(new, fmt))
            channels = static_shape(var)[1]
            if static_shape(back)[1] != channels:  # nChw{B}c padding: keep the first C
                padded = self._bind(out, f"{var.name}_padded", back, dataflow)
                back = relax.BlockBuilder().normalize(unpad(padded, channels))
            out.append(relax.VarBinding(var, back))
            self.report.exits += 1

    def _conv(self, value, conv, fmt: str, out, dataflow: bool, dst: Optional[str] = None):
        """A member convolution reading its data in ``fmt`` (or NCHW, see the ``format``
        guard) and writing ``dst`` (default: ``fmt``)."""
        call, ops = conv
        data = ops[0]
        dst = dst or fmt
        cin, cout = static_shape(data)[1], static_shape(value)[1]
        if self.forced or data in self.new and self.member_fmt.get(data) == fmt:
            src = fmt
        else:
            src = fmt if preferred(value)[0] == fmt else "nchw"
        updates = {"src_fmt": src} if src != "nchw" else {}
        if dst != "nchw":
            updates["dst_fmt"] = dst
        self.report.plain_sources += src == "nchw"
        if src not in ("nchw", "nhwc"):
            updates["src_c"] = str(cin)
        if dst not in ("nchw", "nhwc"):
            updates["dst_c"] = str(cout)
        new_ops = list(ops)
        if src != "nchw":
            new_ops[0] = self._in_format(data, src, out, dataflow)
        if call.get("res", "0") == "1":
            new_ops[-1] = self._in_format(ops[-1], fmt, out, dataflow)
        new_call = call.with_attrs(**updates)
        if self.pack_weights and isinstance(ops[1], tvm.ir.expr.Constant):
            new_call, new_ops[1] = pack_weight(new_call, static_shape(data), ops[1])
        shape = static_shape(value)
        return lib.emit_call(new_call, new_ops,
                             formatted_shape(shape, dst) if dst != "nchw" else shape)

    def _deconv(self, value, deconv, fmt: str, out, dataflow: bool):
        """A transposed convolution in a channels-last chain: its data read as it is (in the
        chain's format when a member, else NCHW: no entry), its residual and result in
        ``fmt``."""
        call, ops = deconv
        data = ops[0]
        src = fmt if data in self.new and self.member_fmt.get(data) == fmt else "nchw"
        new_ops = list(ops)
        new_ops[0] = self.new[data] if src == fmt else data
        if call.get("res", "0") == "1":
            new_ops[-1] = self._in_format(ops[-1], fmt, out, dataflow)
        new_call = call.with_attrs(src_fmt=src, dst_fmt=fmt)
        return lib.emit_call(new_call, new_ops, formatted_shape(static_shape(value), fmt))

    def _norm(self, value, norm, fmt: str, out, dataflow: bool):
        """An instance norm in ``fmt``: its data and residual in the format (an entry for one
        from outside the chain), scale and bias as they are."""
        call, ops = norm
        new_ops = list(ops)
        new_ops[0] = self._in_format(ops[0], fmt, out, dataflow)
        if call.get("res", "0") == "1":
            new_ops[-1] = self._in_format(ops[-1], fmt, out, dataflow)
        updates = {"fmt": fmt}
        if fmt != "nhwc":
            updates["c"] = str(static_shape(value)[1])
        return lib.emit_call(call.with_attrs(**updates), new_ops,
                             formatted_shape(static_shape(value), fmt))

    def _elementwise(self, value, fmt: str, out, dataflow: bool):
        channels = static_shape(value)[1]
        args = []
        for arg in value.args:
            if isinstance(arg, tvm.ir.expr.Constant):
                data = constant_to_format(arg.value.numpy(), fmt, channels)
                args.append(relax.const(data, "float32"))
            else:
                args.append(self._in_format(arg, fmt, out, dataflow))
        return relax.Call(value.op, args, value.attrs, value.ty_args)


def _formatted_chains(func, fmt: Optional[str], spatial: bool,
                      report: LayoutReport) -> List[Chain]:
    """The chains of ``func`` that pass ``chain_length`` and ``format``, with their format."""
    bindings = _bindings(func)
    chains = []
    for chain in find_chains(func, spatial):
        if len(chain.convs) < 2:
            continue  # chain_length
        chain.fmt = fmt or choose_format(chain, bindings)
        if not chain.fmt:
            report.skipped.append(f"a chain of {len(chain.convs)} convs: no blocked format")
            continue
        if chain.spatial and chain.fmt != "nhwc":
            chains.append(chain)  # (not rewritable: blocked_layout finds it again without them)
            continue
        if fmt is None and not saves_reorders(func, chain):
            report.skipped.append(f"a chain of {len(chain.convs)} convs: more transforms than "
                                  "reorders saved")
            continue
        chains.append(chain)
    return chains


def saves_reorders(func: "relax.Function", chain: Chain) -> bool:
    """Guard ``saves_reorders``: converting ``chain`` removes more passes over a tensor than it
    adds. Each member convolution in NCHW reorders its source and destination inside the call
    (oneDNN prefers another format: the ``format`` guard); converted, it reorders only a source
    it still reads as NCHW or a destination it writes as NCHW (``exit_in_kernel``), and the
    chain adds one ``layout_transform`` per entry and exit:
    ``2 * convs - plain sources - plain destinations > entries + exits``. Counted by
    rewriting the chain alone."""
    dry = LayoutReport()
    _Rewriter(func, [chain], dry).run()
    return 2 * len(chain.convs) - dry.plain_sources - dry.plain_dests > dry.entries + dry.exits


def pack_lone_weights(func: "relax.Function", chained: Set["relax.Var"],
                      report: LayoutReport) -> "relax.Function":
    """``func`` with the constant weights of its native convolutions outside every chain
    (``chained``: the chains' members) packed for their calls (:func:`pack_weight`).

    Why: a convolution that no chain takes (its neighbours need NCHW: an instance norm, a
    mirror pad; or it is alone) still reads its weights as OIHW, and oneDNN reorders them into
    its blocked format at every call (Candy quick's rewritten plan: 8 weight reorders per
    inference, 3-9 us each in ``ONEDNN_VERBOSE``). Its activations stay NCHW: only the weight
    operand changes, so no transform is added."""
    blocks, changed = [], 0
    for block in func.body.blocks:
        out = []
        for b in block.bindings:
            conv = member_conv(b.value) if isinstance(b, relax.VarBinding) else None
            constant = conv is not None and isinstance(conv[1][1], tvm.ir.expr.Constant)
            if not constant or b.var in chained:
                out.append(b)
                continue
            call, ops = conv
            new_call, weight = pack_weight(call, static_shape(ops[0]), ops[1])
            value = lib.emit_call(new_call, [ops[0], weight, *ops[2:]], static_shape(b.value))
            out.append(relax.VarBinding(b.var, value))
            changed += 1
        blocks.append(relax.DataflowBlock(out) if isinstance(block, relax.DataflowBlock)
                      else relax.BindingBlock(out))
    if not changed:
        return func
    report.lone_packed += changed
    return relax.Function(func.params, relax.SeqExpr(blocks, func.body.body), func.ret_ty,
                          func.is_pure, func.attrs)


def _with_pad_ops(mod: "tvm.IRModule", func: "relax.Function", fmt: Optional[str],
                  report: LayoutReport) -> "relax.Function":
    """``func`` with the ONNX importer's PrimFunc pads as ``nn.pad`` (:mod:`.tir_pads`) when
    that makes a chain, else ``func`` unchanged: the pads are chain members only as ops."""
    with_ops = pads_as_ops(mod, func)
    if with_ops is func:
        return func
    dry = LayoutReport()
    chains = _formatted_chains(with_ops, fmt, True, dry)
    if any(c.spatial and c.fmt != "nhwc" for c in chains):
        chains = _formatted_chains(with_ops, fmt, False, dry)
    if not chains:
        return func
    report.tir_pads += _count_pads(with_ops) - _count_pads(func)
    return with_ops


def _count_pads(func: "relax.Function") -> int:
    return sum(1 for v in _bindings(func).values() if _op_name(v) == "relax.nn.pad")


def blocked_layout(mod: "tvm.IRModule", fmt: Optional[str] = None, pack_weights: bool = False
                   ) -> Tuple["tvm.IRModule", LayoutReport]:
    """``mod`` with its convolution chains kept in oneDNN's preferred format (module
    docstring), and what was done. Without the native library's format query, ``mod``.

    Parameters
    ----------
    mod : IRModule
        A Relax module after the rewrite (native conv calls as ``call_dps_packed``).
    fmt : str, optional
        Every chain in this format (``"nhwc"``, ``"nChw4c"``, ``"nChw8c"``, ``"nChw16c"``)
        instead of oneDNN's preference (tests, and comparing formats).
    pack_weights : bool
        Also pack the constant weights of the chain's convolutions into oneDNN's format for
        these very calls (``wpacked=1``), so that no call reorders its weights, and those of
        the convolutions outside every chain (:func:`pack_lone_weights`). The packs are
        made for this machine's CPU and thread count; run elsewhere (or with another thread
        count), a call reorders its pack from the oneDNN format tag in the pack's header, as
        it reorders unpacked weights.
    """
    if fmt is not None and fmt not in _FORMATS:
        raise ValueError(f"blocked_layout: fmt must be one of {_FORMATS}, got {fmt!r}")
    report = LayoutReport()
    if not native.available() or not native.provides(native.CONV2D_PREFERRED_FORMAT):
        report.skipped.append("the native library has no conv2d_preferred_format")
        return mod, report
    updates = {}
    for gv, func in mod.functions_items():
        if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
            continue
        func = _with_pad_ops(mod, func, fmt, report)
        chains = _formatted_chains(func, fmt, True, report)
        if any(c.spatial and c.fmt != "nhwc" for c in chains):
            chains = _formatted_chains(func, fmt, False, report)
        report.chains.extend((len(c.convs), c.fmt) for c in chains)
        new = func
        if pack_weights:
            chained = {v for c in chains for v in c.members}
            new = pack_lone_weights(func, chained, report)
        if chains:
            new = _Rewriter(new, chains, report, forced=fmt is not None,
                            pack_weights=pack_weights).run()
        if new is not func:
            updates[gv] = new
    if not updates:
        return mod, report
    out = mod.shallow_copy() if hasattr(mod, "shallow_copy") else tvm.IRModule(
        dict(mod.functions_items()), attrs=mod.attrs)
    for gv, func in updates.items():
        out[gv] = func
    return relax.transform.Normalize()(out), report
