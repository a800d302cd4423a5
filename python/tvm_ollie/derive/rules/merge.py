"""Variable merging and iterator mapping: change which iterators a scope traverses.

* :data:`MAP_ITERS` (iterator mapping) — two traversal iterators ``x``, ``y`` that an index uses
  as ``c·x + c·s·y`` are re-expressed through ``t = x + s·y`` (``y`` kept); the scope becomes a
  nested stage over ``(t, y)`` read back at ``(x + s·y, y)``::

      L<x, y> {f(x, y)}  =  L<x, y> { (L<t, y> {f(t - s·y, y)})[x + s·y, y] }

  The new stage also covers ``(t, y)`` pairs whose ``x`` lies outside its range; they are never
  read, but their reads must stay in bounds (checked; otherwise the rule refuses).

* :data:`FUSE_ITERS` (variable merging) — two iterators that an index uses as ``c·x ± c·n_x·y``
  (``n_x`` the extent of ``x``) become one, ``z`` with ``x = b_x + z % n_x`` and
  ``y = b_y + z // n_x`` (or ``e_y - 1 - z // n_x`` for the minus sign). Summation iterators are
  substituted directly; traversal iterators go through a nested stage read at
  ``(x - b_x) + n_x·(y - b_y)``.
"""

from __future__ import annotations

from typing import Iterator, List, Set, Tuple

from ...ir.nodes import BinOp, Const, IterVar, Scope, Var, substitute
from ..canon import normalize_indices
from .base import (
    Rewrite,
    Rule,
    RuleContext,
    body_accesses,
    fresh_vars,
    in_bounds,
    iter_names,
    linear_form,
)


def _index_pairs(scope: Scope) -> List[Tuple[Var, int, Var, int]]:
    """``(x, cx, y, cy)`` for every ordered pair of iterators sharing a linear index."""
    cache = scope._cache  # pylint: disable=protected-access
    if "pairs" in cache:
        return cache["pairs"]
    seen: Set[Tuple] = set()
    out = []
    for acc in body_accesses(scope.body):
        for idx in acc.indices:
            lin = linear_form(idx)
            if lin is None:
                continue
            items = sorted(lin[0].items(), key=lambda vc: vc[0].name)
            for x, cx in items:
                for y, cy in items:
                    if x is not y and (x, cx, y, cy) not in seen:
                        seen.add((x, cx, y, cy))
                        out.append((x, cx, y, cy))
    cache["pairs"] = out
    return out


def _map_iters(scope: Scope, ctx: RuleContext) -> Iterator[Rewrite]:  # pylint: disable=unused-argument
    for _, _, _, rw in map_iters_with_pairs(scope):
        yield rw


def map_iters_with_pairs(scope: Scope) -> List[Tuple[Var, Var, Var, Rewrite]]:
    """:data:`MAP_ITERS`'s rewrites of ``scope``, each with its ``(x, y, t)`` (t = x + s*y).

    Cached on the scope (the guided rule chains mappings and needs to know which iterators
    each one merged).
    """
    cache = scope._cache  # pylint: disable=protected-access
    hit = cache.get("map_iters")
    if hit is None:
        hit = list(_map_iters_pairs(scope))
        cache["map_iters"] = hit
    return hit


