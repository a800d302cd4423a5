"""Gathers (``take``) as injective kernels, so that TVM's greedy fusion fuses them.

TVM 0.27's ``AnnotateTIROpPattern`` derives each PrimFunc's fusion pattern from its loop nest,
and a load whose index is read from another buffer (``A[idx[i]]``, the body TOPI writes for
``take``) is not an affine access: the function is marked ``opaque`` (8), and ``FuseOps``
fuses nothing into it or out of it. Relay registered ``take`` as injective. PyTorch's ONNX
exporter writes a reflection pad as two ``take`` calls (along H, then W), so quick Candy's
kept plan ran 20 lone ``take`` kernels (110 us of its 1.75 ms of kernels at load 13,
``tvm-ollie profile``), two passes over each padded tensor where one fused kernel reads the
input once. Kernel orchestration did not fuse them either: its table calls a Relax ``take`` a
layout primitive, but it runs after legalization, where a ``call_tir``'s kind follows the same
``op_pattern``. Both fusions read the pattern this pass corrects.

:func:`is_gather` is the rule (a PrimFunc the pattern analysis called opaque whose one block is
spatial and writes its output at exactly its iterators: every output element computed on its
own, whatever indices its loads take); :func:`mark_gathers_injective` is the module pass, run
right after ``AnnotateTIROpPattern`` (:func:`~tvm_ollie.tune.cpu_schedule.cpu_pipeline`).
Fusing an injective producer into a gather (or a gather into its elementwise consumer) is
what ``FuseTIR`` does for any injective kernel: the producer's value is substituted at the
gathered index.
"""

from __future__ import annotations

from typing import List, Sequence

from ..compat import tirx, tvm

__all__ = ["INJECTIVE", "OPAQUE", "is_gather", "mark_gathers_injective",
           "with_gathers_injective"]

#: TVM's ``OpPatternKind`` values used here (``include/tvm/relax/op_attr_types.h``).
INJECTIVE, OPAQUE = 2, 8

#: ``IterVar.iter_type`` of a spatial (data-parallel) iterator.
DATA_PAR = 0


def _realizes(stmt, out: List) -> List:
    """The ``SBlockRealize`` statements below ``stmt``, the root block's first."""
    kind = type(stmt).__name__
    if kind == "SeqStmt":
        children = list(stmt.seq)
    elif kind == "SBlockRealize":
        out.append(stmt)
        children = [stmt.block]
    elif kind == "SBlock":
        children = [s for s in (stmt.init, stmt.body) if s is not None]
    elif kind == "IfThenElse":
        children = [s for s in (stmt.then_case, stmt.else_case) if s is not None]
    else:
        body = getattr(stmt, "body", None)
        children = [body] if isinstance(body, tirx.Stmt) else []
    for child in children:
        _realizes(child, out)
    return out


def _always(predicate) -> bool:
    return isinstance(predicate, tirx.IntImm) and int(predicate.value) == 1


def is_gather(func: "tirx.PrimFunc") -> bool:
    """Whether ``func`` is injective although the pattern analysis called it opaque.

    True when ``func`` is marked opaque, has one block, executed at every point of its loops
    (no predicate), every iterator of the block is spatial, the block has no init, and its
    body is one store at exactly the block's iterators, in order (with one block, into the
    output): the loads may be at any index (``A[idx[i], j]``).
    """
    attrs = func.attrs
    if attrs is None or int(attrs.get("op_pattern", -1)) != OPAQUE:
        return False
    realizes = [r for r in _realizes(func.body, []) if r.block.name_hint != "root"]
    if len(realizes) != 1 or not _always(realizes[0].predicate):
        return False
    block = realizes[0].block
    if block.init is not None or any(int(iv.iter_type) != DATA_PAR for iv in block.iter_vars):
        return False
    store = block.body
    if type(store).__name__ != "BufferStore" or len(store.indices) != len(block.iter_vars):
        return False
    return all(isinstance(i, tirx.Var) and i.same_as(iv.var)
               for i, iv in zip(store.indices, block.iter_vars))


@tvm.transform.module_pass(opt_level=0, name="MarkGathersInjective")
def mark_gathers_injective(mod: "tvm.IRModule", _ctx=None) -> "tvm.IRModule":
    """Mark every PrimFunc of ``mod`` that :func:`is_gather` accepts ``op_pattern`` injective
    (run after ``AnnotateTIROpPattern``, before ``FuseOps``)."""
    updates = {}
    for gv, func in mod.functions_items():
        if isinstance(func, tirx.PrimFunc) and is_gather(func):
            updates[gv] = func.with_attr("op_pattern", INJECTIVE)
    if not updates:
        return mod
    out = tvm.IRModule(dict(mod.functions_items()), attrs=mod.attrs,
                       global_infos=mod.global_infos)
    for gv, func in updates.items():
        out[gv] = func
    return out


def with_gathers_injective(passes: Sequence["tvm.transform.Pass"]) -> list:
    """``passes`` with :func:`mark_gathers_injective` right after ``AnnotateTIROpPattern``
    (unchanged when that pass is absent)."""
    out = []
    for p in passes:
        out.append(p)
        if p.info.name == "AnnotateTIROpPattern":
            out.append(mark_gathers_injective)
    return out
