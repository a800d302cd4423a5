"""Guided rules: rewrites tried only toward a target operator, kept only when they reach one.

* :data:`MAP_TO_TARGET` (guided iterator mapping) — a chain of one or more iterator mappings
  (:data:`tvm_ollie.derive.rules.merge.MAP_ITERS`, each applied to the contraction stage the
  previous one created) that turns a compute scope into a nested stage matching a target::

      L<x,y> f(x,y) = L<x,y> { (L<t,y> f(t - s*y, y))[x + s*y, y] },  t = x + s*y   (repeated)

  kept only when the innermost stage, normalized (eager rules, canonical form), matches one of
  ``ctx.targets`` (:func:`tvm_ollie.derive.targets.match_scope`) while the focus itself does not
  (a stage that matches already is instantiated as it is). Chains continue past a stage that
  matches: conv5x5 split into 3x3 taps matches conv2d (grouped) after one mapping, and the
  4-filter conv3x3 only after the second. Each mapping is an ordinary equivalence, so the chain
  is one; the guard only decides whether it is worth taking. The
  search applies it at every scope a state has newly created and instantiates the result without
  charging depth (a guided step): an operator whose index form is one mapping (or
  ``ctx.guided_maps`` mappings) away from a target is found where the mapped stage appears,
  instead of one or two explorative levels later (EinNet's conv5x5 -> conv3x3 needs two).
"""

from __future__ import annotations

from typing import Iterator, List, Tuple

from ...ir.nodes import Access, Scope
from ..canon import canonicalize
from ..focus import apply_eager, compute_scopes, replace_node
from ..targets import match_scope
from .base import Rewrite, Rule, RuleContext
from .merge import map_iters_with_pairs
from .plain import EAGER_RULES


def _contraction(outer: Scope) -> Scope:
    """The stage a mapping created: the scope read by the copy ``outer`` returns."""
    body = outer.body
    if isinstance(body, Access) and isinstance(body.source, Scope):
        return body.source
    raise ValueError("map_iters did not return a copy of a nested stage")


def _chains(scope: Scope, ctx: RuleContext, depth: int,
            after: Tuple[str, ...] = ()) -> Iterator[Tuple[Scope, Scope, str]]:
    """``(rewritten scope, innermost stage, note)`` for every chain of 1..``depth`` mappings.

    Mappings of disjoint iterator pairs commute (both orders give the same stage up to names,
    which the canonical form removes), so such a pair is taken only after the pairs that sort
    before it (``after`` = the previous mapping's ``x``, ``y`` and new ``t`` names; a pair that
    shares one of them is always taken).
    """

    for x, y, t, rw in map_iters_with_pairs(scope):
        names = (x.name, y.name)
        if after and not set(names) & set(after) and names < after[:2]:
            continue  # the same two mappings in the other order are tried from the focus
        inner = _contraction(rw.scope)
        yield rw.scope, inner, rw.note
        if depth > 1:
            for sub, deeper, note in _chains(inner, ctx, depth - 1, names + (t.name,)):
                yield replace_node(rw.scope, inner, sub), deeper, f"{rw.note}; {note}"


def reaches_target(stage: Scope, ctx: RuleContext) -> List:
    """The target matches of ``stage`` in its normal form (cached on the stage node).

    The stage as it is is matched first, a cheap pre-filter: a stage that does not match raw is
    rejected without normalizing (on the benchmark cases every stage that matched after
    normalization also matched raw; tightening and renaming narrow ranges, they do not create
    the product-of-two-reads structure the matcher needs).
    """
    cache = stage._cache  # pylint: disable=protected-access
    key = ("reaches_target", ctx.targets)
    hit = cache.get(key)
    if hit is None:
        hit = []
        if match_scope(stage, ctx.targets):
            normal = canonicalize(apply_eager(stage, EAGER_RULES, ctx))
            hit = [m for s in compute_scopes(normal) for m in match_scope(s, ctx.targets)]
        cache[key] = hit
    return hit


def _map_to_target(scope: Scope, ctx: RuleContext) -> Iterator[Rewrite]:
    if not ctx.targets or ctx.guided_maps < 1 or reaches_target(scope, ctx):
        return
    seen = set()  # the nodes themselves (interned), not ids: a dropped one may free its id
    for new, inner, note in _chains(scope, ctx, ctx.guided_maps):
        if new in seen:
            continue
        seen.add(new)
        if reaches_target(inner, ctx):
            yield Rewrite(new, f"guided {note}")


MAP_TO_TARGET = Rule(
    "map_to_target", "guided",
    "L<x,y> f(x,y) = L<x,y> { (L<t,y> f(t - s*y, y))[x + s*y, y] } (t = x + s*y, chained up to "
    "ctx.guided_maps times), taken only when the innermost stage matches a target",
    _map_to_target,
    costs_depth=False,
    guided=True,
)

RULES = (MAP_TO_TARGET,)
