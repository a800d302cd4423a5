"""Boundary tightening and relaxing: each rewrite keeps the interpreter's result."""

from hypothesis import given, settings
from strategies import conv_like_scopes, scopes

from rulecheck import check_rule, check_rule_everywhere, conv2d_nhwc
from tvm_ollie.derive.rules import RELAX_SUM, TIGHTEN, RuleContext
from tvm_ollie.derive.rules.boundary import feasible_range, relax_sum_range
from tvm_ollie.ir.nodes import IterVar, Scope, Tensor, Var


def test_tighten_cuts_to_data_and_records_padding():
    t, f = Var("t"), Var("f")
    a = Tensor("A", (7,), pad=((1, 1),))
    k = Tensor("K", (3,))
    stage = Scope([IterVar(t, 0, 9), IterVar(f, 0, 3)], [], a[t - 1] * k[f])
    assert feasible_range(stage, t) == (1, 7)
    rws = check_rule(TIGHTEN, stage)
    assert len(rws) == 1
    new = rws[0].scope
    assert (new.loops[0].begin, new.loops[0].end) == (1, 8)
    assert new.pad[0] == (1, 1) and new.shape == stage.shape


def test_tighten_sum_range():
    t, r = Var("t"), Var("r")
    a = Tensor("A", (4,), pad=((2, 2),))
    stage = Scope([IterVar(t, 0, 2)], [IterVar(r, -2, 4)], a[r] * a[t])
    new = check_rule(TIGHTEN, stage)[0].scope
    assert (new.reduce[0].begin, new.reduce[0].end) == (0, 4)


def test_tighten_does_not_cut_max_reductions():
    r = Var("r")
    a = Tensor("A", (4,), pad=((2, 2),))
    stage = Scope([IterVar("t", 0, 1)], [IterVar(r, -2, 4)], a[r], reducer="max")
    assert TIGHTEN(stage) == []


def test_relax_sum_pads_the_reads():
    conv5 = conv2d_nhwc(h=5, r=5, c=1, f=1)
    new = relax_sum_range(conv5, Var("r"), 6)
    assert new is not None
    rws = check_rule(RELAX_SUM, conv5, RuleContext(small_factors=(3,)))
    assert rws


def test_relax_sum_refuses_without_a_vanishing_read():
    r = Var("r")
    a = Tensor("A", (6,))
    stage = Scope([IterVar("t", 0, 1)], [IterVar(r, 0, 5)], a[r] * 2.0)
    # A[5] is data, nothing vanishes at r = 5: relaxing would add a term
    assert relax_sum_range(stage, r, 6) is None


@given(conv_like_scopes())
@settings(max_examples=30)
def test_boundary_rules_on_conv_like(scope):
    ctx = RuleContext(small_factors=(2, 3, 4))
    for rule in (TIGHTEN, RELAX_SUM):
        check_rule(rule, scope, ctx, limit=3)


@given(scopes(max_depth=2, pad_values=(0.0, 1.0)))
@settings(max_examples=40)
def test_boundary_rules_on_random_scopes(scope):
    ctx = RuleContext(small_factors=(2, 3, 4))
    for rule in (TIGHTEN, RELAX_SUM):
        check_rule_everywhere(rule, scope, ctx, limit=3)


def test_tighten_is_eager_and_idempotent():
    """Tightening is part of the canonical form: free of depth, and a fixed point after one use."""
    from tvm_ollie.derive.rules import EAGER_RULES, SEARCH_RULES

    assert not TIGHTEN.costs_depth and TIGHTEN in EAGER_RULES and TIGHTEN not in SEARCH_RULES
    t, f, r = Var("t"), Var("f"), Var("r")
    a = Tensor("A", (7,), pad=((4, 4),))
    k = Tensor("K", (3,))
    stage = Scope([IterVar(t, 0, 11), IterVar(f, 0, 3)], [IterVar(r, 0, 3)], a[t + r - 2] * k[f])
    once = check_rule(TIGHTEN, stage)[0].scope
    assert (once.loops[0].begin, once.loops[0].end) == (0, 9) and once.pad[0] == (0, 2)
    assert TIGHTEN(once) == []


@settings(max_examples=40, deadline=None)
@given(conv_like_scopes())
def test_feasible_ranges_bound_the_nonzero_region(scope):
    from tvm_ollie.derive.rules.boundary import feasible_ranges

    ranges = feasible_ranges(scope)
    for iv in scope.loops + scope.reduce:
        lo, hi = ranges[iv.var]
        assert lo >= iv.begin and hi <= iv.end - 1 or lo > hi
    check_rule(TIGHTEN, scope)
