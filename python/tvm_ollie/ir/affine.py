"""Integer-affine normal form of index expressions.

An index expression is turned into ``const + Σ coeff * atom`` where an atom is an iterator
(:class:`Var`) or a floor division / floor modulo of a canonical sub-expression by a positive
constant (``BinOp('//' | '%', inner, Const(k))``). The form is canonical: like terms are
collected, zero coefficients dropped, terms sorted by a stable key of their atom (iterators by
name first, then div/mod atoms by their inner expression, ``e // k`` before ``e % k``), and the
inner expression of every div/mod atom is itself canonical.

Normalization applies only identities that hold for all integer values of the iterators, so it
needs no ranges:

* ``(k*a + b) // k -> a + b // k`` and ``(k*a + b) % k -> b % k`` (terms whose coefficient is a
  multiple of ``k`` leave the atom; the constant is reduced into ``[0, k)``);
* ``(g*a + c) // (g*m) -> (a + c // g) // m`` and ``(g*a + c) % (g*m) -> g*((a + c//g) % m) +
  c % g`` where ``g`` divides every coefficient and ``k``;
* ``(e // a + c) // b -> (e + c*a) // (a*b)``; ``(e % m) // b -> (e // b) % (m / b)`` when ``b``
  divides ``m``; ``(e % m) % k -> e % k`` when ``k`` divides ``m``;
* ``c*(e % m) + c*m*(e // m) -> c*e`` (the identity ``e = m*(e//m) + e%m``);
* with iterator bounds (``bounds``, also the bounds that hold for every value, e.g.
  ``0 <= e % m < m``): ``e // k -> q`` and ``e % k -> e - q*k`` when ``e`` lies within the single
  block ``[q*k, (q+1)*k)``.

Coefficients that are not multiples of ``k`` are deliberately left inside the atom (``(3*i) // 2``
stays as it is, not ``i + i // 2``): splitting them loosens interval bounds and hides the
"within one block" simplification. The normal form is therefore canonical for the rules above,
not a decision procedure for equality of arbitrary div/mod expressions.

Results are cached per node (in the node's own cache, so they live exactly as long as the node).
"""

from __future__ import annotations

from math import gcd
from typing import Dict, FrozenSet, Iterable, Mapping, Optional, Tuple, Union

from .nodes import BinOp, Const, Node, Var, iter_nodes, live_nodes

#: Inclusive integer bounds ``(lo, hi)`` of an iterator or expression.
Bounds = Tuple[int, int]
Atom = Node

_MISSING = object()
_NO_BOUNDS: Dict[Var, Bounds] = {}
_CACHE_AFFINE = "affine"
_CACHE_KEY = "affine.key"

_setattr = object.__setattr__


