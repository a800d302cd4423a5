"""Instantiation by iterator table: which scopes match which operators, with which attributes.

Every positive case is also instantiated and run: the program must compute the scope exactly
(integer-valued inputs, float64), so a wrong attribute or layout cannot pass.
"""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tvm_ollie.derive.match import TARGETS, iterator_table, match_scope
from tvm_ollie.derive.program import instantiate
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
    found = [m for m in match_scope(expr) if m.kind == kind]
    assert len(found) == 1, [m.kind for m in match_scope(expr)]
    m = found[0]
    run_exact(expr, instantiate(expr, expr, m))
    return m


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
    assert [m.kind for m in match_scope(e, targets=("matmul",))] == ["matmul"]
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
