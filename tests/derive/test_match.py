"""Instantiation by iterator table: which scopes match which operators, with which attributes.

Every positive case is also instantiated and run: the program must compute the scope exactly
(integer-valued inputs, float64), so a wrong attribute or layout cannot pass.
"""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tvm_ollie.derive.match import iterator_table
from tvm_ollie.derive.program import instantiate
from tvm_ollie.derive.targets import TARGET_NAMES as TARGETS
from tvm_ollie.derive.targets import match_scope
from tvm_ollie.ir.interp import evaluate, random_inputs
from tvm_ollie.ir.nodes import Access, IterVar, Scope, Tensor, Var
from tvm_ollie.ir.parser import parse

try:  # shared strategies (tests/conftest.py puts tests/ir on sys.path)
    from strategies import conv_like_scopes, scopes
except ImportError:  # pragma: no cover
    conv_like_scopes = scopes = None


def run_exact(expr, prog, seed=0):
    ins = random_inputs(expr, seed=seed, integer=True)
    ref = evaluate(expr, ins, np.float64)
    got = prog.evaluate(ins, np.float64)
    assert got.shape == ref.shape
    np.testing.assert_array_equal(got, ref)


def only(expr, kind):
    """The (cheapest) match of ``kind``; every match of that kind must run exactly."""
    found = [m for m in match_scope(expr) if m.kind == kind]
    limit = 2 if kind in ("matmul", "batch_matmul") else 1  # the other operand order
    assert 1 <= len(found) <= limit, [m.kind for m in match_scope(expr)]
    for m in found:
        run_exact(expr, instantiate(expr, expr, m))
    return found[0]


# -- GEMMs ------------------------------------------------------------------------------------


def test_plain_matmul_is_free_of_eops():
    e = parse("L<i:0:4, j:0:5> Σ<k:0:3> { A[i, k] * B[k, j] } where A: float32[4, 3]; "
              "B: float32[3, 5]")
    m = only(e, "matmul")
    assert (m.attrs["M"], m.attrs["N"], m.attrs["K"]) == (4, 5, 3)
    assert not m.attrs["transpose_a"] and not m.attrs["transpose_b"]
    assert all(op.is_view for op in m.operands)
    prog = instantiate(e, e, m)
    assert repr(prog) == "matmul[4x3 @ 3x5]"
    assert m.signature() == "matmul[4x3 @ 3x5]"


@pytest.mark.parametrize("ta,tb", list(itertools.product([False, True], repeat=2)))
def test_batch_matmul_transposes(ta, tb):
    a, sa = ("A[b, k, i]", "[2, 3, 4]") if ta else ("A[b, i, k]", "[2, 4, 3]")
    b, sb = ("B[b, j, k]", "[2, 5, 3]") if tb else ("B[b, k, j]", "[2, 3, 5]")
    e = parse(f"L<b:0:2, i:0:4, j:0:5> Σ<k:0:3> {{ {a} * {b} }} "
              f"where A: float32{sa}; B: float32{sb}")
    m = only(e, "batch_matmul")
    assert (m.attrs["batch"], m.attrs["M"], m.attrs["N"], m.attrs["K"]) == (2, 4, 5, 3)
    assert (m.attrs["transpose_a"], m.attrs["transpose_b"]) == (ta, tb)
    assert all(op.is_view for op in m.operands)
    assert repr(instantiate(e, e, m)) == "batch_matmul[2x4x3 @ 2x3x5]"
    assert not any(x.kind == "matmul" for x in match_scope(e))


def test_matmul_operands_swapped_when_output_is_n_by_m():
    # out[j, i] = Σ A[i, k] B[k, j]: computing B^T A^T keeps the output a free view.
    e = parse("L<j:0:5, i:0:4> Σ<k:0:3> { A[i, k] * B[k, j] } where A: float32[4, 3]; "
              "B: float32[3, 5]")
    m = only(e, "matmul")
    assert m.output_is_view()
    assert (m.attrs["M"], m.attrs["N"]) == (5, 4)
    assert len(instantiate(e, e, m).stages) == 1


