"""Stage rules: split a summation into nested stages, or merge stages back.

* :data:`SPLIT_STAGE` (summation splitting) — some summation iterators ``P`` move outward; the
  rest are summed in a new nested stage that keeps ``P`` as traversal iterators::

      L<l> Σ<P, Q> {f}  =  L<l> Σ<P> { (L<P, l> Σ<Q> {f})[P, l] }

  ``P`` never holds a plain contraction iterator (one that every read it occurs in, at least
  two, indexes alone, like the channel ``c`` of a convolution): moving it out only turns the
  contraction into a batch of outer products summed by an eOperator, which no target wants,
  and it multiplies the states of a search (``2^n - 2`` subsets become ``2^(n-1) - 2``).

* :data:`MERGE_STAGE` (stage merging, eager: costs no depth) — a read of a nested stage that only
  moves data out of another stage (``W = L<w> {X[ψ(w)]}``, ``X`` a scope, no summation) is
  replaced by the read it stands for::

      W[idx]  ->  X[ψ(idx)]

  (A stage that moves data out of an input TENSOR is a data-layout stage made on purpose by
  :mod:`.layout`; it is kept, unless it is a plain transposed copy ``L<w> {X[π(w)]}`` of the whole
  tensor, as a lifted ``permute_dims`` feeding an operator is: that carries no layout the
  operators could not read directly, and inlining it is what lets them match the transpose.)

  When the reader can reach ``W``'s zero margins, the merge is kept only if ``X`` reads zero
  padding there as well (some index of ``ψ`` leaves ``X``'s data on that margin); ``X``'s own
  padding is grown so the merged read stays in bounds.

* :data:`MERGE_STAGE_SUM` (stage merging with a summation) — a stage whose body is just a read of a
  summing stage takes the summation over::

      L<l> Σ<P> { (L<w> Σ<Q> {f(w, Q)})[idx] }  =  L<l> Σ<P, Q'> {f(idx, Q')}

  (same reducer on both sides, no margin of the inner stage read).
"""

from __future__ import annotations

from itertools import combinations
from typing import Dict, FrozenSet, Iterator, Optional

from ...ir.nodes import Access, IterVar, Node, Scope, Tensor, Var, free_vars, substitute
from .base import (
    Rewrite,
    Rule,
    RuleContext,
    body_accesses,
    data_bounds,
    fresh_vars,
    interval,
    iter_names,
    linear_form,
    scope_ranges,
    widen_pad,
    zero_padded,
)


def plain_contractions(scope: Scope) -> FrozenSet[Var]:
    """Summation iterators that index a dimension alone in every read they occur in (>= 2)."""
    uses: Dict[Var, int] = {}
    mixed = set()
    for acc in body_accesses(scope.body):
        seen = set()
        for idx in acc.indices:
            lin = linear_form(idx)
            if lin is None:
                mixed.update(v for v in free_vars(idx) if isinstance(v, Var))
                continue
            if len(lin[0]) == 1:
                (v, c), = lin[0].items()
                if abs(c) == 1:
                    seen.add(v)
                    continue
            mixed.update(lin[0])
        for v in seen:
            uses[v] = uses.get(v, 0) + 1
    red = {iv.var for iv in scope.reduce}
    return frozenset(v for v, n in uses.items() if n >= 2 and v in red and v not in mixed)


def _split_stage(scope: Scope, ctx: RuleContext) -> Iterator[Rewrite]:  # pylint: disable=unused-argument
    red = scope.reduce
    if len(red) < 2:
        return
    plain = plain_contractions(scope)
    for size in range(1, len(red)):
        for outer_set in combinations(red, size):
            if any(iv.var in plain for iv in outer_set):
                continue
            rest = tuple(iv for iv in red if iv not in outer_set)
            inner = Scope(outer_set + scope.loops, rest, scope.body, reducer=scope.reducer)
            idx = tuple(iv.var for iv in outer_set + scope.loops)
            outer = Scope(scope.loops, outer_set, inner[idx], pad=scope.pad,
                          reducer=scope.reducer)
            names = ", ".join(iv.var.name for iv in outer_set)
            yield Rewrite(outer, f"split stage: outer Σ<{names}>")


def _margins_read(acc: Access, w: Scope, ranges) -> Optional[list]:
    """Per dimension of ``w``: the (lo, hi) inclusive margin ranges the reader may hit.

    None when a bound cannot be computed.
    """
    out = []
    for iv, (lo, hi), idx in zip(w.loops, w.pad, acc.indices):
        if not lo and not hi:
            out.append(())
            continue
        r = interval(idx, ranges)
        if r is None:
            return None
        sides = []
        if r[0] < iv.begin:
            sides.append((max(r[0], iv.begin - lo), iv.begin - 1))
        if r[1] >= iv.end:
            sides.append((iv.end, min(r[1], iv.end + hi - 1)))
        out.append(tuple(sides))
    return out


