"""Lifts of ``relax.nn.max_pool{1,2,3}d`` and ``relax.nn.avg_pool{1,2,3}d``.

Max pooling is a ``Max`` reduction over the window taps of an input padded with ``-inf``::

    L<n, c, h, w> Max<r, s> { x<pad, value=-inf>[n, c, h·sh + r·dh - pt, w·sw + s·dw - pl] }

(where some window lies entirely in the padding, which ``ceil_mode`` can cause, the pad value is
the dtype's lowest finite number instead, as in TOPI, so that such outputs agree too).

Average pooling is the window sum divided by the number of counted taps, in two stages as TOPI
computes it: ``L<n, c, h, w> { (L Σ<r, s> {x<pad>[...]})[n, c, h, w] / count }``. ``count``
follows TOPI exactly: with ``count_include_pad`` it counts the taps inside the input plus its
explicit padding (the extra ``ceil_mode`` margin is not counted); without, the taps inside the
input, at least 1. A count that is the same for every output is a constant; otherwise it is a
small nested scope over the spatial outputs that sums ``select(tap counted, 1, 0)``, which is
exact and keeps the divisor in floating point.
"""

from __future__ import annotations

from typing import Dict, List

import numpy as np

from ..ir.nodes import Access, BinOp, Call, IterVar, Node, Scope, Tensor
from .common import (
    IterNames,
    affine,
    conjunction,
    float_const,
    int_list,
    read_padding,
    require_float,
)
from .conv import TAP_NAMES
from .errors import LiftError
from .layouts import SPATIAL, parse_layout
from .registry import Operands, register_lift


class _Window:
    """Pooling geometry of one spatial dimension."""

    def __init__(self, size, k, s, d, pb, pa, out):
        self.size, self.k, self.s, self.d, self.pb, self.pa, self.out = size, k, s, d, pb, pa, out

    def taps(self, o: int) -> np.ndarray:
        """Input positions read by output ``o``."""
        return o * self.s - self.pb + np.arange(self.k) * self.d

    def counts(self, include_pad: bool) -> List[int]:
        """Taps TOPI counts for each output position."""
        hi = self.size + self.pa - 1 if include_pad else self.size - 1
        lo = -self.pb if include_pad else 0
        return [int(np.count_nonzero((self.taps(o) >= lo) & (self.taps(o) <= hi)))
                for o in range(self.out)]

    def empty_windows(self) -> bool:
        """Whether some output's window misses the input entirely."""
        return any(c == 0 for c in self.counts(False))


def _pool_setup(call, names: Operands, nd: int):
    attrs = call.attrs
    op = names.op
    if str(attrs.out_layout) != str(attrs.layout):
        raise LiftError(f"{op}: out_layout {attrs.out_layout} differs from layout "
                        f"{attrs.layout} (TVM cannot legalize that either)")
    lay = parse_layout(attrs.layout, "NC", nd, f"{op} layout")
    x = names.tensor(call.args[0], "data")
    require_float(x.dtype, op)
    size = int_list(attrs.pool_size, f"{op} pool_size")
    strides = int_list(attrs.strides, f"{op} strides")
    dilation = int_list(attrs.dilation, f"{op} dilation")
    padding = int_list(attrs.padding, f"{op} padding")
    if len(padding) == nd:
        padding = padding + padding
    if len(size) != nd or len(strides) != nd or len(dilation) != nd or len(padding) != 2 * nd:
        raise LiftError(f"{op}: malformed attributes")
    if min(size + strides + dilation) <= 0 or min(padding) < 0:
        raise LiftError(f"{op}: non-positive window/stride/dilation or negative padding")
    out_shape = names.out_shape()
    spatial = SPATIAL[nd]
    wins = []
    for d, c in enumerate(spatial):
        n = x.shape[lay[c]]
        w = _Window(n, size[d], strides[d], dilation[d], padding[d], padding[nd + d],
                    out_shape[lay[c]])
        span = n + w.pb + w.pa - (w.k - 1) * w.d - 1
        floor_out = span // w.s + 1
        # ceil_mode adds a last partial window, which Relax drops (as PyTorch does) when it
        # would start beyond the input and its left padding; either way windows are o·s - pb.
        ceil_out = (span + w.s - 1) // w.s + 1 if bool(attrs.ceil_mode) else floor_out
        if span < 0 or not floor_out <= w.out <= ceil_out:
            raise LiftError(f"{op}: result shape {out_shape} does not match the attributes")
        wins.append(w)
    if out_shape[lay["N"]] != x.shape[lay["N"]] or out_shape[lay["C"]] != x.shape[lay["C"]]:
        raise LiftError(f"{op}: result shape {out_shape} does not match the input")
    return x, lay, wins, out_shape


