"""The rewrite driver (tvm_ollie.ir.rewrite): identity, sharing, hooks, nested scopes."""

import numpy as np

from tvm_ollie.ir.interp import evaluate, random_inputs
from tvm_ollie.ir.nodes import Access, BinOp, Const, Scope, Var, substitute
from tvm_ollie.ir.parser import parse
from tvm_ollie.ir.rewrite import rewrite

NESTED = parse("L<i:0:4> Σ<k:0:3> { (L<a:0:4, b:0:3> { A[a, b] * 2.0 })[i, k] * B[k] } "
               "where A: float32[4, 3]; B: float32[3]")


def test_no_hook_gives_the_same_node():
    assert rewrite(NESTED) is NESTED


def test_post_sees_children_rewritten_and_each_shared_node_once():
    i = Var("i")
    shared = BinOp("+", i, Const(1))
    expr = BinOp("*", shared, shared)
    seen = []

    def post(node):
        seen.append(node)
        return Const(7) if node is i else None

    out = rewrite(expr, post=post)
    assert out is BinOp("*", BinOp("+", Const(7), Const(1)), BinOp("+", Const(7), Const(1)))
    assert sum(1 for n in seen if n is i) == 1  # a shared leaf is visited once
    assert len([n for n in seen if isinstance(n, BinOp) and n.op == "+"]) == 1


def test_post_matches_substitute_outside_nested_scopes():
    body = NESTED.body
    mapping = {Var("k"): BinOp("-", Var("k"), Const(0))}
    assert rewrite(body, post=lambda n: mapping.get(n), enter_scopes=False) is \
        substitute(body, mapping)


def test_enter_scopes_reaches_nested_bodies_and_keeps_the_value():
    def double_to_three(node):
        if isinstance(node, Const) and node.value == 2.0:
            return Const(3.0, "float32")
        return None

    inner_only = rewrite(NESTED, post=double_to_three)
    untouched = rewrite(NESTED, post=double_to_three, enter_scopes=False)
    assert untouched is NESTED and inner_only is not NESTED
    ins = random_inputs(NESTED, seed=0, integer=True)
    np.testing.assert_array_equal(evaluate(inner_only, ins, np.float64),
                                  1.5 * evaluate(NESTED, ins, np.float64))


def test_pre_replacement_is_final():
    inner = NESTED.body.a if isinstance(NESTED.body.a, Access) else NESTED.body.b
    seen = []
    out = rewrite(NESTED, pre=lambda n: n if isinstance(n, Access) and
                  isinstance(n.source, Scope) else None,
                  post=lambda n: seen.append(n))
    assert out is NESTED
    assert inner.source.body not in seen  # not walked into
