"""Stage splitting and merging: each rewrite keeps the interpreter's result."""

from hypothesis import given, settings
from strategies import conv_like_scopes, scopes

from rulecheck import Applied, assert_equivalent, check_rule, check_rule_everywhere, conv2d_nhwc
from tvm_ollie.derive.rules import MERGE_STAGE, MERGE_STAGE_SUM, SPLIT_STAGE, TIGHTEN
from tvm_ollie.derive.rules.stage import plain_contractions
from tvm_ollie.ir.nodes import Access, IterVar, Scope, Tensor, Var


def test_split_stage_every_proper_subset():
    conv = conv2d_nhwc()
    rws = check_rule(SPLIT_STAGE, conv, limit=6)
    # 2^3 - 2 subsets of {c, r, s}, less the three that move the channel c out
    assert len(rws) == 3
    assert sorted(rw.note for rw in rws) == [
        "split stage: outer Σ<r, s>", "split stage: outer Σ<r>", "split stage: outer Σ<s>"]
    for rw in rws:
        assert isinstance(rw.scope.body, Access) and isinstance(rw.scope.body.source, Scope)


def test_split_stage_keeps_plain_contractions_inside():
    i, j, k, l = Var("i"), Var("j"), Var("k"), Var("l")
    a, b = Tensor("A", (3, 4, 2)), Tensor("B", (4, 2, 5))
    mm = Scope([IterVar(i, 0, 3), IterVar(j, 0, 5)], [IterVar(k, 0, 4), IterVar(l, 0, 2)],
               a[i, k, l] * b[k, l, j])
    assert plain_contractions(mm) == {k, l}
    assert SPLIT_STAGE(mm) == []
    # k also indexes with another iterator (k + i): it is not plain any more, it may move out
    a2 = Tensor("A", (7, 4, 2))
    band = Scope([IterVar(i, 0, 3), IterVar(j, 0, 5)], [IterVar(k, 0, 4), IterVar(l, 0, 2)],
                 a2[i + k, k, l] * b[k, l, j])
    assert plain_contractions(band) == {l}
    assert [rw.note for rw in check_rule(SPLIT_STAGE, band)] == ["split stage: outer Σ<k>"]


def test_split_stage_then_merge_back():
    conv = conv2d_nhwc()
    for rw in SPLIT_STAGE(conv):
        back = MERGE_STAGE_SUM(rw.scope)
        assert back, rw.note
        assert_equivalent(conv, back[0].scope, "merge back")


def test_merge_stage_inlines_data_movement():
    i, j = Var("i"), Var("j")
    a = Tensor("A", (4, 3))
    inner = Scope([IterVar(i, 0, 4), IterVar(j, 0, 3)], [IterVar("k", 0, 2)],
                  a[i, j] * Var("k"))
    wrap = Scope([IterVar(i, 0, 3), IterVar(j, 0, 4)], [], inner[j, i])
    outer = Scope([IterVar(i, 0, 4), IterVar(j, 0, 3)], [], wrap[j, i] + 1.0)
    rws = check_rule(MERGE_STAGE, outer)
    assert rws and rws[0].scope.body.a.source is inner


def test_merge_stage_keeps_layout_stages_over_tensors():
    i = Var("i")
    a = Tensor("A", (4,))
    gather = Scope([IterVar(i, 0, 4)], [], a[3 - i])
    outer = Scope([IterVar(i, 0, 4)], [], gather[i] * 2.0)
    assert MERGE_STAGE(outer) == []


def test_merge_stage_inlines_a_transposed_copy_of_a_tensor():
    # a lifted permute_dims read by a matmul: the copy carries no layout the operator needs
    i, j, k = Var("i"), Var("j"), Var("k")
    a, b = Tensor("A", (4, 3)), Tensor("B", (4, 5))
    perm = Scope([IterVar(i, 0, 3), IterVar(j, 0, 4)], [], a[j, i])
    mm = Scope([IterVar(i, 0, 3), IterVar(j, 0, 5)], [IterVar(k, 0, 4)], perm[i, k] * b[k, j])
    rws = check_rule(MERGE_STAGE, mm)
    assert len(rws) == 1 and rws[0].scope.body.a is a[k, i]
    # a partial copy (a window of the tensor) is a layout stage: it stays
    window = Scope([IterVar(i, 0, 3), IterVar(j, 0, 3)], [], a[j, i])
    mm2 = Scope([IterVar(i, 0, 3), IterVar(j, 0, 5)], [IterVar(k, 0, 3)], window[i, k] * b[k, j])
    assert MERGE_STAGE(mm2) == []


def test_merge_stage_through_zero_margins():
    # The tightened stage's margin (t = 0) is zero; so is A's padding at t - 1 = -1.
    t, u = Var("t"), Var("u")
    a = Tensor("A", (4,), pad=((1, 1),))
    k = Tensor("K", (3,))
    stage = Scope([IterVar(t, 0, 6), IterVar(u, 0, 3)], [], a[t - 1] * k[u])
    tight = TIGHTEN(stage)[0].scope
    assert tight.pad[0] == (1, 1)
    copy = Scope([IterVar(t, 0, 6), IterVar(u, 0, 3)], [], tight[t, u])
    h, r = Var("h"), Var("r")
    outer = Scope([IterVar(h, 0, 4)], [IterVar(r, 0, 3)], copy[h + r, r])
    rws = check_rule(MERGE_STAGE, outer)
    assert rws and rws[0].scope.body.source is tight


def test_stage_rules_on_conv_like():
    applied = Applied()

    @given(conv_like_scopes())
    @settings(max_examples=30)
    def run(scope):
        applied.cases += 1
        rws = check_rule(SPLIT_STAGE, scope, limit=3)
        applied.note(SPLIT_STAGE, len(rws))
        for rw in rws[:3]:
            applied.note(MERGE_STAGE_SUM, len(check_rule(MERGE_STAGE_SUM, rw.scope)))

    run()
    applied.require(SPLIT_STAGE, MERGE_STAGE_SUM)


def test_stage_rules_on_random_scopes():
    applied = Applied()

    @given(scopes(max_depth=2))
    @settings(max_examples=40)
    def run(scope):
        applied.cases += 1
        for rule in (SPLIT_STAGE, MERGE_STAGE, MERGE_STAGE_SUM):
            applied.note(rule, check_rule_everywhere(rule, scope, limit=3))

    run()
    applied.require_any(SPLIT_STAGE, MERGE_STAGE, MERGE_STAGE_SUM)
