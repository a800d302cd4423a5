"""Lifts of data-movement ops: ``permute_dims``, ``reshape`` (and ``expand_dims``, ``squeeze``,
``flatten``), ``broadcast_to``, ``strided_slice``, ``concat`` and constant-mode ``nn.pad``.

These ops only move elements, so they lift for any element type. ``reshape`` is row-major: the
dimensions are cut into the smallest groups whose extents multiply to the same number on both
sides, and inside a group the output position is flattened and split again with ``//`` and
``%`` (a pure merge or split therefore reads ``x[i // 8, i % 8]`` or ``x[i * 8 + j]``).
``concat`` selects the operand by comparing the concatenation index with the offsets; every
operand is zero-padded along the axis so that all reads stay in bounds, whichever branch is
taken. ``nn.pad`` is a padded tensor read with shifted indices.
"""

from __future__ import annotations

from typing import List, Sequence, Tuple

from ..compat import relax, tirx
from ..ir.nodes import Access, BinOp, Call, IterVar, Node, Scope, Tensor
from .common import IterNames, affine, int_list, normalize_axis, prim_int
from .elementwise import broadcast_index
from .errors import LiftError
from .registry import Operands, register_lift


def _loops(names: Operands, shape: Sequence[int]) -> List[IterVar]:
    return IterNames(names.names).iters([f"i{k}" for k in range(len(shape))], shape)


@register_lift("relax.permute_dims")
def lift_permute_dims(call, names: Operands) -> Scope:
    """``out[i0, ..] = x[i_{inv(0)}, ..]`` for ``out.shape[k] = x.shape[axes[k]]``."""
    x = names.tensor(call.args[0], "data")
    axes = call.attrs.axes
    perm = list(range(x.ndim))[::-1] if axes is None else \
        [normalize_axis(a, x.ndim, names.op) for a in int_list(axes, "axes")]
    if sorted(perm) != list(range(x.ndim)):
        raise LiftError(f"{names.op}: {perm} is not a permutation")
    loops = _loops(names, [x.shape[a] for a in perm])
    idx: List[Node] = [None] * x.ndim
    for k, a in enumerate(perm):
        idx[a] = loops[k].var
    return Scope(loops, (), Access(x, idx))


def reshape_groups(ins: Sequence[int], outs: Sequence[int]) -> List[Tuple[list, list]]:
    """Smallest runs of input and output dimensions whose extents have equal products."""
    groups = []
    i = j = 0
    while i < len(ins) or j < len(outs):
        gi, gj, pi, pj = [], [], 1, 1
        if i < len(ins):
            gi.append(i)
            pi, i = pi * ins[i], i + 1
        if j < len(outs):
            gj.append(j)
            pj, j = pj * outs[j], j + 1
        while pi != pj:
            if pi < pj and i < len(ins):
                gi.append(i)
                pi, i = pi * ins[i], i + 1
            elif pj < pi and j < len(outs):
                gj.append(j)
                pj, j = pj * outs[j], j + 1
            else:
                raise LiftError(f"cannot reshape {tuple(ins)} to {tuple(outs)}")
        groups.append((gi, gj))
    return groups


def reshape_indices(ins: Sequence[int], loops: Sequence[IterVar]) -> List[Node]:
    """Input indices that read, row-major, the element at output position ``loops``."""
    outs = [iv.extent for iv in loops]
    idx: List[Node] = [None] * len(ins)
    for gi, gj in reshape_groups(ins, outs):
        terms, stride = [], 1
        for q in reversed(gj):
            if outs[q] > 1:
                terms.append((loops[q].var, stride))
            stride *= outs[q]
        flat = affine(list(reversed(terms)))
        real = [p for p in gi if ins[p] > 1]
        for p in gi:
            if ins[p] == 1:
                idx[p] = 0
        if len(real) == 1:
            idx[real[0]] = flat
            continue
        istride = 1
        for p in reversed(real):
            node = flat if istride == 1 else BinOp("//", flat, istride)
            if p != real[0]:
                node = BinOp("%", node, ins[p])
            idx[p] = node
            istride *= ins[p]
    return idx


def _lift_reshape(call, names: Operands) -> Scope:
    x = names.tensor(call.args[0], "data")
    out = names.out_shape()
    size_in, size_out = 1, 1
    for s in x.shape:
        size_in *= s
    for s in out:
        size_out *= s
    if size_in != size_out:
        raise LiftError(f"{names.op}: cannot reshape {x.shape} to {out}")
    loops = _loops(names, out)
    return Scope(loops, (), Access(x, reshape_indices(x.shape, loops)))


for _name in ("relax.reshape", "relax.expand_dims", "relax.squeeze", "relax.flatten"):
    register_lift(_name, _lift_reshape)


def _int_tuple(expr, what: str) -> List[int]:
    if isinstance(expr, relax.Tuple):
        return [prim_int(f, what) for f in expr.fields]
    if isinstance(expr, relax.ShapeExpr):
        return [prim_int(f, what) for f in expr.values]
    raise LiftError(f"{what} is not a static tuple: {expr}")


