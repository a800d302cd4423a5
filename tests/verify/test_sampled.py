"""Sampled verification agrees with the reference interpreter and catches wrong rewrites."""

import numpy as np
from hypothesis import given, settings
from strategies import conv_like_scopes, scopes

from tvm_ollie.ir.interp import evaluate, random_inputs
from tvm_ollie.ir.nodes import IterVar, Scope, Tensor, Var
from tvm_ollie.verify.sampled import (check_sampled, evaluate_points, sample_positions, work)


def _all_points(scope):
    return sample_positions(scope.shape, 1 << 30)


@given(scopes(max_depth=2, allow_max=True, pad_values=(0.0, 1.0)))
@settings(max_examples=60)
def test_points_match_the_interpreter(scope):
    inputs = random_inputs(scope, seed=1)
    ref = evaluate(scope, inputs, dtype=np.float64)
    got = evaluate_points(scope, inputs, _all_points(scope)).reshape(scope.shape)
    assert np.allclose(ref, got, rtol=1e-9, atol=1e-9, equal_nan=True)


@given(conv_like_scopes())
@settings(max_examples=30)
def test_points_match_on_conv_like(scope):
    inputs = random_inputs(scope, seed=2)
    ref = evaluate(scope, inputs, dtype=np.float64)
    got = evaluate_points(scope, inputs, _all_points(scope)).reshape(scope.shape)
    assert np.allclose(ref, got, rtol=1e-9, atol=1e-9)


def test_sampled_check_detects_an_off_by_one():
    i, k = Var("i"), Var("k")
    a = Tensor("A", (64, 8), pad=((1, 1), (0, 0)))
    good = Scope([IterVar(i, 0, 64)], [IterVar(k, 0, 8)], a[i, k] * a[i - 1, k])
    bad = Scope([IterVar(i, 0, 64)], [IterVar(k, 0, 8)], a[i, k] * a[i + 1, k])
    assert check_sampled(good, good, points=16).ok
    res = check_sampled(good, bad, points=16)
    assert not res.ok and res.reason


def test_large_dilated_g2bmm_is_sampled_quickly():
    # 8 x 10000 x 65 x 64 would be too big to materialize in a test; sampling reads ~256 rows.
    b, m, w, k = (Var(x) for x in "bmwk")
    a = Tensor("A", (8, 10000, 64))
    bt = Tensor("B", (8, 10000, 64), pad=((0, 0), (128, 128), (0, 0)))
    g2 = Scope([IterVar(b, 0, 8), IterVar(m, 0, 10000), IterVar(w, 0, 65)], [IterVar(k, 0, 64)],
               a[b, m, k] * bt[b, m + 4 * (w - 32), k])
    assert work(g2) > 3e8
    assert check_sampled(g2, g2, points=128).ok
