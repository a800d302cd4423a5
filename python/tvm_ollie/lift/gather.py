"""Lifts of ``relax.take`` and ``relax.gather_nd`` with a constant index tensor that is an
affine function of its coordinates.

Exported graphs write a (dilated) window as a gather: ``take(pad(x), idx, axis)`` with a
constant ``idx`` such as ``idx[m, w] = m + D * w``. Read as an opaque table, such a gather hides
the band from the derivation; read as an affine index it is an ordinary access::

    out[i_pre.., j_0.., j_{k-1}, i_post..] = x[i_pre.., c + Σ_d a_d · j_d, i_post..]

The coefficients are fitted from ``k + 1`` entries (``c = idx[0..0]``,
``a_d = idx[e_d] - idx[0..0]``) and then checked exactly against every entry; every entry must
also lie in ``[0, n)`` so that the index mode (``fast``, ``clip``, ``wrap``) does not matter.
Anything else (random or negative indices, a non-constant index) raises :class:`LiftError`,
and the call stays an opaque read.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import numpy as np

from ..compat import tvm
from ..ir.nodes import Access, IterVar, Node, Scope
from .common import IterNames, affine, normalize_axis
from .errors import LiftError
from .registry import Operands, register_lift

__all__ = ["fit_affine_index", "lift_gather_nd", "lift_take"]

_CONST = tvm.ir.expr.Constant


def fit_affine_index(idx: np.ndarray) -> Optional[Tuple[int, List[int]]]:
    """``(c, [a_0, ..])`` with ``idx[j] == c + Σ a_d j_d`` for every entry, else None.

    Fitted from the origin and one step along each dimension, then checked on every entry.
    """
    if idx.dtype.kind not in "iu" or idx.size == 0:
        return None
    idx = idx.astype(np.int64)
    origin = (0,) * idx.ndim
    c = int(idx[origin]) if idx.ndim else int(idx)
    coeffs = []
    for d, n in enumerate(idx.shape):
        if n == 1:
            coeffs.append(0)
            continue
        step = list(origin)
        step[d] = 1
        coeffs.append(int(idx[tuple(step)]) - c)
    grid = np.full(idx.shape, c, dtype=np.int64)
    for d, a in enumerate(coeffs):
        shape = [1] * idx.ndim
        shape[d] = idx.shape[d]
        grid = grid + a * np.arange(idx.shape[d], dtype=np.int64).reshape(shape)
    if not np.array_equal(grid, idx):
        return None
    return c, coeffs


@register_lift("relax.take")
def lift_take(call, names: Operands) -> Scope:
    """``take(x, idx, axis)`` with a constant affine ``idx`` as an affine read of ``x``."""
    data, index = call.args[0], call.args[1]
    if not isinstance(index, _CONST):
        raise LiftError(f"{names.op}: the indices are not a constant tensor "
                        "(a data-dependent read)")
    x = names.tensor(data, "data")
    idx = index.value.numpy()
    if call.attrs.axis is None:
        raise LiftError(f"{names.op}: take without an axis (flattened) is unsupported")
    axis = normalize_axis(int(call.attrs.axis), x.ndim, names.op)
    fit = fit_affine_index(idx)
    if fit is None:
        raise LiftError(f"{names.op}: the constant indices are not an affine function of "
                        "their coordinates")
    n = x.shape[axis]
    if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= n):
        raise LiftError(f"{names.op}: indices outside [0, {n}) are unsupported")
    c, coeffs = fit
    out = tuple(x.shape[:axis]) + tuple(idx.shape) + tuple(x.shape[axis + 1:])
    if out != tuple(names.out_shape()):
        raise LiftError(f"{names.op}: result shape {out} differs from {names.out_shape()}")
    gen = IterNames(names.names)
    loops: List[IterVar] = gen.iters([f"i{k}" for k in range(len(out))], out)
    vars_ = [iv.var for iv in loops]
    window = vars_[axis:axis + idx.ndim]
    read: Node = affine(list(zip(window, coeffs)), c)
    indices = vars_[:axis] + [read] + vars_[axis + idx.ndim:]
    return Scope(loops, (), Access(x, indices))


@register_lift("relax.gather_nd")
def lift_gather_nd(call, names: Operands) -> Scope:
    """``gather_nd(x, idx)`` (``batch_dims=0``) with a constant ``idx`` whose every component
    ``idx[.., q]`` is affine in the leading coordinates, as an affine read of ``x``::

        out[j.., rest..] = x[c_0 + Σ a_0d j_d, .., c_{M-1} + Σ a_{M-1,d} j_d, rest..]
    """
    data, index = call.args[0], call.args[1]
    if not isinstance(index, _CONST):
        raise LiftError(f"{names.op}: the indices are not a constant tensor "
                        "(a data-dependent read)")
    if int(call.attrs.batch_dims) != 0:
        raise LiftError(f"{names.op}: batch_dims {call.attrs.batch_dims} is unsupported")
    x = names.tensor(data, "data")
    idx = index.value.numpy()
    if idx.ndim < 1 or not 1 <= idx.shape[-1] <= x.ndim:
        raise LiftError(f"{names.op}: indices of shape {idx.shape} do not index {x.shape}")
    m = idx.shape[-1]
    lead = idx.shape[:-1]
    out = tuple(lead) + tuple(x.shape[m:])
    if out != tuple(names.out_shape()):
        raise LiftError(f"{names.op}: result shape {out} differs from {names.out_shape()}")
    gen = IterNames(names.names)
    loops: List[IterVar] = gen.iters([f"i{k}" for k in range(len(out))], out)
    vars_ = [iv.var for iv in loops]
    reads: List[Node] = []
    for q in range(m):
        comp = idx[..., q]
        fit = fit_affine_index(comp) if comp.ndim else (int(comp), [])
        if fit is None:
            raise LiftError(f"{names.op}: the constant indices are not an affine function of "
                            "their coordinates")
        if comp.size and (int(comp.min()) < 0 or int(comp.max()) >= x.shape[q]):
            raise LiftError(f"{names.op}: indices outside [0, {x.shape[q]}) are unsupported")
        c, coeffs = fit
        reads.append(affine(list(zip(vars_[:len(lead)], coeffs)), c))
    return Scope(loops, (), Access(x, reads + vars_[len(lead):]))
