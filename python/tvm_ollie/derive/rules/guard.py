"""Guard solving: a summation guarded by a stride condition becomes a summation over its solutions.

A transposed convolution lifted in gather form (:mod:`tvm_ollie.lift.conv_transpose`) sums over
kernel taps ``r`` and keeps only those that land on the output row ``h``::

    Σ<r:rb:re> { select(E % s == 0 ∧ G, X[.., E // s, ..], 0) * K[.., r, ..] },  E = a·h ± r + c

Most taps fail the guard (``s - 1`` of every ``s``), and ``select`` is not a product of reads, so
no operator matches. :data:`SOLVE_GUARD` ("solve stride guard") changes the summation variable
to the quotient ``q = E / s`` the guard asks for. With ``E = b·r + ρ`` (``b = ±1``, ``ρ`` the rest of
``E``), ``E = s·q`` solves to ``r = b·(s·q − ρ)``, so::

    Σ<r:rb:re> select(E % s == 0 ∧ G, f(r, E // s), 0)
        =  Σ<q:⌈E_lo/s⌉:⌊E_hi/s⌋+1> select(G', f(b·(s·q − ρ), q), 0)

(``E_lo``, ``E_hi`` the bounds of ``E``; ``G'`` is ``G`` with ``r`` substituted; the select goes away
when ``G`` is empty). Each ``q`` is one ``r`` for which the guard holds, and every such ``r`` has
its ``q``; the ``q`` whose ``r`` falls outside ``[rb, re)`` must contribute nothing: the rule needs a
factor of the product that reads a zero-padded source at an index ``k·r + c'`` leaving the data
exactly when ``r`` leaves ``[rb, re)`` (the kernel read ``K[.., r, ..]``), and grows that source's
zero padding over the new index range. The result is the scatter form of the transposed
convolution, ``Σ<q> X[.., q, ..] · K[.., h + p − s·q, ..]``, which the other rules turn into a
matmul plus an offset-add eOperator.

The rule solves every solvable conjunct of a guard in one rewrite and is eager (costs no depth):
the solved form is equivalent, does less work (the taps that never land are gone) and is the
only one of the two that an operator can match, so it is part of a state's canonical form.
Guards whose tap coefficient is not ±1 (dilated transposed convolutions whose dilation shares a
factor with the stride) are left alone; so are guards on a ``max`` reduction (the 0 that a false
guard yields takes part in a maximum).
"""

from __future__ import annotations

from typing import Dict, Iterator, List, Optional, Tuple

from ...ir.nodes import Access, BinOp, Call, Const, IterVar, Node, Scope, Var, substitute
from ...ir.simplify import simplify
from .base import (
    Rewrite,
    Rule,
    RuleContext,
    body_accesses,
    build_linear,
    data_bounds,
    factors,
    fresh_vars,
    in_bounds,
    interval,
    iter_names,
    linear_form,
    scope_ranges,
    widen_pad,
    zero_padded,
)


def conjuncts(cond: Node) -> List[Node]:
    """The operands of a chain of ``and`` (``a and b and c`` -> ``[a, b, c]``)."""
    if isinstance(cond, BinOp) and cond.op == "and":
        return conjuncts(cond.a) + conjuncts(cond.b)
    return [cond]


def stride_condition(node: Node) -> Optional[Tuple[Node, int]]:
    """``(E - k, s)`` when ``node`` is ``E % s == k`` (either side) with ``0 <= k < s``, else None."""
    if not isinstance(node, BinOp) or node.op != "==":
        return None
    for mod, rhs in ((node.a, node.b), (node.b, node.a)):
        if (isinstance(mod, BinOp) and mod.op == "%" and isinstance(mod.b, Const)
                and isinstance(rhs, Const) and rhs.dtype.startswith("int")
                and mod.b.dtype.startswith("int") and 0 <= rhs.value < mod.b.value):
            e = mod.a if rhs.value == 0 else BinOp("-", mod.a, Const(rhs.value))
            return e, mod.b.value
    return None


def _is_zero(node: Node) -> bool:
    return isinstance(node, Const) and node.value == 0


def _guarded_select(body: Node) -> Optional[Call]:
    """The factor ``select(cond, then, 0)`` of a product body (the first one), or None."""
    for fac in factors(body):
        if isinstance(fac, Call) and fac.func == "select" and _is_zero(fac.args[2]):
            return fac
    return None


def _multiplicative_reads(body: Node, sel: Call) -> List[Access]:
    """Reads that multiply the whole body: product factors, and factors of the select's
    then-branch (its else-branch is 0, so a zero there zeroes the body too)."""
    out = [f for f in factors(body) if isinstance(f, Access)]
    out += [f for f in factors(sel.args[1]) if isinstance(f, Access)]
    return out


