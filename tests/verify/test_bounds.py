"""Tests of the static bound checker (``tvm_ollie.verify.check_bounds``).

The property tests compare against brute force: every point of the (small) iteration space is
enumerated with a Python evaluator of index expressions that does not use the code under test.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.ir.strategies import conv_like_scopes, scopes
from tvm_ollie.ir.nodes import Access, BinOp, Call, Const, IterVar, Node, Scope, Tensor, Var
from tvm_ollie.ir.interp import OutOfBoundsError, evaluate, random_inputs
from tvm_ollie.verify import check_bounds

N, H, W, F, C, R, S, I, J = (Var(x) for x in ("n", "h", "w", "f", "c", "r", "s", "i", "j"))
K = Tensor("K", (3, 3, 4, 4))
LOOPS = (IterVar(N, 0, 1), IterVar(H, 0, 5), IterVar(W, 0, 5), IterVar(F, 0, 4))
REDUCE = (IterVar(C, 0, 4), IterVar(R, 0, 3), IterVar(S, 0, 3))


def conv(a: Tensor) -> Scope:
    return Scope(LOOPS, REDUCE, a[N, H + R - 1, W + S - 1, C] * K[R, S, F, C])


def test_padded_conv_is_in_bounds():
    assert check_bounds(conv(Tensor("A", (1, 5, 5, 4), pad=[0, 1, 1, 0]))) == []


def test_unpadded_conv_reports_both_spatial_dims():
    problems = check_bounds(conv(Tensor("A", (1, 5, 5, 4))))
    assert len(problems) == 2
    assert "index 1 (h + r - 1) takes values in [-1, 5]" in problems[0]
    assert "tensor A dimension 1 is readable only in [0, 4]" in problems[0]
    assert "index 2" in problems[1]


def test_one_sided_padding():
    problems = check_bounds(conv(Tensor("A", (1, 5, 5, 4), pad=[0, (1, 0), 1, 0])))
    assert len(problems) == 1 and "[-1, 5]" in problems[0] and "[-1, 4]" in problems[0]


def test_nested_scope_reads_in_loop_value_coordinates():
    t = Tensor("T", (6,))
    inner = Scope((IterVar(J, 1, 5),), (), t[J], pad=[(1, 2)])  # readable [0, 7)
    ok = Scope((IterVar(I, 0, 7),), (), Access(inner, (I,)))
    assert check_bounds(ok) == []
    too_far = Scope((IterVar(I, 0, 8),), (), Access(inner, (I,)))
    problems = check_bounds(too_far)
    assert len(problems) == 1 and "nested scope L<j>" in problems[0] and "[0, 6]" in problems[0]
    # a violation inside the nested scope itself
    bad_inner = Scope((IterVar(J, 0, 7),), (), t[J])
    problems = check_bounds(Scope((IterVar(I, 0, 7),), (), Access(bad_inner, (I,))))
    assert len(problems) == 1 and "T[j] in L<j>" in problems[0]


def test_div_mod_indices():
    t = Tensor("T", (4, 2))
    ok = Scope((IterVar(I, 0, 8),), (), t[I // 2, I % 2])
    assert check_bounds(ok) == []
    bad = Scope((IterVar(I, 0, 9),), (), t[I // 2, I % 2])
    assert len(check_bounds(bad)) == 1
    merged = Scope((IterVar(I, 0, 4),), (), Tensor("U", (4,))[2 * (I // 2) + I % 2])
    assert check_bounds(merged) == []


def test_guards_on_select():
    t = Tensor("T", (5,))
    loops = (IterVar(H, 0, 5),)
    guarded = Scope(loops, (), Call("select", (BinOp(">", H, Const(0)), t[H - 1], Const(0.0))))
    assert check_bounds(guarded) == []
    unguarded = Scope(loops, (), Call("select", (BinOp("<", H, Const(5)), t[H - 1],
                                                 Const(0.0))))
    assert len(check_bounds(unguarded)) == 1
    # the else branch sees the negated condition
    negated = Scope(loops, (), Call("select", (BinOp("<", H, Const(1)), Const(0.0), t[H - 1])))
    assert check_bounds(negated) == []
    # a padding guard on a compound index
    reduce = (IterVar(R, 0, 3),)
    idx = H + R - 1
    cond = BinOp("and", BinOp(">=", idx, Const(0)), BinOp("<", idx, Const(5)))
    padded = Scope(loops, reduce, Call("select", (cond, t[idx], Const(0.0))))
    assert check_bounds(padded) == []
    half = Scope(loops, reduce, Call("select", (BinOp(">=", idx, Const(0)), t[idx], Const(0.0))))
    assert len(check_bounds(half)) == 1
    # the guard written the other way around: 0 <= h + r - 1  ==  (1 - h - r) <= 0
    flipped = BinOp("and", BinOp("<=", Const(1) - H - R, Const(0)), BinOp("<", idx, Const(5)))
    assert check_bounds(Scope(loops, reduce, Call("select", (flipped, t[idx], Const(0.0))))) == []


def test_bare_expressions():
    t = Tensor("T", (4,))
    assert check_bounds(t[I + 1], {I: (0, 3)}) == []
    assert len(check_bounds(t[I + 1], {I: (0, 4)})) == 1
    problems = check_bounds(t[I + J], {I: (0, 3)})
    assert len(problems) == 1 and "without a range" in problems[0]


def test_non_affine_index_is_conservative():
    t = Tensor("T", (10,))
    loops = (IterVar(I, 0, 4), IterVar(J, 0, 4))
    assert check_bounds(Scope(loops, (), t[I * J])) == []
    assert len(check_bounds(Scope(loops, (), t[I * J + 1]))) == 1
    # i * (3 - i) <= 2 in truth, but interval arithmetic allows 9: a false alarm, flagged
    small = Tensor("U", (3,))
    assert len(check_bounds(Scope((IterVar(I, 0, 4),), (), small[I * (Const(3) - I)]))) == 1


# -- brute force -------------------------------------------------------------------------------


def _eval(node: Node, env) -> int:
    if type(node) is Var:
        return env[node]
    if type(node) is Const:
        return node.value
    a, b = _eval(node.a, env), _eval(node.b, env)
    return {"+": lambda: a + b, "-": lambda: a - b, "*": lambda: a * b,
            "//": lambda: a // b, "%": lambda: a % b}[node.op]()


def _brute_force_violation(scope: Scope) -> bool:
    """True when some point of the iteration space reads outside some source (outer level)."""
    ivs = scope.loops + scope.reduce
    accesses = []
    stack = [scope.body]
    while stack:
        node = stack.pop()
        if type(node) is Access:
            accesses.append(node)
        elif type(node) in (BinOp, Call):
            stack.extend(node.children)
    for values in itertools.product(*(range(iv.begin, iv.end) for iv in ivs)):
        env = {iv.var: v for iv, v in zip(ivs, values)}
        for acc in accesses:
            for dim, index in enumerate(acc.indices):
                lo, hi = acc.source.pad[dim]
                if type(acc.source) is Tensor:
                    low, high = -lo, acc.source.shape[dim] + hi
                else:
                    loop = acc.source.loops[dim]
                    low, high = loop.begin - lo, loop.end + hi
                if not low <= _eval(index, env) < high:
                    return True
    return False


@st.composite
def single_level_scopes(draw):
    """Scopes reading 1-2 tensors with random affine (and sometimes div/mod) subscripts."""
    names = ("i", "j", "r")
    n_loops = draw(st.integers(1, 2))
    ivs = []
    for name in names[:n_loops + draw(st.integers(0, 1))]:
        begin = draw(st.integers(-1, 1))
        ivs.append(IterVar(name, begin, begin + draw(st.integers(1, 4))))
    loops, reduce = ivs[:n_loops], ivs[n_loops:]
    reads = []
    for tname in ("A", "B")[:draw(st.integers(1, 2))]:
        rank = draw(st.integers(1, 2))
        indices = []
        for _ in range(rank):
            expr: Node = Const(draw(st.integers(-1, 2)))
            for iv in ivs:
                coeff = draw(st.integers(-1, 2))
                if coeff:
                    expr = expr + Const(coeff) * iv.var
            op = draw(st.sampled_from(("", "", "//", "%")))
            if op:
                expr = BinOp(op, expr, Const(draw(st.integers(2, 3))))
            indices.append(expr)
        shape = tuple(draw(st.integers(1, 5)) for _ in range(rank))
        pad = tuple((draw(st.integers(0, 2)), draw(st.integers(0, 2))) for _ in range(rank))
        reads.append(Tensor(tname, shape, pad=pad)[tuple(indices)])
    body = reads[0] if len(reads) == 1 else reads[0] * reads[1]
    return Scope(loops, reduce, body)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(single_level_scopes())
def test_matches_brute_force(scope):
    flagged = bool(check_bounds(scope))
    truth = _brute_force_violation(scope)
    # Sound always; exact here since every subscript uses each iterator at most once.
    assert flagged == truth, (str(scope), check_bounds(scope))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(single_level_scopes())
def test_agrees_with_the_interpreter(scope):
    problems = check_bounds(scope)
    try:
        evaluate(scope, random_inputs(scope))
    except OutOfBoundsError:
        assert problems
    else:
        assert not problems


def test_strategy_scopes_are_in_bounds():
    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(st.one_of(scopes(max_depth=2), conv_like_scopes()))
    def check(scope):
        assert check_bounds(scope) == [], str(scope)

    check()


if __name__ == "__main__":  # pragma: no cover
    pytest.main([__file__])