def test_grouped_iterators_are_views_when_row_major():
    # M = (n, h, w) and N = (r, s, f) read in row-major order: no gather at all.
    e = parse("L<n:0:2, h:0:3, w:0:3, r:0:2, s:0:2, f:0:4> Σ<c:0:5> "
              "{ A[n, h, w, c] * K[r, s, f, c] } where A: float32[2, 3, 3, 5]; "
              "K: float32[2, 2, 4, 5]")
    m = only(e, "matmul")
    assert (m.attrs["M"], m.attrs["N"], m.attrs["K"]) == (18, 16, 5)
    assert m.attrs["transpose_b"] and all(op.is_view for op in m.operands)


def test_gather_when_layout_is_not_row_major():
    e = parse("L<i:0:4, j:0:5> Σ<k:0:3, l:0:2> { A[k, i, l] * B[l, j, k] } "
              "where A: float32[3, 4, 2]; B: float32[2, 5, 3]")
    m = only(e, "matmul")
    assert m.attrs["K"] == 6
    assert m.gathers >= 1
    prog = instantiate(e, e, m)
    assert "eop[" in repr(prog) and "matmul[4x6 @ 6x5]" in repr(prog)


def test_shifted_and_padded_operands():
    e = parse("L<i:1:5, j:0:3> Σ<k:2:5> pad=[1, 0] { A<pad=[1:0, 0]>[i - 2, k - 2] * B[k, j] } "
              "where A: float32[3, 3]; B: float32[5, 3]")
    m = only(e, "matmul")
    assert m.operands[0].is_view is False  # reads the padded margin: a gather


def test_batch_group_of_two_iterators():
    e = parse("L<x:0:2, i:0:3, y:0:2, j:0:4> Σ<k:0:3> { A[x, y, i, k] * B[x, y, k, j] } "
              "where A: float32[2, 2, 3, 3]; B: float32[2, 2, 3, 4]")
    m = only(e, "batch_matmul")
    assert m.attrs["batch"] == 4


# -- conv2d -----------------------------------------------------------------------------------

CONVS = [
    # (text, expected attrs subset)
    ("L<n:0:2, f:0:4, h:0:5, w:0:5> Σ<c:0:3, r:0:3, s:0:3> "
     "{ A<pad=[0, 0, 1, 1]>[n, c, h + r - 1, w + s - 1] * K[f, c, r, s] } "
     "where A: float32[2, 3, 5, 5]; K: float32[4, 3, 3, 3]",
     dict(stride=(1, 1), dilation=(1, 1), padding=(1, 1, 1, 1), data_layout="NCHW",
          kernel_layout="OIHW", out_layout="NCHW")),
    ("L<n:0:1, h:0:4, w:0:4, f:0:8> Σ<c:0:8, r:0:3, s:0:3> "
     "{ A<pad=[0, 1, 1, 0]>[n, h + r - 1, w + s - 1, c] * K[r, s, f, c] } "
     "where A: float32[1, 4, 4, 8]; K: float32[3, 3, 8, 8]",
     dict(padding=(1, 1, 1, 1), data_layout="NHWC", kernel_layout="HWOI", out_layout="NHWC")),
    ("L<n:0:2, f:0:4, h:0:3, w:0:3> Σ<c:0:3, r:0:3, s:0:3> "
     "{ A<pad=[0, 0, 1:0, 1:0]>[n, c, 2 * h + r - 1, 2 * w + s - 1] * K[f, c, r, s] } "
     "where A: float32[2, 3, 6, 6]; K: float32[4, 3, 3, 3]",
     dict(stride=(2, 2), dilation=(1, 1), padding=(1, 1, 0, 0))),
    ("L<n:0:2, h:0:4, w:0:4, f:0:4> Σ<c:0:3, r:0:3, s:0:3> "
     "{ A[n, h + 2 * r, w + 2 * s, c] * K[r, s, c, f] } "
     "where A: float32[2, 8, 8, 3]; K: float32[3, 3, 3, 4]",
     dict(stride=(1, 1), dilation=(2, 2), padding=(0, 0, 0, 0), kernel_layout="HWIO")),
    ("L<n:0:2, f:0:4, h:0:2, w:0:2> Σ<c:0:3, r:0:3, s:0:3> "
     "{ A<pad=[0, 0, 1, 1]>[n, c, 2 * h + 2 * r - 1, 2 * w + 2 * s - 1] * K[f, c, r, s] } "
     "where A: float32[2, 3, 6, 6]; K: float32[4, 3, 3, 3]",
     dict(stride=(2, 2), dilation=(2, 2), padding=(1, 1, 0, 0))),
    # conv1d: a unit H
    ("L<n:0:2, f:0:4, w:0:6> Σ<c:0:3, s:0:3> { A[n, c, w + s] * K[f, c, s] } "
     "where A: float32[2, 3, 8]; K: float32[4, 3, 3]",
     dict(R=1, S=3, H=1, W=8, OH=1, OW=6)),
    # 1xk on a 2-D input
    ("L<n:0:2, f:0:4, h:0:5, w:0:6> Σ<c:0:3, s:0:3> { A[n, c, h, w + s] * K[f, c, s] } "
     "where A: float32[2, 3, 5, 8]; K: float32[4, 3, 3]",
     dict(R=1, S=3, H=5, OH=5)),
    # single filter (no f iterator), C = 1 (no c iterator)
    ("L<n:0:2, h:0:4, w:0:4> Σ<r:0:3, s:0:3> { A[n, h + r, w + s] * K[r, s] } "
     "where A: float32[2, 6, 6]; K: float32[3, 3]",
     dict(F=1, C=1, R=3, S=3)),
]


