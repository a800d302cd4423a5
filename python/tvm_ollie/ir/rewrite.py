"""One rewrite driver for expression trees: bottom-up, memoized, sharing what does not change.

Every transformation that rebuilds an expression (substituting reads, retyping inputs,
canonicalizing nested scopes, ...) is a small function of ONE node given to :func:`rewrite`; the
walk itself (children first, each shared sub-expression visited once, a node rebuilt only when
a child changed) lives here, so that a new node kind is handled in one place.

Two hooks, both returning a replacement node or ``None`` for "no change":

* ``post(node)`` runs after the node's children were rewritten (the usual bottom-up rule);
* ``pre(node)`` runs before, and its replacement is final (not walked into): for rules that
  must see a node as it was, or that stop the walk (e.g. at nested scopes).
"""

from __future__ import annotations

from typing import Callable, Dict, Optional

from .nodes import Access, BinOp, Call, Node, Scope, is_index

__all__ = ["Hook", "rewrite"]

#: A rewrite hook: the replacement of a node, or None to keep it.
Hook = Callable[[Node], Optional[Node]]


def rewrite(node: Node, post: Optional[Hook] = None, pre: Optional[Hook] = None,
            enter_scopes: bool = True, reads_only: bool = False) -> Node:
    """``node`` rewritten bottom-up by ``post`` (and top-down by ``pre``).

    Parameters
    ----------
    node : Node
        The root (any node; the body of a root scope is always walked).
    post : callable, optional
        Applied to every node after its children were rewritten.
    pre : callable, optional
        Applied to every node before its children; a replacement is not walked into.
    enter_scopes : bool
        Walk into scopes read by an access (nested scopes); False leaves them as they are
        (``post`` still sees the access that reads them).
    reads_only : bool
        The hooks replace only reads (accesses and what they read): index arithmetic (iterators,
        integer constants and their sums, products, divisions), which holds no read, is left
        as it is without walking it (most nodes of a body; the answer is cached per node).

    Returns
    -------
    Node
        The rewritten tree; unchanged sub-trees are the same (interned) nodes.
    """
    # keyed by id: every key is a node of the input tree, alive for the whole call (so no id is
    # reused), and Node.__hash__ is a Python-level call on a hot path (canonicalization)
    memo: Dict[int, Node] = {}

    def go(cur: Node) -> Node:
        done = memo.get(id(cur))
        if done is not None:
            return done
        if reads_only and _is_index(cur):
            return cur
        out = pre(cur) if pre is not None else None
        if out is None:
            out = _children_rewritten(cur, go, enter_scopes)
            if post is not None:
                hit = post(out)
                out = out if hit is None else hit
        memo[id(cur)] = out
        return out

    out = go(node)
    del go  # the closure refers to itself: unbound, refcounting frees it (no cyclic garbage)
    return out


def _children_rewritten(cur: Node, go: Callable[[Node], Node], enter_scopes: bool) -> Node:
    """``cur`` rebuilt from its rewritten children (itself when none changed)."""
    if isinstance(cur, BinOp):
        a, b = go(cur.a), go(cur.b)
        return cur if a is cur.a and b is cur.b else BinOp(cur.op, a, b)
    if isinstance(cur, Call):
        args = tuple(go(a) for a in cur.args)
        return cur if all(x is y for x, y in zip(args, cur.args)) else Call(cur.func, args)
    if isinstance(cur, Access):
        src = cur.source
        if enter_scopes and isinstance(src, Scope):
            src = go(src)
        idx = tuple(go(i) for i in cur.indices)
        if src is cur.source and all(x is y for x, y in zip(idx, cur.indices)):
            return cur
        return Access(src, idx)
    if isinstance(cur, Scope):
        body = go(cur.body)
        return cur if body is cur.body else cur.replace(body=body)
    return cur  # Var, Const, Tensor, IterVar: leaves


def _is_index(node: Node) -> bool:
    hit = node._cache.get("is_index")  # pylint: disable=protected-access
    return is_index(node) if hit is None else hit
