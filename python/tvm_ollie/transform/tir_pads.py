"""Pads that TVM's ONNX importer emits as TOPI PrimFuncs, recognised as Relax ``nn.pad``.

The ONNX importer builds ``Pad`` with ``bb.emit_te``: ``call_tir`` of ``topi.nn.mirror_pad``
(``reflect``), ``topi.nn.replicate_pad`` (``edge``) or ``topi.nn.pad`` (``constant``), so the
pad reaches the Relax passes as an opaque kernel of NCHW shape. The layout step
(:mod:`.blocked_layout`) can move an ``nn.pad`` into a chain's format, not a PrimFunc; without
this, Candy exported to ONNX stays ten chains of one convolution each.

Rule ``tir_pad_as_op``::

    call_tir(f, (x,)) = nn.pad(x, [0, 0, 0, 0, t, b, l, r], mode)
        when f is, up to the names of its variables, the PrimFunc that emit_te makes of the
        TOPI pad of mode on x's shape with those widths

The check is structural equality with the PrimFunc generated for the candidate widths (the
symmetric split first, then every split of each spatial axis's extra rows), so it holds exactly
for what the importer emits and for nothing else: a hand-written or fused PrimFunc is left
alone. Constant pads are recognised for the value 0 only.
"""

from __future__ import annotations

import functools
from typing import Iterator, List, Optional, Tuple

import tvm_ffi

from ..compat import relax, topi, tvm
from .epilogue import static_shape

__all__ = ["pads_as_ops", "recognised_pad"]

_TOPI = {
    "reflect": lambda x, before, after: topi.nn.mirror_pad(x, before, after, "REFLECT"),
    "replicate": lambda x, before, after: topi.nn.replicate_pad(x, before, after),
    "constant": lambda x, before, after: topi.nn.pad(x, before, after, 0.0),
}
#: The most candidate splits tried per call (every split of both axes up to 8 extra rows each).
_MAX_CANDIDATES = 81


@functools.lru_cache(maxsize=256)
def _generated(shape: Tuple[int, ...], mode: str, before: Tuple[int, ...],
               after: Tuple[int, ...]):
    """The PrimFunc ``bb.emit_te`` makes of the TOPI pad of ``mode`` on a float32 ``shape``."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    with bb.function("f", [x]):
        out = bb.emit_te(_TOPI[mode], x, list(before), list(after))
        bb.emit_func_output(out)
    return next(f for _, f in bb.get().functions_items() if not isinstance(f, relax.Function))


def _splits(extra: Tuple[int, int]) -> Iterator[Tuple[Tuple[int, ...], Tuple[int, ...]]]:
    """Candidate (before, after) widths of NCHW for ``extra`` rows and columns: the symmetric
    split first, then every other."""
    eh, ew = extra
    sym = ((0, 0, eh // 2, ew // 2), (0, 0, eh - eh // 2, ew - ew // 2))
    yield sym
    count = 1
    for th in range(eh + 1):
        for tw in range(ew + 1):
            cand = ((0, 0, th, tw), (0, 0, eh - th, ew - tw))
            if cand != sym and count < _MAX_CANDIDATES:
                count += 1
                yield cand


def recognised_pad(mod: "tvm.IRModule", value) -> Optional[Tuple[str, List[int]]]:
    """``(mode, pad_width)`` (Relax ``nn.pad``'s) when ``value`` is ``call_tir`` of a TOPI pad
    of a 4-D float32 tensor's spatial axes (rule ``tir_pad_as_op``), else None."""
    if not isinstance(value, relax.Call) or not isinstance(value.op, tvm.ir.Op) or \
            value.op.name != "relax.call_tir" or len(value.args) != 2:
        return None
    gv, args = value.args
    if not isinstance(args, relax.Tuple) or len(args.fields) != 1:
        return None
    x = args.fields[0]
    shape, out = static_shape(x), static_shape(value)
    if shape is None or out is None or len(shape) != 4 or len(out) != 4 or \
            str(x.ty.dtype) != "float32" or str(value.ty.dtype) != "float32":
        return None
    extra = tuple(o - s for o, s in zip(out, shape))
    if extra[:2] != (0, 0) or min(extra) < 0 or extra == (0, 0, 0, 0):
        return None
    func = mod[gv] if gv in mod.get_global_vars() else None
    if func is None or isinstance(func, relax.Function):
        return None
    for mode in _TOPI:
        for before, after in _splits(extra[2:]):
            if mode == "reflect" and (max(before[2], after[2]) >= shape[2]
                                      or max(before[3], after[3]) >= shape[3]):
                continue  # TOPI's mirror pad cannot reflect that far
            if tvm_ffi.structural_equal(func, _generated(shape, mode, before, after),
                                        map_free_vars=True):
                return mode, [0, 0, 0, 0, before[2], after[2], before[3], after[3]]
    return None


def pads_as_ops(mod: "tvm.IRModule", func: "relax.Function") -> "relax.Function":
    """``func`` with every recognised ``call_tir`` pad (:func:`recognised_pad`) bound to the
    equal ``nn.pad`` under the same variable; ``func`` itself when there is none."""
    blocks, changed = [], False
    for block in func.body.blocks:
        out = []
        for b in block.bindings:
            pad = recognised_pad(mod, b.value) if isinstance(b, relax.VarBinding) else None
            if pad is None:
                out.append(b)
                continue
            mode, widths = pad
            value = relax.BlockBuilder().normalize(
                relax.op.nn.pad(b.value.args[1].fields[0], widths, mode, 0.0))
            out.append(relax.VarBinding(b.var, value))
            changed = True
        blocks.append(relax.DataflowBlock(out) if isinstance(block, relax.DataflowBlock)
                      else relax.BindingBlock(out))
    if not changed:
        return func
    return relax.Function(func.params, relax.SeqExpr(blocks, func.body.body), func.ret_ty,
                          func.is_pure, func.attrs)
