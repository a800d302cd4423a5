"""What every derivation rule is made of: :class:`Rule`, :class:`Rewrite`, :class:`RuleContext`,
and the small index analyses the rules' guards share.

A rule rewrites ONE scope (the focus) into an equivalent scope: same loop ranges, same padding,
same value at every point of the padded domain. New nested scopes may appear inside the result.
The driver in :mod:`tvm_ollie.derive.focus` picks the focus and rebuilds the expression around it.

The analyses here are deliberately local and conservative: a linear form of an index
(``Σ coeff·var + const``, ``None`` when ``//`` or ``%`` appear) and integer interval bounds. A guard
that cannot prove its side condition refuses the rewrite; it never guesses.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Dict, FrozenSet, Iterable, Iterator, List, NamedTuple, Optional
from typing import Sequence, Tuple

from ...ir.nodes import Access, BinOp, Call, Const, IterVar, Node, Scope, Tensor, Var

Ranges = Dict[Var, Tuple[int, int]]  # var -> half-open (begin, end)


class Rewrite(NamedTuple):
    """One application of a rule: the equivalent replacement of the focus and what was done."""

    scope: Scope
    note: str


@dataclass(frozen=True)
class RuleContext:
    """What rules may consult besides the focus.

    Attributes
    ----------
    targets : tuple of str
        The operators the search is heading for (rules may use them to pick factors).
    small_factors : tuple of int
        Split factors always tried when they divide a range (besides the strides that the
        indices themselves show, see :func:`split_factors`).
    split_factors : tuple of int or None
        When given, exactly these factors are tried (overrides the automatic choice).
    max_relax : int
        Largest amount by which boundary relaxing may enlarge a summation range.
    guided_maps : int
        Longest chain of iterator mappings the guided rule ``map_to_target`` tries (0: off).
    """

    targets: Tuple[str, ...] = ()
    small_factors: Tuple[int, ...] = (2, 3)
    split_factors: Optional[Tuple[int, ...]] = None
    max_relax: int = 4
    guided_maps: int = 2


@dataclass(frozen=True)
class Rule:
    """A named derivation rule: ``apply(focus, ctx)`` yields equivalent rewrites of the focus.

    ``doc`` is the equation the rule implements; ``costs_depth`` is False for eager rules (stage
    merging), which the search applies to a fixed point after every step without counting depth.
    ``max_per_path`` bounds how often the search uses the rule on one derivation path (None: no
    bound); rules whose repeated use only re-nests what one use already did carry a bound.
    ``guided`` rules are neither explorative nor eager: the search tries them at each scope a
    state newly created and keeps a result only when it instantiates a target (no depth cost).
    """

    name: str
    family: str
    doc: str
    apply: Callable[[Scope, RuleContext], Iterator[Rewrite]] = field(repr=False)
    costs_depth: bool = True
    max_per_path: Optional[int] = None
    guided: bool = False

    def __call__(self, scope: Scope, ctx: Optional[RuleContext] = None) -> List[Rewrite]:
        """All rewrites of ``scope`` (a list; empty when the rule does not apply)."""
        return list(self.apply(scope, ctx or RuleContext()))


# ---------------------------------------------------------------------------------------------
# Index analyses
# ---------------------------------------------------------------------------------------------


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


def body_accesses(node: Node) -> Tuple[Access, ...]:
    """Accesses in a scope body (not entering nested scopes), each once, in pre-order.

    Cached on the node: every rule guard asks this of the same few bodies.
    """
    hit = node._cache.get("body_accesses")  # pylint: disable=protected-access
    if hit is not None:
        return hit
    out: List[Access] = []
    seen = set()
    stack = [node]
    while stack:
        cur = stack.pop()
        if id(cur) in seen:
            continue
        seen.add(id(cur))
        kind = type(cur)
        if kind is Access:
            out.append(cur)
            stack.extend(reversed(cur.indices))
        elif kind is BinOp:
            stack.append(cur.b)
            stack.append(cur.a)
        elif kind is Call:
            stack.extend(reversed(cur.args))
    out = tuple(out)
    node._cache["body_accesses"] = out  # pylint: disable=protected-access
    return out


def data_bounds(source) -> List[Tuple[int, int]]:
    """Per dimension, the inclusive index range that holds data (not padding)."""
    if isinstance(source, Tensor):
        return [(0, n - 1) for n in source.shape]
    return [(iv.begin, iv.end - 1) for iv in source.loops]


def padded_bounds(source) -> List[Tuple[int, int]]:
    """Per dimension, the inclusive index range that may be read (data plus padding)."""
    if isinstance(source, Tensor):
        return [(-lo, n - 1 + hi) for n, (lo, hi) in zip(source.shape, source.pad)]
    return [(iv.begin - lo, iv.end - 1 + hi) for iv, (lo, hi) in zip(source.loops, source.pad)]


def zero_padded(source) -> bool:
    """True when reads outside the data region of ``source`` give 0."""
    return isinstance(source, Scope) or source.pad_value == 0.0


def with_pad(source, pad):
    """``source`` with another padding (a Tensor's or a Scope's)."""
    if isinstance(source, Tensor):
        return source.with_pad(pad)
    return source.replace(pad=pad)


def widen_pad(source, needed: Sequence[Optional[Tuple[int, int]]]):
    """``source`` with its padding grown so that the inclusive ranges ``needed`` are readable.

    Returns None when growing is not allowed (a tensor whose pad value is not finite: a zero
    multiplied by it would not stay zero).
    """
    bounds = data_bounds(source)
    new_pad = []
    changed = False
    for (lo, hi), (dlo, dhi), need in zip(source.pad, bounds, needed):
        if need is not None:
            nlo = max(lo, dlo - need[0])
            nhi = max(hi, need[1] - dhi)
            if (nlo, nhi) != (lo, hi):
                changed = True
            lo, hi = nlo, nhi
        new_pad.append((lo, hi))
    if not changed:
        return source
    if isinstance(source, Tensor) and not math.isfinite(source.pad_value):
        return None
    return with_pad(source, new_pad)


def in_bounds(scope: Scope) -> bool:
    """True when every read in the scope body provably stays within its source's padded range."""
    ranges = scope_ranges(scope)
    for acc in body_accesses(scope.body):
        for idx, (plo, phi) in zip(acc.indices, padded_bounds(acc.source)):
            r = interval(idx, ranges)
            if r is None or r[0] < plo or r[1] > phi:
                return False
    return True