class Affine:
    """An immutable integer-affine form ``const + Σ coeff * atom`` in canonical order.

    Parameters
    ----------
    const : int
        The constant term.
    terms : iterable of (atom, int) or mapping atom -> int
        Atoms (a :class:`Var` or ``BinOp('//'|'%', inner, Const(k > 0))``) with coefficients;
        repeated atoms are summed, zero coefficients dropped and the terms sorted canonically.
        Use :func:`to_affine` to get the normal form of an expression: this constructor does
        not rewrite the atoms themselves.
    """

    __slots__ = ("const", "terms")

    const: int
    terms: Tuple[Tuple[Atom, int], ...]

    def __init__(self, const: int = 0, terms: Union[Iterable, Mapping] = ()) -> None:
        acc: Dict[Atom, int] = {}
        items = terms.items() if isinstance(terms, Mapping) else terms
        for atom, coeff in items:
            _check_atom(atom)
            acc[atom] = acc.get(atom, 0) + int(coeff)
        _setattr(self, "const", int(const))
        _setattr(self, "terms", _sorted_terms(acc))

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("Affine forms are immutable")

    # -- queries -------------------------------------------------------------------------------
    @property
    def is_const(self) -> bool:
        """True when the form has no terms."""
        return not self.terms

    def coeff(self, var: Atom) -> int:
        """Top-level coefficient of ``var`` (or of a div/mod atom); 0 when absent.

        Occurrences inside div/mod atoms are not counted: ``(i + j) // 2`` has ``coeff(i) == 0``.
        """
        for atom, c in self.terms:
            if atom is var:
                return c
        return 0

    def vars(self) -> FrozenSet[Var]:
        """Every iterator the form depends on, inside div/mod atoms included."""
        out = set()
        for atom, _ in self.terms:
            if type(atom) is Var:
                out.add(atom)
            else:
                out |= to_affine(atom.a).vars()
        return frozenset(out)

    def atoms(self) -> Tuple[Atom, ...]:
        """The atoms in canonical order."""
        return tuple(atom for atom, _ in self.terms)

    # -- arithmetic ----------------------------------------------------------------------------
    def add(self, other: Union["Affine", int]) -> "Affine":
        """``self + other`` in normal form."""
        if isinstance(other, int):
            return _new(self.const + other, self.terms) if other else self
        return _merge(_combine(self, other, 1))

    def sub(self, other: Union["Affine", int]) -> "Affine":
        """``self - other`` in normal form."""
        if isinstance(other, int):
            return _new(self.const - other, self.terms) if other else self
        return _merge(_combine(self, other, -1))

    def scale(self, factor: int) -> "Affine":
        """``factor * self``."""
        return _scale(self, int(factor))

    def floordiv(self, k: int, bounds: Optional[Mapping[Var, Bounds]] = None) -> "Affine":
        """``self // k`` in normal form; ``bounds`` maps iterators to INCLUSIVE ``(lo, hi)``."""
        if k <= 0:
            raise ValueError(f"floordiv by a non-positive constant {k}")
        return _div(self, int(k), bounds or _NO_BOUNDS)

    def floormod(self, k: int, bounds: Optional[Mapping[Var, Bounds]] = None) -> "Affine":
        """``self % k`` in normal form; ``bounds`` maps iterators to INCLUSIVE ``(lo, hi)``."""
        if k <= 0:
            raise ValueError(f"floormod by a non-positive constant {k}")
        return _mod(self, int(k), bounds or _NO_BOUNDS)

    def bounds(self, bounds: Optional[Mapping[Var, Bounds]] = None) -> Optional[Bounds]:
        """Inclusive interval of the form's values, or None when an iterator is unbounded.

        Each atom is bounded on its own (interval arithmetic), so the result is exact when every
        iterator occurs once, and conservative when atoms share iterators.
        """
        return affine_bounds(self, bounds or _NO_BOUNDS)

    def __add__(self, other: Union["Affine", int]) -> "Affine":
        return self.add(other)

    __radd__ = __add__

    def __sub__(self, other: Union["Affine", int]) -> "Affine":
        return self.sub(other)

    def __rsub__(self, other: int) -> "Affine":
        return _scale(self, -1).add(other)

    def __mul__(self, factor: int) -> "Affine":
        if not isinstance(factor, int):
            return NotImplemented
        return _scale(self, factor)

    __rmul__ = __mul__

    def __neg__(self) -> "Affine":
        return _scale(self, -1)

    # -- identity and text ---------------------------------------------------------------------
    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Affine):
            return NotImplemented
        return self.const == other.const and self.terms == other.terms

    def __hash__(self) -> int:
        return hash((self.const, self.terms))

    def to_node(self) -> Node:
        """A canonical node: positive terms, then subtracted negative terms, then the constant.

        ``h + r - 1``; ``2 * h - w + 3``; a form with only negative terms starts with the
        constant when it is positive (``3 - h``) and otherwise with ``-k * atom``.
        """
        pos = [(a, c) for a, c in self.terms if c > 0]
        neg = [(a, -c) for a, c in self.terms if c < 0]
        const = self.const
        node = None
        for atom, c in pos:
            term = atom if c == 1 else BinOp("*", Const(c), atom)
            node = term if node is None else BinOp("+", node, term)
        if node is None and neg:
            if const > 0:
                node, const = Const(const), 0
            else:
                atom, c = neg.pop(0)
                node = BinOp("*", Const(-c), atom)
        for atom, c in neg:
            node = BinOp("-", node, atom if c == 1 else BinOp("*", Const(c), atom))
        if node is None:
            return Const(const)
        if const > 0:
            return BinOp("+", node, Const(const))
        if const < 0:
            return BinOp("-", node, Const(-const))
        return node

    def __str__(self) -> str:
        return str(self.to_node())

    def __repr__(self) -> str:
        return f"Affine({self.to_node()})"


