"""The target operators: one table of what derivation can instantiate.

Every operator a derived program may call is one :class:`TargetOp` row: its name, its equation,
how a scope is matched against it (:mod:`tvm_ollie.derive.match`), the canonical expression of
a match over fresh operand tensors, the short signature printed in reports, its FLOPs, and how it
is implemented (the Relax operator family that expresses it and the native-library kernel family
that runs it, when there is one). Search, matching, costing, emission and the library all read
this table, so adding an operator is adding a row (plus its matcher), never editing name tuples
in five modules. :func:`match_scope` tries the rows in order.

The Relax and library fields are names, not callables: this module stays free of TVM, and
:mod:`tvm_ollie.transform.emit` and :mod:`tvm_ollie.codegen.library` dispatch on them (each
with its own guards on attributes, e.g. transposed operands or layouts a library lacks).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from ..ir.nodes import Scope
from .match import (
    IterTable,
    Match,
    band_expr,
    band_signature,
    conv_expr,
    conv_signature,
    gemm_operator_expr,
    gemm_signature,
    iterator_table,
    match_band,
    match_conv,
    match_gemm,
)

__all__ = ["TargetOp", "TARGET_OPS", "TARGET_NAMES", "match_scope", "target_op",
           "operator_flops"]

Attrs = Mapping[str, object]


@dataclass(frozen=True)
class TargetOp:
    """One operator derivation can instantiate.

    Attributes
    ----------
    name : str
        The stage kind (``Stage.kind``, ``Match.kind``).
    equation : str
        The operator's definition, for docs and reports.
    matcher : callable
        ``IterTable -> Match | list[Match] | None``: the ways a scope is this operator.
    expression : callable
        ``(Match, a, b) -> Scope``: the operator over operand tensors ``a`` and ``b``.
    signature : callable
        ``attrs -> str``, e.g. ``matmul[49x512 @ 512x4608]``.
    flops : callable
        ``attrs -> float``: floating-point operations (a multiply-add counts 2).
    relax_op : str or None
        The Relax operator family that expresses it (``"matmul"``, ``"conv2d"``); None: it is
        emitted as a lowered TIR kernel.
    library : str or None
        The native-library kernel family that runs it (:mod:`tvm_ollie.codegen.library`).
    """

    name: str
    equation: str
    matcher: Callable[[IterTable], Union[None, Match, List[Match]]]
    expression: Callable[..., object]
    signature: Callable[[Attrs], str]
    flops: Callable[[Attrs], float]
    relax_op: Optional[str] = None
    library: Optional[str] = None


def _gemm_flops(at: Attrs) -> float:
    return 2.0 * at.get("batch", 1) * at["M"] * at["N"] * at["K"]


def _conv_flops(at: Attrs) -> float:
    c_per_group = at["C"] // at.get("groups", 1)
    return 2.0 * at["N"] * at["F"] * at["OH"] * at["OW"] * c_per_group * at["R"] * at["S"]


def _band_flops(inner: str) -> Callable[[Attrs], float]:
    def flops(at: Attrs) -> float:
        return 2.0 * at["batch"] * at["length"] * (2 * at["width"] + 1) * at[inner]
    return flops


#: Every target operator, in the order a scope is matched against them.
TARGET_OPS: Dict[str, TargetOp] = {op.name: op for op in (
    TargetOp("matmul", "out[m, n] = Σ_k A[m, k] * B[k, n]",
             lambda t: match_gemm(t, batched=False), gemm_operator_expr, gemm_signature,
             _gemm_flops, relax_op="matmul", library="matmul"),
    TargetOp("batch_matmul", "out[b, m, n] = Σ_k A[b, m, k] * B[b, k, n]",
             lambda t: match_gemm(t, batched=True), gemm_operator_expr, gemm_signature,
             _gemm_flops, relax_op="matmul", library="matmul"),
    TargetOp("conv2d", "out[n, f, h, w] = Σ_{c, r, s} X[n, c, st*h + dil*r - p, ...] * "
             "W[f, c, r, s]", match_conv, conv_expr, conv_signature, _conv_flops,
             relax_op="conv2d", library="conv2d"),
    TargetOp("g2bmm", "out[b, i, j] = Σ_k A[b, i, k] * B[b, i + D*(j - W), k]",
             lambda t: match_band(t, "g2bmm"), band_expr, band_signature, _band_flops("K"),
             library="g2bmm"),
    TargetOp("gbmm", "out[b, i, n] = Σ_j A[b, i, j] * B[b, i + D*(j - W), n]",
             lambda t: match_band(t, "gbmm"), band_expr, band_signature, _band_flops("N"),
             library="gbmm"),
)}

#: The names of :data:`TARGET_OPS`, in matching order (derivation's default targets).
TARGET_NAMES: Tuple[str, ...] = tuple(TARGET_OPS)


def target_op(name: str) -> TargetOp:
    """The row of ``name``; a ``ValueError`` naming the known operators otherwise."""
    try:
        return TARGET_OPS[name]
    except KeyError:
        raise ValueError(f"unknown target operator {name!r} (known: "
                         f"{', '.join(TARGET_NAMES)})") from None


def operator_flops(kind: str, attrs: Attrs) -> float:
    """FLOPs of a matched operator stage of kind ``kind``."""
    return target_op(kind).flops(attrs)


def match_scope(scope: Scope, targets: Optional[Sequence[str]] = None) -> List[Match]:
    """The ways to instantiate ``scope`` as a target operator, in table order.

    At most one match per kind, except matmul / batch_matmul, which also offer the other
    operand order when it prepares operands or the output differently (cheapest first).

    Parameters
    ----------
    scope : Scope
        Any scope; nested scopes in its body are treated as tensors (their data box).
    targets : sequence of str
        Operator kinds to try (names of :data:`TARGET_OPS`; unknown names are ignored); None:
        all of them.

    Returns
    -------
    list[Match]
        Empty when the scope matches none of the targets.
    """
    table = iterator_table(scope)
    if table is None:
        return []
    out = []
    for kind, op in TARGET_OPS.items():
        if targets is not None and kind not in targets:
            continue
        found = op.matcher(table)
        if isinstance(found, Match):
            out.append(found)
        elif found:
            out.extend(found)
    return out
