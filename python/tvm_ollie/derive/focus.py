"""The focus driver: which scope a rule rewrites, and how the expression is rebuilt around it.

A derivation state is one expression (a root :class:`Scope` whose body may read nested scopes).
Rules rewrite one scope at a time; this module enumerates the candidate foci (every distinct
scope in the tree, outermost first), substitutes the rewritten scope for the focus wherever it
occurs (nodes are hash-consed, so occurrences are found by identity), and runs the eager rules
to a fixed point.
"""

from __future__ import annotations

from typing import Callable, Dict, Iterator, List, NamedTuple, Optional, Sequence

from ..ir.nodes import Access, BinOp, Call, Node, Scope
from .rules.base import Rule, RuleContext


class Step(NamedTuple):
    """A rule applied to a state: the rule, the rewrite's note, the new whole expression."""

    rule: Rule
    note: str
    expr: Scope
    focus: Scope


def scopes_of(expr: Node) -> List[Scope]:
    """Every distinct scope in ``expr``, outermost first (pre-order, each once)."""
    cache = expr._cache  # pylint: disable=protected-access
    hit = cache.get("scopes")
    if hit is not None:
        return hit
    out: List[Scope] = []
    seen = set()

    def visit(node: Node) -> None:
        if id(node) in seen:
            return
        seen.add(id(node))
        if isinstance(node, Scope):
            out.append(node)
            visit(node.body)
        elif isinstance(node, Access):
            visit(node.source)
            for idx in node.indices:
                visit(idx)
        elif isinstance(node, (BinOp, Call)):
            for child in node.children:
                visit(child)

    visit(expr)
    cache["scopes"] = out
    return out


def is_compute(scope: Scope) -> bool:
    """True when the scope's body multiplies at least two reads (a contraction, not a copy).

    The explorative search focuses on these: the stages that only move or combine data are the
    eOperators left around an instantiated operator, and rewriting them gains nothing.
    """
    cache = scope._cache  # pylint: disable=protected-access
    hit = cache.get("is_compute")
    if hit is None:
        from .rules.base import factors  # pylint: disable=import-outside-toplevel

        hit = sum(isinstance(f, Access) for f in factors(scope.body)) >= 2
        cache["is_compute"] = hit
    return hit


def compute_scopes(expr: Node) -> List[Scope]:
    """The scopes of ``expr`` that :func:`is_compute` accepts, outermost first."""
    return [s for s in scopes_of(expr) if is_compute(s)]


def replace_node(expr: Node, old: Node, new: Node) -> Node:
    """``expr`` with every occurrence of ``old`` (by identity) replaced by ``new``."""
    if old is new:
        return expr
    memo: Dict[int, Node] = {}

    def go(node: Node) -> Node:
        if node is old:
            return new
        key = id(node)
        hit = memo.get(key)
        if hit is not None:
            return hit
        if isinstance(node, Scope):
            body = go(node.body)
            out = node if body is node.body else node.replace(body=body)
        elif isinstance(node, Access):
            src = go(node.source)
            idx = tuple(go(i) for i in node.indices)
            same = src is node.source and all(a is b for a, b in zip(idx, node.indices))
            out = node if same else Access(src, idx)
        elif isinstance(node, BinOp):
            a, b = go(node.a), go(node.b)
            out = node if (a is node.a and b is node.b) else BinOp(node.op, a, b)
        elif isinstance(node, Call):
            args = tuple(go(x) for x in node.args)
            out = node if all(x is y for x, y in zip(args, node.args)) else Call(node.func, args)
        else:
            out = node
        memo[key] = out
        return out

    return go(expr)


def contains(expr: Node, target: Node) -> bool:
    """True when ``target`` (by identity) occurs in ``expr``."""
    if isinstance(target, Scope):
        return any(s is target for s in scopes_of(expr))
    from ..ir.nodes import iter_nodes  # pylint: disable=import-outside-toplevel

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