@pytest.mark.parametrize("text,want", CONVS)
def test_conv2d(text, want):
    e = parse(text)
    m = only(e, "conv2d")
    for key, value in want.items():
        assert m.attrs[key] == value, (key, m.attrs)


def test_conv_with_offset_read_becomes_gathered_window():
    # Reads start at +1 (a crop): not expressible as conv padding, the window is gathered.
    e = parse("L<n:0:1, f:0:2, h:0:3, w:0:3> Σ<c:0:2, r:0:2, s:0:2> "
              "{ A[n, c, h + r + 1, w + s + 1] * K[f, c, r, s] } "
              "where A: float32[1, 2, 5, 5]; K: float32[2, 2, 2, 2]")
    m = only(e, "conv2d")
    assert not m.operands[0].is_view
    assert m.attrs["padding"] == (0, 0, 0, 0) and m.attrs["H"] == 4


# -- g2bmm / gbmm -----------------------------------------------------------------------------


@pytest.mark.parametrize("dil", [1, 2])
def test_g2bmm(dil):
    half = 2
    e = parse(f"L<b:0:2, m:0:16, w:0:{2 * half + 1}> Σ<k:0:4> "
              f"{{ A[b, m, k] * B<pad=[0, {dil * half}, 0]>[b, m + {dil} * w - {dil * half}, k] }} "
              "where A: float32[2, 16, 4]; B: float32[2, 16, 4]")
    m = only(e, "g2bmm")
    assert m.attrs == {"batch": 2, "length": 16, "width": half, "dilation": dil, "K": 4}
    assert all(op.is_view for op in m.operands)


@pytest.mark.parametrize("dil", [1, 2])
def test_gbmm(dil):
    half = 2
    e = parse(f"L<b:0:2, m:0:16, n:0:4> Σ<w:0:{2 * half + 1}> "
              f"{{ A[b, m, w] * B<pad=[0, {dil * half}, 0]>[b, m + {dil} * w - {dil * half}, n] }} "
              "where A: float32[2, 16, 5]; B: float32[2, 16, 4]")
    m = only(e, "gbmm")
    assert m.attrs == {"batch": 2, "length": 16, "width": half, "dilation": dil, "N": 4}


