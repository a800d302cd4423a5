"""Canonical form of a derivation state: simplified indices and deterministic iterator names.

Two states that differ only by iterator names, by the order of summation iterators, or by the
order in which a nested stage lays out its loops denote the same computation; the search should
see them once. :func:`canonicalize`:

1. simplifies every index (``tvm_ollie.ir.simplify``: affine normal form with iterator ranges);
2. drops summation iterators of extent 1 (substituting their only value);
3. orders the loops of every NESTED scope by first use in its body (its readers' subscripts are
   permuted to match; the root keeps its loop order, which is the output layout) and the
   summation iterators of every scope likewise;
4. renames iterators by position (``i0, i1, ..`` loops, ``r0, r1, ..`` summations; each scope is
   closed, so every scope reuses the same names). The canonical form of each scope is cached on
   the node, so a nested scope shared by many states is canonicalized once.

Because nodes are hash-consed, equal canonical states are the same object, and the fingerprint
(:mod:`tvm_ollie.ir.fingerprint`) sees them as equal.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from ..ir.nodes import SELF, Access, BinOp, Call, Const, IterVar, Node, Scope, Var, substitute
from ..ir.rewrite import rewrite
from ..ir.simplify import simplify

__all__ = ["canonicalize", "normalize_indices", "rename_iterators"]


def normalize_indices(scope: Scope) -> Scope:
    """``scope`` with every index in normal form (used by rule guards before bound checks)."""
    return simplify(scope)


def canonicalize(expr: Scope) -> Scope:
    """The canonical form of a state (see the module docstring)."""
    return _canon(expr, True)[0]


def _canon(s: Scope, root: bool) -> Tuple[Scope, Tuple[int, ...]]:
    """``(canonical scope, loop permutation)``; cached on the node (scopes are closed, so the
    canonical form of a nested scope does not depend on where it is read)."""
    key = "canon.root" if root else "canon.nested"
    cache = s._cache  # pylint: disable=protected-access
    hit = cache.get(key)
    if hit is not None:
        return (s, hit[1]) if hit[0] is SELF else hit
    body = rewrite(s.body, post=_canonical_read, enter_scopes=False, reads_only=True)
    simple = simplify(s.replace(body=body) if body is not s.body else s)
    out = _rename(simple, root)
    # SELF for the node itself: a node holding itself is a cycle only the cyclic GC frees
    cache[key] = (SELF, out[1]) if out[0] is s else out
    canon = out[0]._cache  # pylint: disable=protected-access
    canon.setdefault(key, (SELF, tuple(range(len(s.loops)))))
    # renaming and reordering keep simplified indices simplified: mark the canonical scope so
    # that simplifying a state that reads it (its parent's canonicalization) does not redo it
    canon.setdefault("simplify", SELF)
    return out


def _canonical_read(cur: Node) -> Optional[Node]:
    """A read of a nested scope as a read of its canonical form (subscripts permuted); the
    rewrite driver does not enter nested scopes, :func:`_canon` canonicalizes them (cached)."""
    if not (isinstance(cur, Access) and isinstance(cur.source, Scope)):
        return None
    src, perm = _canon(cur.source, False)
    return Access(src, tuple(cur.indices[k] for k in perm))


def _rename(s: Scope, root: bool, reorder_nested: bool = True) -> Tuple[Scope, Tuple[int, ...]]:
    """Unit summations dropped; nested loops and summations ordered by first use; renamed."""
    body = s.body
    reduce = list(s.reduce)
    unit = {iv.var: Const(iv.begin) for iv in reduce if iv.extent == 1}
    if unit:  # a reduction over one value is that value, for sum and max alike
        body = simplify(substitute(body, unit), {iv.var: (iv.begin, iv.end) for iv in s.loops})
        reduce = [iv for iv in reduce if iv.var not in unit]
    first = {v: k for k, v in enumerate(_var_order(body))}
    big = len(first)
    n = len(s.loops)
    if root or not reorder_nested:
        perm = tuple(range(n))
    else:
        perm = tuple(sorted(range(n), key=lambda k: (first.get(s.loops[k].var, big), k)))
    reduce.sort(key=lambda iv: first.get(iv.var, big))
    mapping: Dict[Node, Node] = {}
    loops = []
    for pos, k in enumerate(perm):
        iv = s.loops[k]
        v = Var(f"i{pos}")
        mapping[iv.var] = v
        loops.append(IterVar(v, iv.begin, iv.end))
    reds = []
    for pos, iv in enumerate(reduce):
        v = Var(f"r{pos}")
        mapping[iv.var] = v
        reds.append(IterVar(v, iv.begin, iv.end))
    pad = tuple(s.pad[k] for k in perm)
    out = Scope(loops, reds, substitute(body, mapping), pad=pad,
                reducer=s.reducer if reds else "sum")
    return out, perm


def rename_iterators(expr: Scope) -> Scope:
    """Iterators of every scope renamed by position (nested loops ordered by first use)."""
    return canonicalize(expr)


def _var_order(body: Node) -> List[Var]:
    """Iterators in order of first use (pre-order; nested scopes are not entered)."""
    order: List[Var] = []
    seen = set()
    stack = [body]
    while stack:
        cur = stack.pop()
        kind = type(cur)
        if kind is Var:
            if cur not in seen:
                seen.add(cur)
                order.append(cur)
        elif kind is Access:
            stack.extend(reversed(cur.indices))
        elif kind is BinOp:
            stack.append(cur.b)
            stack.append(cur.a)
        elif kind is Call:
            stack.extend(reversed(cur.args))
    return order