def vanishes_outside(reads: List[Access], var: Var, begin: int, end: int) -> bool:
    """True when some read is zero padding whenever ``var`` leaves ``[begin, end)``.

    The read's index on some dimension must be ``k·var + c`` (``var`` alone): it is monotone in
    ``var``, so it is enough that ``begin - 1`` and ``end`` already fall outside the data.
    """
    for acc in reads:
        if not zero_padded(acc.source):
            continue
        for idx, (dlo, dhi) in zip(acc.indices, data_bounds(acc.source)):
            lin = linear_form(idx)
            if lin is None or set(lin[0]) != {var}:
                continue
            k, c = lin[0][var], lin[1]
            below, above = k * (begin - 1) + c, k * end + c
            if k < 0:
                below, above = above, below
            if below < dlo and above > dhi:
                return True
    return False


def _solve_one(scope: Scope) -> Optional[Tuple[Scope, str]]:
    """Solve the first solvable stride conjunct of the scope's guard (see the module doc)."""
    sel = _guarded_select(scope.body)
    if sel is None:
        return None
    ranges = scope_ranges(scope)
    reds = {iv.var: iv for iv in scope.reduce}
    conds = conjuncts(sel.args[0])
    reads = _multiplicative_reads(scope.body, sel)
    for pos, cond in enumerate(conds):
        found = stride_condition(cond)
        if found is None:
            continue
        e, s = found
        lin = linear_form(e)
        if lin is None or s < 2:
            continue
        coeffs, const = lin
        for r, b in sorted(coeffs.items(), key=lambda vc: vc[0].name):
            iv = reds.get(r)
            if iv is None or abs(b) != 1:
                continue
            if not vanishes_outside(reads, r, iv.begin, iv.end):
                continue
            bounds = interval(e, ranges)
            if bounds is None:
                continue
            out = _substitute(scope, sel, conds, pos, r, b, coeffs, const, s, bounds)
            if out is not None:
                return out
    return None


def _substitute(scope, sel, conds, pos, r, b, coeffs, const, s, bounds):
    """The scope with ``r = b·(s·q − ρ)`` and conjunct ``pos`` dropped (None if out of bounds)."""
    q = fresh_vars(iter_names(scope), 1, prefix="q")[0]
    rest = {v: c for v, c in coeffs.items() if v is not r}
    r_coeffs: Dict[Var, int] = {q: b * s}
    for v, c in rest.items():
        r_coeffs[v] = -b * c
    r_value = build_linear(r_coeffs, -b * const)
    q_lo, q_hi = -(-bounds[0] // s), bounds[1] // s
    if q_lo > q_hi:
        return None
    others = [c for k, c in enumerate(conds) if k != pos]
    then = sel.args[1]
    if others:
        cond = others[0]
        for c in others[1:]:
            cond = BinOp("and", cond, c)
        new_sel: Node = Call("select", (cond, then, sel.args[2]))
    else:
        new_sel = then
    body = substitute(substitute(scope.body, {sel: new_sel}), {r: r_value})
    reduce = tuple(IterVar(q, q_lo, q_hi + 1) if iv.var is r else iv for iv in scope.reduce)
    new = simplify(scope.replace(reduce=reduce, body=body))
    new = widened(new)
    if new is None or not in_bounds(new):
        return None
    return new, f"solve guard on {r.name}: {r.name} = {r_value}, Σ {q.name} in [{q_lo}, {q_hi + 1})"


def widened(scope: Scope) -> Optional[Scope]:
    """Every read's source padded so that it covers the read's index range."""
    ranges = scope_ranges(scope)
    mapping: Dict[Node, Node] = {}
    for acc in body_accesses(scope.body):
        needed = [interval(idx, ranges) for idx in acc.indices]
        if any(n is None for n in needed):
            return None
        src = widen_pad(acc.source, needed)
        if src is None:
            return None
        if src is not acc.source:
            mapping[acc] = Access(src, acc.indices)
    if not mapping:
        return scope
    return scope.replace(body=substitute(scope.body, mapping))


def _solve_guard(scope: Scope, ctx: RuleContext) -> Iterator[Rewrite]:  # pylint: disable=unused-argument
    if scope.reducer != "sum" or not scope.reduce:
        return
    notes = []
    cur = scope
    for _ in range(8):  # one conjunct per spatial dimension; bounded for safety
        step = _solve_one(cur)
        if step is None:
            break
        cur, note = step
        notes.append(note)
    if notes:
        yield Rewrite(cur, "; ".join(notes))


SOLVE_GUARD = Rule(
    "solve_stride_guard", "guard",
    "Σ<r> select(E % s == 0 ∧ G, f(r, E // s), 0) = Σ<q> select(G', f(b*(s*q - ρ), q), 0), "
    "E = b*r + ρ, b = ±1, some factor of f is 0 for r outside its range",
    _solve_guard,
    costs_depth=False,
)

RULES = (SOLVE_GUARD,)
