"""Variable splitting: one iterator becomes two, ``i = b + k·i1 + i2``.

* :data:`SPLIT_SUM` — a summation iterator, a plain substitution::

      Σ<i:b:b+n> f(i)  =  Σ<i1:0:n/k, i2:0:k> f(b + k·i1 + i2)          (k | n)

* :data:`SPLIT_LOOP` — a traversal iterator: the scope becomes a nested stage over the split
  iterators, read back through ``((i - b) // k, (i - b) % k)``::

      L<i:b:b+n> {f(i)}  =  L<i:b:b+n> { (L<i1:0:n/k, i2:0:k> {f(b + k·i1 + i2)})[(i-b)//k, (i-b)%k] }

* :data:`SPLIT_SUM_PADDED` — a summation iterator whose range ``k`` does not divide: the range is
  first relaxed to the next multiple of ``k`` (boundary relaxing, zero padding) then split.

Factors come from :func:`split_factors` (divisors of the range that are small or are strides of
the scope's own indices), never from shapes.
"""

from __future__ import annotations

from typing import Iterator

from ...ir.nodes import BinOp, Const, IterVar, Scope, substitute
from .base import (
    Rewrite,
    Rule,
    RuleContext,
    compound_vars,
    fresh_vars,
    index_strides,
    iter_names,
    relax_factors,
    replace_iter,
    split_factors,
)
from .boundary import relax_sum_range


def _split_sum(scope: Scope, ctx: RuleContext) -> Iterator[Rewrite]:
    compound = compound_vars(scope)
    for iv in scope.reduce:
        if iv.var in compound:
            yield from _split_sum_by(scope, iv, split_factors(iv.extent, scope, ctx))


def _split_sum_by(scope: Scope, iv: IterVar, ks) -> Iterator[Rewrite]:
    for k in ks:
        i1, i2 = fresh_vars(iter_names(scope), 2)
        n = iv.extent
        value = BinOp("+", BinOp("*", Const(k), i1), i2)
        if iv.begin:
            value = BinOp("+", value, Const(iv.begin))
        reduce = replace_iter(scope.reduce, iv.var, (IterVar(i1, 0, n // k), IterVar(i2, 0, k)))
        body = substitute(scope.body, {iv.var: value})
        yield Rewrite(
            scope.replace(reduce=reduce, body=body),
            f"split Σ {iv.var.name} -> {k}*{i1.name} + {i2.name}",
        )


def _split_loop(scope: Scope, ctx: RuleContext) -> Iterator[Rewrite]:
    compound = compound_vars(scope)
    strides = index_strides(scope)
    for pos, iv in enumerate(scope.loops):
        if iv.var not in compound:
            continue
        for k in split_factors(iv.extent, scope, ctx):
            if k not in strides and ctx.split_factors is None:
                continue  # a traversal split only pays when it lines up with a stride
            i1, i2 = fresh_vars(iter_names(scope), 2)
            value = BinOp("+", BinOp("*", Const(k), i1), i2)
            if iv.begin:
                value = BinOp("+", value, Const(iv.begin))
            loops = replace_iter(
                scope.loops, iv.var, (IterVar(i1, 0, iv.extent // k), IterVar(i2, 0, k)))
            inner = Scope(loops, scope.reduce, substitute(scope.body, {iv.var: value}),
                          reducer=scope.reducer)
            rel = iv.var if not iv.begin else BinOp("-", iv.var, Const(iv.begin))
            idx = [lv.var for lv in scope.loops]
            idx[pos:pos + 1] = [BinOp("//", rel, Const(k)), BinOp("%", rel, Const(k))]
            outer = Scope(scope.loops, (), inner[tuple(idx)], pad=scope.pad)
            yield Rewrite(outer, f"split L {iv.var.name} -> {k}*{i1.name} + {i2.name}")


def _split_sum_padded(scope: Scope, ctx: RuleContext) -> Iterator[Rewrite]:
    if scope.reducer != "sum":
        return
    compound = compound_vars(scope)
    for iv in scope.reduce:
        if iv.var not in compound:
            continue
        for k in relax_factors(iv.extent, scope, ctx):
            new_end = iv.begin + -(-iv.extent // k) * k
            relaxed = relax_sum_range(scope, iv.var, new_end)
            if relaxed is None:
                continue
            riv = relaxed.iter_range(iv.var)
            for rw in _split_sum_by(relaxed, riv, (k,)):
                yield Rewrite(rw.scope, f"relax Σ {iv.var.name} to [{iv.begin}, {new_end}); "
                              + rw.note)


SPLIT_SUM = Rule(
    "split_sum", "split",
    "Σ<i:b:b+n> f(i) = Σ<i1:0:n/k, i2:0:k> f(b + k*i1 + i2), k | n",
    _split_sum,
    max_per_path=2,
)
SPLIT_LOOP = Rule(
    "split_loop", "split",
    "L<i:b:b+n> f(i) = L<i> { (L<i1:0:n/k, i2:0:k> f(b + k*i1 + i2))[(i-b)//k, (i-b)%k] }, k | n",
    _split_loop,
    max_per_path=1,
)
SPLIT_SUM_PADDED = Rule(
    "split_sum_padded", "split",
    "Σ<i:b:b+n> f(i) = Σ<i1:0:ceil(n/k), i2:0:k> f0(b + k*i1 + i2), f0 = f on [b,b+n), 0 beyond"
    " (zero padding of the reads that vanish there)",
    _split_sum_padded,
    max_per_path=2,
)

RULES = (SPLIT_SUM, SPLIT_LOOP, SPLIT_SUM_PADDED)
