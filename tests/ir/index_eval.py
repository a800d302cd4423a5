"""A tiny evaluator of integer index expressions and local strategies, for the index tests.

Kept independent of ``tvm_ollie.ir.affine`` and ``simplify`` (the code under test): it walks the
node tree with Python integers (``//`` and ``%`` are Python's floor division and modulo, the IR's
semantics).
"""

from __future__ import annotations

import itertools
from typing import Dict, Iterator, Mapping, Tuple

from hypothesis import strategies as st

from tvm_ollie.ir.nodes import BinOp, Const, Node, Var

I, J, K = Var("i"), Var("j"), Var("k")
#: Small ranges, some negative, for exhaustive evaluation (5 * 4 * 6 = 120 points).
RANGES: Dict[Var, Tuple[int, int]] = {I: (-2, 3), J: (0, 4), K: (-1, 5)}


def eval_index(node: Node, env: Mapping[Var, int]) -> int:
    """Value of an integer index expression at one point."""
    if type(node) is Var:
        return env[node]
    if type(node) is Const:
        return node.value
    assert type(node) is BinOp, node
    a, b = eval_index(node.a, env), eval_index(node.b, env)
    if node.op == "+":
        return a + b
    if node.op == "-":
        return a - b
    if node.op == "*":
        return a * b
    if node.op == "//":
        return a // b
    assert node.op == "%", node
    return a % b


def points(ranges: Mapping[Var, Tuple[int, int]]) -> Iterator[Dict[Var, int]]:
    """Every point of the box given by half-open ranges."""
    names = list(ranges)
    for values in itertools.product(*(range(*ranges[v]) for v in names)):
        yield dict(zip(names, values))


def values(node: Node, ranges: Mapping[Var, Tuple[int, int]]) -> list:
    """Values of ``node`` over the whole box, in a fixed order."""
    return [eval_index(node, env) for env in points(ranges)]


def _leaf():
    return st.one_of(st.sampled_from((I, J, K)), st.integers(-4, 4).map(Const))


def _extend(children):
    const = st.integers(-3, 3).map(Const)
    pos = st.integers(1, 6).map(Const)
    return st.one_of(
        st.tuples(children, children).map(lambda t: t[0] + t[1]),
        st.tuples(children, children).map(lambda t: t[0] - t[1]),
        st.tuples(children, const).map(lambda t: t[0] * t[1]),
        st.tuples(const, children).map(lambda t: t[0] * t[1]),
        st.tuples(children, pos).map(lambda t: t[0] // t[1]),
        st.tuples(children, pos).map(lambda t: t[0] % t[1]),
    )


#: Random affine index expressions over i, j, k with nested ``//`` and ``%`` by constants.
index_trees = st.recursive(_leaf(), _extend, max_leaves=10)


def _pure_extend(children):
    const = st.integers(-3, 3).map(Const)
    return st.one_of(
        st.tuples(children, children).map(lambda t: t[0] + t[1]),
        st.tuples(children, children).map(lambda t: t[0] - t[1]),
        st.tuples(children, const).map(lambda t: t[0] * t[1]),
    )


#: Affine expressions without div/mod.
pure_affine_trees = st.recursive(_leaf(), _pure_extend, max_leaves=8)


@st.composite
def split_merge_exprs(draw):
    """``c*m*(e // m) + c*(e % m) + rest`` built from a random ``e``: equal to ``c*e + rest``."""
    e = draw(index_trees)
    m = draw(st.integers(2, 6))
    c = draw(st.integers(-3, 3).filter(bool))
    rest = draw(st.one_of(st.just(None), index_trees))
    parts = [Const(c * m) * (e // Const(m)), Const(c) * (e % Const(m))]
    if draw(st.booleans()):
        parts.reverse()
    out = parts[0] + parts[1]
    return (out if rest is None else out + rest), e, c, rest


def _nonaffine_extend(children):
    divisor = st.sampled_from((J + 1, 2 * J + 1, Const(3)))
    return st.one_of(
        _extend(children),
        st.tuples(children, children).map(lambda t: t[0] * t[1]),
        st.tuples(children, divisor).map(lambda t: t[0] // t[1]),
        st.tuples(children, divisor).map(lambda t: t[0] % t[1]),
    )


#: Index expressions that also multiply iterators and divide by (positive) iterator expressions.
nonaffine_trees = st.recursive(_leaf(), _nonaffine_extend, max_leaves=8)