def test_g2bmm_with_batch_group_and_layout_change():
    # The derived form of a dilated G2BMM: m = 4*i3 + i4 regrouped as batch (b, i4), length i3.
    e = parse("L<b:0:2, i4:0:2, i3:0:8, w:0:3> Σ<k:0:4> "
              "{ A[b, 2 * i3 + i4, k] * B<pad=[0, 2, 0]>[b, 2 * i3 + i4 + 2 * w - 2, k] } "
              "where A: float32[2, 16, 4]; B: float32[2, 16, 4]")
    assert not any(m.kind == "g2bmm" for m in match_scope(e))  # band stride 2 in i3: not g2bmm
    t1 = Scope([IterVar("b", 0, 2), IterVar("i4", 0, 2), IterVar("i3", 0, 8), IterVar("k", 0, 4)],
               [], Tensor("A", (2, 16, 4))[Var("b"), 2 * Var("i3") + Var("i4"), Var("k")])
    t3 = Scope([IterVar("b", 0, 2), IterVar("i4", 0, 2), IterVar("i3", 0, 8), IterVar("k", 0, 4)],
               [], Tensor("B", (2, 16, 4))[Var("b"), 2 * Var("i3") + Var("i4"), Var("k")],
               pad=[0, 0, 1, 0])
    b, i4, i3, w, k = map(Var, ("b", "i4", "i3", "w", "k"))
    inner = Scope([IterVar(b, 0, 2), IterVar(i4, 0, 2), IterVar(i3, 0, 8), IterVar(w, 0, 3)],
                  [IterVar(k, 0, 4)], t1[b, i4, i3, k] * t3[b, i4, i3 + w - 1, k])
    m = only(inner, "g2bmm")
    assert m.attrs["batch"] == 4 and m.attrs["length"] == 8 and m.attrs["dilation"] == 1


# -- non-matches ------------------------------------------------------------------------------

NON_MATCHES = [
    "L<i:0:4, j:0:5> { A[i] * B[j] } where A: float32[4]; B: float32[5]",  # no reduction
    "L<i:0:4> Σ<k:0:3> { A[i, k] + B[k] } where A: float32[4, 3]; B: float32[3]",  # not a product
    "L<i:0:4, j:0:3> Max<k:0:3> { A[i, k] * B[k, j] } where A: float32[4, 3]; B: float32[3, 3]",
    "L<i:0:4, j:0:3> Σ<k:0:3> { A[i, k] * B[k, j] * B[k, j] } "
    "where A: float32[4, 3]; B: float32[3, 3]",  # three factors
    "L<i:0:4, j:0:3> Σ<k:0:3, l:0:2> { A[i, k] * B[k, j] } "
    "where A: float32[4, 3]; B: float32[3, 3]",  # a summation iterator nobody reads
    "L<i:0:4, j:0:3, z:0:2> Σ<k:0:3> { A[i, k] * B[k, j] } "
    "where A: float32[4, 3]; B: float32[3, 3]",  # a broadcast output dim
    "L<i:0:4> Σ<k:0:3> { A[i, k] * relu(B[k]) } where A: float32[4, 3]; B: float32[3]",
]


@pytest.mark.parametrize("text", NON_MATCHES)
def test_non_matches(text):
    e = parse(text)
    assert match_scope(e) == []


def test_targets_filter_and_table():
    e = parse("L<i:0:4, j:0:5> Σ<k:0:3> { A[i, k] * B[k, j] } where A: float32[4, 3]; "
              "B: float32[3, 5]")
    assert match_scope(e, targets=("conv2d",)) == []
    assert {m.kind for m in match_scope(e, targets=("matmul",))} == {"matmul"}
    table = iterator_table(e)
    assert table.where(Var("k")) == (False, True, True)
    assert "k:0:3 Σ" in table.describe()


def test_nested_scope_operand_is_read_through_its_box():
    # The operand is a nested scope with an offset range: a view of its stage.
    inner = parse("L<x:2:6, k:0:3> { A[x - 2, k] * 2.0 } where A: float32[4, 3]")
    i, j, k = Var("i"), Var("j"), Var("k")
    bt = Tensor("B", (3, 5))
    e = Scope([IterVar(i, 0, 4), IterVar(j, 0, 5)], [IterVar(k, 0, 3)],
              Access(inner, (i + 2, k)) * bt[k, j])
    m = only(e, "matmul")
    assert m.operands[0].is_view


# -- properties -------------------------------------------------------------------------------


