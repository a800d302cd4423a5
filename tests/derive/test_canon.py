"""Canonical forms: equivalent, deterministic, and equal for renamed / reordered states."""

from hypothesis import given, settings
from strategies import conv_like_scopes, scopes

from rulecheck import assert_equivalent, conv2d_nhwc
from tvm_ollie.derive.canon import canonicalize
from tvm_ollie.ir.nodes import IterVar, Scope, Tensor, Var


def test_renaming_and_summation_order_do_not_matter():
    a = conv2d_nhwc()
    x = [Var(n) for n in ("p", "q", "u", "v", "c2", "r2", "s2")]
    t_a, t_k = a.inputs
    b = Scope([IterVar(x[0], 0, 1), IterVar(x[1], 0, 4), IterVar(x[2], 0, 4), IterVar(x[3], 0, 2)],
              [IterVar(x[6], 0, 3), IterVar(x[4], 0, 3), IterVar(x[5], 0, 3)],
              t_a[x[0], x[1] + x[5] - 1, x[2] + x[6] - 1, x[4]] * t_k[x[5], x[6], x[3], x[4]])
    assert canonicalize(a) is canonicalize(b)


def test_nested_loop_order_is_canonical():
    i, j = Var("i"), Var("j")
    a = Tensor("A", (3, 4))
    s1 = Scope([IterVar(i, 0, 3), IterVar(j, 0, 4)], [], a[i, j] * 2.0)
    s2 = Scope([IterVar(j, 0, 4), IterVar(i, 0, 3)], [], a[i, j] * 2.0)
    o1 = Scope([IterVar(i, 0, 3), IterVar(j, 0, 4)], [], s1[i, j] + 1.0)
    o2 = Scope([IterVar(i, 0, 3), IterVar(j, 0, 4)], [], s2[j, i] + 1.0)
    assert canonicalize(o1) is canonicalize(o2)
    assert_equivalent(o1, canonicalize(o2))


def test_unit_summations_are_dropped():
    i, r = Var("i"), Var("r")
    a = Tensor("A", (3, 1))
    s = Scope([IterVar(i, 0, 3)], [IterVar(r, 0, 1)], a[i, r] * 2.0)
    c = canonicalize(s)
    assert not c.reduce
    assert_equivalent(s, c)


def test_canonical_form_is_idempotent():
    c = canonicalize(conv2d_nhwc())
    assert canonicalize(c) is c


@given(scopes(max_depth=2, allow_max=True))
@settings(max_examples=60)
def test_canonical_form_is_equivalent(scope):
    assert_equivalent(scope, canonicalize(scope), "canonicalize")


@given(conv_like_scopes())
@settings(max_examples=30)
def test_canonical_form_of_conv_like(scope):
    assert_equivalent(scope, canonicalize(scope), "canonicalize")
