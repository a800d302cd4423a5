"""Inter-expression rules: operator splitting, memory-bound fusion, merging of shared inputs."""

import numpy as np
import pytest

from tvm_ollie.derive.targets import match_scope
from tvm_ollie.derive.program import Program, Stage, instantiate
from tvm_ollie.derive.rules.inter import (
    FUSE_MEMORY_BOUND,
    INTER_RULES,
    MERGE_SHARED_INPUT,
    SPLIT_OPERATORS,
    InterRule,
    combine_programs,
    merge_gemm_stages,
    merge_shared_input,
)
from tvm_ollie.ir.interp import evaluate, random_arrays, random_inputs
from tvm_ollie.ir.nodes import IterVar, Scope, Tensor, Var
from tvm_ollie.ir.parser import parse


def test_rules_are_named_data_with_equations():
    for rule in INTER_RULES:
        assert isinstance(rule, InterRule) and rule.family == "inter"
        assert rule.name and "=" in rule.doc
    assert len({r.name for r in INTER_RULES}) == len(INTER_RULES)


def test_split_operators_pulls_matched_nested_scope_out_of_an_eop():
    e = parse("L<i:0:4, j:0:5> { relu((L<i:0:4, j:0:5> Σ<k:0:3> { A[i, k] * B[k, j] })[i, j]) } "
              "where A: float32[4, 3]; B: float32[3, 5]")
    prog = Program([Stage("Y", "eop", e)], e, "Y")
    out = SPLIT_OPERATORS(prog)
    assert out is not None
    assert [s.kind for s in out.stages] == ["matmul", "eop"] and out.output == "Y"
    ins = random_inputs(e, integer=True)
    np.testing.assert_array_equal(out.evaluate(ins, np.float64), evaluate(e, ins, np.float64))
    assert SPLIT_OPERATORS(out) is None  # nothing left to split


def test_split_operators_keeps_readers_of_the_renamed_stage():
    # Stage "Y" is an eOperator that is itself a matmul; a later stage reads it.
    mm = parse("L<i:0:4, j:0:5> Σ<k:0:3> { A[i, k] * B[k, j] } where A: float32[4, 3]; "
               "B: float32[3, 5]")
    i, j = Var("i"), Var("j")
    tail = Scope([IterVar(i, 0, 4), IterVar(j, 0, 5)], [], Tensor("Y", (4, 5))[i, j] * 2.0)
    orig = Scope([IterVar(i, 0, 4), IterVar(j, 0, 5)], [], mm[i, j] * 2.0)
    prog = Program([Stage("Y", "eop", mm), Stage("Z", "eop", tail)], orig, "Z")
    out = SPLIT_OPERATORS(prog)
    assert [s.kind for s in out.stages] == ["matmul", "eop"]
    ins = random_inputs(orig, integer=True)
    np.testing.assert_array_equal(out.evaluate(ins, np.float64), evaluate(orig, ins, np.float64))


def test_fuse_memory_bound_rule():
    x = Tensor("X", (4, 6))
    i, j = Var("i"), Var("j")
    p = Stage("P", "eop", Scope([IterVar(i, 0, 4), IterVar(j, 0, 6)], [], x[i, j] * 2.0))
    q = Stage("Q", "eop", Scope([IterVar(j, 0, 6), IterVar(i, 0, 4)], [],
                                Tensor("P", (4, 6))[i, j] + 1.0))
    orig = Scope([IterVar(j, 0, 6), IterVar(i, 0, 4)], [], x[i, j] * 2.0 + 1.0)
    prog = Program([p, q], orig, "Q")
    fused = FUSE_MEMORY_BOUND(prog)
    assert fused is not None and len(fused.stages) == 1
    assert FUSE_MEMORY_BOUND(fused) is None


def _check_two(prog, e1, e2, seed=0):
    ins = random_arrays(list(e1.inputs) + list(e2.inputs), seed=seed, integer=True)
    y1, y2 = prog.evaluate(ins, np.float64)
    np.testing.assert_array_equal(y1, evaluate(e1, ins, np.float64))
    np.testing.assert_array_equal(y2, evaluate(e2, ins, np.float64))


def test_merge_two_matmuls_sharing_x():
    e1 = parse("L<i:0:4, j:0:5> Σ<k:0:3> { X[i, k] * W1[k, j] } where X: float32[4, 3]; "
               "W1: float32[3, 5]")
    e2 = parse("L<i:0:4, j:0:2> Σ<k:0:3> { X[i, k] * W2[k, j] } where X: float32[4, 3]; "
               "W2: float32[3, 2]")
    prog = MERGE_SHARED_INPUT(e1, e2)
    assert prog is not None and prog.multi
    assert "matmul[4x3 @ 3x7]" in repr(prog)
    assert [s.label for s in prog.stages if not s.is_operator] == ["concat", "slice", "slice"]
    _check_two(prog, e1, e2)
    assert "merge-shared-input" in prog.explain()


def test_merge_shared_weight_transposed_and_batched():
    e1 = parse("L<b:0:2, i:0:4, j:0:5> Σ<k:0:3> { X[b, k, i] * W[b, j, k] } "
               "where X: float32[2, 3, 4]; W: float32[2, 5, 3]")
    e2 = parse("L<b:0:2, i:0:6, j:0:5> Σ<k:0:3> { Z[b, k, i] * W[b, j, k] } "
               "where Z: float32[2, 3, 6]; W: float32[2, 5, 3]")
    prog = MERGE_SHARED_INPUT(e1, e2)
    assert prog is not None
    assert "batch_matmul[2x10x3 @ 2x3x5]" in repr(prog)
    _check_two(prog, e1, e2)


