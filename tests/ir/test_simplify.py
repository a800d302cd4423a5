"""Tests of the simplifier and of ``index_range`` (``tvm_ollie.ir.simplify``)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from index_eval import (
    RANGES,
    I,
    J,
    K,
    index_trees,
    nonaffine_trees,
    pure_affine_trees,
    values,
)
from strategies import conv_like_scopes, scopes

from tvm_ollie.ir import affine, simplify as simplify_module
from tvm_ollie.ir.interp import evaluate, random_inputs
from tvm_ollie.ir.nodes import Access, BinOp, Call, Const, IterVar, Scope, Tensor, Var
from tvm_ollie.ir.simplify import index_range, simplify

N, H, W, F, C, R, S = (Var(x) for x in "nhwfcrs")


def conv3x3():
    a = Tensor("A", (1, 7, 7, 8), pad=[0, 1, 1, 0])
    k = Tensor("K", (3, 3, 8, 8))
    return Scope([IterVar(N, 0, 1), IterVar(H, 0, 7), IterVar(W, 0, 7), IterVar(F, 0, 8)],
                 [IterVar(C, 0, 8), IterVar(R, 0, 3), IterVar(S, 0, 3)],
                 a[N, H + R - 1, W + S - 1, C] * k[R, S, F, C])


def clear_caches(*roots):
    """Cold caches: of every live node, or (cheaper after other tests left many nodes alive)
    of the nodes reachable from ``roots``."""
    affine.clear_cache(roots or None)
    simplify_module.clear_cache(roots or None)


# -- index expressions -----------------------------------------------------------------------


def test_split_merge():
    for k in range(2, 9):
        assert simplify(k * (I // k) + I % k) is I
        assert simplify(I % k + (I // k) * k) is I
    assert simplify(8 * (I // 8) + 2 * ((I % 8) // 2) + I % 2) is I


def test_range_rules():
    ranges = {H: (0, 7), R: (0, 3)}
    assert simplify(H // 8, ranges) is Const(0)
    assert simplify(H % 8, ranges) is H
    assert simplify((H + 8) // 8, ranges) is Const(1)
    assert simplify((H + 8) % 8, ranges) is H
    assert str(simplify((H + R + 7) // 16, ranges)) == "0"
    assert str(simplify((H + R + 8) // 16, ranges)) == "(h + r + 8) // 16"
    assert str(simplify((H - 10) // 4, ranges)) == "(h + 2) // 4 - 3"
    assert str(simplify((H + 4) // 4, {H: (0, 4)})) == "1"
    assert str(simplify((4 * W + H) // 4, {H: (0, 4)})) == "w"
    assert str(simplify((4 * W + H) % 4, {H: (0, 4)})) == "h"
    assert str(simplify((H % 16) // 4 * 4 + H % 4, {H: (0, 16)})) == "h"
    # without ranges only the range-free identities apply
    assert str(simplify(H // 8)) == "h // 8"
    assert str(simplify(H % 8, {R: (0, 3)})) == "h % 8"


def test_nested_div_mod_rules():
    assert str(simplify((I // 2) // 4)) == "i // 8"
    assert str(simplify((I % 12) % 4)) == "i % 4"
    assert str(simplify((I % 12) % 5)) == "i % 12 % 5"
    assert str(simplify((3 * I + 6) // 3)) == "i + 2"
    assert str(simplify((3 * I + 7) % 3)) == "1"


def test_non_affine_index_expressions():
    assert simplify(I * J + 0) is I * J
    assert str(simplify(I * J + 4 * (K // 4) + K % 4)) == "i * j + k"
    assert simplify(I * J * 1) is I * J
    assert simplify((I * J) * 0) is Const(0)
    assert simplify(I * J) is I * J


def test_float_bodies_keep_semantics():
    a = Tensor("A", (4,))
    x = a[I]
    assert simplify(x * 1.0) is x
    assert simplify(Const(1.0) * x) is x
    assert simplify(x + 0.0) is x
    assert simplify(Const(0.0) + x) is x
    assert simplify(x - 0.0) is x
    assert simplify(x / 1.0) is x
    assert simplify(x * 0.0) is Const(0.0)
    # not identities: kept as written
    assert simplify(x * 2.0) is x * 2.0
    assert simplify(Const(0.0) - x) is Const(0.0) - x
    assert simplify(Const(1.5) + Const(2.5)) is Const(1.5) + Const(2.5)
    assert simplify(Call("exp", (x + 0.0,))) is Call("exp", (x,))


def test_comparisons_and_select():
    a = Tensor("A", (8,), pad=[(1, 0)])
    ranges = {H: (0, 7)}
    assert simplify(BinOp("<", H, Const(7)), ranges) is Const(1)
    assert simplify(BinOp(">=", H, Const(7)), ranges) is Const(0)
    assert simplify(BinOp("<", H, Const(3)), ranges) is BinOp("<", H, Const(3))
    guarded = Call("select", (BinOp("<", H + 1, Const(9)), a[H - 1], Const(0.0)))
    assert simplify(guarded, ranges) is a[H - 1]
    unguarded = Call("select", (BinOp(">", H, Const(0)), a[H - 1], Const(0.0)))
    assert simplify(unguarded, ranges) is unguarded
    both = BinOp("and", BinOp("<", H, Const(100)), BinOp(">", H, Const(0)))
    assert simplify(both, ranges) is BinOp(">", H, Const(0))


def test_scope_indices_and_nested_scopes():
    a = Tensor("A", (16,))
    inner = Scope([IterVar(J, 0, 16)], [], a[4 * (J // 4) + J % 4])
    outer = Scope([IterVar(I, 0, 4)], [IterVar(K, 0, 4)], Access(inner, (I * 4 + K,)) * 1.0)
    out = simplify(outer)
    assert str(out).startswith("L<i:0:4> Σ<k:0:4> { (L<j:0:16> { A[j] })[4 * i + k] }")
    assert simplify(out) is out


def test_conv_is_canonical_and_cached():
    conv = conv3x3()
    out = simplify(conv)
    assert str(out).split(" where ")[0] == (
        "L<n:0:1, h:0:7, w:0:7, f:0:8> Σ<c:0:8, r:0:3, s:0:3> "
        "{ A<pad=[0, 1, 1, 0]>[n, h + r - 1, s + w - 1, c] * K[r, s, f, c] }")
    assert simplify(conv) is out
    clear_caches()
    assert simplify(conv) is out


def test_index_range_hand_cases():
    ranges = {H: (0, 7), R: (0, 3), W: (-2, 2)}
    assert index_range(H + R - 1, ranges) == (-1, 7)
    assert index_range(H - 2 * R, ranges) == (-4, 6)
    assert index_range(W * 3, ranges) == (-6, 3)
    assert index_range((H + R) // 2, ranges) == (0, 4)
    assert index_range((H + R) % 4, ranges) == (0, 3)
    assert index_range((2 * H + 1) % 4, ranges) == (1, 3)
    assert index_range(H % 8, ranges) == (0, 6)
    assert index_range(H * W, ranges) == (-12, 6)
    assert index_range(H // (R + 1), ranges) == (0, 6)
    assert index_range(Const(5), {}) == (5, 5)
    with pytest.raises(ValueError, match="without a range"):
        index_range(H + R, {H: (0, 7)})
    with pytest.raises(ValueError):
        index_range(H // R, ranges)  # the divisor can be zero
    with pytest.raises(ValueError):
        index_range(Const(1.5), {})
    with pytest.raises(ValueError, match="empty range"):
        index_range(H, {H: (3, 3)})


# -- properties ------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(index_trees)
def test_simplify_preserves_values(expr):
    out = simplify(expr, RANGES)
    assert values(out, RANGES) == values(expr, RANGES)


@settings(max_examples=300, deadline=None)
@given(index_trees)
def test_simplify_is_idempotent(expr):
    once = simplify(expr, RANGES)
    clear_caches(expr, once)
    assert simplify(once, RANGES) is once
    assert simplify(simplify(expr)) is simplify(expr)


@settings(max_examples=300, deadline=None)
@given(index_trees)
def test_index_range_is_sound(expr):
    lo, hi = index_range(expr, RANGES)
    vals = values(expr, RANGES)
    assert lo <= min(vals) and max(vals) <= hi


@settings(max_examples=300, deadline=None)
@given(nonaffine_trees)
def test_non_affine_simplify_preserves_values_and_is_idempotent(expr):
    out = simplify(expr, RANGES)
    assert values(out, RANGES) == values(expr, RANGES)
    clear_caches(expr, out)
    assert simplify(out, RANGES) is out
    lo, hi = index_range(expr, RANGES)
    vals = values(expr, RANGES)
    assert lo <= min(vals) and max(vals) <= hi


@settings(max_examples=200, deadline=None)
@given(pure_affine_trees)
def test_index_range_is_exact_for_affine(expr):
    vals = values(expr, RANGES)
    assert index_range(expr, RANGES) == (min(vals), max(vals))


@settings(max_examples=200, deadline=None)
@given(index_trees, st.sampled_from((I, J, K)), st.integers(2, 5))
def test_index_range_exact_for_single_div_mod(expr, var, k):
    # (affine with each iterator once) // k and % k: exact
    base = var * 2 + (J if var is not J else K) - 1
    for node in (base // k, base % k):
        vals = values(node, RANGES)
        assert index_range(node, RANGES) == (min(vals), max(vals))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scopes(max_depth=2, max_extent=4))
def test_simplify_scope_preserves_value(scope):
    out = simplify(scope)
    inputs = random_inputs(scope, seed=1)
    np.testing.assert_allclose(evaluate(out, inputs, dtype="float64"),
                               evaluate(scope, inputs, dtype="float64"), rtol=1e-9, atol=1e-9)
    clear_caches(scope, out)
    assert simplify(out) is out


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conv_like_scopes())
def test_simplify_conv_like_preserves_value(scope):
    out = simplify(scope)
    inputs = random_inputs(scope, seed=2)
    np.testing.assert_allclose(evaluate(out, inputs, dtype="float64"),
                               evaluate(scope, inputs, dtype="float64"), rtol=1e-9, atol=1e-9)
