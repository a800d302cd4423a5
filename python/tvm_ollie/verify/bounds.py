"""Static check that every subscript of an expression reads inside its source.

A tensor with padding ``(lo, hi)`` on a dimension of size ``n`` may be read at ``[-lo, n + hi)``;
a nested scope with loop ``[begin, end)`` and padding ``(lo, hi)`` at ``[begin - lo, end + hi)``
(loop-value coordinates). Each index is bounded over every value of the enclosing scope's
iterators with :func:`tvm_ollie.ir.simplify.index_range`.

Precision: the bounds are exact for affine indices in which each iterator occurs once (every
index the lifters and the usual rules produce), so there no read is missed and none is flagged
wrongly. For indices that use one iterator in several div/mod atoms, or that are not affine
(``i * j``), interval arithmetic is conservative: a read may be flagged although it stays inside
(a false alarm, never a missed violation).

Guards: the reference interpreter only requires the branch of ``select(c, a, b)`` that is taken
to read in bounds. The checker follows affine guards on the branch they protect: a comparison of
one iterator with a constant narrows that iterator's range (``select(h > 0, A[h - 1], 0)``), and
a comparison of an affine expression ``g`` with a constant bounds every index equal to ``±g`` plus
a constant (the padding guard ``select(h + r - 1 >= 0 and h + r - 1 < 7, A[h + r - 1], 0)``);
conjunctions (and negated disjunctions on the ``else`` side) combine. Other guards are ignored,
which can only produce false alarms.
"""

from __future__ import annotations

from typing import Dict, List, Mapping, Optional, Tuple

from ..ir.affine import Affine, to_affine
from ..ir.nodes import Access, BinOp, Call, Node, Scope, Tensor, Var, free_vars
from ..ir.printer import to_text
from ..ir.simplify import index_range

__all__ = ["check_bounds"]

Ranges = Dict[Var, Tuple[int, int]]
#: Guard facts: the non-constant part of an affine expression (sign-normalized terms) mapped
#: to inclusive bounds ``(lo, hi)`` (None for an open side).
Facts = Dict[tuple, Tuple[Optional[int], Optional[int]]]

_NEGATED = {"<": ">=", "<=": ">", ">": "<=", ">=": "<", "==": "!=", "!=": "=="}


def check_bounds(expr: Node, ranges: Optional[Mapping[Var, Tuple[int, int]]] = None
                 ) -> List[str]:
    """Human-readable out-of-bounds reads in ``expr`` (an empty list means every read is valid).

    Parameters
    ----------
    expr : Node
        Usually a :class:`Scope`; nested scopes are checked with their own iterators.
    ranges : Mapping[Var, (begin, end)], optional
        Half-open ranges of the free iterators of a bare (non-scope) expression.
    """
    checker = _Checker()
    if type(expr) is Scope:
        checker.scope(expr)
    else:
        bounds = {v: (int(b), int(e)) for v, (b, e) in (ranges or {}).items()}
        unbound = sorted(v.name for v in free_vars(expr) if v not in bounds)
        if unbound:
            return [f"cannot check {to_text(expr, where=False)}: iterators without a range: "
                    f"{unbound}"]
        checker.body(expr, bounds, {}, "")
    return list(dict.fromkeys(checker.problems))  # each message once, in order


class _Checker:
    def __init__(self) -> None:
        self.problems: List[str] = []
        self.checked: set = set()

    def scope(self, scope: Scope) -> None:
        if scope in self.checked:
            return
        self.checked.add(scope)
        ranges = {iv.var: (iv.begin, iv.end) for iv in scope.loops + scope.reduce}
        where = f" in L<{', '.join(iv.var.name for iv in scope.loops)}>"
        self.body(scope.body, ranges, {}, where)

    def body(self, node: Node, ranges: Ranges, facts: Facts, where: str) -> None:
        """Check the accesses below ``node`` at this scope level, under the given guards."""
        kind = type(node)
        if kind is Access:
            self.access(node, ranges, facts, where)
            if type(node.source) is Scope:
                self.scope(node.source)
            for index in node.indices:
                self.body(index, ranges, facts, where)
        elif kind is Scope:
            self.scope(node)
        elif kind is Call and node.func == "select":
            cond, then, other = node.args
            self.body(cond, ranges, facts, where)
            for branch, positive in ((then, True), (other, False)):
                guarded = _assume(cond, positive, ranges, facts)
                if guarded is not None:  # None: the branch is never taken
                    self.body(branch, guarded[0], guarded[1], where)
        elif kind in (BinOp, Call):
            for child in node.children:
                self.body(child, ranges, facts, where)

    def access(self, access: Access, ranges: Ranges, facts: Facts, where: str) -> None:
        source = access.source
        for dim, index in enumerate(access.indices):
            low, high = _readable(source, dim)
            try:
                lo, hi = index_range(index, ranges)
            except ValueError as err:
                self.problems.append(f"{to_text(access, where=False)}{where}: index {dim} "
                                     f"cannot be bounded ({err})")
                continue
            lo, hi = _apply_facts(index, lo, hi, facts)
            if lo < low or hi > high:
                self.problems.append(
                    f"{to_text(access, where=False)}{where}: index {dim} "
                    f"({to_text(index, where=False)}) takes values in [{lo}, {hi}] but "
                    f"{_source_name(source)} dimension {dim} is readable only in [{low}, {high}]"
                )


