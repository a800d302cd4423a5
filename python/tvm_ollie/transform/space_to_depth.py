"""Space-to-depth then convolution as one strided convolution (the Focus stem of YOLOX).

A network that stacks the ``r * r`` phases of its input on channels (YOLOv5's and YOLOX's
``Focus``: ``x[..., ::2, ::2]``, ``x[..., 1::2, ::2]``, ... concatenated) and convolves the
result spends a memory-bound kernel on the slices and the concatenation (one TVM kernel of
1.32 ms at paper-size YOLOX, against a 0.23 ms ``SpaceToDepth`` in ONNX Runtime) before a
convolution over a tensor it could have read in place. Each tap ``(u, v)`` of phase ``(a, b)``
reads input pixel ``(r (i + u - p) + a, r (j + v - p) + b)``, so the whole is one convolution
of ``x`` with stride ``r``, kernel ``r k`` and padding ``r p``, its tap ``(r u + a, r v + b)``
the phase's tap ``(u, v)``: rule ``space_to_depth_conv``. The ``r * r`` phases cover every tap
of the big kernel exactly once, so no tap is zero, and the FLOPs stay the same: what goes is
the slicing kernel, and the library convolution reads ``x`` where it lies.

It is an inference fold (:class:`~.fold_rule.FoldRule`, applied by
:func:`~.inference_fold.fold_inference` before the derivation and the library plan decide
anything), so that the convolution every later step weighs is the one that will run, and the
stem joins the channels-last chain of library convolutions after it. A constant weight is
rearranged now (numpy); a weight given at run time by Relax ops (reshape, take, transpose).
Slices or a concatenation that other operators also read stay for them.
"""

from __future__ import annotations

from collections import Counter
from typing import Dict, List, Optional, Tuple

import numpy as np

from ..compat import relax
from .fold_rule import FoldRule, Matches
from .fold_rule import const_value as _const
from .regions import static_tensor

__all__ = ["SPACE_TO_DEPTH_RULES", "phase_weight", "space_to_depth_conv"]

_dpl = relax.dpl

#: ``end`` of a slice that runs to the end of its axis, as exporters write it
_TO_END = 2**31 - 1

_W = _dpl.wildcard()
_CAT = _dpl.is_op("relax.concat")(_dpl.wildcard())
_CONV = _dpl.is_op("relax.nn.conv2d")(_CAT, _W)


# --- guards -------------------------------------------------------------------------------


def _ints(expr) -> Optional[Tuple[int, ...]]:
    """The integers of a Relax tuple of integers (a strided slice's axes, begins...): each
    field an ``IntImm``, or a ``PrimValue`` of one."""
    fields = getattr(expr, "fields", None)
    if fields is None:
        return None
    out = []
    for field in fields:
        value = getattr(field, "value", None)
        value = getattr(value, "value", value)
        if not isinstance(value, int):
            return None
        out.append(int(value))
    return tuple(out)


def _plain_conv(conv) -> bool:
    """An NCHW/OIHW convolution with one group and no dilation, whose weight has a static
    shape (the cases the rearranged weight is derived for)."""
    attrs = conv.attrs
    return (attrs.data_layout == "NCHW" and attrs.kernel_layout == "OIHW"
            and attrs.out_layout in ("NCHW", "") and int(attrs.groups) == 1
            and all(int(d) == 1 for d in attrs.dilation)
            and all(int(s) == 1 for s in attrs.strides)
            and static_tensor(conv.args[1]) and static_tensor(conv))


def _phase(call) -> Optional[Tuple[object, int, Tuple[int, int]]]:
    """``(x, r, (a, b))`` when ``call`` is ``x[:, :, a::r, b::r]`` over the whole of a 4-D
    ``x`` whose height and width ``r`` divides (``0 <= a, b < r``), else None."""
    if not isinstance(call, relax.Call) or getattr(call.op, "name", "") != "relax.strided_slice":
        return None
    x = call.args[0]
    if len(call.args) != 5 or not static_tensor(x) or len(x.ty.shape) != 4:
        return None
    axes, begin, end, strides = (_ints(a) for a in call.args[1:])
    if None in (axes, begin, end, strides) or len(axes) != 2:
        return None
    by_axis = {ax % 4: (b, e, s) for ax, b, e, s in zip(axes, begin, end, strides)}
    if sorted(by_axis) != [2, 3]:
        return None
    (a, end_h, r), (b, end_w, r_w) = by_axis[2], by_axis[3]
    shape = [int(d) for d in x.ty.shape]
    if r != r_w or r < 2 or not (0 <= a < r and 0 <= b < r):
        return None
    if end_h < min(shape[2], _TO_END) or end_w < min(shape[3], _TO_END):
        return None
    if shape[2] % r or shape[3] % r:
        return None
    return x, r, (a, b)