def to_affine(node: Node) -> Optional[Affine]:
    """The affine normal form of an integer index expression, or None if it is not affine.

    None for float constants, tensor reads, calls, comparisons, products of two non-constant
    expressions, and division or modulo by anything but a positive integer constant.
    """
    cache = node._cache
    hit = cache.get(_CACHE_AFFINE, _MISSING)
    if hit is _MISSING:
        hit = _build(node)
        cache[_CACHE_AFFINE] = hit
    return hit


def affine_bounds(aff: Affine, bounds: Mapping[Var, Bounds]) -> Optional[Bounds]:
    """Inclusive ``(lo, hi)`` of ``aff`` given inclusive iterator bounds, None if unbounded.

    Iterators missing from ``bounds`` are unbounded, but ``e % k`` is always within ``[0, k)``
    (refined to the residues it can take when the coefficients of ``e`` share a factor with k).
    """
    lo = hi = aff.const
    for atom, c in aff.terms:
        if type(atom) is Var:
            r = bounds.get(atom)
        else:
            r = _atom_bounds(atom, bounds)
        if r is None:
            return None
        if c > 0:
            lo += c * r[0]
            hi += c * r[1]
        else:
            lo += c * r[1]
            hi += c * r[0]
    return lo, hi


def clear_cache(roots: Optional[Iterable[Node]] = None) -> None:
    """Forget cached affine forms (for tests and benchmarks of cold behaviour): of every live
    node, or of the nodes reachable from ``roots``."""
    nodes = live_nodes() if roots is None else {
        id(n): n for root in roots for n in iter_nodes(root)}.values()
    for node in nodes:
        node._cache.pop(_CACHE_AFFINE, None)
        node._cache.pop(_CACHE_KEY, None)


# ---------------------------------------------------------------------------------------------
# Internals. Terms are tuples of (atom, coeff) in canonical order; every helper returns a
# normalized Affine.


def _new(const: int, terms: tuple) -> Affine:
    obj = object.__new__(Affine)
    _setattr(obj, "const", const)
    _setattr(obj, "terms", terms)
    return obj


def _const(value: int) -> Affine:
    return _new(value, ())


def _atom(atom: Atom, coeff: int = 1) -> Affine:
    return _new(0, ((atom, coeff),))


def _check_atom(atom: object) -> None:
    if type(atom) is Var:
        return
    if (
        type(atom) is BinOp
        and atom.op in ("//", "%")
        and type(atom.b) is Const
        and isinstance(atom.b.value, int)
        and atom.b.value > 0
        and to_affine(atom.a) is not None
    ):
        return
    raise TypeError(f"not an affine atom: {atom!r}")


def _atom_key(atom: Atom) -> tuple:
    """Stable sort key: iterators by name, then div/mod atoms by inner form, divisor, op."""
    cache = atom._cache
    key = cache.get(_CACHE_KEY)
    if key is None:
        if type(atom) is Var:
            key = (0, atom._args[0])
        else:
            inner = to_affine(atom.a)
            inner_key = tuple((_atom_key(a), c) for a, c in inner.terms)
            key = (1, inner_key, inner.const, atom.b.value, 0 if atom.op == "//" else 1)
        cache[_CACHE_KEY] = key
    return key


def _item_key(item: tuple) -> tuple:
    return _atom_key(item[0])


def _sorted_terms(acc: Dict[Atom, int]) -> tuple:
    items = [(a, c) for a, c in acc.items() if c]
    if len(items) > 1:
        items.sort(key=_item_key)
    return tuple(items)


def _from_dict(const: int, acc: Dict[Atom, int]) -> Affine:
    return _new(const, _sorted_terms(acc))


