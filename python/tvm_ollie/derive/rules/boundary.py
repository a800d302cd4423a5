"""Boundary rules: shrink ranges to where data is, or grow them over zero padding.

* :data:`TIGHTEN` (boundary tightening) — when the body is a product and one factor reads a
  zero-padded source at an index ``a·v + rest``, values of ``v`` for which that index can never
  reach the data region contribute 0. Traversal ranges are cut to the rest and the cut is recorded
  as output padding (reads there give 0, as before); summation ranges are simply cut::

      L<v:b:e> pad[lo,hi] {f}  =  L<v:b':e'> pad[lo + b'-b, hi + e-e'] {f}    (f = 0 off [b', e'))

* :data:`RELAX_SUM` (boundary relaxing) — a summation range is enlarged when, on the added values,
  some factor reads only zero padding; every read is given the padding it needs to stay in
  bounds (its value there is multiplied by that zero)::

      Σ<v:b:e> f  =  Σ<v:b:e+d> f'     (f' = f with sources padded; one factor is 0 on [e, e+d))

The amounts relaxed are the ones that make a split divide evenly (see ``relax_factors``).
"""

from __future__ import annotations

from typing import Dict, Iterator, Optional, Tuple

from ...ir.nodes import Access, IterVar, Node, Scope, Var, substitute
from .base import (
    Rewrite,
    Rule,
    RuleContext,
    body_accesses,
    data_bounds,
    factors,
    interval,
    linear_form,
    padded_bounds,
    relax_factors,
    scope_ranges,
    widen_pad,
    zero_padded,
)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def feasible_range(scope: Scope, var: Var) -> Tuple[int, int]:
    """Inclusive range of ``var`` outside which some factor of the body reads only padding zeros.

    Sound over-approximation of where the body can be non-zero; the full range when nothing is
    known.
    """
    return feasible_ranges(scope)[var]


def feasible_ranges(scope: Scope) -> Dict[Var, Tuple[int, int]]:
    """:func:`feasible_range` of every iterator of ``scope`` (one pass over the body, cached).

    Each bound is derived from the iterators' ORIGINAL ranges (not from bounds tightened in the
    same pass), so every iterator's answer is the same as when asked alone.
    """
    cache = scope._cache  # pylint: disable=protected-access
    hit = cache.get("feasible")
    if hit is not None:
        return hit
    ranges = scope_ranges(scope)
    out = {v: (r[0], r[1] - 1) for v, r in ranges.items()}
    for fac in factors(scope.body):
        if not isinstance(fac, Access) or not zero_padded(fac.source):
            continue
        for idx, (dlo, dhi) in zip(fac.indices, data_bounds(fac.source)):
            lin = linear_form(idx)
            if lin is None:
                continue
            coeffs, const = lin
            lo_all = hi_all = const
            spans = []
            for v, c in coeffs.items():
                r = ranges.get(v)
                if r is None:
                    spans = None
                    break
                a, b = c * r[0], c * (r[1] - 1)
                spans.append((v, c, min(a, b), max(a, b)))
                lo_all += min(a, b)
                hi_all += max(a, b)
            if not spans:
                continue
            for v, a, vmin, vmax in spans:
                rest = (lo_all - vmin, hi_all - vmax)
                low, high = dlo - rest[1], dhi - rest[0]  # a*v must lie in [low, high]
                if a > 0:
                    vlo, vhi = _ceil_div(low, a), high // a
                else:
                    vlo, vhi = _ceil_div(high, a), low // a
                cur = out[v]
                out[v] = (max(cur[0], vlo), min(cur[1], vhi))
    cache["feasible"] = out
    return out


