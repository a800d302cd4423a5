"""Simplification of expressions and interval bounds of index expressions.

:func:`simplify` rewrites every index expression into its affine normal form (see
:mod:`.affine`) using the ranges of the iterators in scope, so that, e.g., ``4*(i//4) + i%4``
becomes ``i``, ``(h + 8) // 8`` becomes ``1`` when ``0 <= h < 8``, and ``(e // a) // b`` becomes
``e // (a*b)``. Body arithmetic on values (float or tensor reads) is left as written except for
trivial identities (``x*1``, ``x+0``, ``x-0``, ``x/1``, ``x*0 -> 0``), comparisons of index
expressions that the ranges decide, and ``select`` on a decided condition. ``x*0 -> 0`` is the
one rewrite that is not exact in IEEE arithmetic (``inf*0`` is ``nan``); everything else keeps
float semantics bit for bit.

The result is canonical for the rules applied and idempotent. Results are cached on the nodes
(per scope, and per index expression and ranges of its iterators), so repeated calls during a
derivation search are dictionary lookups.
"""

from __future__ import annotations

from typing import Dict, Iterable, List, Mapping, Optional, Tuple

from .affine import Affine, affine_bounds, to_affine
from .nodes import (CAST_DTYPES, COMPARE_OPS, SELF, Access, BinOp, Call, Const, Node, Scope, Var,
                    dtype_bits, free_vars, has_weak_dtype, is_cast, is_float_dtype, is_index,
                    iter_nodes, live_nodes, value_dtype)

#: Half-open ranges ``Var -> (begin, end)`` as the public functions take them.
Ranges = Mapping[Var, Tuple[int, int]]
#: Inclusive bounds ``Var -> (lo, hi)`` as the affine module works with them.
Bounds = Dict[Var, Tuple[int, int]]

_CACHE_SCOPE = "simplify"
_CACHE_INDEX = "simplify.index"
_CACHE_FREE = "simplify.free"
_NO_BOUNDS: Bounds = {}
_ZERO = Affine(0)
_MAX_ROUNDS = 16
_BOOLEAN_OPS = frozenset(COMPARE_OPS)


def simplify(node: Node, ranges: Optional[Ranges] = None) -> Node:
    """Simplify ``node``; ``ranges`` gives half-open ``(begin, end)`` of its free iterators.

    A :class:`Scope` is simplified with the ranges of its own iterators (``ranges`` is not
    needed: scopes are closed), nested scopes with theirs. Iterators without a range are treated
    as unbounded: only the range-free identities apply to them.
    """
    if type(node) is Scope:
        return _simplify_scope(node)
    bounds = _inclusive(ranges) if ranges else _NO_BOUNDS
    return _simplify(node, bounds, {})


def index_range(node: Node, ranges: Ranges) -> Tuple[int, int]:
    """Inclusive integer bounds ``(lo, hi)`` of index expression ``node``.

    ``ranges`` maps each free iterator to its half-open ``(begin, end)``. The bounds are exact
    for affine expressions in which every iterator occurs once (``h + r - 1``, ``(h + r) // 2``,
    ``c % 4``): the box corners realize them. When iterators occur in several div/mod atoms, or
    the expression is not affine (``i * j``, ``i // j``), interval arithmetic is applied per
    sub-expression, which is sound but may be wider than the true range.

    Raises
    ------
    ValueError
        When an iterator has no range, or ``node`` is not integer index arithmetic.
    """
    bounds = _inclusive(ranges)
    rng = _node_bounds(node, bounds)
    if rng is None:
        missing = sorted(v.name for v in free_vars(node) if v not in bounds)
        why = f"iterators without a range: {missing}" if missing else "not integer arithmetic"
        raise ValueError(f"cannot bound {node}: {why}")
    return rng


def clear_cache(roots: Optional[Iterable[Node]] = None) -> None:
    """Forget cached simplification results (for tests and benchmarks of cold behaviour): of
    every live node, or of the nodes reachable from ``roots``. (Every live node can be many
    after a derivation search: hundreds of milliseconds a call.)"""
    for node in live_nodes() if roots is None else _reachable(roots):
        cache = node._cache
        cache.pop(_CACHE_SCOPE, None)
        cache.pop(_CACHE_INDEX, None)
        cache.pop(_CACHE_FREE, None)


