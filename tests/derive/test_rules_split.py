"""Variable splitting rules: each rewrite keeps the interpreter's result."""

from hypothesis import event, given, settings
from hypothesis import strategies as st
from strategies import conv_like_scopes, scopes

from rulecheck import Applied, check_rule, check_rule_everywhere, conv2d_nhwc
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


@st.composite
def split_cases(draw):
    """``(rule, scope)``: an NHWC convolution shaped so that ``rule``'s guard holds.

    split_sum: a kernel extent of 4 or 6 (factors 2, 3 divide it); split_loop: an output extent
    of 4 or 6; split_sum_padded: a kernel extent of 3 or 5 (factor 2 does not divide it).
    Strides, dilation, padding and channels vary freely around that.
    """
    rule = draw(st.sampled_from([SPLIT_SUM, SPLIT_LOOP, SPLIT_SUM_PADDED]))
    stride, dil = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    c, f, n = draw(st.integers(1, 2)), draw(st.integers(1, 2)), draw(st.integers(1, 2))
    if rule is SPLIT_SUM:
        r = draw(st.sampled_from([4, 6]))
    elif rule is SPLIT_SUM_PADDED:
        r = draw(st.sampled_from([3, 5]))
    else:
        r = draw(st.integers(1, 3))
    pad = draw(st.integers(0, r - 1))
    span = dil * (r - 1) + 1
    if rule is SPLIT_LOOP:
        out = draw(st.sampled_from([4, 6]))
        h = (out - 1) * stride + span - 2 * pad
        if h < 1:
            pad, h = 0, (out - 1) * stride + span
    else:
        h = max(draw(st.integers(1, 6)), span - 2 * pad)
    return rule, conv2d_nhwc(n=n, h=h, c=c, f=f, r=r, stride=stride, dil=dil, pad=pad)


#: the factors the generated cases are shaped for
SPLIT_CTX = {SPLIT_SUM: RuleContext(split_factors=(2, 3)),
             SPLIT_LOOP: RuleContext(split_factors=(2, 3)),
             SPLIT_SUM_PADDED: RuleContext(split_factors=(2,))}


@given(split_cases())
@settings(max_examples=20)
def test_split_rules_apply_and_keep_results(case):
    rule, scope = case
    rws = check_rule(rule, scope, SPLIT_CTX[rule], limit=2)
    # the case is shaped for the rule's guard: a rule that stops applying fails here
    assert rws, f"{rule.name} did not apply to {scope}"
    event(f"{rule.name}: {len(rws)} rewrites")


def test_split_rules_on_conv_like():
    applied = Applied()

    @given(conv_like_scopes())
    @settings(max_examples=30)
    def run(scope):
        ctx = RuleContext(split_factors=(2, 3))
        applied.cases += 1
        for rule in (SPLIT_SUM, SPLIT_LOOP, SPLIT_SUM_PADDED):
            applied.note(rule, len(check_rule(rule, scope, ctx, limit=3)))

    run()
    # kernels of at most 3 taps leave split_sum nothing to divide (split_cases covers it)
    applied.require(SPLIT_LOOP, SPLIT_SUM_PADDED)


def test_split_rules_on_random_scopes():
    applied = Applied()

    @given(scopes(max_depth=2, allow_max=True))
    @settings(max_examples=30)
    def run(scope):
        ctx = RuleContext(split_factors=(2, 3))
        applied.cases += 1
        for rule in (SPLIT_SUM, SPLIT_LOOP, SPLIT_SUM_PADDED):
            applied.note(rule, check_rule_everywhere(rule, scope, ctx, limit=3))

    run()
    # each rule applies to few random scopes (split_sum_padded needs reads that vanish past a
    # range's end), so the family must apply here; split_cases covers each rule by construction
    applied.require_any(SPLIT_SUM, SPLIT_LOOP, SPLIT_SUM_PADDED)
