"""Variable splitting rules: each rewrite keeps the interpreter's result."""

from hypothesis import given, settings
from strategies import conv_like_scopes, scopes

from rulecheck import check_rule, check_rule_everywhere, conv2d_nhwc
from tvm_ollie.derive.rules import SPLIT_LOOP, SPLIT_SUM, SPLIT_SUM_PADDED, RuleContext
from tvm_ollie.ir.nodes import IterVar, Scope, Tensor, Var


def test_split_sum_divides_the_range():
    rws = check_rule(SPLIT_SUM, conv2d_nhwc(r=4, h=4, pad=1), RuleContext(split_factors=(2,)))
    assert rws and all("split Σ" in rw.note for rw in rws)
    for rw in rws:
        sizes = sorted(iv.extent for iv in rw.scope.reduce)
        assert 1 in sizes or 2 in sizes


def test_split_sum_skips_iterators_that_index_alone():
    # c indexes a dimension on its own in both reads: splitting it only reshapes; skipped.
    conv = conv2d_nhwc(c=4, r=1, pad=0)
    assert SPLIT_SUM(conv, RuleContext(split_factors=(2,))) == []


def test_split_loop_by_index_stride():
    # G2BMM with dilation 2: the stride 2 of w makes splitting m by 2 worthwhile.
    b, m, w, k = (Var(x) for x in "bmwk")
    a = Tensor("A", (1, 8, 3))
    bt = Tensor("B", (1, 8, 3), pad=((0, 0), (2, 2), (0, 0)))
    g2 = Scope([IterVar(b, 0, 1), IterVar(m, 0, 8), IterVar(w, 0, 3)], [IterVar(k, 0, 3)],
               a[b, m, k] * bt[b, m + 2 * w - 2, k])
    rws = check_rule(SPLIT_LOOP, g2)
    assert any("split L m -> 2*" in rw.note for rw in rws)


def test_split_sum_padded_relaxes_conv5():
    conv5 = conv2d_nhwc(h=5, r=5, c=2, f=1)
    rws = check_rule(SPLIT_SUM_PADDED, conv5)
    notes = [rw.note for rw in rws]
    assert any("relax Σ r" in n and "3*" in n for n in notes), notes
    # the relaxed kernel is zero-padded, the input padded further
    rw = next(rw for rw in rws if "relax Σ r" in rw.note and "3*" in rw.note)
    pads = {t.name: t.pad for t in rw.scope.inputs}
    assert pads["K"][0] == (0, 1)


@given(conv_like_scopes())
@settings(max_examples=30)
def test_split_rules_on_conv_like(scope):
    ctx = RuleContext(split_factors=(2, 3))
    for rule in (SPLIT_SUM, SPLIT_LOOP, SPLIT_SUM_PADDED):
        check_rule(rule, scope, ctx, limit=3)


@given(scopes(max_depth=2, allow_max=True))
@settings(max_examples=30)
def test_split_rules_on_random_scopes(scope):
    ctx = RuleContext(split_factors=(2, 3))
    for rule in (SPLIT_SUM, SPLIT_LOOP, SPLIT_SUM_PADDED):
        check_rule_everywhere(rule, scope, ctx, limit=3)