def _window_scope(names: Operands, nd: int, x, lay, wins, out_shape, pad_value: float,
                  reducer: str) -> Scope:
    """``L<loops> Σ|Max<taps> { x<pad>[window read] }``."""
    spatial = SPATIAL[nd]
    gen = IterNames(names.names)
    want = {"N": "n", "C": "c", "D": "d", "H": "h", "W": "w"}
    loops: List[IterVar] = []
    loop_of: Dict[str, IterVar] = {}
    for ch in sorted(lay, key=lay.get):
        iv = IterVar(gen.take(want[ch]), 0, out_shape[lay[ch]])
        loops.append(iv)
        loop_of[ch] = iv
    reduce: List[IterVar] = []
    idx: List[Node] = [None] * (nd + 2)
    pads = [(0, 0)] * (nd + 2)
    idx[lay["N"]], idx[lay["C"]] = loop_of["N"].var, loop_of["C"].var
    for d, ch in enumerate(spatial):
        w = wins[d]
        terms = [(loop_of[ch].var, w.s)]
        if w.k > 1:
            t = IterVar(gen.take(TAP_NAMES[nd][d]), 0, w.k)
            reduce.append(t)
            terms.append((t.var, w.d))
        idx[lay[ch]] = affine(terms, -w.pb)
        pads[lay[ch]] = read_padding(-w.pb, (w.out - 1) * w.s + (w.k - 1) * w.d - w.pb, w.size)
    padded = any(lo or hi for lo, hi in pads)
    src = Tensor(x.name, x.shape, x.dtype, pads, pad_value if padded else 0.0)
    return Scope(loops, reduce, Access(src, idx), reducer=reducer)


def _lift_max_pool(call, names: Operands, nd: int) -> Scope:
    x, lay, wins, out_shape = _pool_setup(call, names, nd)
    pad_value = float("-inf")
    if any(w.empty_windows() for w in wins):
        pad_value = float(np.finfo(np.dtype(x.dtype) if x.dtype != "bfloat16" else np.float32).min)
    return _window_scope(names, nd, x, lay, wins, out_shape, pad_value, "max")


def _lift_avg_pool(call, names: Operands, nd: int) -> Scope:
    x, lay, wins, out_shape = _pool_setup(call, names, nd)
    include = bool(call.attrs.count_include_pad)
    total = _window_scope(names, nd, x, lay, wins, out_shape, 0.0, "sum")
    counts = [w.counts(include) for w in wins]
    if include and any(0 in c for c in counts):
        raise LiftError(f"{names.op}: a window lies entirely in the ceil_mode margin; TOPI "
                        "divides by a non-positive count there")
    loops = total.loops
    spatial = SPATIAL[nd]
    loop_of = {ch: loops[lay[ch]] for ch in lay}
    const = 1.0
    varying = []
    for d, ch in enumerate(spatial):
        if len(set(counts[d])) == 1:
            const *= counts[d][0]
        else:
            varying.append(d)
    divisor: Node = float_const(const, x.dtype)
    if varying:
        cnt = _count_scope(nd, [wins[d] for d in varying], [spatial[d] for d in varying],
                           include, x.dtype)
        read = Access(cnt, [loop_of[spatial[d]].var for d in varying])
        divisor = read if const == 1.0 else BinOp("*", read, divisor)
    if not include and any(0 in c for c in counts):
        divisor = Call("max", (divisor, float_const(1.0, x.dtype)))
    if total.reduce:
        value = Access(total, [iv.var for iv in loops])
    else:
        value = total.body
    return Scope(loops, (), BinOp("/", value, divisor))


def _count_scope(nd: int, wins: List[_Window], letters: List[str], include: bool,
                 dtype: str) -> Scope:
    """``L<o...> Σ<t...> { select(every tap counted, 1, 0) }``: taps counted per output."""
    gen = IterNames()
    loops, reduce, conds = [], [], []
    for w, ch in zip(wins, letters):
        o = IterVar(gen.take(ch.lower()), 0, w.out)
        t = IterVar(gen.take(TAP_NAMES[nd][SPATIAL[nd].index(ch)]), 0, w.k)
        loops.append(o)
        reduce.append(t)
        pos = affine([(o.var, w.s), (t.var, w.d)], -w.pb)
        if include:
            conds.append(BinOp("<", pos, w.size + w.pa))
        else:
            conds.append(BinOp("and", BinOp(">=", pos, 0), BinOp("<", pos, w.size)))
    body = Call("select", (conjunction(conds), float_const(1.0, dtype), float_const(0.0, dtype)))
    return Scope(loops, reduce, body)


def _register(nd: int) -> None:
    register_lift(f"relax.nn.max_pool{nd}d", lambda call, names: _lift_max_pool(call, names, nd))
    register_lift(f"relax.nn.avg_pool{nd}d", lambda call, names: _lift_avg_pool(call, names, nd))


for _nd in (1, 2, 3):
    _register(_nd)
