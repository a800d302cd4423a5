"""Lifts of ``relax.nn.conv1d/2d/3d``: any strides, (asymmetric) padding, dilation and groups.

For NCHW/OIHW the lifted expression is::

    L<n, f, h, w> Σ<c, r, s> { x<pad>[n, g(f)·Cg + c, h·sh + r·dh - pt, w·sw + s·dw - pl]
                               * K[f, c, r, s] }

Zero padding is carried by the input tensor (reads in its margin give 0), which is the form the
derivation rules expect. ``g(f) = f // (F / groups)`` selects the group; with one group the
channel index is just ``c``, and for depthwise convolutions (one input channel per group) the
``c`` reduction disappears. Reduction iterators of extent 1 (1x1 kernels) are dropped. Other
data layouts (``NHWC``, ...) and kernel layouts (``HWIO``, ...) only permute the subscripts.
The tensor is padded exactly as far as the reads reach, which may be less than the attribute
asks for on the high side when the stride skips the last rows. An ``out_dtype`` other than the
input type (float16 data summed in float32) casts both reads to it, as TOPI does.
"""

from __future__ import annotations

from typing import Dict, List

from ..ir.nodes import Access, BinOp, IterVar, Node, Scope, Var
from .common import (
    IterNames,
    accumulation_dtype,
    affine,
    cast_to,
    int_list,
    read_padding,
    require_float,
)
from .errors import LiftError
from .layouts import SPATIAL, parse_layout
from .registry import Operands, register_lift

#: Kernel-tap iterator names per number of spatial dimensions.
TAP_NAMES = {1: ["r"], 2: ["r", "s"], 3: ["q", "r", "s"]}


def spatial_params(attrs, nd: int, what: str):
    """``(strides, dilation, pad_before, pad_after)`` of a conv/pool attribute set."""
    strides = int_list(attrs.strides, f"{what} strides")
    dilation = int_list(attrs.dilation, f"{what} dilation")
    padding = int_list(attrs.padding, f"{what} padding")
    if len(padding) == nd:
        padding = padding + padding
    if len(strides) != nd or len(dilation) != nd or len(padding) != 2 * nd:
        raise LiftError(f"{what}: malformed strides/dilation/padding {strides}, {dilation}, "
                        f"{padding}")
    if any(s <= 0 for s in strides) or any(d <= 0 for d in dilation):
        raise LiftError(f"{what}: non-positive stride or dilation")
    if any(p < 0 for p in padding):
        raise LiftError(f"{what}: negative padding {padding}")
    return strides, dilation, padding[:nd], padding[nd:]


