"""Tests of the canonical-text parser (and of the shared hypothesis strategies it round-trips)."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tvm_ollie.ir.nodes import (
    BINARY_OPS,
    Access,
    BinOp,
    Call,
    Const,
    IterVar,
    Scope,
    Tensor,
    Var,
    free_vars,
    is_index,
    iter_nodes,
)
from tvm_ollie.ir.parser import ParseError, parse
from tvm_ollie.ir.printer import to_text

import strategies

CONV3X3 = (
    "L<n:0:1, h:0:7, w:0:7, f:0:512> Σ<c:0:512, r:0:3, s:0:3> { "
    "A<pad=[0, 1, 1, 0]>[n, h + r - 1, w + s - 1, c] * K[r, s, f, c] } "
    "where A: float32[1, 7, 7, 512]; K: float32[3, 3, 512, 512]"
)

# Canonical texts: printing what they parse to gives them back character for character.
CANONICAL = [
    CONV3X3,
    # nested scope with a range not starting at 0, read through an offset subscript
    "L<i:0:4> { (L<a:-1:5> Σ<b:0:2> { A<pad=[2:0]>[a + b - 1] })[i - 1] + 1.5 } "
    "where A: float32[6]",
    # nested scope reusing the outer iterator names (scopes are closed)
    "L<i:0:2, j:0:3> { (L<i:0:3, j:0:2> { B[j, i] })[j, i] * B[i, j] } where B: float32[2, 3]",
    # max reduction over a tensor padded with -inf
    "L<i:0:3> Max<r:0:3> { A<pad=[1], value=-inf>[i + r - 1] } where A: float32[3]",
    # scope output padding, asymmetric
    "L<i:1:3, j:0:2> pad=[1, 0:2] { A[i, j] } where A: float32[3, 2]",
    "L<i:0:2> pad=[0:1] { (L<k:0:3> pad=[2:1] { A[k] })[i - 2] } where A: float32[3]",
    # floats, negative constants, exponents
    "L<i:0:2> { A[i] * 1e-05 + -2.5 * A[i] - 1.5e+20 - -1.0 } where A: float32[2]",
    "L<i:0:2> { max(A[i], -inf) + min(A[i], inf) } where A: float32[2]",
    # calls and comparisons, and/or precedence
    "L<i:0:4> { select(i < 2 and i != 0 or i >= 3, relu(A[i]), max(A[i], -1.0)) } "
    "where A: float32[4]",
    "L<i:0:4> { select((i < 2 or i == 3) and i <= 1, pow(A[i], 2.0), tanh(neg(A[i]))) } "
    "where A: float32[4]",
    "L<i:0:3> { sigmoid(A[i]) / exp(A[i]) - erf(log(abs(A[i]))) * rsqrt(sqrt(A[i])) } "
    "where A: float32[3]",
    # no loops, zero-rank access
    "L<> Σ<r:0:3> { A[r] } where A: float32[3]",
    "(L<> Σ<r:0:3> { A[r] })[] where A: float32[3]",
    "L<> { S[] } where S: float16[]",
    # bare index expressions and precedence
    "i * 2 + j // 3 - k % 4",
    "(i + 1) * (j - 2)",
    "i - (j - k)",
    "i - j - k",
    "i // (j * 2)",
    "i - -1",
    "-1 * i + 2",
    # bare reads, tensors, iterators
    "A[i + 1, j] * 2.0 where A: float32[3, 4]",
    "A<pad=[1:2]> where A: float16[4]",
    "i:-2:3",
]


@pytest.mark.parametrize("text", CANONICAL)
def test_canonical_round_trip(text):
    node = parse(text)
    assert to_text(node) == text
    assert parse(to_text(node)) is node


def test_conv3x3_structure():
    e = parse(CONV3X3)
    assert isinstance(e, Scope)
    assert [(iv.var.name, iv.begin, iv.end) for iv in e.loops] == [
        ("n", 0, 1), ("h", 0, 7), ("w", 0, 7), ("f", 0, 512)]
    assert [iv.var.name for iv in e.reduce] == ["c", "r", "s"]
    assert e.reducer == "sum"
    a_read, k_read = e.body.a, e.body.b
    assert e.body.op == "*"
    assert a_read.source is Tensor("A", (1, 7, 7, 512), "float32", [0, 1, 1, 0])
    assert k_read.source is Tensor("K", (3, 3, 512, 512))
    n, h, r, c = Var("n"), Var("h"), Var("r"), Var("c")
    assert a_read.indices[0] is n and a_read.indices[3] is c
    assert a_read.indices[1] is h + r - 1
    # the same text built by hand
    w, s, f = Var("w"), Var("s"), Var("f")
    A = Tensor("A", (1, 7, 7, 512), pad=[0, 1, 1, 0])
    K = Tensor("K", (3, 3, 512, 512))
    built = Scope([IterVar(n, 0, 1), IterVar(h, 0, 7), IterVar(w, 0, 7), IterVar(f, 0, 512)],
                  [IterVar(c, 0, 512), IterVar(r, 0, 3), IterVar(s, 0, 3)],
                  A[n, h + r - 1, w + s - 1, c] * K[r, s, f, c])
    assert e is built


def test_sum_alias_and_max_reduction():
    sigma = parse("L<i:0:2> Σ<r:0:3> { A[i + r] } where A: float32[4]")
    assert parse("L<i:0:2> Sum<r:0:3> { A[i + r] } where A: float32[4]") is sigma
    mx = parse("L<i:0:2> Max<r:0:3> { A[i + r] } where A: float32[4]")
    assert mx.reducer == "max" and sigma.reducer == "sum"
    assert mx.replace(reducer="sum") is sigma


def test_nested_scope_structure():
    e = parse(CANONICAL[1])
    read = e.body.a
    inner = read.source
    assert isinstance(read, Access) and isinstance(inner, Scope)
    assert inner.loops == (IterVar("a", -1, 5),)
    assert inner.body.source.pad == ((2, 0),)
    assert read.indices == (Var("i") - 1,)
    assert e.body.b is Const(1.5)


def test_constants_and_pads():
    e = parse(CANONICAL[3])
    src = e.body.source
    assert src.pad == ((1, 1),) and src.pad_value == -math.inf
    assert parse("3") is Const(3) and parse("3").dtype == "int32"
    for text, value in [("3.0", 3.0), ("3.", 3.0), (".5", 0.5), ("1e3", 1000.0),
                        ("2.5E-3", 0.0025), ("inf", math.inf), ("-inf", -math.inf)]:
        got = parse(text)
        assert got is Const(value) and got.dtype == "float32", text
    assert math.isnan(parse("nan").value)
    assert parse("-7") is Const(-7)
    pad = parse("L<i:0:2, j:0:2> pad=[0, 1:2] { A<pad=[3, 0:1], value=2.5>[i, j] } "
                "where A: float32[2, 2]")
    assert pad.pad == ((0, 0), (1, 2))
    assert pad.body.source.pad == ((3, 3), (0, 1)) and pad.body.source.pad_value == 2.5


def test_unary_minus():
    i = Var("i")
    assert parse("-i") is Const(-1) * i  # index negation
    e = parse("-relu(A[i]) where A: float32[3]")
    assert isinstance(e, Call) and e.func == "neg"
    assert parse("-2 * i") is Const(-2) * i  # binds tighter than '*'
    assert parse("i * -2") is i * Const(-2)
    assert parse("- (3)") is Const(-1) * Const(3)


def test_precedence_is_left_associative():
    a, b, c = Var("a"), Var("b"), Var("c")
    assert parse("a - b - c") is (a - b) - c
    assert parse("a // b * c") is (a // b) * c
    assert parse("a + b * c") is a + b * c
    assert parse("a * (b + c)") is a * (b + c)
    assert parse("a < b + 1 and c or a") is BinOp(
        "or", BinOp("and", BinOp("<", a, b + 1), c), a)
    assert parse("a or b and c") is BinOp("or", a, BinOp("and", b, c))


def test_bare_names_resolve():
    e = parse("A + i where A: float32[2]")
    assert e.a is Tensor("A", (2,)) and e.b is Var("i")
    # inside a scope a name is an iterator of that scope, even when a tensor has the name
    s = parse("L<A:0:2> { A[A] } where A: float32[2]")
    assert s.body.indices[0] is Var("A") and s.body.source is Tensor("A", (2,))
    assert parse("L") is Var("L") and parse("L < 3") is BinOp("<", Var("L"), 3)
    assert parse("i.outer + x_1") is Var("i.outer") + Var("x_1")


def test_tensors_argument():
    text = "L<i:0:2, j:0:3> { A[i, j] + B<pad=[1]>[i - 1] }"
    by_spec = parse(text, tensors={"A": ((2, 3), "float32"), "B": ((2,), "float32")})
    by_tensor = parse(text, tensors={"A": Tensor("A", (2, 3), pad=[1, 1]), "B": [2]})
    assert by_spec is by_tensor
    assert by_spec.body.a.source is Tensor("A", (2, 3))  # padding comes from the text
    assert by_spec is parse(to_text(by_spec))
    # a declaration in the text and an agreeing one in tensors= is fine
    assert parse("A[i] where A: float32[3]", tensors={"A": ((3,), "float32")}) is parse(
        "A[i] where A: float32[3]")
    with pytest.raises(ParseError, match="declared"):
        parse("A[i] where A: float32[3]", tensors={"A": ((4,), "float32")})
    with pytest.raises(TypeError):
        parse("A[i]", tensors={"A": "float32"})


ERRORS = [
    # (text, message fragment, position of the offending token)
    ("L<i:0:3> { A[i] where A: float32[3]", "expected '}'", 16),
    ("L<i:0:3> { j }", "iterator 'j' is not bound", 11),
    ("L<i:0:3> { (L<k:0:3> { i })[i] }", "iterator 'i' is not bound", 23),
    ("A[i]", "tensor 'A' has no shape", 0),
    ("foo(i)", "unknown function 'foo'", 0),
    ("relu(i, i)", "relu takes 1 arguments", 0),
    ("L<i:0:3> { A[i, i] } where A: float32[3]", "2 indices for a 1-d source", 12),
    ("L<i:3:3> { 1.0 }", "empty range", 2),
    ("L<i:0:3, i:0:2> { 1.0 }", "not distinct", 0),
    ("i + $", "unexpected character '$'", 4),
    ("L<i:0:3> pad=[1, 2] { 1.0 }", "does not match rank", 0),
    ("A<pad=[-1]>[i] where A: float32[3]", "expected an integer", 7),
    ("i +", "expected an expression, found end of input", 3),
    ("i j", "expected an operator", 2),
    ("(i + 1", "expected ')'", 6),
    ("A[i] where A: float32[3]; A: float32[3]", "declared twice", 26),
    ("L<i:0:3> { 1.0 } where", "expected a tensor name", 22),
    ("L<i:0:2> { L<j:0:2> { 1.0 } }", "must be parenthesized", 11),
    ("A<pad=[1], pad=[1]>[i] where A: float32[3]", "each at most once", 11),
    ("A<value=x>[i] where A: float32[3]", "expected a number", 8),
    ("L<i:0:3> Σ<r:0:2> { A[i] } extra where A: float32[3]", "expected an operator", 27),
    ("L<i:0:1.5> { 1.0 }", "expected an integer", 6),
    ("A[i] where A: float32[2.0]", "expected an integer", 22),
]


@pytest.mark.parametrize("text,fragment,pos", ERRORS)
def test_errors(text, fragment, pos):
    with pytest.raises(ParseError) as info:
        parse(text)
    err = info.value
    assert isinstance(err, ValueError)
    assert fragment in str(err)
    assert err.pos == pos, (err.pos, str(err))
    assert err.line == 1 and err.col == pos + 1


def test_error_line_and_column():
    with pytest.raises(ParseError) as info:
        parse("L<i:0:3> {\n  A[i] +\n  j } where A: float32[3]")
    assert (info.value.line, info.value.col) == (3, 3)
    assert "line 3, column 3" in str(info.value)


def test_parse_rejects_non_text():
    with pytest.raises(TypeError):
        parse(b"i + 1")


# ---------------------------------------------------------------------------------------------
# Property tests
# ---------------------------------------------------------------------------------------------
@settings(max_examples=150, deadline=None)
@given(strategies.scopes())
def test_round_trip_random_scopes(e):
    text = to_text(e)
    assert parse(text) is e
    assert to_text(parse(text)) == text


@settings(max_examples=60, deadline=None)
@given(strategies.scopes(max_depth=3, max_loops=2, max_reduce=1, max_extent=3,
                         pad_values=(0.0, -math.inf, 1.0)))
def test_round_trip_deep_scopes(e):
    assert parse(to_text(e)) is e


@settings(max_examples=80, deadline=None)
@given(strategies.conv_like_scopes())
def test_round_trip_conv_like(e):
    assert parse(to_text(e)) is e


_RANGES = {Var("i"): (0, 4), Var("j"): (-2, 3), Var("k"): (1, 6)}


@settings(max_examples=150, deadline=None)
@given(strategies.index_exprs(_RANGES))
def test_round_trip_index_exprs(e):
    assert is_index(e)
    assert free_vars(e) <= set(_RANGES)
    assert parse(to_text(e)) is e


_LEAVES = st.one_of(
    st.sampled_from([Var("a"), Var("b"), Var("c")]),
    st.integers(-3, 3).map(Const),
    st.sampled_from([0.5, -1.5, 2.0, 1e-07, -3e+30, math.inf, -math.inf]).map(Const),
    st.sampled_from([Var("a"), Const(-1)]).map(lambda i: Tensor("T", (3,))[i]),
)


def _extend(children):
    return st.one_of(
        st.tuples(st.sampled_from(BINARY_OPS), children, children).map(lambda t: BinOp(*t)),
        st.tuples(st.sampled_from(["relu", "neg", "exp"]), children).map(
            lambda t: Call(t[0], (t[1],))),
        st.tuples(children, children).map(lambda t: Call("max", t)),
        st.tuples(children, children, children).map(lambda t: Call("select", t)),
    )


@settings(max_examples=200, deadline=None)
@given(st.recursive(_LEAVES, _extend, max_leaves=12))
def test_round_trip_operator_trees(e):
    """Every operator and precedence combination, negative constants included."""
    assert parse(to_text(e)) is e


# ---------------------------------------------------------------------------------------------
# The strategies themselves
# ---------------------------------------------------------------------------------------------
def _eval_index(node, env):
    if isinstance(node, Var):
        return env[node]
    if isinstance(node, Const):
        return np.int64(node.value)
    a, b = _eval_index(node.a, env), _eval_index(node.b, env)
    ops = {"+": np.add, "-": np.subtract, "*": np.multiply, "//": np.floor_divide, "%": np.mod}
    return ops[node.op](a, b)


def _grid(ivs):
    axes = np.meshgrid(*[np.arange(iv.begin, iv.end) for iv in ivs], indexing="ij")
    return {iv.var: ax for iv, ax in zip(ivs, axes)}


def _out_of_bounds_reads(scope):
    """Reads outside the padded range, found by enumerating every iterator point (no intervals)."""
    env = _grid(scope.loops + scope.reduce)
    bad = []

    def visit(node):
        if isinstance(node, Access):
            src = node.source
            for d, idx in enumerate(node.indices):
                values = _eval_index(idx, env)
                lo_pad, hi_pad = src.pad[d]
                if isinstance(src, Tensor):
                    lo, hi = -lo_pad, src.shape[d] + hi_pad
                else:
                    lo, hi = src.loops[d].begin - lo_pad, src.loops[d].end + hi_pad
                if np.min(values) < lo or np.max(values) >= hi:
                    bad.append(f"{node} dim {d}: [{np.min(values)}, {np.max(values)}] "
                               f"not in [{lo}, {hi})")
            if isinstance(src, Scope):
                bad.extend(_out_of_bounds_reads(src))
        else:
            for child in node.children:
                visit(child)

    visit(scope.body)
    return bad


def _tensors_consistent(scope):
    seen = {}
    for node in iter_nodes(scope):
        if isinstance(node, Tensor):
            assert seen.setdefault(node.name, (node.shape, node.dtype)) == (node.shape,
                                                                              node.dtype)
            assert node.dtype == "float32"


def test_out_of_bounds_checker_catches_bad_reads():
    """The check below is not vacuous: it flags reads past a tensor's or a nested scope's end."""
    i = Var("i")
    A = Tensor("A", (3,), pad=[(1, 0)])
    assert _out_of_bounds_reads(Scope([IterVar(i, 0, 3)], [], A[i - 1])) == []
    assert _out_of_bounds_reads(Scope([IterVar(i, 0, 3)], [], A[i - 2]))
    assert _out_of_bounds_reads(Scope([IterVar(i, 0, 4)], [], A[i]))
    inner = Scope([IterVar("k", 1, 3)], [], A[Var("k")], pad=[(1, 0)])
    assert _out_of_bounds_reads(Scope([IterVar(i, 0, 3)], [], inner[i])) == []
    assert _out_of_bounds_reads(Scope([IterVar(i, 0, 4)], [], inner[i]))
    bad_inner = Scope([IterVar("k", 0, 3)], [], A[Var("k") + 1])
    assert _out_of_bounds_reads(Scope([IterVar(i, 0, 3)], [], bad_inner[i]))


@settings(max_examples=100, deadline=None)
@given(strategies.scopes())
def test_scopes_are_closed_and_in_bounds(e):
    assert isinstance(e, Scope) and 1 <= len(e.loops) <= 3 and len(e.reduce) <= 3
    assert all(iv.extent <= 5 for iv in e.loops + e.reduce)
    assert not free_vars(e)
    assert e.inputs, "every scope reads at least one tensor"
    _tensors_consistent(e)
    assert _out_of_bounds_reads(e) == []


@settings(max_examples=60, deadline=None)
@given(strategies.conv_like_scopes())
def test_conv_like_scopes_are_products_in_bounds(e):
    assert isinstance(e.body, BinOp) and e.body.op == "*"
    assert all(isinstance(x, Access) and isinstance(x.source, Tensor)
               for x in (e.body.a, e.body.b))
    assert e.reduce and e.reducer == "sum"
    _tensors_consistent(e)
    assert _out_of_bounds_reads(e) == []


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_index_bounds_is_sound(data):
    ranges = {Var("i"): (0, data.draw(st.integers(1, 5))),
              Var("j"): (b := data.draw(st.integers(-3, 2)), b + data.draw(st.integers(1, 5)))}
    e = data.draw(strategies.index_exprs(ranges))
    lo, hi = strategies.index_bounds(e, ranges)
    values = np.broadcast_to(_eval_index(e, _grid([IterVar(v, *r) for v, r in ranges.items()])),
                             (ranges[Var("i")][1], ranges[Var("j")][1] - ranges[Var("j")][0]))
    assert lo <= values.min() and values.max() <= hi


@settings(max_examples=40, deadline=None)
@given(strategies.scopes(pad_values=(0.0, 1.0)), strategies.conv_like_scopes())
def test_strategies_evaluate_without_out_of_bounds(e, conv):
    """The interpreter (the project's oracle) accepts every generated scope."""
    interp = pytest.importorskip("tvm_ollie.ir.interp")
    for expr in (e, conv):
        out = interp.evaluate(expr, interp.random_inputs(expr, seed=0))
        assert out.shape == expr.shape