@st.composite
def gemm_scopes(draw):
    """Random GEMM-like scopes: role groups of 0-2 iterators, permuted operand dims."""
    names = iter(("p", "q", "r", "s", "t", "u", "v", "x"))
    roles = {}
    for role, lo in (("batch", 0), ("M", 0), ("N", 0), ("K", 1)):
        roles[role] = [Var(next(names)) for _ in range(draw(st.integers(lo, 2)))]
    ext = {v: draw(st.integers(1, 3)) for vs in roles.values() for v in vs}
    a_vars = roles["batch"] + roles["M"] + roles["K"]
    b_vars = roles["batch"] + roles["N"] + roles["K"]
    a_vars = draw(st.permutations(a_vars))
    b_vars = draw(st.permutations(b_vars))
    out = draw(st.permutations(roles["batch"] + roles["M"] + roles["N"]))
    if not out:
        out = []
    ta = Tensor("A", [ext[v] for v in a_vars] or [1])
    tb = Tensor("B", [ext[v] for v in b_vars] or [1])
    body = Access(ta, a_vars or [0]) * Access(tb, b_vars or [0])
    loops = [IterVar(v, 0, ext[v]) for v in out]
    if not loops:
        return None
    return Scope(loops, [IterVar(v, 0, ext[v]) for v in roles["K"]], body), bool(roles["batch"])


@settings(max_examples=40)
@given(gemm_scopes())
def test_every_gemm_like_scope_matches_and_runs(case):
    if case is None:
        return
    e, batched = case
    kinds = [m.kind for m in match_scope(e)]
    assert ("batch_matmul" if batched else "matmul") in kinds
    for m in match_scope(e):
        run_exact(e, instantiate(e, e, m))


@pytest.mark.skipif(conv_like_scopes is None, reason="shared strategies missing")
@settings(max_examples=40)
@given(st.data())
def test_any_match_of_random_scopes_is_exact(data):
    e = data.draw(conv_like_scopes() if data.draw(st.booleans()) else scopes())
    for m in match_scope(e, TARGETS):
        run_exact(e, instantiate(e, e, m))


# -- conv2d with grouped roles (derived forms) -------------------------------------------------


def conv5x5_split_to_3x3(n_, c_, f_, hw, nchw=False):
    """The conv5x5 -> conv3x3 derived state (split r, s by 3 with kernel padding, stage split).

    ``out[n,h,w,f] = Σ_{a,b<2} inner[n, h+3a, w+3b, a, b, f]`` where ``inner`` is a 3x3 conv
    whose output channels are the group ``(a, b, f)`` and whose weight reads
    ``K[3a + r, 3b + s, ..]`` (a weight index mixing output-group and kernel iterators).
    Returns ``(original, derived, inner)``.
    """
    n, h, w, f, c, r, s, a, b, t, u = map(Var, ("n", "h", "w", "f", "c", "r", "s", "a", "b",
                                               "t", "u"))
    if nchw:
        A = Tensor("A", (n_, c_, hw, hw))
        K = Tensor("K", (f_, c_, 5, 5))
        ap = A.with_pad([(0, 0), (0, 0), (2, 2), (2, 2)])
        orig = Scope([IterVar(n, 0, n_), IterVar(f, 0, f_), IterVar(h, 0, hw), IterVar(w, 0, hw)],
                     [IterVar(c, 0, c_), IterVar(r, 0, 5), IterVar(s, 0, 5)],
                     ap[n, c, h + r - 2, w + s - 2] * K[f, c, r, s])
        kp = K.with_pad([(0, 0), (0, 0), (0, 1), (0, 1)])
        a3 = A.with_pad([(0, 0), (0, 0), (2, 3), (2, 3)])
        inner = Scope([IterVar(n, 0, n_), IterVar(a, 0, 2), IterVar(b, 0, 2), IterVar(f, 0, f_),
                       IterVar(t, 0, hw + 3), IterVar(u, 0, hw + 3)],
                      [IterVar(c, 0, c_), IterVar(r, 0, 3), IterVar(s, 0, 3)],
                      a3[n, c, t + r - 2, u + s - 2] * kp[f, c, 3 * a + r, 3 * b + s])
        loops = orig.loops
        body = lambda n, h, w, f, a, b: inner[n, a, b, f, h + 3 * a, w + 3 * b]  # noqa: E731
    else:
        A = Tensor("A", (n_, hw, hw, c_))
        K = Tensor("K", (5, 5, f_, c_))
        ap = A.with_pad([(0, 0), (2, 2), (2, 2), (0, 0)])
        orig = Scope([IterVar(n, 0, n_), IterVar(h, 0, hw), IterVar(w, 0, hw), IterVar(f, 0, f_)],
                     [IterVar(r, 0, 5), IterVar(s, 0, 5), IterVar(c, 0, c_)],
                     ap[n, h + r - 2, w + s - 2, c] * K[r, s, f, c])
        kp = K.with_pad([(0, 1), (0, 1), (0, 0), (0, 0)])
        a3 = A.with_pad([(0, 0), (2, 3), (2, 3), (0, 0)])
        inner = Scope([IterVar(n, 0, n_), IterVar(t, 0, hw + 3), IterVar(u, 0, hw + 3),
                       IterVar(a, 0, 2), IterVar(b, 0, 2), IterVar(f, 0, f_)],
                      [IterVar(r, 0, 3), IterVar(s, 0, 3), IterVar(c, 0, c_)],
                      a3[n, t + r - 2, u + s - 2, c] * kp[3 * a + r, 3 * b + s, f, c])
        loops = orig.loops
        body = lambda n, h, w, f, a, b: inner[n, h + 3 * a, w + 3 * b, a, b, f]  # noqa: E731
    derived = Scope(loops, [IterVar(a, 0, 2), IterVar(b, 0, 2)], body(n, h, w, f, a, b))
    return orig, derived, inner