def _map_iters_pairs(scope: Scope) -> Iterator[Tuple[Var, Var, Var, Rewrite]]:
    loops = {iv.var: iv for iv in scope.loops}
    done = set()
    for x, cx, y, cy in _index_pairs(scope):
        if x not in loops or y not in loops or cy % cx:
            continue
        s = cy // cx
        if (x, y, s) in done:
            continue
        done.add((x, y, s))
        ix, iy = loops[x], loops[y]
        t = fresh_vars(iter_names(scope), 1)[0]
        lo = ix.begin + min(s * iy.begin, s * (iy.end - 1))
        hi = ix.end - 1 + max(s * iy.begin, s * (iy.end - 1))
        new_loops = tuple(IterVar(t, lo, hi + 1) if iv is ix else iv for iv in scope.loops)
        body = substitute(scope.body, {x: BinOp("-", t, _times(s, y))})
        inner = Scope(new_loops, scope.reduce, body, reducer=scope.reducer)
        inner = _normalized(inner)
        if not in_bounds(inner):
            continue
        idx = tuple(BinOp("+", iv.var, _times(s, y)) if iv is ix else iv.var
                    for iv in scope.loops)
        outer = Scope(scope.loops, (), inner[idx], pad=scope.pad)
        yield x, y, t, Rewrite(outer, f"map [{x.name}, {y.name}] -> {t.name} = {x.name} + {s}*{y.name}")


def _fuse_iters(scope: Scope, ctx: RuleContext) -> Iterator[Rewrite]:  # pylint: disable=unused-argument
    loops = {iv.var: iv for iv in scope.loops}
    reds = {iv.var: iv for iv in scope.reduce}
    done = set()
    for x, cx, y, cy in _index_pairs(scope):
        both_loops = x in loops and y in loops
        both_reds = x in reds and y in reds
        if not (both_loops or both_reds):
            continue
        table = loops if both_loops else reds
        ix, iy = table[x], table[y]
        nx = ix.extent
        if abs(cy) != abs(cx) * nx or (x, y) in done:
            continue
        done.add((x, y))
        sign = 1 if cy == cx * nx else -1
        z = fresh_vars(iter_names(scope), 1)[0]
        xv = _plus(BinOp("%", z, Const(nx)), ix.begin)
        q = BinOp("//", z, Const(nx))
        yv = _plus(q, iy.begin) if sign > 0 else BinOp("-", Const(iy.end - 1), q)
        body = substitute(scope.body, {x: xv, y: yv})
        zv = IterVar(z, 0, nx * iy.extent)
        note = (f"fuse [{x.name}, {y.name}] -> {z.name}: {x.name} = {_txt(xv)}, "
                f"{y.name} = {_txt(yv)}")
        if both_reds:
            reduce = tuple(zv if iv is ix else iv for iv in scope.reduce if iv is not iy)
            yield Rewrite(scope.replace(reduce=reduce, body=body), note)
            continue
        new_loops = tuple(zv if iv is ix else iv for iv in scope.loops if iv is not iy)
        inner = Scope(new_loops, scope.reduce, body, reducer=scope.reducer)
        rel_y = _plus(y, -iy.begin) if sign > 0 else BinOp("-", Const(iy.end - 1), y)
        zval = BinOp("+", _plus(x, -ix.begin), _times(nx, rel_y))
        idx = tuple(zval if iv is ix else iv.var for iv in scope.loops if iv is not iy)
        outer = Scope(scope.loops, (), inner[idx], pad=scope.pad)
        yield Rewrite(outer, note)


def _times(k: int, v):
    return v if k == 1 else BinOp("*", Const(k), v)


def _plus(v, k: int):
    if k == 0:
        return v
    return BinOp("+", v, Const(k)) if k > 0 else BinOp("-", v, Const(-k))


def _txt(node) -> str:
    return str(node)


def _normalized(scope: Scope) -> Scope:
    """Indices rewritten to their linear canonical form (so bound checks see cancellations)."""

    return normalize_indices(scope)


MAP_ITERS = Rule(
    "map_iters", "merge",
    "L<x,y> f(x,y) = L<x,y> { (L<t,y> f(t - s*y, y))[x + s*y, y] }, t = x + s*y",
    _map_iters,
)
FUSE_ITERS = Rule(
    "fuse_iters", "merge",
    "x = b_x + z % n_x, y = b_y + z // n_x (z in [0, n_x*n_y)) when an index uses c*x +- c*n_x*y",
    _fuse_iters,
    max_per_path=2,
)

RULES = (MAP_ITERS, FUSE_ITERS)