def _readable(source: Node, dim: int) -> Tuple[int, int]:
    """Inclusive readable interval of dimension ``dim`` of a tensor or nested scope."""
    lo_pad, hi_pad = source.pad[dim]
    if type(source) is Tensor:
        return -lo_pad, source.shape[dim] + hi_pad - 1
    loop = source.loops[dim]
    return loop.begin - lo_pad, loop.end + hi_pad - 1


def _source_name(source: Node) -> str:
    if type(source) is Tensor:
        return f"tensor {source.name}"
    return f"nested scope L<{', '.join(iv.var.name for iv in source.loops)}>"


# -- guards ------------------------------------------------------------------------------------


def _split(aff: Affine) -> Tuple[tuple, int, int]:
    """``aff = sign * part + const`` with ``part`` the sign-normalized non-constant terms."""
    sign = -1 if aff.terms and aff.terms[0][1] < 0 else 1
    part = tuple((atom, sign * c) for atom, c in aff.terms)
    return part, sign, aff.const


def _assume(cond: Node, positive: bool, ranges: Ranges, facts: Facts
            ) -> Optional[Tuple[Ranges, Facts]]:
    """Ranges and facts that hold where ``cond`` is ``positive``; None if that never happens."""
    ranges, facts = dict(ranges), dict(facts)
    for op, diff in _comparisons(cond, positive):
        lo, hi = {"<": (None, -1), "<=": (None, 0), ">": (1, None), ">=": (0, None),
                  "==": (0, 0)}[op]
        part, sign, const = _split(diff)
        if not part:  # a constant comparison
            if (lo is not None and const < lo) or (hi is not None and const > hi):
                return None
            continue
        # lo <= sign * part + const <= hi  ->  bounds on part
        lo, hi = (None if lo is None else lo - const), (None if hi is None else hi - const)
        if sign < 0:
            lo, hi = (None if hi is None else -hi), (None if lo is None else -lo)
        old_lo, old_hi = facts.get(part, (None, None))
        lo = lo if old_lo is None else (old_lo if lo is None else max(lo, old_lo))
        hi = hi if old_hi is None else (old_hi if hi is None else min(hi, old_hi))
        if lo is not None and hi is not None and lo > hi:
            return None
        facts[part] = (lo, hi)
        if len(part) == 1 and type(part[0][0]) is Var and part[0][0] in ranges:
            var, c = part[0]
            begin, end = ranges[var]
            if lo is not None:
                begin = max(begin, -(-lo // c))
            if hi is not None:
                end = min(end, hi // c + 1)
            if end <= begin:
                return None
            ranges[var] = (begin, end)
    return ranges, facts


def _comparisons(cond: Node, positive: bool) -> List[Tuple[str, Affine]]:
    """Affine comparisons ``diff OP 0`` implied by ``cond`` (or by its negation)."""
    if type(cond) is not BinOp:
        return []
    op = cond.op
    if (op == "and" and positive) or (op == "or" and not positive):
        return _comparisons(cond.a, positive) + _comparisons(cond.b, positive)
    if op not in _NEGATED:
        return []
    a, b = to_affine(cond.a), to_affine(cond.b)
    if a is None or b is None:
        return []
    if not positive:
        op = _NEGATED[op]
    return [] if op == "!=" else [(op, a.sub(b))]


def _apply_facts(index: Node, lo: int, hi: int, facts: Facts) -> Tuple[int, int]:
    if not facts:
        return lo, hi
    aff = to_affine(index)
    if aff is None or not aff.terms:
        return lo, hi
    part, sign, const = _split(aff)
    known = facts.get(part)
    if known is None:
        return lo, hi
    f_lo, f_hi = known
    if sign < 0:
        f_lo, f_hi = (None if f_hi is None else -f_hi), (None if f_lo is None else -f_lo)
    if f_lo is not None:
        lo = max(lo, f_lo + const)
    if f_hi is not None:
        hi = min(hi, f_hi + const)
    return lo, hi
