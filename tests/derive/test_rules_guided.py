"""The guided rule map_to_target: iterator mappings taken only when they reach a target."""

import re

from rulecheck import check_rule, conv2d_nhwc
from tvm_ollie.derive import derive
from tvm_ollie.derive.rules import EAGER_RULES, GUIDED_RULES, MAP_TO_TARGET, SEARCH_RULES
from tvm_ollie.derive.rules import RuleContext
from tvm_ollie.derive.rules.guided import reaches_target
from tvm_ollie.ir.nodes import Access, IterVar, Scope, Tensor, Var

CONV3 = RuleContext(targets=("conv2d",))


def _split_conv5x5_stage() -> Scope:
    """A 5x5 conv after splitting both taps as 3*q + r (padded) and moving Σ q outward:
    ``L<n,h,qh,w,qw,f> Σ<r,s,c> A[n, h + 3qh + r - 2, w + 3qw + s - 2, c] * K[3qh + r, 3qw + s, f, c]``
    (the stage the search creates at depth 3 on the way to conv5x5 -> conv3x3)."""
    n, h, qh, w, qw, f, r, s, c = (Var(x) for x in ("n", "h", "qh", "w", "qw", "f", "r", "s", "c"))
    a = Tensor("A", (1, 6, 6, 2), pad=((0, 0), (2, 3), (2, 3), (0, 0)))
    k = Tensor("K", (5, 5, 1, 2), pad=((0, 1), (0, 1), (0, 0), (0, 0)))
    loops = [IterVar(n, 0, 1), IterVar(h, 0, 6), IterVar(qh, 0, 2), IterVar(w, 0, 6),
             IterVar(qw, 0, 2), IterVar(f, 0, 1)]
    return Scope(loops, [IterVar(r, 0, 3), IterVar(s, 0, 3), IterVar(c, 0, 2)],
                 a[n, h + 3 * qh + r - 2, w + 3 * qw + s - 2, c]
                 * k[3 * qh + r, 3 * qw + s, f, c])


def _innermost(scope: Scope) -> Scope:
    while isinstance(scope.body, Access) and isinstance(scope.body.source, Scope):
        scope = scope.body.source
    return scope


def test_is_guided_not_eager_not_explorative():
    assert MAP_TO_TARGET.guided and not MAP_TO_TARGET.costs_depth
    assert MAP_TO_TARGET in GUIDED_RULES
    assert MAP_TO_TARGET not in EAGER_RULES and MAP_TO_TARGET not in SEARCH_RULES
    assert "t = x + s*y" in MAP_TO_TARGET.doc


def test_two_mappings_turn_the_split_5x5_stage_into_a_3x3_conv():
    stage = _split_conv5x5_stage()
    assert not reaches_target(stage, CONV3)  # the stage itself is no conv2d
    rws = check_rule(MAP_TO_TARGET, stage, CONV3)  # every rewrite is equivalent
    assert rws
    kernels = set()
    for rw in rws:
        assert rw.note.startswith("guided map [")
        matches = reaches_target(_innermost(rw.scope), CONV3)
        assert matches  # the rule's promise: the mapped stage matches a target
        kernels.update((m.attrs["R"], m.attrs["S"]) for m in matches if m.kind == "conv2d")
    assert (3, 3) in kernels
    assert any(rw.note.count("map [") == 2 for rw in rws)  # h + 3qh and w + 3qw, chained


def test_fires_only_when_a_target_matches():
    stage = _split_conv5x5_stage()
    assert MAP_TO_TARGET(stage, RuleContext(targets=())) == []
    assert MAP_TO_TARGET(stage, RuleContext(targets=("g2bmm",))) == []
    assert MAP_TO_TARGET(stage, RuleContext(targets=("conv2d",), guided_maps=0)) == []
    # one mapping is not enough for a 3x3 conv here (both spatial indices need one)
    one = MAP_TO_TARGET(stage, RuleContext(targets=("conv2d",), guided_maps=1))
    assert all(reaches_target(_innermost(rw.scope), CONV3) for rw in one)
    # a scope that already matches needs no mapping
    assert MAP_TO_TARGET(conv2d_nhwc(h=4, c=2, f=2), CONV3) == []


def _conv5x5_nchw() -> Scope:
    vn, vh, vw, vf, vc, vr, vs = (Var(x) for x in "nhwfcrs")
    a = Tensor("A", (1, 2, 6, 6), pad=((0, 0), (0, 0), (2, 2), (2, 2)))
    k = Tensor("K", (1, 2, 5, 5))
    return Scope([IterVar(vn, 0, 1), IterVar(vf, 0, 1), IterVar(vh, 0, 6), IterVar(vw, 0, 6)],
                 [IterVar(vc, 0, 2), IterVar(vr, 0, 5), IterVar(vs, 0, 5)],
                 a[vn, vc, vh + vr - 2, vw + vs - 2] * k[vf, vc, vr, vs])


def test_search_finds_conv5x5_as_conv3x3_at_depth_3_verified():
    expr = _conv5x5_nchw()
    pattern = re.compile(r"conv2d\[\S+ \* \d+x\d+x3x3[ \]]")
    res = derive(expr, targets=("conv2d",), max_depth=3, max_candidates=None,
                 search_time_s=120, stop_on_first=False)
    assert res.stats.candidates_rejected == 0  # derive verified every candidate it returns
    hits = [p for p in res.candidates if pattern.search(repr(p))]
    assert hits, res.stats.summary()
    assert res.stats.guided_steps > 0
    guided = [p for p in hits if any(st.rule == "map_to_target" for st in p.steps)]
    assert guided  # reached through the guided rule (3 explorative steps, mappings free)
    assert "map_to_target" in guided[0].explain()


def test_without_the_guided_rule_depth_3_is_not_enough():
    expr = _conv5x5_nchw()
    pattern = re.compile(r"conv2d\[\S+ \* \d+x\d+x3x3[ \]]")
    res = derive(expr, targets=("conv2d",), max_depth=3, max_candidates=None, verify=False,
                 ctx=RuleContext(targets=("conv2d",), guided_maps=0))
    assert not [p for p in res.candidates if pattern.search(repr(p))]
    assert res.stats.guided_steps == 0