def _combine(a: Affine, b: Affine, sign: int) -> Affine:
    """``a + sign * b`` with like terms collected (no div/mod merging)."""
    if not b.terms:
        return _new(a.const + sign * b.const, a.terms)
    if not a.terms and sign == 1:
        return _new(a.const + b.const, b.terms)
    acc = dict(a.terms)
    for atom, c in b.terms:
        acc[atom] = acc.get(atom, 0) + sign * c
    return _from_dict(a.const + sign * b.const, acc)


def _scale(a: Affine, factor: int) -> Affine:
    if factor == 1:
        return a
    if factor == 0:
        return _const(0)
    return _new(a.const * factor, tuple((atom, c * factor) for atom, c in a.terms))


def _build(node: Node) -> Optional[Affine]:
    kind = type(node)
    if kind is Var:
        return _atom(node)
    if kind is Const:
        return _const(node.value) if node.dtype.startswith("int") else None
    if kind is not BinOp:
        return None
    op = node.op
    if op not in ("+", "-", "*", "//", "%"):
        return None
    a = to_affine(node.a)
    if a is None:
        return None
    b = to_affine(node.b)
    if b is None:
        return None
    if op == "+":
        return _merge(_combine(a, b, 1))
    if op == "-":
        return _merge(_combine(a, b, -1))
    if op == "*":
        if not b.terms:
            return _scale(a, b.const)
        if not a.terms:
            return _scale(b, a.const)
        return None
    if b.terms or b.const <= 0:
        return None
    if op == "//":
        return _div(a, b.const, _NO_BOUNDS)
    return _mod(a, b.const, _NO_BOUNDS)


def _is_mod(atom: Atom) -> bool:
    return type(atom) is BinOp and atom._args[0] == "%"


def _merge(aff: Affine) -> Affine:
    """Apply ``c*(e % m) + c*m*(e // m) -> c*e`` until no such pair is left."""
    while True:
        for atom, c in aff.terms:
            if not _is_mod(atom):
                continue
            m = atom.b.value
            quot = to_affine(BinOp("//", atom.a, Const(m)))
            if not quot.terms:
                continue
            coeffs = dict(aff.terms)
            if all(coeffs.get(q_atom) == c * m * qc for q_atom, qc in quot.terms):
                inner = to_affine(atom.a)
                del coeffs[atom]
                for q_atom, _ in quot.terms:
                    del coeffs[q_atom]
                const = aff.const - c * m * quot.const + c * inner.const
                for i_atom, ic in inner.terms:
                    coeffs[i_atom] = coeffs.get(i_atom, 0) + c * ic
                aff = _from_dict(const, coeffs)
                break
        else:
            return aff