@pytest.mark.parametrize("n_,c_,f_,nchw", [(1, 2, 1, False), (2, 3, 2, False), (1, 4, 1, True),
                                           (2, 2, 2, True)])
def test_conv5x5_derived_as_conv3x3_with_output_channel_group(n_, c_, f_, nchw):
    orig, derived, inner = conv5x5_split_to_3x3(n_, c_, f_, 8, nchw)
    ms = [m for m in match_scope(inner) if m.kind == "conv2d"]
    assert len(ms) == 1
    m = ms[0]
    at = m.attrs
    assert (at["N"], at["C"], at["F"], at["R"], at["S"]) == (n_, c_, 4 * f_, 3, 3)
    assert (at["OH"], at["OW"], at["H"], at["W"]) == (11, 11, 8, 8)
    assert at["padding"] == (2, 2, 3, 3) and at["groups"] == 1
    data, weight = m.operands
    assert data.is_view and not weight.is_view  # only the weight is gathered (zero-padded)
    assert weight.shape == (4 * f_, c_, 3, 3)
    run_exact(inner, instantiate(inner, inner, m))
    prog = instantiate(derived, inner, m, original=orig)
    assert [s.kind for s in prog.stages].count("conv2d") == 1
    assert "conv2d[" in repr(prog) and "11x11" not in repr(prog).split("conv2d")[0]
    run_exact(orig, prog)


def test_engine_conv5x5_state_matches():
    # The exact state the search reaches at depth 5 (see derive-notes-engine.md).
    e = parse("L<i0:0:1, i1:0:9, i2:0:9, i3:0:2, i4:0:2, i5:0:1> Σ<r0:0:3, r1:0:3, r2:0:2> "
              "{ A<pad=[0, 2:3, 2:3, 0]>[i0, i1 + r0 - 2, i2 + r1 - 2, r2] * "
              "K<pad=[0:1, 0:1, 0, 0]>[3 * i3 + r0, 3 * i4 + r1, i5, r2] } "
              "where A: float32[1, 6, 6, 2]; K: float32[5, 5, 1, 2]")
    m = only(e, "conv2d")
    assert m.attrs["F"] == 4 and m.attrs["data_layout"] == "NHWC"
    assert m.output_is_view()