def test_merge_with_output_eops_and_name_clashes():
    # Outputs in transposed order need their own eOperators after the slices.
    e1 = parse("L<j:0:5, b:0:2, i:0:4> Σ<k:0:3> { X[b, i, k] * W1[b, k, j] } "
               "where X: float32[2, 4, 3]; W1: float32[2, 3, 5]")
    e2 = parse("L<j:0:3, b:0:2, i:0:4> Σ<k:0:3> { X[b, i, k] * W2[b, k, j] } "
               "where X: float32[2, 4, 3]; W2: float32[2, 3, 3]")
    prog = MERGE_SHARED_INPUT(e1, e2)
    assert prog is not None
    assert len({s.name for s in prog.stages}) == len(prog.stages)
    _check_two(prog, e1, e2)


@pytest.mark.parametrize("text2", [
    # no shared tensor
    "L<i:0:4, j:0:2> Σ<k:0:3> { Y[i, k] * W2[k, j] } where Y: float32[4, 3]; W2: float32[3, 2]",
    # shared tensor read with another transpose
    "L<i:0:3, j:0:2> Σ<k:0:4> { X[k, i] * W2[k, j] } where X: float32[4, 3]; W2: float32[4, 2]",
    # not a matmul
    "L<i:0:4, j:0:2> { X[i, j] * 2.0 } where X: float32[4, 3]",
])
def test_merge_refuses(text2):
    e1 = parse("L<i:0:4, j:0:5> Σ<k:0:3> { X[i, k] * W1[k, j] } where X: float32[4, 3]; "
               "W1: float32[3, 5]")
    assert MERGE_SHARED_INPUT(e1, parse(text2)) is None


# -- merging GEMM stages inside programs --------------------------------------------------------


def _two_gemm_expr():
    """``relu(X @ W1) + X @ W2``: one expression whose split program has two GEMMs on X."""
    return parse("L<i:0:4, j:0:5> { relu((L<i:0:4, j:0:5> Σ<k:0:3> { X[i, k] * W1[k, j] })[i, j])"
                 " + (L<i:0:4, j:0:5> Σ<k:0:3> { X[i, k] * W2[k, j] })[i, j] } "
                 "where X: float32[4, 3]; W1: float32[3, 5]; W2: float32[3, 5]")


def test_merge_gemm_stages_inside_one_program():
    e = _two_gemm_expr()
    prog = SPLIT_OPERATORS(Program([Stage("Y", "eop", e)], e, "Y"))
    assert prog.kinds.count("matmul") == 2
    merged = MERGE_SHARED_INPUT(prog)
    assert merged is not None and not merged.multi
    assert merged.kinds.count("matmul") == 1 and "matmul[4x3 @ 3x10]" in repr(merged)
    ins = random_inputs(e, integer=True)
    np.testing.assert_array_equal(merged.evaluate(ins, np.float64), evaluate(e, ins, np.float64))
    before, after = prog.cost(), merged.cost()
    ops = lambda c: sum(s.flops for s in c.stages if s.kind == "matmul")  # noqa: E731
    assert ops(before) == ops(after) and after.time_s > 0
    assert MERGE_SHARED_INPUT(merged) is None
    assert "share A=X" in merged.explain()


def test_merge_two_programs_and_three_gemms():
    texts = ["L<i:0:4, j:0:%d> Σ<k:0:3> { X[i, k] * W%d[k, j] } where X: float32[4, 3]; "
             "W%d: float32[3, %d]" % (n, k, k, n) for k, n in ((1, 5), (2, 2), (3, 3))]
    es = [parse(t) for t in texts]
    progs = [instantiate(e, e, match_scope(e, ("matmul",))[0]) for e in es]
    two = merge_shared_input(progs[0], progs[1])
    assert two is not None and two.multi and two.kinds.count("matmul") == 1
    _check_two(two, es[0], es[1])
    three = merge_shared_input(combine_programs(two, progs[2]))
    assert three is not None and three.kinds.count("matmul") == 1
    assert "matmul[4x3 @ 3x10]" in repr(three)
    ins = random_arrays(sorted({t for e in es for t in e.inputs}, key=lambda t: t.name),
                        integer=True)
    for got, e in zip(three.evaluate(ins, np.float64), es):
        np.testing.assert_array_equal(got, evaluate(e, ins, np.float64))
    assert three.cost().time_s > 0 and len(three.cost().stages) == len(three.stages)


def test_merge_refuses_dependent_gemms():
    # T2 = X @ T1 reads T1 = X @ W: they share X but cannot run as one GEMM.
    x, w = Tensor("X", (4, 4)), Tensor("W", (4, 4))
    i, j, k = Var("i"), Var("j"), Var("k")
    t1 = Scope([IterVar(i, 0, 4), IterVar(j, 0, 4)], [IterVar(k, 0, 4)], x[i, k] * w[k, j])
    e = Scope([IterVar(i, 0, 4), IterVar(j, 0, 4)], [IterVar(k, 0, 4)], x[i, k] * t1[k, j])
    prog = SPLIT_OPERATORS(Program([Stage("Y", "eop", e)], e, "Y"))
    assert prog is not None and prog.kinds.count("matmul") == 2
    assert merge_gemm_stages(prog) is None


def test_merge_shared_input_type_errors():
    e = _two_gemm_expr()
    with pytest.raises(TypeError):
        merge_shared_input(e)
