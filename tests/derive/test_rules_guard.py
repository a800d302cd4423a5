"""Guard solving (solve stride guard): each rewrite keeps the interpreter's result, and the select
of a lifted transposed convolution disappears."""

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from rulecheck import check_rule, conv_transpose_gather
from tvm_ollie.derive.rules import EAGER_RULES, SOLVE_GUARD
from tvm_ollie.derive.rules.base import in_bounds
from tvm_ollie.derive.rules.guard import conjuncts, stride_condition
from tvm_ollie.ir.nodes import BinOp, Call, Const, IterVar, Scope, Tensor, Var, iter_nodes


def _has_select(expr) -> bool:
    return any(isinstance(x, Call) and x.func == "select" for x in iter_nodes(expr))


def test_stride_condition_parses_both_sides():
    h = Var("h")
    assert stride_condition(BinOp("==", BinOp("%", h, Const(2)), Const(0)))[1] == 2
    assert stride_condition(BinOp("==", Const(1), BinOp("%", h, Const(3))))[1] == 3
    assert stride_condition(BinOp("==", BinOp("%", h, Const(2)), Const(2))) is None
    assert len(conjuncts(BinOp("and", BinOp("<", h, 1), BinOp(">", h, 0)))) == 2


def test_solve_guard_k4_s2_p1_gives_scatter_form():
    e = conv_transpose_gather(1, 3, 2, (3, 3), (4, 4), (2, 2), (1, 1), (1, 1), (0, 0))
    assert _has_select(e)
    rws = check_rule(SOLVE_GUARD, e)
    assert len(rws) == 1
    new = rws[0].scope
    assert not _has_select(new) and in_bounds(new)
    # the taps became the input rows: x is now read at a plain iterator on each spatial dim
    assert "x<" in str(new) and "h0 - 2 * q" in str(new)
    assert SOLVE_GUARD in EAGER_RULES and not SOLVE_GUARD.costs_depth


def test_solve_guard_k3_s2_output_padding():
    e = conv_transpose_gather(2, 2, 3, (3, 3), (3, 3), (2, 2), (0, 0), (0, 0), (1, 1))
    new = check_rule(SOLVE_GUARD, e)[0].scope
    assert not _has_select(new)


def test_solve_guard_refuses_max_reduction_and_no_vanishing_factor():
    h, r = Var("h"), Var("r")
    x = Tensor("x", (4,), pad=((1, 1),))
    guard = BinOp("==", BinOp("%", h - r, Const(2)), Const(0))
    read = Call("select", (guard, x[BinOp("//", h - r, Const(2))], Const(0.0, "float32")))
    loops, red = [IterVar(h, 0, 6)], [IterVar(r, 0, 3)]
    # nothing vanishes when r leaves [0, 3): solving would add terms
    assert SOLVE_GUARD(Scope(loops, red, read * 2.0)) == []
    k = Tensor("K", (3,))
    assert SOLVE_GUARD(Scope(loops, red, read * k[r], reducer="max")) == []
    assert len(check_rule(SOLVE_GUARD, Scope(loops, red, read * k[r]))) == 1


def test_solve_guard_leaves_dilated_taps_alone():
    # dilation 2 with stride 2: the tap coefficient is -2, not ±1; the rule must not guess
    e = conv_transpose_gather(1, 2, 2, (4,), (3,), (2,), (1,), (1,), (0,), dil=(2,))
    assert SOLVE_GUARD(e) == []


@st.composite
def conv_transposes(draw):
    nd = draw(st.integers(1, 2))
    size = [draw(st.integers(1, 3)) for _ in range(nd)]
    taps = [draw(st.integers(1, 4)) for _ in range(nd)]
    stride = [draw(st.integers(1, 3)) for _ in range(nd)]
    dil = [draw(st.sampled_from((1, 1, 2, 3))) for _ in range(nd)]
    pad_lo = [draw(st.integers(0, d * (t - 1))) for t, d in zip(taps, dil)]
    pad_hi = [draw(st.integers(0, d * (t - 1))) for t, d in zip(taps, dil)]
    out_pad = [draw(st.integers(0, s - 1)) for s in stride]
    n, c, f = draw(st.integers(1, 2)), draw(st.integers(1, 2)), draw(st.integers(1, 2))
    return n, c, f, size, taps, stride, pad_lo, pad_hi, out_pad, dil


@given(conv_transposes())
@settings(max_examples=40, deadline=None)
def test_solve_guard_random_conv_transposes(params):
    n, c, f, size, taps, stride, pad_lo, pad_hi, out_pad, dil = params
    out = [(i - 1) * s - pl - ph + d * (t - 1) + o + 1
           for i, s, pl, ph, d, t, o in zip(size, stride, pad_lo, pad_hi, dil, taps, out_pad)]
    assume(min(out) >= 1)
    e = conv_transpose_gather(n, c, f, size, taps, stride, pad_lo, pad_hi, out_pad, dil)
    rws = check_rule(SOLVE_GUARD, e)
    solvable = [s > 1 and d == 1 for s, d in zip(stride, dil)]
    if any(solvable):
        assert len(rws) == 1
        assert in_bounds(rws[0].scope)
        if all(solvable[k] or stride[k] == 1 for k in range(len(size))):
            assert not _has_select(rws[0].scope)
    else:
        assert not rws or all(in_bounds(rw.scope) for rw in rws)
