"""Lift of ``relax.matmul``: 2-D, batched with numpy broadcasting of batch dims, and 1-D operands.

``out[b..., i, j] = Σ_k A[b..., i, k] * B[b..., k, j]``. Batch dimensions align from the right;
an operand's batch dimension of extent 1 against a larger output extent is read at index 0, and
missing leading batch dimensions are simply not read. A 1-D ``A`` has no ``i`` (numpy prepends
and then drops a unit row), a 1-D ``B`` has no ``j``.

There is no ``relax.nn.linear`` op in TVM 0.27: ``relax.op.linear`` is a Python helper that emits
``permute_dims`` + ``matmul`` (+ ``add``), so each of those lifts on its own. An ``out_dtype``
other than the operands' type casts both reads to it (TVM's legalization does the same).
"""

from __future__ import annotations

from ..ir.nodes import Access, BinOp, Scope
from .common import IterNames, accumulation_dtype, cast_to, require_float
from .errors import LiftError
from .registry import Operands, register_lift


@register_lift("relax.matmul")
def lift_matmul(call, names: Operands) -> Scope:
    """Lift ``relax.matmul`` (see the module docstring)."""
    a_arg, b_arg = call.args
    a, b = names.tensor(a_arg, "lhs"), names.tensor(b_arg, "rhs")
    if a.dtype != b.dtype:
        raise LiftError(f"{names.op}: operand dtypes differ ({a.dtype}, {b.dtype})")
    require_float(a.dtype, names.op)
    acc = accumulation_dtype(call.attrs.out_dtype, a.dtype, names.op)
    if a.ndim == 0 or b.ndim == 0:
        raise LiftError(f"{names.op}: 0-d operands are not matrices")
    out_shape = names.out_shape()
    a_vec, b_vec = a.ndim == 1, b.ndim == 1
    k_extent = a.shape[-1]
    if b.shape[0 if b_vec else -2] != k_extent:
        raise LiftError(f"{names.op}: reduction extents differ ({a.shape}, {b.shape})")
    n_batch = len(out_shape) - (0 if a_vec else 1) - (0 if b_vec else 1)
    gen = IterNames(names.names)
    batch = gen.iters([f"b{d}" for d in range(n_batch)], out_shape[:n_batch])
    loops = list(batch)
    i = j = None
    if not a_vec:
        i = gen.iters(["i"], [a.shape[-2]])[0]
        loops.append(i)
    if not b_vec:
        j = gen.iters(["j"], [b.shape[-1]])[0]
        loops.append(j)
    if tuple(iv.extent for iv in loops) != tuple(out_shape):
        raise LiftError(f"{names.op}: result shape {out_shape} does not match the operands")
    k = gen.iters(["k"], [k_extent])[0]

    def batch_index(shape):
        idx = []
        for d, extent in enumerate(shape):
            iv = batch[n_batch - len(shape) + d]
            if extent == iv.extent:
                idx.append(iv.var)
            elif extent == 1:
                idx.append(0)
            else:
                raise LiftError(f"{names.op}: batch shapes {a.shape}, {b.shape} do not broadcast")
        return idx

    a_idx = batch_index(a.shape[:-2]) + ([] if a_vec else [i.var]) + [k.var]
    b_idx = batch_index(b.shape[:-2]) + [k.var] + ([] if b_vec else [j.var])
    reduce = [k] if k_extent > 1 else []
    if not reduce:
        a_idx = [0 if x is k.var else x for x in a_idx]
        b_idx = [0 if x is k.var else x for x in b_idx]
    body = BinOp("*", cast_to(Access(a, a_idx), acc), cast_to(Access(b, b_idx), acc))
    return Scope(loops, reduce, body)
