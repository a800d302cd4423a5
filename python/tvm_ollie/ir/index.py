"""Index analyses of expressions: linear forms, interval bounds, product factors.

Matching (:mod:`tvm_ollie.derive.match`), the search driver and every rule's guards ask these
questions of index expressions; they live with the IR so that no layer imports the rules from
below. They are deliberately local and conservative: a linear form of an index
(``Σ coeff·var + const``; ``None`` when ``//``, ``%``, reads or floats appear) and integer
interval bounds. A guard that cannot prove its side condition refuses the rewrite; it never
guesses.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

from .nodes import BinOp, Const, Node, Scope, Var

__all__ = ["Ranges", "linear_form", "build_linear", "interval", "scope_ranges", "factors"]

Ranges = Dict[Var, Tuple[int, int]]  # var -> half-open (begin, end)


def linear_form(node: Node) -> Optional[Tuple[Dict[Var, int], int]]:
    """``({var: coeff}, const)`` when ``node`` is linear integer arithmetic of iterators.

    Returns None for anything else (``//``, ``%``, reads, floats): callers then skip the guard
    that needed it, which only ever makes a rule apply less often.
    """
    cache = node._cache  # pylint: disable=protected-access
    if "linear" in cache:
        return cache["linear"]
    out = _linear(node)
    cache["linear"] = out
    return out


def _linear(node: Node):
    if isinstance(node, Var):
        return {node: 1}, 0
    if isinstance(node, Const):
        return ({}, node.value) if node.dtype.startswith("int") else None
    if isinstance(node, BinOp) and node.op in ("+", "-", "*"):
        a, b = linear_form(node.a), linear_form(node.b)
        if a is None or b is None:
            return None
        if node.op == "*":
            if not a[0]:
                a, b = b, a
            if b[0]:
                return None  # product of two iterators: not linear
            k = b[1]
            return {v: c * k for v, c in a[0].items() if c * k}, a[1] * k
        sign = 1 if node.op == "+" else -1
        coeffs = dict(a[0])
        for v, c in b[0].items():
            coeffs[v] = coeffs.get(v, 0) + sign * c
        return {v: c for v, c in coeffs.items() if c}, a[1] + sign * b[1]
    return None


def build_linear(coeffs: Dict[Var, int], const: int, order: Sequence[Var] = ()) -> Node:
    """The canonical node of ``Σ coeff·var + const`` (vars in ``order``, then by name)."""
    rank = {v: i for i, v in enumerate(order)}
    terms = sorted(coeffs.items(), key=lambda vc: (rank.get(vc[0], len(rank)), vc[0].name))
    out: Optional[Node] = None
    for var, c in terms:
        if c == 0:
            continue
        term = var if c == 1 else (BinOp("*", Const(c), var))
        if out is None:
            out = term if c != -1 else BinOp("*", Const(-1), var)
        elif c < 0:
            out = BinOp("-", out, var if c == -1 else BinOp("*", Const(-c), var))
        else:
            out = BinOp("+", out, term)
    if out is None:
        return Const(const)
    if const > 0:
        out = BinOp("+", out, Const(const))
    elif const < 0:
        out = BinOp("-", out, Const(-const))
    return out


def interval(node: Node, ranges: Ranges) -> Optional[Tuple[int, int]]:
    """Inclusive integer bounds of an index expression (None when not index arithmetic)."""
    if isinstance(node, Var):
        r = ranges.get(node)
        return None if r is None else (r[0], r[1] - 1)
    if isinstance(node, Const):
        return (node.value, node.value) if node.dtype.startswith("int") else None
    if not isinstance(node, BinOp):
        return None
    lin = linear_form(node)
    if lin is not None:
        lo = hi = lin[1]
        for v, c in lin[0].items():
            r = ranges.get(v)
            if r is None:
                return None
            a, b = c * r[0], c * (r[1] - 1)
            lo += min(a, b)
            hi += max(a, b)
        return lo, hi
    a = interval(node.a, ranges)
    b = interval(node.b, ranges)
    if a is None or b is None:
        return None
    op = node.op
    if op == "+":
        return a[0] + b[0], a[1] + b[1]
    if op == "-":
        return a[0] - b[1], a[1] - b[0]
    if op == "*":
        prods = [x * y for x in a for y in b]
        return min(prods), max(prods)
    if op in ("//", "%") and b[0] == b[1] and b[0] > 0:
        k = b[0]
        if op == "//":
            return a[0] // k, a[1] // k
        if a[0] // k == a[1] // k:
            return a[0] % k, a[1] % k
        return 0, k - 1
    return None


def scope_ranges(scope: Scope) -> Ranges:
    """Iterator ranges of a scope (loops and reductions)."""
    cache = scope._cache  # pylint: disable=protected-access
    if "ranges" not in cache:
        cache["ranges"] = {iv.var: (iv.begin, iv.end) for iv in scope.loops + scope.reduce}
    return cache["ranges"]


def factors(body: Node) -> List[Node]:
    """The factors of a product chain (``a * b * c`` -> ``[a, b, c]``)."""
    if isinstance(body, BinOp) and body.op == "*" and not _is_int(body):
        return factors(body.a) + factors(body.b)
    return [body]


def _is_int(node: Node) -> bool:
    return isinstance(node, (Var,)) or (isinstance(node, Const) and node.dtype.startswith("int"))
