"""Tests of the affine normal form of index expressions (``tvm_ollie.ir.affine``)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from index_eval import RANGES, I, J, K, index_trees, split_merge_exprs, values
from strategies import index_exprs

from tvm_ollie.ir.affine import Affine, to_affine
from tvm_ollie.ir.nodes import Access, BinOp, Call, Const, Tensor, Var

H, R, W, S = Var("h"), Var("r"), Var("w"), Var("s")


def text(node):
    return str(to_affine(node))


# -- hand cases ------------------------------------------------------------------------------


def test_collects_like_terms_and_orders_canonically():
    assert text(H + R - 1) == "h + r - 1"
    assert text(R - 1 + H) == "h + r - 1"
    assert text(W + S - 1) == "s + w - 1"
    assert text(H + H + 2 * R - R) == "2 * h + r"
    assert text(H - H) == "0"
    assert text(Const(3) - H) == "3 - h"
    assert text(Const(0) - H - R) == "-1 * h - r"
    assert text(2 * (H + 3) - 6) == "2 * h"


def test_affine_fields():
    aff = to_affine(3 * H - R + 4)
    assert aff.const == 4
    assert aff.terms == ((H, 3), (R, -1))
    assert aff.coeff(H) == 3 and aff.coeff(R) == -1 and aff.coeff(W) == 0
    assert aff.vars() == frozenset((H, R))
    assert to_affine((H + W) // 2 + R).vars() == frozenset((H, R, W))
    assert to_affine((H + W) // 2).coeff(H) == 0


def test_not_affine():
    a = Tensor("A", (4,))
    assert to_affine(H * R) is None
    assert to_affine(H // R) is None
    assert to_affine(H % Const(0)) is None
    assert to_affine(H // Const(-2)) is None
    assert to_affine(Const(1.5)) is None
    assert to_affine(H + Const(1.0)) is None
    assert to_affine(Access(a, (H,))) is None
    assert to_affine(Call("abs", (H,))) is None
    assert to_affine(BinOp("<", H, R)) is None
    assert to_affine(BinOp("/", H, Const(2))) is None


def test_products_with_constants_are_affine():
    assert text((H + 1) * 3) == "3 * h + 3"
    assert text(Const(2) * (Const(3) * H)) == "6 * h"
    assert text(H * (Const(2) - 2)) == "0"


def test_split_merges_back():
    for k in range(2, 9):
        assert to_affine(k * (H // k) + H % k) == to_affine(H)
        assert to_affine(H % k + (H // k) * k) == to_affine(H)
    # two levels of splitting
    assert to_affine(8 * (H // 8) + 2 * ((H % 8) // 2) + H % 2) == to_affine(H)
    # a scaled split, and one of a compound expression
    assert to_affine(12 * ((H + R) // 4) + 3 * ((H + R) % 4)) == to_affine(3 * H + 3 * R)


def test_div_mod_normalization():
    assert text((2 * H + R) // 2) == "h + r // 2"
    assert text((4 * H + R) % 4) == "r % 4"
    assert text((H + 3) // 2) == "(h + 1) // 2 + 1"
    assert text((H - 1) % 4) == "(h + 3) % 4"
    assert text((2 * H + 2) // 4) == "(h + 1) // 2"
    assert text((2 * H + 1) % 4) == "2 * (h % 2) + 1"
    assert text((H // 2) // 4) == "h // 8"
    assert text(((H // 2) + 1) // 4) == "(h + 2) // 8"
    assert text((H % 8) % 4) == "h % 4"
    assert text((H % 4) % 8) == "h % 4"
    assert text((H % 8) // 2) == "h // 2 % 4"
    assert text((H % 4) // 4) == "0"
    assert text(H // 1) == "h"
    assert text(H % 1) == "0"
    assert text(Const(-7) // 2) == "-4"
    assert text(Const(-7) % 2) == "1"
    # coefficients that are not multiples stay inside the atom
    assert text((3 * H) // 2) == "3 * h // 2"
    assert text((H - R) // 2) == "(h - r) // 2"


def test_mixed_div_and_mod_order():
    assert text(H % 4 + 4 * (H // 4) + R) == "h + r"
    assert text(H % 4 + H // 4) == "h // 4 + h % 4"


def test_arithmetic():
    a, b = to_affine(H + 2 * R), to_affine(R - 3)
    assert a + b == to_affine(H + 3 * R - 3)
    assert a - b == to_affine(H + R + 3)
    assert a * 2 == to_affine(2 * H + 4 * R) == 2 * a == a.scale(2)
    assert -a == to_affine(Const(0) - H - 2 * R)
    assert a + 5 == to_affine(H + 2 * R + 5)
    assert 1 - b == to_affine(4 - R)
    assert (a - a).is_const and (a - a).const == 0
    # arithmetic keeps the merge rule
    assert to_affine(4 * (H // 4)) + to_affine(H % 4) == to_affine(H)


def test_floordiv_floormod_with_bounds():
    bounds = {H: (0, 6), R: (0, 1)}
    assert str(to_affine(H + R).floordiv(8, bounds)) == "0"
    assert str(to_affine(H + R - 1).floordiv(8, bounds)) == "(h + r + 7) // 8 - 1"
    assert str(to_affine(H + R + 8).floordiv(8, bounds)) == "1"
    assert str(to_affine(H + R + 1).floormod(16, bounds)) == "h + r + 1"
    assert str(to_affine(H + R + 16).floormod(16, bounds)) == "h + r"
    assert str(to_affine(H).floordiv(4, bounds)) == "h // 4"
    assert str(to_affine(H).floordiv(4)) == "h // 4"
    with pytest.raises(ValueError):
        to_affine(H).floordiv(0)


def test_bounds():
    assert to_affine(H + R - 1).bounds({H: (0, 6), R: (0, 2)}) == (-1, 7)
    assert to_affine(H - 2 * R).bounds({H: (0, 6), R: (0, 2)}) == (-4, 6)
    assert to_affine(H + R).bounds({H: (0, 6)}) is None
    assert to_affine(H % 4).bounds() == (0, 3)
    assert to_affine((2 * H + R) % 4 + 1).bounds() == (1, 4)
    assert to_affine(H // 4).bounds({H: (-5, 9)}) == (-2, 2)


def test_to_node_round_trip_and_readability():
    for expr in (H + R - 1, Const(3) - H, Const(0) - 2 * H, H - R, Const(-5), 4 * H + R // 3 - 7):
        aff = to_affine(expr)
        node = aff.to_node()
        assert to_affine(node) == aff
        assert node is aff.to_node()  # interned: the same text is the same node
    assert str(to_affine(Const(0) - 2 * H + 1).to_node()) == "1 - 2 * h"


def test_constructor_and_immutability():
    aff = Affine(3, [(R, 1), (H, 2), (R, -1), (W, 0)])
    assert aff.terms == ((H, 2),) and aff.const == 3
    assert Affine(0, {H: 1}) == to_affine(H)
    assert hash(Affine(0, {H: 1})) == hash(to_affine(H))
    with pytest.raises(AttributeError):
        aff.const = 4
    with pytest.raises(TypeError):
        Affine(0, [(Const(2), 1)])
    with pytest.raises(TypeError):
        Affine(0, [(H * R, 1)])


def test_results_are_cached_on_nodes():
    expr = 3 * H + (R % 4) * 2
    assert to_affine(expr) is to_affine(expr)


# -- properties ------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(index_trees)
def test_normal_form_preserves_values(expr):
    aff = to_affine(expr)
    assert aff is not None
    assert values(aff.to_node(), RANGES) == values(expr, RANGES)


@settings(max_examples=300, deadline=None)
@given(index_trees)
def test_normal_form_is_a_fixed_point(expr):
    aff = to_affine(expr)
    node = aff.to_node()
    assert to_affine(node) == aff
    assert aff.to_node() is node


@settings(max_examples=200, deadline=None)
@given(split_merge_exprs())
def test_split_always_merges(case):
    expr, e, c, rest = case
    expected = to_affine(e) * c
    if rest is not None:
        expected = expected + to_affine(rest)
    assert to_affine(expr) == expected


@settings(max_examples=200, deadline=None)
@given(index_trees, index_trees, st.integers(-3, 3))
def test_arithmetic_matches_values(a, b, factor):
    fa, fb = to_affine(a), to_affine(b)
    assert values((fa + fb).to_node(), RANGES) == values(a + b, RANGES)
    assert values((fa - fb).to_node(), RANGES) == values(a - b, RANGES)
    assert values((fa * factor).to_node(), RANGES) == values(a * factor, RANGES)


@settings(max_examples=200, deadline=None)
@given(index_trees, st.integers(1, 7))
def test_bounds_are_sound(expr, k):
    bounds = {v: (b, e - 1) for v, (b, e) in RANGES.items()}
    for node in (expr, expr // k, expr % k):
        aff = to_affine(node)
        lo, hi = aff.bounds(bounds)
        vals = values(node, RANGES)
        assert lo <= min(vals) and max(vals) <= hi


@settings(max_examples=100, deadline=None)
@given(index_exprs({I: RANGES[I], J: RANGES[J], K: RANGES[K]}))
def test_shared_strategy_values(expr):
    assert values(to_affine(expr).to_node(), RANGES) == values(expr, RANGES)