GROUPED = [
    # depthwise NCHW: the channel is a traversal iterator read by both operands
    ("L<n:0:2, ch:0:3, h:0:4, w:0:4> Σ<r:0:3, s:0:3> "
     "{ A<pad=[0, 0, 1, 1]>[n, ch, h + r - 1, w + s - 1] * K[ch, r, s] } "
     "where A: float32[2, 3, 4, 4]; K: float32[3, 3, 3]",
     dict(groups=3, C=3, F=3, padding=(1, 1, 1, 1)), (True, True)),
    # depthwise NHWC with channel multiplier 2
    ("L<n:0:1, h:0:4, w:0:4, ch:0:3, m:0:2> Σ<r:0:3, s:0:3> "
     "{ A[n, h + r, w + s, ch] * K[r, s, ch, m] } "
     "where A: float32[1, 6, 6, 3]; K: float32[3, 3, 3, 2]",
     dict(groups=3, C=3, F=6), (True, True)),
    # grouped, explicit group dims
    ("L<n:0:2, g:0:2, f:0:3, h:0:3, w:0:3> Σ<c:0:2, r:0:2, s:0:2> "
     "{ A[n, g, c, h + r, w + s] * K[g, f, c, r, s] } "
     "where A: float32[2, 2, 2, 4, 4]; K: float32[2, 3, 2, 2, 2]",
     dict(groups=2, C=4, F=6, R=2, S=2), (True, True)),
    # grouped NHWC with merged channel index (a free view) and stride 2
    ("L<n:0:1, h:0:3, w:0:3, g:0:2, f:0:2> Σ<r:0:3, s:0:3, c:0:3> "
     "{ A[n, 2 * h + r, 2 * w + s, 3 * g + c] * K[r, s, g, f, c] } "
     "where A: float32[1, 7, 7, 6]; K: float32[3, 3, 2, 2, 3]",
     dict(groups=2, C=6, F=4, stride=(2, 2)), (True, None)),
    # group iterator after the channel in the data: not a grouped layout, gathered
    ("L<n:0:1, g:0:2, f:0:2, h:0:3, w:0:3> Σ<c:0:2, r:0:2, s:0:2> "
     "{ A[n, c, g, h + r, w + s] * K[g, f, c, r, s] } "
     "where A: float32[1, 2, 2, 4, 4]; K: float32[2, 2, 2, 2, 2]",
     dict(groups=2, C=4, F=4), (False, True)),
]


@pytest.mark.parametrize("text,want,views", GROUPED)
def test_grouped_and_depthwise_conv2d(text, want, views):
    e = parse(text)
    m = only(e, "conv2d")
    for key, value in want.items():
        assert m.attrs[key] == value, (key, m.attrs)
    for op, view in zip(m.operands, views):
        if view is not None:
            assert op.is_view == view, (op.role, m.describe())
    if m.attrs["groups"] > 1:
        assert f"g{m.attrs['groups']}" in m.signature()


def test_batch_group_and_channel_group_of_several_iterators():
    # N = (p, q) and C = (c1, c2): merged roles, views because each group is row-major.
    e = parse("L<p:0:2, q:0:2, f:0:3, h:0:3, w:0:3> Σ<c1:0:2, c2:0:2, r:0:2, s:0:2> "
              "{ A[p, q, c1, c2, h + r, w + s] * K[f, c1, c2, r, s] } "
              "where A: float32[2, 2, 2, 2, 4, 4]; K: float32[3, 2, 2, 2, 2]")
    m = only(e, "conv2d")
    assert (m.attrs["N"], m.attrs["C"]) == (4, 4)
    assert all(op.is_view for op in m.operands)


def test_merged_dim_is_a_view_for_matmul():
    # A[3*i + j, k]: (i, j) row-major over a dim of extent 6 -- no gather needed.
    e = parse("L<i:0:2, j:0:3, n:0:4> Σ<k:0:5> { A[3 * i + j, k] * B[k, n] } "
              "where A: float32[6, 5]; B: float32[5, 4]")
    m = only(e, "matmul")
    assert all(op.is_view for op in m.operands)


