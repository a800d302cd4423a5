"""The focus driver: which scope a rule rewrites, and how the expression is rebuilt around it.

A derivation state is one expression (a root :class:`Scope` whose body may read nested scopes).
Rules rewrite one scope at a time; this module enumerates the candidate foci (every distinct
scope in the tree, outermost first), substitutes the rewritten scope for the focus wherever it
occurs (nodes are hash-consed, so occurrences are found by identity), and runs the eager rules
to a fixed point.
"""

from __future__ import annotations

from typing import Callable, Dict, Iterator, List, NamedTuple, Optional, Sequence, Tuple

from ..ir.index import factors
from ..ir.nodes import Access, BinOp, Call, Node, Scope, is_index, iter_nodes
from .rule import Rule, RuleContext


class Step(NamedTuple):
    """A rule applied to a state: the rule, the rewrite's note, the new whole expression."""

    rule: Rule
    note: str
    expr: Scope
    focus: Scope


def scopes_of(expr: Node) -> List[Scope]:
    """Every distinct scope in ``expr``, outermost first (pre-order, each once).

    Walks the scope graph through :func:`direct_scopes` (cached per scope), so a state whose
    nested scopes are shared with earlier states costs one walk over its own new scopes only.
    """
    cache = expr._cache  # pylint: disable=protected-access
    hit = cache.get("scopes")
    if hit is not None:
        return [expr, *hit] if type(expr) is Scope else list(hit)
    out: List[Scope] = []
    seen = set()
    # depth first, iteratively (a recursive closure would be a reference cycle per call)
    for root in (expr,) if isinstance(expr, Scope) else _body_scopes(expr):
        if id(root) in seen:
            continue
        seen.add(id(root))
        out.append(root)
        stack = [iter(direct_scopes(root))]
        while stack:
            child = next(stack[-1], None)
            if child is None:
                stack.pop()
            elif id(child) not in seen:
                seen.add(id(child))
                out.append(child)
                stack.append(iter(direct_scopes(child)))
    # a scope's own entry leaves the scope out: a node holding itself is a reference cycle,
    # which refcounting never frees (the cyclic GC must find it, a large cost in a search)
    cache["scopes"] = tuple(out[1:]) if type(expr) is Scope else tuple(out)
    return out


def scope_ids(expr: Node) -> frozenset:
    """``id`` of every scope in ``expr`` (cached; for "is this scope new here?" tests)."""
    cache = expr._cache  # pylint: disable=protected-access
    hit = cache.get("scope_ids")
    if hit is None:
        hit = frozenset(id(s) for s in scopes_of(expr))
        cache["scope_ids"] = hit
    return hit


def direct_scopes(scope: Scope) -> Tuple[Scope, ...]:
    """The scopes read directly by ``scope``'s body (not entering them), in pre-order, once."""
    cache = scope._cache  # pylint: disable=protected-access
    hit = cache.get("direct_scopes")
    if hit is None:
        hit = _body_scopes(scope.body)
        cache["direct_scopes"] = hit
    return hit


def _body_scopes(body: Node) -> Tuple[Scope, ...]:
    out: List[Scope] = []
    seen = set()
    stack = [body]
    while stack:
        cur = stack.pop()
        kind = type(cur)
        if kind is Access:
            src = cur.source
            if type(src) is Scope and id(src) not in seen:
                seen.add(id(src))
                out.append(src)
            stack.extend(reversed(cur.indices))
        elif kind is BinOp:
            if not is_index(cur):  # index arithmetic reads nothing
                stack.append(cur.b)
                stack.append(cur.a)
        elif kind is Call:
            stack.extend(reversed(cur.args))
        elif kind is Scope and id(cur) not in seen:
            seen.add(id(cur))
            out.append(cur)
    return tuple(out)