def _all_phases_once(phases: List[Tuple[object, int, Tuple[int, int]]]) -> bool:
    """The slices are of one tensor, with one ``r``, and each of its ``r * r`` phases is there
    exactly once."""
    if not phases:
        return False
    x, r = phases[0][0], phases[0][1]
    offsets = [p[2] for p in phases]
    return (all(p[0].same_as(x) and p[1] == r for p in phases)
            and len(offsets) == r * r and len(set(offsets)) == r * r)


# --- the weight ---------------------------------------------------------------------------


def phase_weight(weight: np.ndarray, r: int, offsets: List[Tuple[int, int]]) -> np.ndarray:
    """The strided convolution's weight: ``W'[o, c, r u + a, r v + b] = W[o, q C + c, u, v]``
    where ``q`` is the position of phase ``(a, b)`` in the concatenation (``offsets``)."""
    out_c, in_c, k_h, k_w = weight.shape
    channels = in_c // (r * r)
    by_phase = weight.reshape(out_c, r * r, channels, k_h, k_w)
    order = [offsets.index((a, b)) for a in range(r) for b in range(r)]
    grid = by_phase[:, order].reshape(out_c, r, r, channels, k_h, k_w)  # o, a, b, c, u, v
    return np.ascontiguousarray(
        grid.transpose(0, 3, 4, 1, 5, 2).reshape(out_c, channels, r * k_h, r * k_w))


def _phase_weight_expr(weight, r: int, offsets: List[Tuple[int, int]]):
    """:func:`phase_weight` as Relax ops, for a weight given at run time."""
    out_c, in_c, k_h, k_w = (int(d) for d in weight.ty.shape)
    channels = in_c // (r * r)
    order = [offsets.index((a, b)) for a in range(r) for b in range(r)]
    op = relax.op
    by_phase = op.reshape(weight, (out_c, r * r, channels, k_h, k_w))
    picked = op.take(by_phase, relax.const(np.array(order, "int64")), axis=1)
    grid = op.reshape(picked, (out_c, r, r, channels, k_h, k_w))
    return op.reshape(op.permute_dims(grid, [0, 3, 4, 1, 5, 2]),
                      (out_c, channels, r * k_h, r * k_w))


# --- the rule -----------------------------------------------------------------------------


def _slices_of(concat, value_of: Dict[object, object]):
    """The phases of the concatenation's operands (their bound values looked up), or None."""
    axis = concat.attrs.axis
    if axis is None or int(axis) % 4 != 1:
        return None
    fields = getattr(concat.args[0], "fields", None)
    if fields is None:
        fields = getattr(value_of.get(concat.args[0]), "fields", None)
    if fields is None:
        return None
    phases = [_phase(value_of.get(f, f)) for f in fields]
    return None if any(p is None for p in phases) else phases


def space_to_depth_conv(matches: Matches, _uses: Counter, binding_of) -> Optional[object]:
    """``space_to_depth_conv``: ``conv_{k, s=1, p}(concat_q x[:, :, a_q::r, b_q::r], W)
    = conv_{r k, s=r, r p}(x, W')`` with ``W'[o, c, r u + a_q, r v + b_q] = W[o, q C + c,
    u, v]``, for all ``r * r`` phases, any order, any batch."""
    conv, concat = matches[_CONV], matches[_CAT]
    if not _plain_conv(conv) or len(concat.ty.shape) != 4:
        return None
    value_of = {var: value for value, var in binding_of.items()}
    phases = _slices_of(concat, value_of)
    if phases is None or not _all_phases_once(phases):
        return None
    x, r = phases[0][0], phases[0][1]
    offsets = [p[2] for p in phases]
    weight_expr = value_of.get(matches[_W], matches[_W])
    weight = _const(weight_expr)
    if weight is not None:
        new_weight = relax.const(phase_weight(weight, r, offsets))
    else:
        new_weight = _phase_weight_expr(matches[_W], r, offsets)
    padding = [r * int(p) for p in conv.attrs.padding]
    return relax.op.nn.conv2d(x, new_weight, strides=(r, r), padding=padding,
                              data_layout="NCHW", kernel_layout="OIHW",
                              out_dtype=conv.attrs.out_dtype)


#: The rule, for :data:`~.inference_fold.FOLD_RULES`.
SPACE_TO_DEPTH_RULES: Tuple[FoldRule, ...] = (
    FoldRule("space_to_depth_conv", _CONV, space_to_depth_conv),
)