def _div(e: Affine, k: int, bounds: Mapping[Var, Bounds]) -> Affine:
    """Normal form of ``e // k`` (k > 0)."""
    if k == 1:
        return e
    if not e.terms:
        return _const(e.const // k)
    # (k*a + b) // k -> a + b // k, constant reduced into [0, k).
    quot, rem = divmod(e.const, k)
    pulled = [(a, c // k) for a, c in e.terms if c % k == 0]
    if pulled or quot:
        rest = tuple((a, c) for a, c in e.terms if c % k)
        inner = _div(_new(rem, rest), k, bounds)
        return _merge(_combine(_new(quot, tuple(pulled)), inner, 1))
    # (g*a + c) // (g*m) -> (a + c // g) // m
    g = k
    for _, c in e.terms:
        g = gcd(g, c)
        if g == 1:
            break
    if g > 1:
        reduced = _new(e.const // g, tuple((a, c // g) for a, c in e.terms))
        return _div(reduced, k // g, bounds)
    if len(e.terms) == 1 and e.terms[0][1] == 1:
        atom = e.terms[0][0]
        if type(atom) is BinOp:
            inner = to_affine(atom.a)
            d = atom.b.value
            if atom.op == "//":  # (x // d + c) // k -> (x + c*d) // (d*k)
                return _div(inner.add(e.const * d), d * k, bounds)
            if e.const == 0 and d % k == 0:  # (x % d) // k -> (x // k) % (d / k)
                return _mod(_div(inner, k, bounds), d // k, bounds)
    rng = affine_bounds(e, bounds)
    if rng is not None and rng[0] // k == rng[1] // k:
        return _const(rng[0] // k)
    return _atom(BinOp("//", e.to_node(), Const(k)))


def _mod(e: Affine, k: int, bounds: Mapping[Var, Bounds]) -> Affine:
    """Normal form of ``e % k`` (k > 0)."""
    if k == 1:
        return _const(0)
    if not e.terms:
        return _const(e.const % k)
    # (x % m) % k -> x % k when k divides m (inside the sum).
    if any(_is_mod(a) and a.b.value % k == 0 for a, _ in e.terms):
        acc: Dict[Atom, int] = {}
        const = e.const
        for atom, c in e.terms:
            if _is_mod(atom) and atom.b.value % k == 0:
                inner = to_affine(atom.a)
                const += c * inner.const
                for i_atom, ic in inner.terms:
                    acc[i_atom] = acc.get(i_atom, 0) + c * ic
            else:
                acc[atom] = acc.get(atom, 0) + c
        return _mod(_merge(_from_dict(const, acc)), k, bounds)
    # (k*a + b) % k -> b % k, constant reduced into [0, k).
    rest = tuple((a, c) for a, c in e.terms if c % k)
    const = e.const % k
    if not rest:
        return _const(const)
    if const != e.const or len(rest) != len(e.terms):
        e = _new(const, rest)
    # (g*a + c) % (g*m) -> g*((a + c // g) % m) + c % g
    g = k
    for _, c in rest:
        g = gcd(g, c)
        if g == 1:
            break
    if g > 1:
        reduced = _new(const // g, tuple((a, c // g) for a, c in rest))
        return _scale(_mod(reduced, k // g, bounds), g).add(const % g)
    rng = affine_bounds(e, bounds)
    if rng is not None and rng[0] // k == rng[1] // k:
        return e.add(-(rng[0] // k) * k)
    return _atom(BinOp("%", e.to_node(), Const(k)))


def _atom_bounds(atom: Atom, bounds: Mapping[Var, Bounds]) -> Optional[Bounds]:
    inner = to_affine(atom.a)
    k = atom.b.value
    rng = affine_bounds(inner, bounds)
    if atom.op == "//":
        return None if rng is None else (rng[0] // k, rng[1] // k)
    if rng is not None and rng[0] // k == rng[1] // k:
        shift = (rng[0] // k) * k
        return rng[0] - shift, rng[1] - shift
    if rng is not None:
        residues = _residues(inner, k, bounds)
        if residues is not None:
            return residues
    # The inner value is congruent to its constant modulo d = gcd(coefficients, k).
    d = k
    for _, c in inner.terms:
        d = gcd(d, c)
        if d == 1:
            break
    low = inner.const % d
    return low, k - d + low


#: Work limit (k times the steps per iterator) for enumerating the residues of ``e % k``.
_RESIDUE_BUDGET = 4096


def _residues(inner: Affine, k: int, bounds: Mapping[Var, Bounds]) -> Optional[Bounds]:
    """Exact ``(min, max)`` of ``inner % k`` for a sum of bounded iterators, by enumerating the
    reachable residues; None when ``inner`` has div/mod atoms or the work would be too large.

    Interval arithmetic alone says ``[0, k)`` whenever ``inner`` spans two blocks, which is
    wider than the truth when the coefficients leave residues out (``(3*j + 1) % 4`` with
    ``j`` in ``{0, 1}`` only takes 1 and 0).
    """
    base = inner.const
    steps = []
    work = 0
    for atom, c in inner.terms:
        if type(atom) is not Var:
            return None
        lo, hi = bounds[atom]
        base += c * lo
        count = min(hi - lo + 1, k)
        work += k * count
        if work > _RESIDUE_BUDGET:
            return None
        if c % k:
            steps.append((c % k, count))
    reached = {base % k}
    for c, count in steps:
        reached = {(r + c * t) % k for r in reached for t in range(count)}
        if len(reached) == k:
            return 0, k - 1
    return min(reached), max(reached)