def inline_access(acc: Access, ranges) -> Optional[Access]:
    """``W[idx]`` with ``W = L<w> {X[ψ]}`` rewritten as ``X[ψ(idx)]``, or None if not provable."""
    w = acc.source
    if not isinstance(w, Scope) or w.reduce or not isinstance(w.body, Access):
        return None
    inner = w.body
    src = inner.source
    if not isinstance(src, Scope) and not _is_transposed_copy(w):
        return None  # a stage over an input tensor is a data-layout stage: it stays
    margins = _margins_read(acc, w, ranges)
    if margins is None:
        return None
    if any(margins):
        if not zero_padded(src):
            return None
        padded = {iv.var: (iv.begin - lo, iv.end + hi) for iv, (lo, hi) in zip(w.loops, w.pad)}
        bounds = data_bounds(src)
        for iv, sides in zip(w.loops, margins):
            for side in sides:
                sub = dict(padded)
                sub[iv.var] = (side[0], side[1] + 1)
                if not any(_outside(interval(p, sub), b) for p, b in zip(inner.indices, bounds)):
                    return None
    mapping = {iv.var: idx for iv, idx in zip(w.loops, acc.indices)}
    new_idx = tuple(substitute(p, mapping) for p in inner.indices)
    needed = []
    for p in new_idx:
        r = interval(p, ranges)
        if r is None:
            return None
        needed.append(r)
    src2 = widen_pad(src, needed)
    if src2 is None:
        return None
    return Access(src2, new_idx)


def _is_transposed_copy(w: Scope) -> bool:
    """True when ``w = L<w> {X[π(w)]}`` copies a whole tensor ``X`` (no padding, ``π`` a
    permutation of the loop iterators, each loop spanning its dimension)."""
    inner = w.body
    if not isinstance(inner.source, Tensor) or any(lo or hi for lo, hi in w.pad):
        return False
    loops = {iv.var: iv for iv in w.loops}
    if len(inner.indices) != len(loops) or len(set(inner.indices)) != len(loops):
        return False
    for idx, size in zip(inner.indices, inner.source.shape):
        iv = loops.get(idx)
        if iv is None or iv.begin != 0 or iv.end != size:
            return False
    return True


def _outside(r, bounds) -> bool:
    return r is not None and (r[1] < bounds[0] or r[0] > bounds[1])


def _merge_stage(scope: Scope, ctx: RuleContext) -> Iterator[Rewrite]:  # pylint: disable=unused-argument
    ranges = scope_ranges(scope)
    mapping: Dict[Node, Node] = {}
    for acc in body_accesses(scope.body):
        new = inline_access(acc, ranges)
        if new is not None:
            mapping[acc] = new
    if mapping:
        yield Rewrite(scope.replace(body=substitute(scope.body, mapping)),
                      f"merge stages ({len(mapping)} read(s) inlined)")


def _merge_stage_sum(scope: Scope, ctx: RuleContext) -> Iterator[Rewrite]:  # pylint: disable=unused-argument
    acc = scope.body
    if not isinstance(acc, Access) or not isinstance(acc.source, Scope):
        return
    w = acc.source
    if not w.reduce or (scope.reduce and scope.reducer != w.reducer):
        return
    ranges = scope_ranges(scope)
    margins = _margins_read(acc, w, ranges)
    if margins is None or any(margins):
        return
    new_vars = fresh_vars(iter_names(scope), len(w.reduce), prefix="k")
    mapping = {iv.var: idx for iv, idx in zip(w.loops, acc.indices)}
    mapping.update({iv.var: v for iv, v in zip(w.reduce, new_vars)})
    body = substitute(w.body, mapping)
    reduce = scope.reduce + tuple(IterVar(v, iv.begin, iv.end) for iv, v in zip(w.reduce, new_vars))
    yield Rewrite(scope.replace(reduce=reduce, body=body, reducer=w.reducer),
                  "merge stages with summation")


SPLIT_STAGE = Rule(
    "split_stage", "stage",
    "L<l> Σ<P,Q> f = L<l> Σ<P> { (L<P,l> Σ<Q> f)[P, l] }",
    _split_stage,
    max_per_path=1,
)
MERGE_STAGE = Rule(
    "merge_stage", "stage",
    "(L<w> X[ψ(w)])[idx] = X[ψ(idx)]",
    _merge_stage,
    costs_depth=False,
)
MERGE_STAGE_SUM = Rule(
    "merge_stage_sum", "stage",
    "L<l> Σ<P> { (L<w> Σ<Q> f(w,Q))[idx] } = L<l> Σ<P,Q> f(idx, Q)",
    _merge_stage_sum,
    max_per_path=1,
)

RULES = (SPLIT_STAGE, MERGE_STAGE, MERGE_STAGE_SUM)
