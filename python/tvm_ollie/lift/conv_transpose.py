"""Lifts of ``relax.nn.conv1d_transpose/conv2d_transpose/conv3d_transpose`` in gather form.

A transposed convolution scatters ``x[i] * K[r]`` to output position ``i·s + r·d - p``. Read
backwards, output ``h`` gathers the taps ``r`` for which ``(h + p - r·d)`` is a multiple of the
stride ``s``, reading input row ``(h + p - r·d) / s``::

    L<n, o, h, w> Σ<c, r, q> {
        select((h + pt - r·dh) % sh == 0 and (w + pl - q·dw) % sw == 0,
               x<pad>[n, g(o)·Cg + c, (h + pt - r·dh) // sh, (w + pl - q·dw) // sw], 0)
        * K[g(o)·Cg + c, o % Og, r, q] }

Why this form: it is exact (the guard keeps only the taps that really land on ``h``; the IR has
no divisibility predicate, so ``%`` with ``==`` expresses it), it reads the original input
rather than a zero-stuffed copy (TVM's legalizer convolves a dilated, padded input and spends
about ``s²`` times the useful multiply-adds), and it keeps the affine structure ``h + p - r·d``
that derivation rules split on. Floor division keeps every read inside the input's zero margin,
even where the guard is false. With stride 1 the guard and the division disappear and the lift
is an ordinary convolution with a flipped kernel index. ``output_padding`` only enlarges the
output (its extra rows gather like any other row).

TVM legalizes only NC[D]HW data with IO[D]HW kernels (and ``out_layout == data_layout``); the
lift accepts exactly those.
"""

from __future__ import annotations

from typing import List

from ..ir.nodes import Access, BinOp, Call, IterVar, Node, Scope
from .common import (
    IterNames,
    affine,
    conjunction,
    float_const,
    int_list,
    read_padding,
    require_float,
    require_out_dtype,
)
from .conv import TAP_NAMES
from .errors import LiftError
from .layouts import SPATIAL
from .registry import Operands, register_lift


def _lift_conv_transpose(call, names: Operands, nd: int) -> Scope:
    attrs = call.attrs
    op = names.op
    spatial = SPATIAL[nd]
    data_layout, kernel_layout = "NC" + spatial, "IO" + spatial
    if str(attrs.data_layout) != data_layout or str(attrs.kernel_layout) != kernel_layout or \
            str(attrs.out_layout) != data_layout:
        raise LiftError(f"{op}: only {data_layout} data with {kernel_layout} kernels is "
                        f"supported (TVM's legalizer has the same limit), got "
                        f"{attrs.data_layout}/{attrs.kernel_layout}/{attrs.out_layout}")
    x = names.tensor(call.args[0], "data")
    k = names.tensor(call.args[1], "kernel")
    if x.dtype != k.dtype:
        raise LiftError(f"{op}: data and kernel dtypes differ ({x.dtype}, {k.dtype})")
    require_float(x.dtype, op)
    require_out_dtype(attrs.out_dtype, x.dtype, op)
    strides = int_list(attrs.strides, f"{op} strides")
    dilation = int_list(attrs.dilation, f"{op} dilation")
    padding = int_list(attrs.padding, f"{op} padding")
    out_pad = int_list(attrs.output_padding, f"{op} output_padding")
    if len(padding) == nd:
        padding = padding + padding
    if len(strides) != nd or len(dilation) != nd or len(padding) != 2 * nd or \
            len(out_pad) != nd:
        raise LiftError(f"{op}: malformed attributes")
    if min(strides + dilation) <= 0 or min(padding + out_pad) < 0:
        raise LiftError(f"{op}: non-positive stride/dilation or negative padding")
    pad_lo, pad_hi = padding[:nd], padding[nd:]
    groups = int(attrs.groups)
    batch, chans = x.shape[0], x.shape[1]
    kin, og = k.shape[0], k.shape[1]
    taps = list(k.shape[2:])
    if groups <= 0 or kin != chans or chans % groups:
        raise LiftError(f"{op}: kernel {k.shape} does not fit data {x.shape} with "
                        f"groups={groups}")
    cg, filters = chans // groups, og * groups
    in_sp = list(x.shape[2:])
    out_shape = names.out_shape()
    expect = [
        (i - 1) * s - pl - ph + d * (t - 1) + o + 1
        for i, s, pl, ph, d, t, o in zip(in_sp, strides, pad_lo, pad_hi, dilation, taps, out_pad)
    ]
    if tuple(out_shape) != (batch, filters, *expect):
        raise LiftError(f"{op}: result shape {out_shape} differs from the expected "
                        f"{(batch, filters, *expect)}")

    gen = IterNames(names.names)
    loops: List[IterVar] = gen.iters(["n", "o"] + [c.lower() for c in spatial], out_shape)
    n, o = loops[0].var, loops[1].var
    reduce: List[IterVar] = []
    c_var = None
    if cg > 1:
        c_var = gen.take("c")
        reduce.append(IterVar(c_var, 0, cg))
    tap_vars = []
    for name, t in zip(TAP_NAMES[nd], taps):
        v = None
        if t > 1:
            v = gen.take(name)
            reduce.append(IterVar(v, 0, t))
        tap_vars.append(v)

    if groups == 1:
        chan: Node = c_var if c_var is not None else 0
        o_local: Node = o
    else:
        group = o if og == 1 else BinOp("//", o, og)
        chan = group if c_var is None else BinOp("+", BinOp("*", group, cg), c_var)
        o_local = 0 if og == 1 else BinOp("%", o, og)

    x_idx: List[Node] = [n, chan]
    guards: List[Node] = []
    pads = [(0, 0), (0, 0)]
    for d in range(nd):
        h = loops[2 + d]
        terms = [(h.var, 1)]
        if tap_vars[d] is not None:
            terms.append((tap_vars[d], -dilation[d]))
        pos = affine(terms, pad_lo[d])
        s = strides[d]
        lo_read = pad_lo[d] - (taps[d] - 1) * dilation[d]
        hi_read = h.extent - 1 + pad_lo[d]
        if s == 1:
            x_idx.append(pos)
        else:
            guards.append(BinOp("==", BinOp("%", pos, s), 0))
            x_idx.append(BinOp("//", pos, s))
            lo_read, hi_read = lo_read // s, hi_read // s
        pads.append(read_padding(lo_read, hi_read, in_sp[d]))
    read = Access(x.with_pad(pads), x_idx)
    guard = conjunction(guards)
    if guard is not None:
        read = Call("select", (guard, read, float_const(0.0, x.dtype)))
    k_idx = [chan, o_local] + [v if v is not None else 0 for v in tap_vars]
    return Scope(loops, reduce, BinOp("*", read, Access(k, k_idx)))


@register_lift("relax.nn.conv1d_transpose")
def lift_conv1d_transpose(call, names: Operands) -> Scope:
    """Lift ``relax.nn.conv1d_transpose`` (NCW data, IOW kernel)."""
    return _lift_conv_transpose(call, names, 1)


@register_lift("relax.nn.conv2d_transpose")
def lift_conv2d_transpose(call, names: Operands) -> Scope:
    """Lift ``relax.nn.conv2d_transpose`` (NCHW data, IOHW kernel)."""
    return _lift_conv_transpose(call, names, 2)


@register_lift("relax.nn.conv3d_transpose")
def lift_conv3d_transpose(call, names: Operands) -> Scope:
    """Lift ``relax.nn.conv3d_transpose`` (NCDHW data, IODHW kernel)."""
    return _lift_conv_transpose(call, names, 3)
