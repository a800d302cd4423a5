"""Data-layout transformation of an input tensor: a gather stage that re-lays the data out.

* :data:`SPLIT_DIM` — dimension ``p`` of an input tensor ``X`` (size ``n``) is split into two,
  ``(n/k, k)``, by a new nested stage ``G`` (a reshape, free in row-major order), and the read is
  rewritten through it::

      X[.., e, ..]  =  G[.., e // k, e % k, ..],   G = L<.., j:0:n/k, q:0:k, ..> {X[.., k*j + q, ..]}

  ``X``'s zero padding on ``p`` becomes ``ceil(lo/k)``/``ceil(hi/k)`` of padding on ``j``. With
  ``e = k*a + b`` (``0 <= b < k``) the read simplifies to ``G[.., a, b, ..]``: an iterator that was
  strided by ``k`` becomes an iterator of its own dimension, which is what dilated operators need
  to turn into undilated ones. ``k`` is a stride that ``e`` itself uses.
"""

from __future__ import annotations

from typing import Iterator

from ...ir.nodes import Access, BinOp, Const, IterVar, Scope, Tensor, substitute
from .base import Rewrite, Rule, RuleContext, body_accesses, linear_form


def _gather(src: Tensor, dim: int, k: int) -> Scope:
    n = src.shape[dim]
    base = Tensor(src.name, src.shape, src.dtype, None, src.pad_value)
    loops, idx, pad = [], [], []
    for d, size in enumerate(src.shape):
        lo, hi = src.pad[d]
        if d == dim:
            j, q = f"j{d}", f"q{d}"
            loops += [IterVar(j, 0, n // k), IterVar(q, 0, k)]
            idx.append(BinOp("+", BinOp("*", Const(k), loops[-2].var), loops[-1].var))
            pad += [(-(-lo // k), -(-hi // k)), (0, 0)]
        else:
            loops.append(IterVar(f"d{d}", 0, size))
            idx.append(loops[-1].var)
            pad.append((lo, hi))
    return Scope(loops, (), Access(base, idx), pad=pad)


def _split_dim(scope: Scope, ctx: RuleContext) -> Iterator[Rewrite]:  # pylint: disable=unused-argument
    for acc in body_accesses(scope.body):
        src = acc.source
        if not isinstance(src, Tensor):
            continue
        if any(lo or hi for lo, hi in src.pad) and src.pad_value != 0.0:
            continue
        for dim, (e, n) in enumerate(zip(acc.indices, src.shape)):
            lin = linear_form(e)
            if lin is None:
                continue
            strides = sorted({abs(c) for c in lin[0].values() if abs(c) > 1})
            for k in strides:
                if n % k or k >= n:
                    continue
                g = _gather(src, dim, k)
                idx = list(acc.indices)
                idx[dim:dim + 1] = [BinOp("//", e, Const(k)), BinOp("%", e, Const(k))]
                body = substitute(scope.body, {acc: Access(g, idx)})
                yield Rewrite(scope.replace(body=body),
                              f"layout {src.name} dim {dim}: {n} -> ({n // k}, {k})")


SPLIT_DIM = Rule(
    "split_dim", "layout",
    "X[.., e, ..] = G[.., e // k, e % k, ..], G = L<.., j, q, ..> { X[.., k*j + q, ..] }",
    _split_dim,
    max_per_path=2,
)

RULES = (SPLIT_DIM,)
