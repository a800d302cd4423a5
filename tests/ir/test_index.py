"""Index analyses (tvm_ollie.ir.index) against brute-force evaluation of the index."""

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from tvm_ollie.ir.index import build_linear, factors, interval, linear_form, scope_ranges
from tvm_ollie.ir.nodes import BinOp, Const, Var
from tvm_ollie.ir.parser import parse

I, J, K = Var("i"), Var("j"), Var("k")
RANGES = {I: (0, 4), J: (-2, 3), K: (1, 6)}


def _value(node, env):
    if isinstance(node, Var):
        return env[node]
    if isinstance(node, Const):
        return node.value
    a, b = _value(node.a, env), _value(node.b, env)
    ops = {"+": lambda: a + b, "-": lambda: a - b, "*": lambda: a * b, "//": lambda: a // b,
           "%": lambda: a % b}
    return ops[node.op]()


def _points():
    names = list(RANGES)
    for vals in itertools.product(*(range(*RANGES[v]) for v in names)):
        yield dict(zip(names, vals))


coeffs = st.fixed_dictionaries({v: st.integers(-3, 3) for v in (I, J, K)})


@settings(max_examples=30, deadline=None)
@given(coeffs, st.integers(-5, 5))
def test_build_linear_round_trips_through_linear_form(cs, const):
    node = build_linear(cs, const, (K, I))
    got = linear_form(node)
    assert got == ({v: c for v, c in cs.items() if c}, const)
    for env in _points():
        assert _value(node, env) == sum(c * env[v] for v, c in cs.items()) + const


@settings(max_examples=30, deadline=None)
@given(coeffs, st.integers(-5, 5), st.sampled_from(["//", "%"]), st.integers(1, 4))
def test_interval_bounds_every_value(cs, const, op, k):
    node = BinOp(op, build_linear(cs, const), Const(k))
    lo, hi = interval(node, RANGES)
    values = [_value(node, env) for env in _points()]
    assert lo <= min(values) and max(values) <= hi


def test_non_linear_index_has_no_linear_form():
    assert linear_form(BinOp("*", I, J)) is None
    assert linear_form(BinOp("//", I, Const(2))) is None
    assert linear_form(Const(1.5, "float32")) is None


def test_factors_and_scope_ranges():
    e = parse("L<i:0:4> Σ<k:0:3> { A[i, k] * B[k] * C[i] } "
              "where A: float32[4, 3]; B: float32[3]; C: float32[4]")
    assert len(factors(e.body)) == 3
    assert {v.name: r for v, r in scope_ranges(e).items()} == {"i": (0, 4), "k": (0, 3)}