def _reachable(roots: Iterable[Node]) -> List[Node]:
    return list({id(n): n for root in roots for n in iter_nodes(root)}.values())


# ---------------------------------------------------------------------------------------------


def _inclusive(ranges: Ranges) -> Bounds:
    out: Bounds = {}
    for var, (begin, end) in ranges.items():
        if end <= begin:
            raise ValueError(f"empty range for {var}: [{begin}, {end})")
        out[var] = (int(begin), int(end) - 1)
    return out


def _simplify_scope(scope: Scope) -> Scope:
    cache = scope._cache
    hit = cache.get(_CACHE_SCOPE)
    if hit is not None:
        return scope if hit is SELF else hit
    bounds = {iv.var: (iv.begin, iv.end - 1) for iv in scope.loops + scope.reduce}
    body = _simplify(scope.body, bounds, {})
    out = scope if body is scope.body else scope.replace(body=body)
    cache[_CACHE_SCOPE] = SELF if out is scope else out
    out._cache[_CACHE_SCOPE] = SELF  # simplification is idempotent
    return out


def _is_index(node: Node) -> bool:
    # nodes.is_index builds a closure on every call; read its cached answer first.
    hit = node._cache.get("is_index")
    return is_index(node) if hit is None else hit


def _simplify(node: Node, bounds: Bounds, memo: dict) -> Node:
    # memo is keyed by id (the nodes outlive the call): Node.__hash__ is a Python-level call.
    done = memo.get(id(node))
    if done is not None:
        return done
    kind = type(node)
    if kind is Scope:
        out = _simplify_scope(node)
    elif _is_index(node):
        out = _simplify_index(node, bounds)
    elif kind is Access:
        out = _simplify_access(node, bounds, memo)
    elif kind is BinOp:
        out = _simplify_binop(node, bounds, memo)
    elif kind is Call:
        out = _simplify_call(node, bounds, memo)
    else:
        out = node
    memo[id(node)] = out
    return out


def _simplify_access(node: Access, bounds: Bounds, memo: dict) -> Node:
    source = node.source
    new_source = _simplify_scope(source) if type(source) is Scope else source
    indices = tuple(_simplify(i, bounds, memo) for i in node.indices)
    if new_source is source and all(a is b for a, b in zip(indices, node.indices)):
        return node
    return Access(new_source, indices)


def _is_const(node: Node, value: float) -> bool:
    return type(node) is Const and node.value == value


def _is_boolean(node: Node) -> bool:
    if type(node) is BinOp:
        return node.op in _BOOLEAN_OPS
    return type(node) is Const and node.value in (0, 1)


def _simplify_binop(node: BinOp, bounds: Bounds, memo: dict) -> Node:
    op = node.op
    a = _simplify(node.a, bounds, memo)
    b = _simplify(node.b, bounds, memo)
    if op in _BOOLEAN_OPS:
        decided = _decide(op, a, b, bounds)
        if decided is not None:
            return decided
    elif op == "+":
        if _is_const(b, 0):
            return a
        if _is_const(a, 0):
            return b
    elif op == "-":
        if _is_const(b, 0):
            return a
    elif op == "*":
        if _is_const(b, 1):
            return a
        if _is_const(a, 1):
            return b
        if _is_const(a, 0):
            return a
        if _is_const(b, 0):
            return b
    elif op == "/":
        if _is_const(b, 1):
            return a
    if a is node.a and b is node.b:
        return node
    out = BinOp(op, a, b)
    # Simplified operands may have made an index expression out of a non-affine one.
    return _simplify_index(out, bounds) if _is_index(out) else out


