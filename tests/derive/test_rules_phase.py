"""Phase splitting (split phase): each rewrite keeps the interpreter's result, every phase sums
only over the taps that land in it, and derivation finds the sub-pixel form of a stride-2
transposed convolution (one conv2d per phase, interleaved by an eOperator)."""

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from rulecheck import Applied, check_rule, conv_transpose_gather
from tvm_ollie.derive.focus import apply_eager
from tvm_ollie.derive.rules import (EAGER_RULES, GUIDED_RULES, SEARCH_RULES, SPLIT_PHASE,
                                    RuleContext)
from tvm_ollie.derive.rules.phase import strided_pairs
from tvm_ollie.derive.search import derive
from tvm_ollie.ir.nodes import Const, IterVar, Scope, Tensor, Var, iter_nodes


def scatter_form(*args, **kwargs) -> Scope:
    """A transposed convolution after the eager rules (guard solved, ranges tightened)."""
    return apply_eager(conv_transpose_gather(*args, **kwargs), EAGER_RULES, RuleContext())


def phases(scope: Scope):
    """The phase scopes an interleave reads (the scopes nested in its body)."""
    return [n for n in iter_nodes(scope.body) if isinstance(n, Scope)]


def macs(scope: Scope) -> int:
    """Multiply-adds of a summation scope (product of its loop and summation extents)."""
    out = 1
    for iv in scope.loops + scope.reduce:
        out *= iv.extent
    return out


def test_split_phase_k4_s2_p1_has_no_wasted_taps():
    # DCGAN's layer shape, small: 4x4 kernel, stride 2, padding 1
    c, f, size = 3, 2, (3, 3)
    e = scatter_form(1, c, f, size, (4, 4), (2, 2), (1, 1), (1, 1), (0, 0))
    assert len(strided_pairs(e)) == 2
    rws = check_rule(SPLIT_PHASE, e)
    assert len(rws) == 1 and "4 phases" in rws[0].note
    parts = phases(rws[0].scope)
    assert len(parts) == 4
    for p in parts:  # a 2x2 tap window per phase: one quarter of the 4x4 taps
        taps = [iv.extent for iv in p.reduce if iv.var.name != "c"]
        assert sorted(taps)[-2:] == [2, 2]
    # each 6x6 output pixel meets 2x2 taps per channel pair; the scatter form sums 3x3
    assert sum(macs(p) for p in parts) == 6 * 6 * 4 * c * f
    assert macs(e) == 6 * 6 * 9 * c * f


def test_split_phase_stride3_output_padding_and_uneven_phases():
    # FSRCNN-like: 9 taps, stride 3, padding 4, output padding 2 (3 taps per phase)
    rws = check_rule(SPLIT_PHASE, scatter_form(1, 2, 1, (3,), (9,), (3,), (4,), (4,), (2,)))
    assert [iv.extent for p in phases(rws[0].scope) for iv in p.reduce if iv.extent > 2] == \
        [3, 3, 3]
    # a 7-row output with stride 3: phases of 3, 2 and 2 rows
    e = scatter_form(1, 1, 2, (3,), (3,), (3,), (1,), (1,), (0,))
    assert e.loops[-1].extent == 7
    rws = check_rule(SPLIT_PHASE, e)
    assert [p.loops[-1].extent for p in phases(rws[0].scope)] == [3, 2, 2]


def test_split_phase_empty_phase_is_zero():
    # a 1-tap kernel with stride 2: odd output rows receive nothing
    rws = check_rule(SPLIT_PHASE, scatter_form(1, 2, 2, (3,), (1,), (2,), (0,), (0,), (1,)))
    assert len(rws) == 1
    assert len(phases(rws[0].scope)) == 1
    assert any(isinstance(n, Const) and n.value == 0.0 for n in iter_nodes(rws[0].scope.body))


def test_split_phase_refuses_stride_one_and_unvanishing_sums():
    # stride 1: an ordinary convolution, nothing to split
    assert SPLIT_PHASE(scatter_form(1, 2, 2, (4,), (3,), (1,), (1,), (1,), (0,))) == []
    # x[q] is not zero outside q's range (its data extends beyond it): new terms would appear
    h, q = Var("h"), Var("q")
    x, k = Tensor("x", (6,)), Tensor("K", (4,), pad=((8, 8),))
    body = x[q] * k[h - 2 * q + 1]
    assert SPLIT_PHASE(Scope([IterVar(h, 0, 6)], [IterVar(q, 0, 3)], body)) == []
    assert SPLIT_PHASE in GUIDED_RULES
    assert SPLIT_PHASE not in SEARCH_RULES and SPLIT_PHASE not in EAGER_RULES


@st.composite
def conv_transposes(draw):
    nd = draw(st.integers(1, 2))
    size = [draw(st.integers(1, 3)) for _ in range(nd)]
    taps = [draw(st.integers(1, 5)) for _ in range(nd)]
    stride = [draw(st.integers(1, 3)) for _ in range(nd)]
    pad_lo = [draw(st.integers(0, t - 1)) for t in taps]
    pad_hi = [draw(st.integers(0, t - 1)) for t in taps]
    out_pad = [draw(st.integers(0, s - 1)) for s in stride]
    n, c, f = draw(st.integers(1, 2)), draw(st.integers(1, 2)), draw(st.integers(1, 2))
    return n, c, f, size, taps, stride, pad_lo, pad_hi, out_pad


APPLIED = Applied()


@given(conv_transposes())
@settings(max_examples=30, deadline=None)
def test_split_phase_random_conv_transposes(params):
    n, c, f, size, taps, stride, pad_lo, pad_hi, out_pad = params
    out = [(i - 1) * s - pl - ph + t - 1 + o + 1
           for i, s, pl, ph, t, o in zip(size, stride, pad_lo, pad_hi, taps, out_pad)]
    assume(min(out) >= 1)
    APPLIED.cases += 1
    rws = check_rule(SPLIT_PHASE, scatter_form(n, c, f, size, taps, stride, pad_lo, pad_hi,
                                               out_pad))
    APPLIED.note(SPLIT_PHASE, len(rws))


def test_split_phase_applied_in_random_cases():
    APPLIED.require(SPLIT_PHASE)


def test_derive_finds_sub_pixel_form_of_stride2_conv_transpose():
    e = conv_transpose_gather(1, 8, 4, (4, 4), (4, 4), (2, 2), (1, 1), (1, 1), (0, 0))
    res = derive(e, targets=("conv2d",), max_depth=1, search_time_s=20, verify=False,
                 max_candidates=None)
    compact = [p for p in res.candidates
               if p.kinds.count("conv2d") == 4
               and all(s.attrs.get("R") == 2 and s.attrs.get("S") == 2 for s in p.operators)]
    assert compact, [repr(p) for p in res.candidates]
    prog = compact[0]
    assert "split_phase" in prog.explain()
    import numpy as np  # pylint: disable=import-outside-toplevel

    from tvm_ollie.ir.interp import evaluate  # pylint: disable=import-outside-toplevel

    rng = np.random.default_rng(0)
    inputs = {"x": rng.standard_normal((1, 8, 4, 4)).astype("float32"),
              "K": rng.standard_normal((8, 4, 4, 4)).astype("float32")}
    np.testing.assert_allclose(prog.evaluate(inputs), evaluate(e, inputs), rtol=1e-4,
                               atol=1e-4)
