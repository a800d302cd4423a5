"""Hypothesis strategies for instantiation: random ``Σ X[..] * Y[..]`` scopes.

The shared strategies (``tests/ir/strategies.py``) rarely produce a body that is a product of two
reads, and their conv-like scopes are the textbook layouts. Derived states are messier: role
groups of several iterators, merged indices (``3*g + c``), weight indices mixing output and kernel
iterators (``K[3*a + r, ..]``), loop ranges that do not start at 0, output padding, operands that
are nested scopes. :func:`product_scopes` draws such scopes, every read in bounds (padding where
the subscripts leave the data), so matching + instantiation can be checked exactly against the
interpreter.
"""

from __future__ import annotations

from typing import List

from hypothesis import strategies as st

from tvm_ollie.ir.nodes import Access, Const, IterVar, Node, Scope, Tensor, Var

from strategies import fit_tensor, index_bounds  # tests/conftest.py puts tests/ir on sys.path

NAMES = ("i", "j", "k", "l", "p", "q", "u", "v")


@st.composite
def _index(draw, iters: List[IterVar], must: List[Var]) -> Node:
    """An affine index over a few iterators (those in ``must`` first), sometimes a div/mod."""
    pool = [iv.var for iv in iters]
    chosen = list(must)
    extra = draw(st.lists(st.sampled_from(pool), max_size=2, unique=True)) if pool else []
    chosen += [v for v in extra if v not in chosen]
    expr: Node = None
    for v in chosen:
        coeff = draw(st.sampled_from((1, 1, 1, 2, 3, -1)))
        term = v if coeff == 1 else v * Const(coeff)
        expr = term if expr is None else expr + term
    if expr is None:
        return Const(draw(st.integers(0, 1)))
    offset = draw(st.sampled_from((0, 0, 0, 1, -1, -2, 2)))
    if offset:
        expr = expr + Const(offset)
    if draw(st.integers(0, 9)) == 0:
        expr = expr // Const(2) if draw(st.booleans()) else expr % Const(3)
    return expr


@st.composite
def _operand_indices(draw, iters: List[IterVar], own: List[Var]) -> List[Node]:
    """1-4 indices that together read every iterator in ``own``."""
    ndim = draw(st.integers(1, 4))
    slots: List[List[Var]] = [[] for _ in range(ndim)]
    for v in draw(st.permutations(own)):
        slots[draw(st.integers(0, ndim - 1))].append(v)
    return [draw(_index(iters if draw(st.integers(0, 3)) == 0 else [], s)) for s in slots]


@st.composite
def product_scopes(draw, nested: bool = True) -> Scope:
    """A closed scope ``L Σ { X[..] * Y[..] }`` with random roles and index forms.

    Each iterator is read by X, by Y or by both (a reduction iterator is usually read by both);
    role layouts are random permutations, so views, gathers, transposes and grouped roles all
    occur. With ``nested``, an operand is sometimes a nested map scope read through its box.
    """
    n_loops, n_red = draw(st.integers(1, 4)), draw(st.integers(1, 3))
    names = list(NAMES)
    iters = []
    for k in range(n_loops + n_red):
        begin = draw(st.sampled_from((0, 0, 0, 0, 1, -1)))
        iters.append(IterVar(Var(names[k]), begin, begin + draw(st.integers(1, 3))))
    loops, reduce = iters[:n_loops], iters[n_loops:]
    x_vars, y_vars = [], []
    for iv in iters:
        is_red = iv in reduce
        where = draw(st.sampled_from(("both", "both", "x", "y") if not is_red else
                                     ("both", "both", "both", "x")))
        if where in ("both", "x"):
            x_vars.append(iv.var)
        if where in ("both", "y"):
            y_vars.append(iv.var)
    if not y_vars:
        y_vars.append(iters[0].var)
    ranges = {iv.var: (iv.begin, iv.end) for iv in iters}
    operands = []
    for name, own in (("A", x_vars), ("K", y_vars)):
        idx = draw(_operand_indices(iters, own))
        shape = []
        for i in idx:
            lo, hi = index_bounds(i, ranges)
            # Shapes cover most of the range; the rest is padding (zero margins).
            span = hi - max(lo, 0) + 1
            shape.append(max(1, span - draw(st.integers(0, 1))))
        tensor = fit_tensor(name, shape, idx, ranges)
        read = Access(tensor, idx)
        if nested and draw(st.integers(0, 4)) == 0:
            read = _through_scope(draw, tensor, idx, ranges)
        operands.append(read)
    pad = None
    if draw(st.integers(0, 4)) == 0:
        pad = [(draw(st.integers(0, 1)), draw(st.integers(0, 1))) for _ in loops]
    return Scope(loops, reduce, operands[0] * operands[1], pad)


def _through_scope(draw, tensor: Tensor, idx: List[Node], ranges) -> Access:
    """``tensor[idx]`` read through a nested map scope ``(L<x..> {2 * T[x..]})`` over its box."""
    xs = [Var(f"x{k}") for k in range(len(idx))]
    loops, shift, pad = [], [], []
    for x, i in zip(xs, idx):
        lo, hi = index_bounds(i, ranges)
        begin = draw(st.sampled_from((0, 1, -1)))
        # The nested box covers [lo, hi] of the read, sometimes minus a margin given back as
        # the scope's padding (reads there give 0).
        m_lo = draw(st.integers(0, 1)) if hi > lo else 0
        m_hi = draw(st.integers(0, 1)) if hi - lo > m_lo else 0
        loops.append(IterVar(x, lo + begin + m_lo, hi + 1 + begin - m_hi))
        shift.append(begin)
        pad.append((m_lo, m_hi))
    inner = Scope(loops, [], Access(tensor, [x - s if s else x for x, s in zip(xs, shift)])
                  * Const(2.0), pad)
    return Access(inner, [i + s if s else i for i, s in zip(idx, shift)])
