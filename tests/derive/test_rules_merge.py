"""Iterator mapping and variable merging: each rewrite keeps the interpreter's result."""

from hypothesis import given, settings
from strategies import conv_like_scopes, scopes

from rulecheck import assert_equivalent, check_rule, check_rule_everywhere, conv2d_nhwc
from tvm_ollie.derive.canon import canonicalize
from tvm_ollie.derive.focus import apply_eager
from tvm_ollie.derive.rules import EAGER_RULES, FUSE_ITERS, MAP_ITERS, SPLIT_STAGE, RuleContext
from tvm_ollie.ir.nodes import Access, IterVar, Scope, Tensor, Var


def _inner_of_stage_split(conv: Scope) -> Scope:
    outer = next(rw.scope for rw in SPLIT_STAGE(conv) if len(rw.scope.reduce) == 2)
    return outer


def test_map_iters_turns_h_plus_r_into_one_index():
    outer = _inner_of_stage_split(conv2d_nhwc(h=4, c=2, f=2))
    inner = outer.body.source
    rws = check_rule(MAP_ITERS, inner)
    assert rws
    # after stage merging the new stage reads A at a single iterator (t - 1), not h + r - 1
    merged = canonicalize(apply_eager(rws[0].scope, EAGER_RULES, RuleContext()))
    assert "map [" in rws[0].note
    assert isinstance(merged, Scope)


def test_map_iters_with_stride_coefficient():
    # Out[h] = Σ_r A[h + 3*r] (a split conv5x5 index): t = h + 3*r.
    h, r = Var("h"), Var("r")
    a = Tensor("A", (10,))
    k = Tensor("K", (2,))
    inner = Scope([IterVar(h, 0, 4), IterVar(r, 0, 2)], [], a[h + 3 * r] * k[r])
    rws = check_rule(MAP_ITERS, inner)
    assert any("3*r" in rw.note for rw in rws)


def test_map_iters_refuses_out_of_bounds_stages():
    # Keeping r and substituting h = t - r covers pairs with h outside [0, 4): B[h] would read
    # out of bounds, so only the other direction (keep h, r = t - h) is offered.
    h, r = Var("h"), Var("r")
    a = Tensor("A", (6,))
    b = Tensor("B", (4,))
    inner = Scope([IterVar(h, 0, 4), IterVar(r, 0, 3)], [], a[h + r] * b[h])
    notes = [rw.note for rw in check_rule(MAP_ITERS, inner)]
    assert notes == ["map [r, h] -> t0 = r + 1*h"]


def test_fuse_iters_sum_and_loop():
    i, j, k = Var("i"), Var("j"), Var("k")
    a = Tensor("A", (12,))
    b = Tensor("B", (3, 4))
    red = Scope([IterVar(k, 0, 2)], [IterVar(i, 0, 4), IterVar(j, 0, 3)],
                a[i + 4 * j] * b[j, i])
    rws = check_rule(FUSE_ITERS, red)
    assert rws and all(len(rw.scope.reduce) == 1 for rw in rws)
    loop = Scope([IterVar(i, 0, 4), IterVar(j, 0, 3)], [], a[i + 4 * j] * b[j, i])
    assert check_rule(FUSE_ITERS, loop)
    neg = Scope([IterVar(i, 0, 4), IterVar(j, 0, 3)], [], a[i - 4 * j + 8] * b[j, i])
    assert check_rule(FUSE_ITERS, neg)


@given(conv_like_scopes())
@settings(max_examples=30)
def test_merge_rules_after_stage_split(scope):
    for rw in SPLIT_STAGE(scope)[:2]:
        inner = rw.scope.body.source if isinstance(rw.scope.body, Access) else None
        if inner is None:
            continue
        for rule in (MAP_ITERS, FUSE_ITERS):
            for rw2 in check_rule(rule, inner, limit=3)[:2]:
                from tvm_ollie.derive.focus import replace_node

                whole = replace_node(rw.scope, inner, rw2.scope)
                assert_equivalent(scope, whole, rule.name)


@given(scopes(max_depth=2))
@settings(max_examples=30)
def test_merge_rules_on_random_scopes(scope):
    for rule in (MAP_ITERS, FUSE_ITERS):
        check_rule_everywhere(rule, scope, limit=3)