def _decide(op: str, a: Node, b: Node, bounds: Bounds) -> Optional[Node]:
    """Fold a comparison or a logical operator whose value the ranges determine."""
    if op == "and":
        if _is_const(a, 0) or _is_const(b, 0):
            return Const(0)
        if type(a) is Const and _is_boolean(b):
            return b
        if type(b) is Const and _is_boolean(a):
            return a
        return None
    if op == "or":
        if (type(a) is Const and a.value != 0) or (type(b) is Const and b.value != 0):
            return Const(1)
        if _is_const(a, 0) and _is_boolean(b):
            return b
        if _is_const(b, 0) and _is_boolean(a):
            return a
        return None
    fa, fb = to_affine(a), to_affine(b)
    if fa is None or fb is None:
        return None
    rng = affine_bounds(fa.sub(fb), bounds)
    if rng is None:
        return None
    lo, hi = rng
    truth = {
        "<": (hi < 0, lo >= 0),
        "<=": (hi <= 0, lo > 0),
        ">": (lo > 0, hi <= 0),
        ">=": (lo >= 0, hi < 0),
        "==": (lo == hi == 0, lo > 0 or hi < 0),
        "!=": (lo > 0 or hi < 0, lo == hi == 0),
    }[op]
    if truth[0]:
        return Const(1)
    if truth[1]:
        return Const(0)
    return None


def _simplify_call(node: Call, bounds: Bounds, memo: dict) -> Node:
    args = tuple(_simplify(a, bounds, memo) for a in node.args)
    if node.func == "select":
        cond, then, other = args
        if type(cond) is Const:
            return then if cond.value != 0 else other
        if then is other:
            return then
    if node.func in CAST_DTYPES:
        folded = fold_cast(node.func, args[0])
        if folded is not None:
            return folded
    if all(x is y for x, y in zip(args, node.args)):
        return node
    return Call(node.func, args)


def fold_cast(dtype: str, arg: Node) -> Optional[Node]:
    """``dtype(arg)`` without the cast when that changes no value, else None.

    Rules: ``t(x) = x`` when ``x`` already has type ``t``; ``t(u(x)) = x`` when ``x`` has type
    ``t`` and ``u`` is a float type that holds every value of ``t`` (widening, then back).
    """
    if value_dtype(arg) == dtype and not (is_float_dtype(dtype) and has_weak_dtype(arg)):
        return arg  # a literal-typed float keeps its cast: without it, it would adapt
    if is_cast(arg) and value_dtype(arg.args[0]) == dtype and _widens(dtype, arg.func):
        return arg.args[0]
    return None


def _widens(src: str, dst: str) -> bool:
    """Every value of float type ``src`` is a value of float type ``dst``."""
    if not (is_float_dtype(src) and is_float_dtype(dst)):
        return False
    if src == dst:
        return True
    if "bfloat16" in (src, dst) and "float16" in (src, dst):
        return False
    return dtype_bits(dst) > dtype_bits(src)


def _sorted_free(node: Node) -> tuple:
    cache = node._cache
    out = cache.get(_CACHE_FREE)
    if out is None:
        out = tuple(sorted(free_vars(node), key=lambda v: v.name))
        cache[_CACHE_FREE] = out
    return out


def _simplify_index(node: Node, bounds: Bounds) -> Node:
    """Index expression in canonical affine form, cached per node and ranges of its iterators."""
    if type(node) is Const or type(node) is Var:
        return node
    cache = node._cache
    per_range = cache.get(_CACHE_INDEX)
    if per_range is None:
        per_range = cache[_CACHE_INDEX] = {}
    key = tuple(bounds.get(v) for v in _sorted_free(node))
    out = per_range.get(key)
    if out is None:
        aff = to_affine(node)
        if aff is not None:
            out = ranged_affine(aff, bounds).to_node()
        else:
            out = _simplify_nonaffine(node, bounds)
        per_range[key] = out
    return out


def _simplify_nonaffine(node: BinOp, bounds: Bounds) -> Node:
    """Index arithmetic with products of iterators or division by iterators.

    A sum is flattened: its affine terms are collected into one normal form (so ``4*(k//4) +
    i*j + k%4`` still merges), the other terms are simplified one by one and kept in their
    order, followed by the affine part.
    """
    if node.op not in ("+", "-"):
        return _simplify_product(node, bounds)
    terms: List[Tuple[int, Node]] = []
    _flatten_sum(node, 1, terms)
    linear = _ZERO
    others: List[Tuple[int, Node]] = []
    for sign, term in terms:
        aff = to_affine(term)
        if aff is None:
            term = _simplify_product(term, bounds)
            aff = to_affine(term)
        if aff is None:
            others.append((sign, term))
        else:
            linear = linear.add(aff.scale(sign))
    linear = ranged_affine(linear, bounds)
    out: Optional[Node] = None
    for sign, term in others:
        if out is None:
            out = term if sign > 0 else BinOp("*", Const(-1), term)
        else:
            out = BinOp("+" if sign > 0 else "-", out, term)
    if out is None:
        return linear.to_node()
    for atom, c in linear.terms:
        term = atom if abs(c) == 1 else BinOp("*", Const(abs(c)), atom)
        out = BinOp("+" if c > 0 else "-", out, term)
    if linear.const:
        out = BinOp("+" if linear.const > 0 else "-", out, Const(abs(linear.const)))
    return out