def _tighten(scope: Scope, ctx: RuleContext) -> Iterator[Rewrite]:  # pylint: disable=unused-argument
    feasible = feasible_ranges(scope)
    loops, pad, notes = [], [], []
    for iv, (plo, phi) in zip(scope.loops, scope.pad):
        lo, hi = feasible[iv.var]
        if lo > hi or (lo, hi + 1) == (iv.begin, iv.end):
            loops.append(iv)
            pad.append((plo, phi))
            continue
        loops.append(IterVar(iv.var, lo, hi + 1))
        pad.append((plo + lo - iv.begin, phi + iv.end - hi - 1))
        notes.append(f"{iv.var.name} [{iv.begin},{iv.end}) -> [{lo},{hi + 1})")
    reduce = []
    if scope.reducer == "sum":
        for iv in scope.reduce:
            lo, hi = feasible[iv.var]
            if lo > hi or (lo, hi + 1) == (iv.begin, iv.end):
                reduce.append(iv)
                continue
            reduce.append(IterVar(iv.var, lo, hi + 1))
            notes.append(f"Σ {iv.var.name} [{iv.begin},{iv.end}) -> [{lo},{hi + 1})")
    else:
        reduce = list(scope.reduce)
    if notes:
        yield Rewrite(scope.replace(loops=tuple(loops), reduce=tuple(reduce), pad=tuple(pad)),
                      "tighten " + ", ".join(notes))


def relax_sum_range(scope: Scope, var: Var, new_end: int) -> Optional[Scope]:
    """``scope`` with summation iterator ``var`` running to ``new_end``, or None if not provable.

    Needs a sum reducer, a body that is a product of reads (and index/constant factors), and one
    read that sees only zero padding when ``var`` is in the added range.
    """
    if scope.reducer != "sum":
        return None
    iv = scope.iter_range(var)
    if iv not in scope.reduce or new_end <= iv.end:
        return None
    facs = factors(scope.body)
    if not all(isinstance(f, Access) or not body_accesses(f) for f in facs):
        return None
    ranges = dict(scope_ranges(scope))
    added = dict(ranges)
    added[var] = (iv.end, new_end)
    zero = False
    for fac in facs:
        if isinstance(fac, Access) and zero_padded(fac.source):
            for idx, (dlo, dhi) in zip(fac.indices, data_bounds(fac.source)):
                r = interval(idx, added)
                if r is not None and (r[1] < dlo or r[0] > dhi):
                    zero = True
    if not zero:
        return None
    ranges[var] = (iv.begin, new_end)
    mapping: Dict[Node, Node] = {}
    for acc in body_accesses(scope.body):
        needed = []
        for idx in acc.indices:
            r = interval(idx, ranges)
            if r is None:
                return None
            needed.append(r)
        src = widen_pad(acc.source, needed)
        if src is None:
            return None
        if src is not acc.source:
            mapping[acc] = Access(src, acc.indices)
    body = substitute(scope.body, mapping)
    reduce = tuple(IterVar(var, iv.begin, new_end) if r is iv else r for r in scope.reduce)
    return scope.replace(reduce=reduce, body=body)


def _relax_sum(scope: Scope, ctx: RuleContext) -> Iterator[Rewrite]:
    for iv in scope.reduce:
        amounts = sorted({-iv.extent % k for k in relax_factors(iv.extent, scope, ctx)})
        for d in amounts:
            new = relax_sum_range(scope, iv.var, iv.end + d)
            if new is not None:
                yield Rewrite(new, f"relax Σ {iv.var.name} [{iv.begin},{iv.end}) -> "
                                   f"[{iv.begin},{iv.end + d})")


TIGHTEN = Rule(
    "tighten", "boundary",
    "L<v:b:e> pad[lo,hi] {f} = L<v:b':e'> pad[lo+b'-b, hi+e-e'] {f}, f = 0 for v outside [b',e')",
    _tighten,
    costs_depth=False,
)
RELAX_SUM = Rule(
    "relax_sum", "boundary",
    "Σ<v:b:e> f = Σ<v:b:e+d> f', some factor of f reads only zero padding for v in [e, e+d)",
    _relax_sum,
)

RULES = (TIGHTEN, RELAX_SUM)