def test_gemm_alternative_operand_order_is_offered_cheapest_first():
    e = parse("L<i:0:4, j:0:5> Σ<k:0:3> { A[i, k] * B[k, j] } where A: float32[4, 3]; "
              "B: float32[3, 5]")
    ms = match_scope(e, ("matmul",))
    assert len(ms) == 2
    progs = [instantiate(e, e, m) for m in ms]
    assert repr(progs[0]) == "matmul[4x3 @ 3x5]"
    assert repr(progs[1]) == "matmul[5x3 @ 3x4] -> eop[transpose 4x5]"
    assert progs[0].cost().time_s < progs[1].cost().time_s
    assert (ms[1].attrs["transpose_a"], ms[1].attrs["transpose_b"]) == (True, True)
    for p in progs:
        run_exact(e, p)
    assert [repr(instantiate(e, e, m)) for m in match_scope(e, ("matmul",))] == \
        [repr(p) for p in progs]  # deterministic


def test_gemm_orders_that_cost_the_same_are_offered_once():
    # With a unit N both orders read free views and write the output as a view.
    e = parse("L<i:0:4, j:0:1> Σ<k:0:3> { A[i, k] * B[k, j] } where A: float32[4, 3]; "
              "B: float32[3, 1]")
    assert len(match_scope(e, ("matmul",))) == 1


# -- properties over derived-looking product scopes --------------------------------------------

from match_strategies import product_scopes  # noqa: E402  (tests/derive is on sys.path)

EXPECTED_KIND = {"matmul": "matmul", "batch_matmul": "batch_matmul", "conv1d": "conv2d",
                 "conv2d": "conv2d", "depthwise": "conv2d", "g2bmm": "g2bmm", "gbmm": "gbmm"}


@settings(max_examples=60)
@given(product_scopes())
def test_random_product_scopes_match_exactly(e):
    ms = match_scope(e, TARGETS)
    assert len(ms) <= len(TARGETS) + 2
    for m in ms:
        prog = instantiate(e, e, m)
        run_exact(e, prog)
        assert prog.cost().time_s > 0


@pytest.mark.skipif(conv_like_scopes is None, reason="shared strategies missing")
@pytest.mark.parametrize("kind", sorted(EXPECTED_KIND))
@settings(max_examples=8)
@given(data=st.data())
def test_conv_like_scopes_match_their_operator(kind, data):
    e = data.draw(conv_like_scopes(kinds=(kind,)))
    ms = [m for m in match_scope(e) if m.kind == EXPECTED_KIND[kind]]
    assert ms, str(e)
    run_exact(e, instantiate(e, e, ms[0]))


@pytest.mark.parametrize("text,weight_view", [
    # h - r: the kernel runs backwards; padding 1 each side after flipping
    ("L<n:0:2, f:0:3, h:0:4, w:0:4> Σ<c:0:2, r:0:3, s:0:3> "
     "{ A<pad=[0, 0, 1, 1]>[n, c, h - r + 1, w - s + 1] * K[f, c, r, s] } "
     "where A: float32[2, 2, 4, 4]; K: float32[3, 2, 3, 3]", False),
    # flipped in both data and weight: the flipped weight is read forwards, a free view
    ("L<n:0:1, f:0:2, h:0:4, w:0:4> Σ<c:0:2, r:0:3, s:0:3> "
     "{ A[n, c, h - r + 2, w - s + 2] * K[f, c, 2 - r, 2 - s] } "
     "where A: float32[1, 2, 6, 6]; K: float32[2, 2, 3, 3]", True),
])
def test_conv2d_with_flipped_kernel(text, weight_view):
    e = parse(text)
    m = only(e, "conv2d")
    assert m.operands[1].is_view == weight_view
    assert m.attrs["R"] == 3 and m.attrs["dilation"] == (1, 1)


def test_transposed_conv_form_reads_as_dilated_conv():
    # out[n,h,w,c] = Σ A[n,i,j,f] K[h+1-2i, w+1-2j, f, c]: K is the data, dilation 2, flipped.
    e = parse("L<n:0:2, h:0:4, w:0:4, c:0:3> Σ<f:0:2, i:0:2, j:0:2> "
              "{ A[n, i, j, f] * K<pad=[2, 2, 0, 0]>[h + 1 - 2 * i, w + 1 - 2 * j, f, c] } "
              "where A: float32[2, 2, 2, 2]; K: float32[4, 4, 2, 3]")
    m = only(e, "conv2d")
    assert m.attrs["dilation"] == (2, 2) and m.attrs["R"] == 2