@register_lift("relax.strided_slice")
def lift_strided_slice(call, names: Operands) -> Scope:
    """``out[.., i, ..] = x[.., start + i·step, ..]`` with Python slice normalization."""
    x = names.tensor(call.args[0], "data")
    axes = [normalize_axis(a, x.ndim, names.op) for a in _int_tuple(call.args[1], "axes")]
    begin = _int_tuple(call.args[2], "begin")
    end = _int_tuple(call.args[3], "end")
    steps = _int_tuple(call.args[4], "strides") if len(call.args) > 4 else [1] * len(axes)
    if not len(axes) == len(begin) == len(end) == len(steps) or len(set(axes)) != len(axes):
        raise LiftError(f"{names.op}: malformed slice")
    out = list(x.shape)
    starts, strides = [0] * x.ndim, [1] * x.ndim
    for a, b, e, s in zip(axes, begin, end, steps):
        if s == 0:
            raise LiftError(f"{names.op}: zero stride")
        rng = range(*slice(b, e, s).indices(x.shape[a]))
        out[a], starts[a], strides[a] = len(rng), rng.start, rng.step
    if tuple(out) != tuple(names.out_shape()) or 0 in out:
        raise LiftError(f"{names.op}: slice result {tuple(out)} differs from the result type "
                        f"{names.out_shape()}")
    loops = _loops(names, out)
    idx = [affine([(iv.var, st)], s0) for iv, st, s0 in zip(loops, strides, starts)]
    return Scope(loops, (), Access(x, idx))


@register_lift("relax.concat")
def lift_concat(call, names: Operands) -> Scope:
    """``select(i < o1, x0[.., i, ..], select(i < o2, x1[.., i - o1, ..], ...))``."""
    parts = call.args[0]
    if not isinstance(parts, relax.Tuple):
        raise LiftError(f"{names.op}: the operands must be an explicit tuple")
    tensors = [names.tensor(f, f"operand {k}") for k, f in enumerate(parts.fields)]
    if not tensors:
        raise LiftError(f"{names.op}: nothing to concatenate")
    out = names.out_shape()
    if call.attrs.axis is None:
        raise LiftError(f"{names.op}: concatenation without an axis (flattening) is unsupported")
    axis = normalize_axis(int(call.attrs.axis), len(out), names.op)
    total = out[axis]
    loops = _loops(names, out)
    i = loops[axis].var
    offsets, off = [], 0
    for t in tensors:
        if t.ndim != len(out) or any(t.shape[d] != out[d] for d in range(len(out)) if d != axis):
            raise LiftError(f"{names.op}: operand shape {t.shape} does not fit {tuple(out)}")
        offsets.append(off)
        off += t.shape[axis]
    if off != total:
        raise LiftError(f"{names.op}: operand extents do not add up to {total}")
    body = None
    for t, o in reversed(list(zip(tensors, offsets))):
        pads = [(0, 0)] * t.ndim
        pads[axis] = (o, total - o - t.shape[axis])
        idx = [iv.var for iv in loops]
        idx[axis] = affine([(i, 1)], -o)
        read = Access(t.with_pad(pads), idx)
        body = read if body is None else Call("select", (BinOp("<", i, o + t.shape[axis]),
                                                          read, body))
    return Scope(loops, (), body)


@register_lift("relax.broadcast_to")
def lift_broadcast_to(call, names: Operands) -> Scope:
    """``out[i] = x[i]`` with numpy broadcasting (size-1 dimensions read at 0)."""
    x = names.tensor(call.args[0], "data")
    loops = _loops(names, names.out_shape())
    return Scope(loops, (), Access(x, broadcast_index(names, x, loops)))


@register_lift("relax.nn.pad")
def lift_pad(call, names: Operands) -> Scope:
    """Constant padding: ``out[i] = x<pad=(before, after), value>[i - before]``."""
    if str(call.attrs.pad_mode) != "constant":
        raise LiftError(f"{names.op}: pad_mode {call.attrs.pad_mode} is unsupported "
                        "(constant only)")
    x = names.tensor(call.args[0], "data")
    widths = int_list(call.attrs.pad_width, "pad_width")
    if len(widths) != 2 * x.ndim:
        raise LiftError(f"{names.op}: pad_width {widths} does not match rank {x.ndim}")
    if min(widths, default=0) < 0:
        raise LiftError(f"{names.op}: negative pad widths are unsupported")
    pads = [(widths[2 * d], widths[2 * d + 1]) for d in range(x.ndim)]
    value = call.attrs.pad_value
    value = float(value.value if isinstance(value, (tirx.IntImm, tirx.FloatImm)) else value)
    out = [s + lo + hi for s, (lo, hi) in zip(x.shape, pads)]
    loops = _loops(names, out)
    src = Tensor(x.name, x.shape, x.dtype, pads, value)
    return Scope(loops, (), Access(src, [affine([(iv.var, 1)], -lo)
                                         for iv, (lo, _) in zip(loops, pads)]))
