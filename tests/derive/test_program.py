"""Programs: instantiation of derived expressions into stages, evaluation, explain, fusion."""

import numpy as np
import pytest

from tvm_ollie.derive.targets import match_scope
from tvm_ollie.derive.program import (
    Program,
    Stage,
    Step,
    eop_label,
    fuse_memory_bound,
    instantiate,
    instantiate_all,
    normalize_scope,
)
from tvm_ollie.ir.interp import evaluate, random_inputs
from tvm_ollie.ir.nodes import IterVar, Scope, Tensor, Var
from tvm_ollie.ir.parser import parse

CONV = parse("L<n:0:1, h:0:4, w:0:4, f:0:8> Σ<c:0:8, r:0:3, s:0:3> "
             "{ A<pad=[0, 1, 1, 0]>[n, h + r - 1, w + s - 1, c] * K[r, s, f, c] } "
             "where A: float32[1, 4, 4, 8]; K: float32[3, 3, 8, 8]")


def offset_add(inner: Scope) -> Scope:
    """``L<n,h,w,f> Σ<r,s> { inner[h + r, w + s, r, s, n, f] }``: the conv3x3 derived form."""
    n, h, w, f, r, s = map(Var, "nhwfrs")
    return Scope([IterVar(n, 0, 1), IterVar(h, 0, 4), IterVar(w, 0, 4), IterVar(f, 0, 8)],
                 [IterVar(r, 0, 3), IterVar(s, 0, 3)], inner[h + r, w + s, r, s, n, f])


def assert_same(expr, prog, seed=0):
    ins = random_inputs(expr, seed=seed, integer=True)
    np.testing.assert_array_equal(prog.evaluate(ins, np.float64), evaluate(expr, ins, np.float64))


def test_conv3x3_derived_form_instantiates_as_matmul_plus_offset_add():
    inner = parse("L<t1:0:6, t2:0:6, r:0:3, s:0:3, n:0:1, f:0:8> Σ<c:0:8> "
                  "{ A<pad=[0, 1, 1, 0]>[n, t1 - 1, t2 - 1, c] * K[r, s, f, c] } "
                  "where A: float32[1, 4, 4, 8]; K: float32[3, 3, 8, 8]")
    expr = offset_add(inner)
    m = [x for x in match_scope(inner) if x.kind == "matmul"][0]
    assert (m.attrs["M"], m.attrs["N"], m.attrs["K"]) == (36, 72, 8)
    prog = instantiate(expr, inner, m, steps=[("stage-split", "Σ<r, s>", expr)], original=CONV)
    assert repr(prog) == "eop[gather 1x6x6x8] -> matmul[36x8 @ 8x72] -> eop[offset-add 1x4x4x8]"
    assert_same(CONV, prog)
    assert prog.original is CONV and prog.derived is expr
    assert [s.kind for s in prog.stages] == ["eop", "matmul", "eop"]
    assert prog.stage(prog.output).label == "offset-add"


def test_tightened_conv3x3_form_needs_no_gather():
    # Boundary tightening leaves t1, t2 in [1, 5) with padding: the A operand is a free view.
    inner = parse("L<t1:1:5, t2:1:5, r:0:3, s:0:3, n:0:1, f:0:8> Σ<c:0:8> pad=[1, 1, 0, 0, 0, 0] "
                  "{ A<pad=[0, 1, 1, 0]>[n, t1 - 1, t2 - 1, c] * K[r, s, f, c] } "
                  "where A: float32[1, 4, 4, 8]; K: float32[3, 3, 8, 8]")
    expr = offset_add(inner)
    m = [x for x in match_scope(inner) if x.kind == "matmul"][0]
    prog = instantiate(expr, inner, m)
    assert repr(prog) == "matmul[16x8 @ 8x72] -> eop[offset-add 1x4x4x8]"
    assert_same(CONV, prog)
    # The padding and offset of the matched scope are folded into the reader's view.
    reader = prog.stages[-1].expr
    (t,) = [x for x in reader.inputs if x.name == prog.stages[0].name]
    assert t.shape == (1, 4, 4, 3, 3, 8) and t.pad[1] == (1, 1)


def test_explain_lists_steps_and_stages():
    e = parse("L<i:0:4, j:0:5> Σ<k:0:3> { A[i, k] * B[k, j] } where A: float32[4, 3]; "
              "B: float32[3, 5]")
    m = match_scope(e)[0]

    class StepObj:  # the engine's step records: rule object with .name, note, expr
        class rule:  # noqa: N801
            name = "variable-merge"
        note = "merge [i, j]"
        expr = e

    prog = instantiate(e, e, m, steps=[Step("split", "k -> 3*k1 + k2", e), ("tuple-rule", "n"),
                                       StepObj()])
    text = prog.explain()
    for piece in ("original:", "1. split: k -> 3*k1 + k2", "2. tuple-rule: n",
                  "3. variable-merge: merge [i, j]", "T0 = matmul[4x3 @ 3x5]", "[output]"):
        assert piece in text, text


