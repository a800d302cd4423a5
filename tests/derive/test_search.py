"""The derivation search end to end: candidates found, verified, limits reported."""

import numpy as np
import pytest

from rulecheck import conv2d_nhwc
from tvm_ollie.derive import StopReason, derive
from tvm_ollie.ir.interp import evaluate, random_inputs
from tvm_ollie.ir.nodes import IterVar, Scope, Tensor, Var


def _g2bmm(dil=2, m=16, w=1, k=4):
    b, vm, vw, vk = (Var(x) for x in "bmwk")
    a = Tensor("A", (1, m, k))
    bt = Tensor("B", (1, m, k), pad=((0, 0), (dil * w, dil * w), (0, 0)))
    return Scope([IterVar(b, 0, 1), IterVar(vm, 0, m), IterVar(vw, 0, 2 * w + 1)],
                 [IterVar(vk, 0, k)], a[b, vm, vk] * bt[b, vm + dil * (vw - w), vk])


def _tconv(n=2, h=2, c=4, f=3):
    vn, vh, vw, vc, vf, vi, vj = (Var(x) for x in "nhwcfij")
    a = Tensor("A", (n, h, h, f))
    k = Tensor("K", (4, 4, f, c), pad=((2, 2), (2, 2), (0, 0), (0, 0)))
    return Scope([IterVar(vn, 0, n), IterVar(vh, 0, 2 * h), IterVar(vw, 0, 2 * h),
                  IterVar(vc, 0, c)],
                 [IterVar(vf, 0, f), IterVar(vi, 0, h), IterVar(vj, 0, h)],
                 a[vn, vi, vj, vf] * k[vh + 1 - 2 * vi, vw + 1 - 2 * vj, vf, vc])


def _check(res, expr):
    inputs = random_inputs(expr, seed=3)
    ref = evaluate(expr, inputs, dtype=np.float64)
    for prog in res.candidates:
        assert np.allclose(prog.evaluate(inputs), ref, rtol=1e-4, atol=1e-5), repr(prog)


def test_conv3x3_to_matmul_plus_offset_add():
    conv = conv2d_nhwc(n=1, h=4, c=8, f=8)
    res = derive(conv, targets=("matmul",), max_depth=4)
    reprs = [repr(p) for p in res.candidates]
    assert "matmul[16x8 @ 8x72] -> eop[offset-add 1x4x4x8]" in reprs, reprs
    assert res.stats.stop_reason is StopReason.MAX_DEPTH
    assert res.stats.candidates_rejected == 0
    assert "matmul" in res.stats.first_found_s
    best = next(p for p in res.candidates if repr(p).startswith("matmul[16x8"))
    assert "map" in best.explain() and "split stage" in best.explain()
    _check(res, conv)


def test_dilated_g2bmm_to_undilated():
    g2 = _g2bmm()
    res = derive(g2, targets=("g2bmm",), max_depth=3)
    sigs = [repr(p) for p in res.candidates]
    assert any("d=1" in s for s in sigs), sigs
    _check(res, g2)


def test_conv_transpose_to_matmul():
    tc = _tconv()
    res = derive(tc, targets=("matmul",), max_depth=4, time_budget_s=60)
    assert any("matmul" in repr(p) and "offset-add" in repr(p) for p in res.candidates)
    _check(res, tc)


@pytest.mark.parametrize("kind", ["strided", "dilated", "1xk", "conv1d"])
def test_other_convs_instantiate(kind):
    if kind == "strided":
        expr = conv2d_nhwc(h=5, stride=2)
    elif kind == "dilated":
        expr = conv2d_nhwc(h=5, dil=2)
    else:
        vn, vh, vw, vf, vc, vs = (Var(x) for x in "nhwfcs")
        a = Tensor("A", (1, 3, 5, 4), pad=((0, 0), (0, 0), (1, 1), (0, 0)))
        k = Tensor("K", (3, 2, 4))
        loops = [IterVar(vn, 0, 1), IterVar(vh, 0, 3), IterVar(vw, 0, 5), IterVar(vf, 0, 2)]
        if kind == "conv1d":
            loops[1] = IterVar(vh, 0, 1)
        expr = Scope(loops, [IterVar(vc, 0, 4), IterVar(vs, 0, 3)],
                     a[vn, vh, vw + vs - 1, vc] * k[vs, vf, vc])
    res = derive(expr, targets=("matmul", "conv2d"), max_depth=2)
    assert res.candidates
    _check(res, expr)


def test_batched_matmul_with_transposed_inputs():
    b, m, n, k = (Var(x) for x in "bmnk")
    a = Tensor("A", (2, 5, 3))   # [b, k, m]
    bt = Tensor("B", (2, 4, 5))  # [b, n, k]
    expr = Scope([IterVar(b, 0, 2), IterVar(m, 0, 3), IterVar(n, 0, 4)], [IterVar(k, 0, 5)],
                 a[b, k, m] * bt[b, n, k])
    res = derive(expr, targets=("batch_matmul",), max_depth=1)
    assert any("batch_matmul" in repr(p) for p in res.candidates)
    _check(res, expr)


def test_limits_are_reported():
    conv = conv2d_nhwc()
    res = derive(conv, targets=("matmul",), max_depth=7, max_states=5)
    assert res.stats.stop_reason is StopReason.MAX_STATES
    assert res.stats.states_visited == 5
    res = derive(conv, targets=("matmul",), max_depth=7, time_budget_s=0.0)
    assert res.stats.stop_reason is StopReason.TIME_BUDGET


def test_search_is_deterministic():
    conv = conv2d_nhwc()
    a = derive(conv, targets=("matmul",), max_depth=2, verify=False)
    b = derive(conv, targets=("matmul",), max_depth=2, verify=False)
    assert [repr(p) for p in a.candidates] == [repr(p) for p in b.candidates]
    assert a.stats.states_visited == b.stats.states_visited


@pytest.mark.slow
def test_conv3x3_real_shape():
    conv = conv2d_nhwc(n=1, h=7, c=512, f=512)
    res = derive(conv, targets=("matmul",), max_depth=4, max_candidates=4)
    reprs = [repr(p) for p in res.candidates]
    assert any(r.startswith("matmul[49x512 @ 512x4608]") or "49x512" in r for r in reprs), reprs
