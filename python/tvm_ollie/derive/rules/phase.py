"""Phase splitting: a strided scatter becomes one dense summation per output phase.

A transposed convolution of stride ``s``, once its stride guard is solved (:mod:`.guard`), is a
scatter form: every output row ``h`` sums over all input rows ``q`` and reads the kernel at
``h + p - s·q``, zero outside the taps::

    L<h> Σ<q> X[q] · K<pad>[h + p - s·q]

Only about ``taps / s`` of the ``q`` land in the kernel, and which ones depends on ``h``, so every
operator that matches the sum (a matmul over a band) does the zero products too. Writing the
output row as ``h = s·h' + a`` fixes the *phase* ``a``: the kernel index becomes
``s·(h' - q) + a + p``, and with ``q = h' + t`` it is ``a + p - s·t``, which does not depend on the
output row at all. :data:`SPLIT_PHASE` ("split phase") makes one scope per phase, each summing
over the ``t`` that land in the kernel only, and interleaves them::

    L<h:0:n> Σ<q> f(q, h + m·q + c)
        =  L<h> { select(h % s == 0, P_0[h // s], select(h % s == 1, P_1[h // s], ...)) }
    P_a  =  L<h':0:⌈(n-a)/s⌉> Σ<t:t_lo(a):t_hi(a)> f(-(m/s)·h' + t, m·t + a + c)      (|m| = s ≥ 2)

``t_lo(a)``, ``t_hi(a)`` bound ``m·t + a + c`` to the data of the zero-padded read that holds it
(the kernel): the ``t`` left out read its padding, so their products are zero. The ``t`` kept may
give ``q`` outside its old range; the rule needs a factor that is zero there (the input ``X[q]``
is, where the range covered its data; its padding is grown to the new index range). Each phase is
then a dense stride-1 convolution (``X[h' + t]`` with a kernel gather), a matmul with no wasted
multiply-adds, and the interleave is a memory-bound eOperator (the depth-to-space of sub-pixel
convolutions). All strided pairs of the scope (one per spatial dimension) are split in one
rewrite: ``s^d`` phases; a phase whose ``t`` range is empty is the constant 0.

The rule is guided (:mod:`.guided`): the search applies it at every scope a state newly creates,
instantiates the result (each phase matched as an operator) and does not explore it further.
Explored, the ``s^d`` sibling phases multiplied the branching of every later level (a stride-2
transposed convolution at depth 4: 1579 states instead of 305, 13x the time) for programs that
only re-derive each phase's convolution.
"""

from __future__ import annotations

import itertools
from typing import Dict, Iterator, List, NamedTuple, Optional, Tuple

from ...ir.nodes import (Access, BinOp, Call, Const, IterVar, Node, Scope, Var, substitute,
                         value_dtype)
from ...ir.simplify import simplify
from .base import (
    Rewrite,
    Rule,
    RuleContext,
    build_linear,
    data_bounds,
    factors,
    fresh_vars,
    in_bounds,
    iter_names,
    linear_form,
    zero_padded,
)
from .guard import vanishes_outside, widened

#: Most phases one rewrite may create (``s^d``; stride 3 in three dimensions is 27).
MAX_PHASES = 27


class StridedPair(NamedTuple):
    """A loop ``h`` and a summation ``q`` meeting as ``h + m·q + c`` in a zero-padded read's
    dimension holding data ``[dlo, dhi]`` (``s = |m|``)."""

    loop: IterVar
    red: IterVar
    m: int
    c: int
    dlo: int
    dhi: int

    @property
    def s(self) -> int:
        return abs(self.m)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def strided_pairs(scope: Scope) -> List[StridedPair]:
    """The loop/summation pairs of the scope that a phase split makes dense (module doc).

    Each loop and summation iterator is used once; the read must be a zero-padded factor of the
    product, the loop start at 0, and some factor must vanish when the summation iterator leaves
    its range.
    """
    loops = {iv.var: iv for iv in scope.loops}
    reds = {iv.var: iv for iv in scope.reduce}
    reads = [f for f in factors(scope.body) if isinstance(f, Access)]
    out: List[StridedPair] = []
    used = set()
    for acc in reads:
        if not zero_padded(acc.source):
            continue
        for idx, (dlo, dhi) in zip(acc.indices, data_bounds(acc.source)):
            pair = _pair(linear_form(idx), loops, reds, dlo, dhi)
            if pair is None or pair.loop.var in used or pair.red.var in used:
                continue
            if not vanishes_outside(reads, pair.red.var, pair.red.begin, pair.red.end):
                continue
            used.update((pair.loop.var, pair.red.var))
            out.append(pair)
    return out


