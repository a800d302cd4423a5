"""Tests of the numeric equivalence check."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tvm_ollie.ir.nodes import Call, Const, IterVar, Scope, Tensor, Var
from tvm_ollie.verify.equivalence import EquivalenceResult, check_equivalent

n, h, w, f, c, r, s, i = (Var(x) for x in "nhwfcrsi")

A = Tensor("A", (1, 5, 5, 4), pad=[0, 1, 1, 0])
K = Tensor("K", (3, 3, 3, 4))
LOOPS = [IterVar("n", 0, 1), IterVar("h", 0, 5), IterVar("w", 0, 5), IterVar("f", 0, 3)]
RC, RR, RS = IterVar("c", 0, 4), IterVar("r", 0, 3), IterVar("s", 0, 3)
BODY = A[n, h + r - 1, w + s - 1, c] * K[r, s, f, c]
CONV = Scope(LOOPS, [RC, RR, RS], BODY)


def test_reordered_reduction_is_equivalent():
    reordered = Scope(LOOPS, [RS, RC, RR], K[r, s, f, c] * A[n, h + r - 1, w + s - 1, c])
    res = check_equivalent(CONV, reordered)
    assert res.ok and res and res.reason == ""
    assert res.max_abs_err < 1e-9


def test_split_nested_form_is_equivalent():
    # Σ_{r,s} (L<r,s,n,h,w,f> Σ_c A[...] * K[...])[r, s, n, h, w, f]
    inner = Scope([RR, RS] + LOOPS, [RC], BODY)
    split = Scope(LOOPS, [RR, RS], inner[r, s, n, h, w, f])
    res = check_equivalent(CONV, split, trials=3)
    assert res.ok, res.reason
    assert res.max_rel_err < 1e-9


def test_off_by_one_is_caught_by_the_integer_trial():
    wider = A.with_pad([0, 1, (1, 2), 0])
    shifted = Scope(LOOPS, [RC, RR, RS], wider[n, h + r - 1, w + s, c] * K[r, s, f, c])
    res = check_equivalent(CONV, shifted)
    assert not res.ok
    assert "integer inputs" in res.reason and "differ" in res.reason
    assert res.max_abs_err >= 1.0  # integer inputs: a real difference is at least one unit


def test_tiny_scale_error_is_caught_despite_loose_float_tolerance():
    scaled = Scope(LOOPS, [RC, RR, RS], BODY * 1.0000001)
    assert not check_equivalent(CONV, scaled, rtol=1e-3, atol=1e-3).ok
    # The float trials alone would accept it.
    ins = {"A": np.random.default_rng(0).uniform(-1, 1, A.shape),
           "K": np.random.default_rng(1).uniform(-1, 1, K.shape)}
    assert check_equivalent(CONV, scaled, rtol=1e-3, atol=1e-3, inputs=ins).ok


def test_out_of_bounds_read_is_not_equivalent():
    oob = Scope(LOOPS, [RC, RR, RS], A[n, h + r - 1, w + s + 1, c] * K[r, s, f, c])
    res = check_equivalent(CONV, oob)
    assert not res.ok
    assert "second expression reads out of bounds" in res.reason
    assert "w + s + 1" in res.reason and math.isinf(res.max_abs_err)
    res = check_equivalent(oob, CONV)
    assert not res.ok and "first expression" in res.reason


def test_shape_mismatch_and_conflicting_tensors():
    fewer = Scope(LOOPS[:3] + [IterVar("f", 0, 2)], [RC, RR, RS], BODY)
    res = check_equivalent(CONV, fewer)
    assert not res.ok and "shapes differ" in res.reason
    other_k = Tensor("K", (3, 3, 3, 5))
    conflicting = Scope(LOOPS, [RC, RR, RS], A[n, h + r - 1, w + s - 1, c] * other_k[r, s, f, c])
    res = check_equivalent(CONV, conflicting)
    assert not res.ok and "two shapes" in res.reason


def test_candidate_may_use_a_subset_of_inputs():
    X, Y = Tensor("X", (6,)), Tensor("Y", (6,))
    li = [IterVar("i", 0, 6)]
    a = Scope(li, [], X[i] + Y[i] * 2.0 - Y[i] - Y[i])
    b = Scope(li, [], X[i])
    assert check_equivalent(a, b).ok
    assert not check_equivalent(a, Scope(li, [], Y[i])).ok


def test_given_inputs_replace_random_trials():
    X = Tensor("X", (5,))
    li = [IterVar("i", 0, 5)]
    relu = Scope(li, [], Call("relu", (X[i],)))
    ident = Scope(li, [], X[i])
    assert not check_equivalent(relu, ident).ok
    assert check_equivalent(relu, ident, inputs={"X": np.arange(1.0, 6.0)}).ok


def test_non_finite_values_must_match():
    X = Tensor("X", (7,))
    li = [IterVar("i", 0, 7)]
    log = Scope(li, [], Call("log", (X[i],)))  # nan (negative) and -inf (zero) entries
    assert check_equivalent(log, Scope(li, [], Call("log", (X[i] * 1.0,)))).ok
    res = check_equivalent(log, Scope(li, [], Call("log", (Call("abs", (X[i],)),))))
    assert not res.ok and math.isinf(res.max_abs_err)


def test_trials_and_result_type():
    with pytest.raises(ValueError):
        check_equivalent(CONV, CONV, trials=0)
    res = check_equivalent(CONV, CONV, trials=1)
    assert isinstance(res, EquivalenceResult) and res.ok and res.max_abs_err == 0.0
    with pytest.raises(AttributeError):
        res.ok = False  # frozen


def test_scalar_expressions():
    X = Tensor("X", (3,))
    total = Scope([], [IterVar("i", 0, 3)], X[i])
    assert check_equivalent(total, Scope([], [IterVar("i", 0, 3)], X[2 - i])).ok
    assert not check_equivalent(total, X[Const(0)] * 3.0).ok
