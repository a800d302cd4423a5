"""What every derivation rule is made of, in one import: the rule interface
(:mod:`tvm_ollie.derive.rule`), the index analyses (:mod:`tvm_ollie.ir.index`) and the small
scope analyses the rules' guards share (defined here: accesses, padding, bounds, factors to try).

Like the index analyses, the guards are conservative: one that cannot prove its side condition
refuses the rewrite; it never guesses.
"""

from __future__ import annotations

import math
from typing import FrozenSet, Iterable, List, Optional, Sequence, Tuple

from ...ir.index import Ranges, build_linear, factors, interval, linear_form, scope_ranges
from ...ir.nodes import Access, BinOp, Call, IterVar, Node, Scope, Tensor, Var, is_index
from ..rule import Rewrite, Rule, RuleContext

__all__ = ["Ranges", "build_linear", "factors", "interval", "linear_form", "scope_ranges",
           "Rewrite", "Rule", "RuleContext"]  # re-exported for the rules; the rest by name


# ---------------------------------------------------------------------------------------------
# Scope analyses of the guards
# ---------------------------------------------------------------------------------------------


def body_accesses(node: Node) -> Tuple[Access, ...]:
    """Accesses in a scope body (not entering nested scopes), each once, in pre-order.

    Cached on the node: every rule guard asks this of the same few bodies.
    """
    hit = node._cache.get("body_accesses")  # pylint: disable=protected-access
    if hit is not None:
        return (node,) + hit if type(node) is Access else hit
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
            if not is_index(cur):  # index arithmetic reads nothing
                stack.append(cur.b)
                stack.append(cur.a)
        elif kind is Call:
            stack.extend(reversed(cur.args))
    out = tuple(out)
    # an access's own entry leaves it out (it comes first): a node holding itself is a
    # reference cycle, which only the cyclic GC frees
    cache = node._cache  # pylint: disable=protected-access
    cache["body_accesses"] = out[1:] if type(node) is Access else out
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
