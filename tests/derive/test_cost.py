"""Analytic cost: operator formulas, eOperator counting, roofline and target defaults."""

import pytest

from tvm_ollie.derive.cost import TARGET_DEFAULTS, expr_cost, program_cost
from tvm_ollie.derive.targets import match_scope
from tvm_ollie.derive.program import instantiate
from tvm_ollie.ir.nodes import IterVar, Scope, Tensor, Var
from tvm_ollie.ir.parser import parse

MM = parse("L<i:0:4, j:0:5> Σ<k:0:3> { A[i, k] * B[k, j] } where A: float32[4, 3]; "
           "B: float32[3, 5]")


def test_matmul_flops_and_bytes():
    prog = instantiate(MM, MM, match_scope(MM)[0])
    cost = program_cost(prog, peak_flops=1e9, bandwidth=1e9)
    (st,) = cost.stages
    assert st.flops == 2 * 4 * 5 * 3
    assert st.bytes == 4 * (4 * 3 + 3 * 5 + 4 * 5)
    assert st.time_s == pytest.approx(max(120 / 1e9, st.bytes / 1e9))
    assert cost.time_s == st.time_s and cost.flops == 120


def test_roofline_picks_the_limiting_roof():
    prog = instantiate(MM, MM, match_scope(MM)[0])
    fast_mem = program_cost(prog, peak_flops=1.0, bandwidth=1e12)
    assert fast_mem.stages[0].bound == "compute" and fast_mem.time_s == pytest.approx(120.0)
    fast_alu = program_cost(prog, peak_flops=1e12, bandwidth=1.0)
    assert fast_alu.stages[0].bound == "memory" and fast_alu.time_s == pytest.approx(188.0)


def test_target_defaults_and_overrides():
    prog = instantiate(MM, MM, match_scope(MM)[0])
    assert prog.cost("cuda").peak_flops == TARGET_DEFAULTS["cuda"][0]
    assert prog.cost("llvm").bandwidth == TARGET_DEFAULTS["llvm"][1]
    assert prog.cost("llvm").time_s > prog.cost("cuda").time_s
    assert prog.cost("cuda", peak_flops=2.0).peak_flops == 2.0
    with pytest.raises(ValueError):
        program_cost(prog, peak_flops=0)
    assert "FLOP" in str(prog.cost())


def test_conv_and_band_operator_flops():
    conv = parse("L<n:0:2, f:0:4, h:0:5, w:0:5> Σ<c:0:3, r:0:3, s:0:3> "
                 "{ A<pad=[0, 0, 1, 1]>[n, c, h + r - 1, w + s - 1] * K[f, c, r, s] } "
                 "where A: float32[2, 3, 5, 5]; K: float32[4, 3, 3, 3]")
    m = [x for x in match_scope(conv) if x.kind == "conv2d"][0]
    assert instantiate(conv, conv, m).cost().flops == 2 * 2 * 4 * 5 * 5 * 3 * 3 * 3
    g2 = parse("L<b:0:2, m:0:16, w:0:5> Σ<k:0:4> "
               "{ A[b, m, k] * B<pad=[0, 4, 0]>[b, m + 2 * w - 4, k] } "
               "where A: float32[2, 16, 4]; B: float32[2, 16, 4]")
    m = [x for x in match_scope(g2) if x.kind == "g2bmm"][0]
    assert instantiate(g2, g2, m).cost().flops == 2 * 2 * 16 * 5 * 4


def test_eop_counts_body_ops_reductions_and_bounded_reads():
    i, r = Var("i"), Var("r")
    x = Tensor("X", (100,))
    # Σ_r X[i + r] * 2: one multiply per point plus the accumulate, over 4 x 3 points.
    e = Scope([IterVar(i, 0, 4)], [IterVar(r, 0, 3)],
              Tensor("X", (100,))[i + r] * 2.0)
    flops, moved = expr_cost(e)
    assert flops == 4 * 3 * 2
    assert moved == 4 * 4 + 4 * 12  # output + 12 reads (fewer than the 100 elements of X)
    whole = Scope([IterVar(i, 0, 100)], [IterVar(r, 0, 3)], x[i] * 1.0)
    assert expr_cost(whole)[1] == 4 * 100 + 4 * 100


def test_derived_conv_is_cheaper_in_flops_than_im2col_with_big_gather():
    conv = parse("L<n:0:1, h:0:4, w:0:4, f:0:8> Σ<c:0:8, r:0:3, s:0:3> "
                 "{ A<pad=[0, 1, 1, 0]>[n, h + r - 1, w + s - 1, c] * K[r, s, f, c] } "
                 "where A: float32[1, 4, 4, 8]; K: float32[3, 3, 8, 8]")
    costs = {m.kind: instantiate(conv, conv, m).cost() for m in match_scope(conv)}
    # conv2d direct vs im2col matmul: same multiply-adds, the im2col gathers cost bytes.
    assert costs["conv2d"].flops == costs["matmul"].flops
    assert costs["conv2d"].bytes < costs["matmul"].bytes


def test_grouped_conv_flops_count_channels_per_group():
    # Depthwise: each output channel sums over 1 input channel, not over all 3.
    e = parse("L<n:0:2, ch:0:3, h:0:4, w:0:4> Σ<r:0:3, s:0:3> "
              "{ A<pad=[0, 0, 1, 1]>[n, ch, h + r - 1, w + s - 1] * K[ch, r, s] } "
              "where A: float32[2, 3, 4, 4]; K: float32[3, 3, 3]")
    (m,) = [x for x in match_scope(e) if x.kind == "conv2d"]
    assert m.attrs["groups"] == 3
    prog = instantiate(e, e, m)
    (st,) = [s for s in program_cost(prog).stages if s.kind == "conv2d"]
    assert st.flops == 2 * 2 * 3 * 4 * 4 * 1 * 3 * 3
    assert st.flops == expr_cost(e)[0]  # as counted on the scope: a mul and an add per point