def iter_names(scope: Scope) -> FrozenSet[str]:
    """Names of the scope's own iterators (scopes are closed: only these can clash)."""
    return frozenset(iv.var.name for iv in scope.loops + scope.reduce)


def fresh_vars(taken: Iterable[str], count: int, prefix: str = "t") -> List[Var]:
    """``count`` distinct variables named ``prefix<k>`` not in ``taken``."""
    taken = set(taken)
    out = []
    k = 0
    while len(out) < count:
        name = f"{prefix}{k}"
        if name not in taken:
            out.append(Var(name))
            taken.add(name)
        k += 1
    return out


def divisors(n: int) -> List[int]:
    """Divisors of ``n`` strictly between 1 and ``n``."""
    out = []
    for d in range(2, int(math.isqrt(n)) + 1):
        if n % d == 0:
            out.append(d)
            if d != n // d:
                out.append(n // d)
    return sorted(out)


def index_strides(scope: Scope) -> FrozenSet[int]:
    """Absolute values (> 1) of iterator coefficients in the scope's linear indices.

    These are the strides the data is addressed with: a split by one of them lines an iterator
    up with a stride (dilations, strides, the block sizes of a flattened index).
    """
    cache = scope._cache  # pylint: disable=protected-access
    if "strides" not in cache:
        out = set()
        for acc in body_accesses(scope.body):
            for idx in acc.indices:
                lin = linear_form(idx)
                if lin is not None:
                    out.update(abs(c) for c in lin[0].values() if abs(c) > 1)
        cache["strides"] = frozenset(out)
    return cache["strides"]


def compound_vars(scope: Scope) -> FrozenSet[Var]:
    """Iterators that share some index with another iterator (``h + r``, ``4*i + j``).

    Splitting or relaxing an iterator that always indexes a dimension alone only reshapes that
    dimension, which instantiation does by itself (iterator groups); the split rules skip those.
    """
    cache = scope._cache  # pylint: disable=protected-access
    if "compound" not in cache:
        out = set()
        for acc in body_accesses(scope.body):
            for idx in acc.indices:
                lin = linear_form(idx)
                if lin is not None and len(lin[0]) > 1:
                    out.update(lin[0])
        cache["compound"] = frozenset(out)
    return cache["compound"]


def split_factors(extent: int, scope: Scope, ctx: RuleContext) -> List[int]:
    """Factors to split a range of ``extent`` by: divisors that are small or index strides.

    Never shape-specific: every factor divides the extent, and is either one of
    ``ctx.small_factors`` or a stride that the scope's own indices use.
    """
    if ctx.split_factors is not None:
        return [k for k in ctx.split_factors if 1 < k < extent and extent % k == 0]
    wanted = set(ctx.small_factors) | index_strides(scope)
    return [k for k in divisors(extent) if k in wanted]


def relax_factors(extent: int, scope: Scope, ctx: RuleContext) -> List[int]:
    """Factors that do not divide ``extent`` but would after relaxing it by <= ``max_relax``."""
    pool = ctx.split_factors if ctx.split_factors is not None else (
        tuple(ctx.small_factors) + tuple(index_strides(scope)))
    out = []
    for k in sorted(set(pool)):
        if 1 < k < extent and extent % k:
            if -extent % k <= ctx.max_relax:
                out.append(k)
    return out


def loop_access(inner: Scope, indices: Sequence[Node]) -> Access:
    """``inner[indices]`` (helper so that rule code reads like the equations)."""
    return Access(inner, tuple(indices))


def replace_iter(ivs: Sequence[IterVar], var: Var, new: Sequence[IterVar]) -> Tuple[IterVar, ...]:
    """``ivs`` with the binding of ``var`` replaced (in place) by ``new``."""
    out: List[IterVar] = []
    for iv in ivs:
        if iv.var is var:
            out.extend(new)
        else:
            out.append(iv)
    return tuple(out)