def test_two_matched_scopes_become_two_operators():
    # (A @ B) @ C with the inner product as a nested scope.
    i, j, k, l = map(Var, "ijkl")
    a, b, c = Tensor("A", (4, 3)), Tensor("B", (3, 5)), Tensor("C", (5, 2))
    inner = Scope([IterVar(i, 0, 4), IterVar(l, 0, 5)], [IterVar(k, 0, 3)], a[i, k] * b[k, l])
    outer = Scope([IterVar(i, 0, 4), IterVar(j, 0, 2)], [IterVar(l, 0, 5)], inner[i, l] * c[l, j])
    mi = match_scope(inner, ("matmul",))[0]
    mo = match_scope(outer, ("matmul",))[0]
    prog = instantiate_all(outer, {inner: mi, outer: mo})
    assert repr(prog) == "matmul[4x3 @ 3x5] -> matmul[4x5 @ 5x2]"
    assert_same(outer, prog)
    # Only the outer one matched: the inner product stays an eOperator feeding it.
    prog = instantiate(outer, outer, mo)
    assert [s.kind for s in prog.stages] == ["eop", "matmul"]
    assert_same(outer, prog)


def test_scope_not_in_expression_is_rejected():
    e = parse("L<i:0:4, j:0:5> Σ<k:0:3> { A[i, k] * B[k, j] } where A: float32[4, 3]; "
              "B: float32[3, 5]")
    other = parse("L<i:0:4, j:0:5> Σ<k:0:3> { A[i, k] * B[k, j] } where A: float32[4, 3]; "
                  "B: float32[3, 6]")
    with pytest.raises(ValueError):
        instantiate(e, other, match_scope(other)[0])


def test_root_with_padding_and_transposed_output():
    e = parse("L<j:0:5, b:0:2, i:0:4> Σ<k:0:3> pad=[1, 0, 2:0] { A[b, i, k] * B[b, k, j] } "
              "where A: float32[2, 4, 3]; B: float32[2, 3, 5]")
    m = [x for x in match_scope(e) if x.kind == "batch_matmul"][0]
    prog = instantiate(e, e, m)
    assert [s.kind for s in prog.stages] == ["batch_matmul", "eop"]
    assert prog.stages[-1].label == "pad"
    assert_same(e, prog)


def test_stage_names_avoid_input_names():
    e = parse("L<i:0:4, j:0:5> Σ<k:0:3> { T0[k, i] * T1[k, j] } where T0: float32[3, 4]; "
              "T1: float32[3, 5]")
    e2 = parse("L<i:0:4, j:0:5> { (L<i:0:4, j:0:5> Σ<k:0:3> { T0[k, i] * T1[k, j] })[i, j] * 2.0 } "
               "where T0: float32[3, 4]; T1: float32[3, 5]")
    inner = e2.body.a.source
    prog = instantiate(e2, inner, match_scope(inner)[0])
    assert all(s.name not in ("T0", "T1") for s in prog.stages)
    assert_same(e2, prog)
    assert match_scope(e)  # the same product at the root also matches


def test_fuse_memory_bound_merges_eop_chain():
    x = Tensor("X", (4, 6))
    i, j = Var("i"), Var("j")
    p = Stage("P", "eop", Scope([IterVar(i, 0, 4), IterVar(j, 0, 6)], [], x[i, j] * 2.0))
    tp = Tensor("P", (4, 6))
    c = Stage("Q", "eop", Scope([IterVar(j, 0, 6), IterVar(i, 0, 4)], [], tp[i, j] + 1.0))
    orig = Scope([IterVar(j, 0, 6), IterVar(i, 0, 4)], [], x[i, j] * 2.0 + 1.0)
    prog = Program([p, c], orig, "Q")
    fused = fuse_memory_bound(prog)
    assert len(fused.stages) == 1 and fused.stages[0].expr is orig
    assert_same(orig, fused)
    assert_same(orig, prog)


def test_eop_labels_and_normalize():
    i, j, r = Var("i"), Var("j"), Var("r")
    x = Tensor("X", (4, 6))
    assert eop_label(Scope([IterVar(j, 0, 6), IterVar(i, 0, 4)], [], x[i, j])) == "transpose"
    assert eop_label(Scope([IterVar(i, 0, 4), IterVar(j, 0, 6)], [], x[i, j])) == "reshape"
    assert eop_label(Scope([IterVar(i, 0, 4)], [IterVar(r, 0, 3)], x[i, r + 1])) == "offset-add"
    assert eop_label(Scope([IterVar(i, 0, 2), IterVar(j, 0, 6)], [], x[2 * i, j])) == "gather"
    s = Scope([IterVar(i, 1, 5)], [], x[i - 1, 0], pad=[(1, 0)])
    ns = normalize_scope(s)
    assert str(ns).startswith("L<i:0:4> { X[i, 0] }")
    ins = random_inputs(s)
    np.testing.assert_array_equal(evaluate(ns, ins), evaluate(s, ins)[1:])


def test_evaluate_reports_missing_stage_input():
    x = Tensor("X", (4,))
    i = Var("i")
    prog = Program([Stage("S", "eop", Scope([IterVar(i, 0, 4)], [], Tensor("Y", (4,))[i]))],
                   Scope([IterVar(i, 0, 4)], [], x[i]), "S")
    with pytest.raises(ValueError):
        prog.evaluate({"X": np.zeros(4)})


def test_program_rejects_unknown_output():
    i = Var("i")
    s = Scope([IterVar(i, 0, 4)], [], Tensor("X", (4,))[i])
    with pytest.raises(ValueError):
        Program([Stage("S", "eop", s)], s, "nope")