def _flatten_sum(node: Node, sign: int, out: List[Tuple[int, Node]]) -> None:
    if type(node) is BinOp and node.op in ("+", "-"):
        _flatten_sum(node.a, sign, out)
        _flatten_sum(node.b, sign if node.op == "+" else -sign, out)
    else:
        out.append((sign, node))


def _simplify_product(node: Node, bounds: Bounds) -> Node:
    """A non-affine ``*``, ``//`` or ``%``: simplify the operands, apply trivial identities."""
    if type(node) is not BinOp:
        return node
    a = _simplify_index(node.a, bounds)
    b = _simplify_index(node.b, bounds)
    op = node.op
    if op == "*":
        if _is_const(a, 0) or _is_const(b, 0):
            return Const(0)
        if _is_const(a, 1):
            return b
        if _is_const(b, 1):
            return a
    elif op in ("//", "%") and _is_const(b, 1):
        return a if op == "//" else Const(0)
    if a is node.a and b is node.b:
        return node
    out = BinOp(op, a, b)
    aff = to_affine(out)
    return out if aff is None else ranged_affine(aff, bounds).to_node()


def ranged_affine(aff: Affine, bounds: Bounds) -> Affine:
    """Re-normalize ``aff`` with inclusive iterator bounds (div/mod atoms resolved by ranges).

    Every div/mod atom is rebuilt from its (recursively re-normalized) inner form with the
    bounds, which removes the atoms whose argument lies within one block; this repeats until
    nothing changes, so the result is a fixed point and simplification is idempotent.
    """
    if not bounds:
        return aff
    for _ in range(_MAX_ROUNDS):
        if all(type(atom) is Var for atom, _ in aff.terms):
            return aff
        out = Affine(aff.const)
        for atom, c in aff.terms:
            if type(atom) is Var:
                part = Affine(0, ((atom, c),))
            else:
                inner = ranged_affine(to_affine(atom.a), bounds)
                k = atom.b.value
                part = inner.floordiv(k, bounds) if atom.op == "//" else inner.floormod(k, bounds)
                part = part.scale(c)
            out = out.add(part)
        if out == aff:
            return aff
        aff = out
    return aff


def _node_bounds(node: Node, bounds: Bounds) -> Optional[Tuple[int, int]]:
    if not is_index(node):
        return None
    simplified = _simplify_index(node, bounds)
    aff = to_affine(simplified)
    if aff is not None:
        return affine_bounds(aff, bounds)
    a = _node_bounds(simplified.a, bounds)
    b = _node_bounds(simplified.b, bounds)
    if a is None or b is None:
        return None
    op = simplified.op
    if op == "+":
        return a[0] + b[0], a[1] + b[1]
    if op == "-":
        return a[0] - b[1], a[1] - b[0]
    if op == "*":
        corners = (a[0] * b[0], a[0] * b[1], a[1] * b[0], a[1] * b[1])
        return min(corners), max(corners)
    if b[0] <= 0 <= b[1]:
        return None  # the divisor may be zero
    if op == "//":
        corners = (a[0] // b[0], a[0] // b[1], a[1] // b[0], a[1] // b[1])
        return min(corners), max(corners)
    if b[0] > 0:  # floor modulo by a positive divisor
        if 0 <= a[0] and a[1] < b[0]:
            return a
        return 0, b[1] - 1
    if a[1] <= 0 and a[0] > b[1]:  # negative divisor, numerator already in (divisor, 0]
        return a
    return b[0] + 1, 0