def _pair(lin, loops, reds, dlo: int, dhi: int) -> Optional[StridedPair]:
    """The pair of an index ``h + m·q + c`` (loop ``h`` from 0, ``|m| >= 2``), else None."""
    if lin is None or len(lin[0]) != 2:
        return None
    coeffs, c = lin
    h = [v for v in coeffs if v in loops]
    q = [v for v in coeffs if v in reds]
    if len(h) != 1 or len(q) != 1 or coeffs[h[0]] != 1 or abs(coeffs[q[0]]) < 2:
        return None
    loop = loops[h[0]]
    if loop.begin != 0 or loop.extent < abs(coeffs[q[0]]):
        return None
    return StridedPair(loop, reds[q[0]], coeffs[q[0]], c, dlo, dhi)


def _tap_range(p: StridedPair, a: int) -> Tuple[int, int]:
    """Half-open ``t`` range with ``m·t + a + c`` inside ``[dlo, dhi]``."""
    lo, hi = p.dlo - a - p.c, p.dhi - a - p.c
    if p.m > 0:
        return _ceil_div(lo, p.m), hi // p.m + 1
    return _ceil_div(hi, p.m), lo // p.m + 1


def _phase(scope: Scope, pairs: List[StridedPair], phase: Tuple[int, ...],
           names: List[Tuple[Var, Var]]) -> Optional[Node]:
    """The scope of one phase (a Scope), the constant 0 when it sums nothing, None on failure."""
    mapping: Dict[Var, Node] = {}
    loops, reduce = list(scope.loops), list(scope.reduce)
    for p, a, (h1, t) in zip(pairs, phase, names):
        t_lo, t_hi = _tap_range(p, a)
        if t_lo >= t_hi:
            return Const(0.0, value_dtype(scope.body))
        mapping[p.loop.var] = build_linear({h1: p.s}, a)
        mapping[p.red.var] = build_linear({h1: -p.m // p.s, t: 1}, 0)
        loops[loops.index(p.loop)] = IterVar(h1, 0, _ceil_div(p.loop.extent - a, p.s))
        reduce[reduce.index(p.red)] = IterVar(t, t_lo, t_hi)
    body = substitute(scope.body, mapping)
    new = simplify(Scope(loops, reduce, body, reducer=scope.reducer))
    new = widened(new)
    if new is None or not in_bounds(new):
        return None
    return new


def _interleave(scope: Scope, pairs: List[StridedPair], phases: List[Node]) -> Scope:
    """``L<loops> select(h % s == a ∧ ..., P_a[.., h // s, ..], ...)`` over every phase."""
    combos = list(itertools.product(*(range(p.s) for p in pairs)))
    split = {p.loop.var: p.s for p in pairs}
    idx = [BinOp("//", iv.var, Const(split[iv.var])) if iv.var in split else iv.var
           for iv in scope.loops]
    body: Optional[Node] = None
    for combo, value in reversed(list(zip(combos, phases))):
        read = Access(value, idx) if isinstance(value, Scope) else value
        if body is None:
            body = read
            continue
        cond: Optional[Node] = None
        for p, a in zip(pairs, combo):
            c = BinOp("==", BinOp("%", p.loop.var, Const(p.s)), Const(a))
            cond = c if cond is None else BinOp("and", cond, c)
        body = Call("select", (cond, read, body))
    return Scope(scope.loops, (), body, pad=scope.pad)


def _split_phase(scope: Scope, ctx: RuleContext) -> Iterator[Rewrite]:  # pylint: disable=unused-argument
    if scope.reducer != "sum" or not scope.reduce:
        return
    pairs = strided_pairs(scope)
    count = 1
    for p in pairs:
        count *= p.s
    if not pairs or count > MAX_PHASES:
        return
    taken = set(iter_names(scope))
    names = []
    for p in pairs:
        h1, t = fresh_vars(taken, 2, prefix="p")
        taken.update((h1.name, t.name))
        names.append((h1, t))
    phases = []
    for combo in itertools.product(*(range(p.s) for p in pairs)):
        ph = _phase(scope, pairs, combo, names)
        if ph is None:
            return
        phases.append(ph)
    if not any(isinstance(ph, Scope) for ph in phases):
        return
    what = ", ".join(f"{p.loop.var.name} = {p.s}*{h1.name} + phase ({p.red.var.name} -> "
                     f"{t.name})" for p, (h1, t) in zip(pairs, names))
    yield Rewrite(_interleave(scope, pairs, phases), f"split phase: {what}, {count} phases")


SPLIT_PHASE = Rule(
    "split_phase", "phase",
    "L<h> Σ<q> f(q, h + m*q + c) = L<h> select(h % s == a, P_a[h // s], ...), "
    "P_a = L<h'> Σ<t:t_lo(a):t_hi(a)> f(-(m/s)*h' + t, m*t + a + c), s = |m| >= 2",
    _split_phase,
    costs_depth=False,
    guided=True,
)

RULES = (SPLIT_PHASE,)

__all__ = ["MAX_PHASES", "SPLIT_PHASE", "StridedPair", "strided_pairs"]
