"""The focus driver: enumerating scopes, replacing one, eager rules to a fixed point."""

from rulecheck import assert_equivalent, conv2d_nhwc
from tvm_ollie.derive.focus import (apply_eager, apply_rules, compute_scopes, is_compute,
                                    replace_node, scopes_of)
from tvm_ollie.derive.rules import EAGER_RULES, MAP_ITERS, SPLIT_STAGE, RuleContext
from tvm_ollie.ir.nodes import IterVar, Scope, Tensor, Var


def _nested():
    i, j = Var("i"), Var("j")
    a = Tensor("A", (4,))
    inner = Scope([IterVar(i, 0, 4)], [IterVar(j, 0, 2)], a[i] * a[3 - i])
    return inner, Scope([IterVar(i, 0, 4)], [], inner[i] + inner[3 - i])


def test_scopes_of_lists_each_scope_once_outermost_first():
    inner, outer = _nested()
    assert scopes_of(outer) == [outer, inner]


def test_replace_node_replaces_every_occurrence():
    inner, outer = _nested()
    new = inner.replace(reduce=(IterVar("j", 0, 3),))
    out = replace_node(outer, inner, new)
    assert scopes_of(out) == [out, new]


def test_compute_scopes_are_contractions():
    inner, outer = _nested()
    assert is_compute(inner) and not is_compute(outer)
    assert compute_scopes(outer) == [inner]


def test_apply_rules_at_nested_focus_and_eager_merging():
    conv = conv2d_nhwc()
    ctx = RuleContext()
    split = next(s for s in apply_rules(conv, (SPLIT_STAGE,), ctx) if len(s.expr.reduce) == 2)
    steps = list(apply_rules(split.expr, (MAP_ITERS,), ctx, compute_scopes(split.expr)))
    assert steps
    for step in steps:
        merged = apply_eager(step.expr, EAGER_RULES, ctx)
        # the wrapper stage of the mapping was merged into the outer stage: two scopes remain
        assert len(scopes_of(merged)) == 2
        assert_equivalent(conv, merged, step.note)