def _lift_conv(call, names: Operands, nd: int) -> Scope:
    attrs = call.attrs
    op = names.op
    if str(attrs.out_layout) != str(attrs.data_layout):
        raise LiftError(f"{op}: out_layout {attrs.out_layout} differs from data_layout "
                        f"{attrs.data_layout} (TVM cannot legalize that either)")
    dl = parse_layout(attrs.data_layout, "NC", nd, f"{op} data_layout")
    kl = parse_layout(attrs.kernel_layout, "OI", nd, f"{op} kernel_layout")
    x = names.tensor(call.args[0], "data")
    k = names.tensor(call.args[1], "kernel")
    if x.dtype != k.dtype:
        raise LiftError(f"{op}: data and kernel dtypes differ ({x.dtype}, {k.dtype})")
    require_float(x.dtype, op)
    acc = accumulation_dtype(attrs.out_dtype, x.dtype, op)
    strides, dilation, pad_lo, pad_hi = spatial_params(attrs, nd, op)
    groups = int(attrs.groups)
    spatial = SPATIAL[nd]
    batch, chans = x.shape[dl["N"]], x.shape[dl["C"]]
    filters, kchans = k.shape[kl["O"]], k.shape[kl["I"]]
    taps = [k.shape[kl[c]] for c in spatial]
    if groups <= 0 or chans % groups or filters % groups or kchans != chans // groups:
        raise LiftError(f"{op}: channels {chans}, filters {filters}, kernel input channels "
                        f"{kchans} do not fit groups={groups}")
    out_shape = names.out_shape()
    out_sp = [out_shape[dl[c]] for c in spatial]
    expect = [
        (x.shape[dl[c]] + pad_lo[d] + pad_hi[d] - (taps[d] - 1) * dilation[d] - 1) // strides[d] + 1
        for d, c in enumerate(spatial)
    ]
    if out_shape[dl["N"]] != batch or out_shape[dl["C"]] != filters or expect != out_sp:
        raise LiftError(f"{op}: result shape {out_shape} does not match the operands")

    gen = IterNames(names.names)
    loop_of: Dict[str, IterVar] = {}
    want = {"N": "n", "C": "f", "D": "d", "H": "h", "W": "w"}
    extent = {"N": batch, "C": filters, **{c: e for c, e in zip(spatial, out_sp)}}
    loops: List[IterVar] = []
    for c in sorted(dl, key=dl.get):
        loop_of[c] = gen.take(want[c])
        loops.append(IterVar(loop_of[c], 0, extent[c]))
    reduce: List[IterVar] = []
    cg = chans // groups
    c_var = None
    if cg > 1:
        c_var = gen.take("c")
        reduce.append(IterVar(c_var, 0, cg))
    tap_vars: List[Node] = []
    for name, t in zip(TAP_NAMES[nd], taps):
        if t > 1:
            v = gen.take(name)
            reduce.append(IterVar(v, 0, t))
            tap_vars.append(v)
        else:
            tap_vars.append(None)

    f = loop_of["C"]
    chan = _group_channel(f, filters // groups, cg, groups, c_var)
    x_idx: List[Node] = [None] * (nd + 2)
    x_idx[dl["N"]] = loop_of["N"]
    x_idx[dl["C"]] = chan
    pads = [(0, 0)] * (nd + 2)
    for d, c in enumerate(spatial):
        terms = [(loop_of[c], strides[d])]
        if tap_vars[d] is not None:
            terms.append((tap_vars[d], dilation[d]))
        x_idx[dl[c]] = affine(terms, -pad_lo[d])
        lo_read = -pad_lo[d]
        hi_read = (out_sp[d] - 1) * strides[d] + (taps[d] - 1) * dilation[d] - pad_lo[d]
        pads[dl[c]] = read_padding(lo_read, hi_read, x.shape[dl[c]])
    k_idx: List[Node] = [None] * (nd + 2)
    k_idx[kl["O"]] = f
    k_idx[kl["I"]] = c_var if c_var is not None else 0
    for d, c in enumerate(spatial):
        k_idx[kl[c]] = tap_vars[d] if tap_vars[d] is not None else 0
    body = BinOp("*", cast_to(Access(x.with_pad(pads), x_idx), acc),
                 cast_to(Access(k, k_idx), acc))
    return Scope(loops, reduce, body)


def _group_channel(f: Var, f_per_group: int, cg: int, groups: int, c_var) -> Node:
    """Input channel read by filter ``f`` at reduction position ``c_var`` (None: ``c = 0``)."""
    if groups == 1:
        return c_var if c_var is not None else 0
    group = f if f_per_group == 1 else BinOp("//", f, f_per_group)
    if cg == 1:
        return group
    base = BinOp("*", group, cg)
    return BinOp("+", base, c_var)


@register_lift("relax.nn.conv1d")
def lift_conv1d(call, names: Operands) -> Scope:
    """Lift ``relax.nn.conv1d`` (NCW/NWC data, OIW/WIO/... kernels)."""
    return _lift_conv(call, names, 1)


@register_lift("relax.nn.conv2d")
def lift_conv2d(call, names: Operands) -> Scope:
    """Lift ``relax.nn.conv2d`` (NCHW/NHWC/... data, OIHW/HWIO/... kernels)."""
    return _lift_conv(call, names, 2)


@register_lift("relax.nn.conv3d")
def lift_conv3d(call, names: Operands) -> Scope:
    """Lift ``relax.nn.conv3d`` (NCDHW/NDHWC/... data, OIDHW/DHWIO/... kernels)."""
    return _lift_conv(call, names, 3)