def is_compute(scope: Scope) -> bool:
    """True when the scope's body multiplies at least two reads (a contraction, not a copy).

    The explorative search focuses on these: the stages that only move or combine data are the
    eOperators left around an instantiated operator, and rewriting them gains nothing.
    """
    cache = scope._cache  # pylint: disable=protected-access
    hit = cache.get("is_compute")
    if hit is None:
        hit = sum(isinstance(f, Access) for f in factors(scope.body)) >= 2
        cache["is_compute"] = hit
    return hit


def compute_scopes(expr: Node) -> List[Scope]:
    """The scopes of ``expr`` that :func:`is_compute` accepts, outermost first."""
    return [s for s in scopes_of(expr) if is_compute(s)]


def replace_node(expr: Node, old: Node, new: Node) -> Node:
    """``expr`` with every occurrence of ``old`` (by identity) replaced by ``new``.

    When ``old`` is a scope, only the scopes that contain it are rebuilt (the others are shared
    unchanged, found through the cached scope sets).
    """
    if old is new:
        return expr
    memo: Dict[int, Node] = {}
    old_id = id(old)
    prune = isinstance(old, Scope)

    def go(node: Node) -> Node:
        if node is old:
            return new
        key = id(node)
        hit = memo.get(key)
        if hit is not None:
            return hit
        kind = type(node)
        if kind is Scope:
            if prune and old_id not in scope_ids(node):
                out = node
            else:
                body = go(node.body)
                out = node if body is node.body else node.replace(body=body)
        elif kind is Access:
            src = go(node.source)
            idx = tuple(go(i) for i in node.indices)
            same = src is node.source and all(a is b for a, b in zip(idx, node.indices))
            out = node if same else Access(src, idx)
        elif kind is BinOp:
            if prune and is_index(node):  # index arithmetic holds no scope
                return node
            a, b = go(node.a), go(node.b)
            out = node if (a is node.a and b is node.b) else BinOp(node.op, a, b)
        elif kind is Call:
            args = tuple(go(x) for x in node.args)
            out = node if all(x is y for x, y in zip(args, node.args)) else Call(node.func, args)
        else:
            out = node
        memo[key] = out
        return out

    out = go(expr)
    del go  # the closure refers to itself: unbound, refcounting frees it (no cyclic garbage)
    return out


def contains(expr: Node, target: Node) -> bool:
    """True when ``target`` (by identity) occurs in ``expr``."""
    if isinstance(target, Scope):
        return id(target) in scope_ids(expr)

    return any(n is target for n in iter_nodes(expr))


def apply_rules(
    expr: Scope,
    rules: Sequence[Rule],
    ctx: RuleContext,
    foci: Optional[Sequence[Scope]] = None,
) -> Iterator[Step]:
    """Every one-step rewrite of ``expr``: each rule at each focus scope.

    Yields :class:`Step` with the rebuilt whole expression (eager rules not yet applied).
    """
    for focus in foci if foci is not None else scopes_of(expr):
        for rule in rules:
            for rw in rewrites(rule, focus, ctx):
                yield Step(rule, rw.note, replace_node(expr, focus, rw.scope), focus)


def rewrites(rule: Rule, focus: Scope, ctx: RuleContext) -> List:
    """``rule``'s rewrites of ``focus``, cached on the scope node.

    Rules are pure functions of (scope, context), and a nested scope recurs in many states of a
    search, so each is rewritten once per context.
    """
    cache = focus._cache  # pylint: disable=protected-access
    key = ("rewrites", rule.name, ctx)
    hit = cache.get(key)
    if hit is None:
        hit = [rw for rw in rule.apply(focus, ctx) if rw.scope is not focus]
        cache[key] = hit
    return hit


def apply_eager(
    expr: Scope,
    rules: Sequence[Rule],
    ctx: RuleContext,
    limit: int = 64,
    on_step: Optional[Callable[[Step], None]] = None,
) -> Scope:
    """Apply eager rules (first rewrite each time) until none applies (or ``limit`` steps)."""
    for _ in range(limit):
        step = next(apply_rules(expr, rules, ctx), None)
        if step is None:
            return expr
        if on_step is not None:
            on_step(step)
        expr = step.expr
    return expr
