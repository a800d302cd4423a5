"""merge-shared-input-bias: ``X @ W_i + b_i`` merged into one GEMM plus one bias add, then
slices; exact against the reference interpreter, and every guard refuses what it must."""

import numpy as np
import pytest

from tvm_ollie.derive.rules.inter import (
    INTER_RULES,
    MERGE_SHARED_INPUT_BIAS,
    guard_bias_add,
    merge_shared_inputs_bias,
)
from tvm_ollie.ir.interp import evaluate, random_arrays
from tvm_ollie.ir.parser import parse


def _proj(w: str, b: str, n: int, bias_first: bool = False, bias_index: str = "j",
          bias_shape: str = None, m: int = 4, k: int = 3) -> object:
    """``L<i, j> { (L<i, j> Σ<k> X[i, k] * W[k, j])[i, j] + B[j] }`` (the lift of
    ``add(matmul(x, w), b)``)."""
    gemm = f"(L<i:0:{m}, j:0:{n}> Σ<k:0:{k}> {{ X[i, k] * {w}[k, j] }})[i0, j0]"
    bias = f"{b}[{bias_index}]".replace("j", "j0")
    body = f"{bias} + {gemm}" if bias_first else f"{gemm} + {bias}"
    shape = bias_shape or f"{n}"
    return parse(f"L<i0:0:{m}, j0:0:{n}> {{ {body} }} where X: float32[{m}, {k}]; "
                 f"{w}: float32[{k}, {n}]; {b}: float32[{shape}]")


def _check(prog, exprs, seed=0):
    tensors = [t for e in exprs for t in e.inputs]
    ins = random_arrays(tensors, seed=seed, integer=True)
    got = prog.evaluate(ins, np.float64)
    assert len(got) == len(exprs)
    for out, expr in zip(got, exprs):
        np.testing.assert_array_equal(out, evaluate(expr, ins, np.float64))


def test_rule_is_registered_with_its_equation():
    assert MERGE_SHARED_INPUT_BIAS in INTER_RULES
    assert "b1 ⊕ b2" in MERGE_SHARED_INPUT_BIAS.doc and "=" in MERGE_SHARED_INPUT_BIAS.doc


def test_two_projections_one_gemm_one_bias_add():
    exprs = [_proj("W1", "B1", 5), _proj("W2", "B2", 2, bias_first=True)]
    prog = MERGE_SHARED_INPUT_BIAS(exprs)
    assert prog is not None and prog.multi
    assert [s.kind for s in prog.operators] == ["matmul"]
    assert prog.operators[0].attrs["N"] == 7
    labels = [s.label for s in prog.stages if not s.is_operator]
    assert labels.count("bias-add") == 1 and labels.count("concat") == 2
    # the slices read the biased product, not the bare one
    add = next(s for s in prog.stages if s.label == "bias-add")
    assert all(prog.stage(o).reads == (add.name,) for o in prog.outputs)
    assert "merge-shared-input-bias" in prog.explain()
    _check(prog, exprs)


def test_three_projections_and_a_unit_leading_bias_dimension():
    exprs = [_proj("Wq", "Bq", 4), _proj("Wk", "Bk", 6),
             _proj("Wv", "Bv", 2, bias_index="0, j", bias_shape="1, 2")]
    prog = merge_shared_inputs_bias(exprs)
    assert prog is not None and prog.operators[0].attrs["N"] == 12
    _check(prog, exprs, seed=3)


def test_guard_bias_add_reads_the_form():
    assert guard_bias_add(_proj("W1", "B1", 5)) is not None
    plain = parse("L<i:0:4, j:0:5> Σ<k:0:3> { X[i, k] * W[k, j] } where X: float32[4, 3]; "
                  "W: float32[3, 5]")
    assert guard_bias_add(plain) is None
    product = parse("L<i0:0:4, j0:0:5> { (L<i:0:4, j:0:5> Σ<k:0:3> { X[i, k] * W[k, j] })"
                    "[i0, j0] * B[j0] } where X: float32[4, 3]; W: float32[3, 5]; B: float32[5]")
    assert guard_bias_add(product) is None
    transposed = parse("L<i0:0:4, j0:0:4> { (L<i:0:4, j:0:4> Σ<k:0:3> { X[i, k] * W[k, j] })"
                       "[j0, i0] + B[j0] } where X: float32[4, 3]; W: float32[3, 4]; "
                       "B: float32[4]")
    assert guard_bias_add(transposed) is None


@pytest.mark.parametrize("case", ["bias-along-rows", "bias-2d", "one-not-biased",
                                  "not-shared", "single"])
def test_merge_refuses(case):
    e1 = _proj("W1", "B1", 4)
    if case == "bias-along-rows":  # b[i]: constant along the concatenated axis
        e2 = parse("L<i0:0:4, j0:0:4> { (L<i:0:4, j:0:4> Σ<k:0:3> { X[i, k] * W2[k, j] })"
                   "[i0, j0] + B2[i0] } where X: float32[4, 3]; W2: float32[3, 4]; "
                   "B2: float32[4]")
    elif case == "bias-2d":  # a residual, not a bias
        e2 = parse("L<i0:0:4, j0:0:4> { (L<i:0:4, j:0:4> Σ<k:0:3> { X[i, k] * W2[k, j] })"
                   "[i0, j0] + R[i0, j0] } where X: float32[4, 3]; W2: float32[3, 4]; "
                   "R: float32[4, 4]")
    elif case == "one-not-biased":
        e2 = parse("L<i:0:4, j:0:4> Σ<k:0:3> { X[i, k] * W2[k, j] } where X: float32[4, 3]; "
                   "W2: float32[3, 4]")
    elif case == "not-shared":
        e2 = parse("L<i0:0:4, j0:0:4> { (L<i:0:4, j:0:4> Σ<k:0:3> { Y[i, k] * W2[k, j] })"
                   "[i0, j0] + B2[j0] } where Y: float32[4, 3]; W2: float32[3, 4]; "
                   "B2: float32[4]")
    else:
        assert merge_shared_inputs_bias([e1]) is None
        return
    assert merge_shared_inputs_bias([e1, e2]) is None


def _rows(x: str, b: str, m: int, n: int = 5, k: int = 3) -> object:
    """``L<i, j> { (L<i, j> Σ<k> X_t[i, k] * W[k, j])[i, j] + B[j] }``: one step's rows through
    the shared weight ``W`` (the lift of an unrolled recurrence's input projection)."""
    gemm = f"(L<i:0:{m}, j:0:{n}> Σ<k:0:{k}> {{ {x}[i, k] * W[k, j] }})[i0, j0]"
    return parse(f"L<i0:0:{m}, j0:0:{n}> {{ {gemm} + {b}[j0] }} where {x}: float32[{m}, {k}]; "
                 f"W: float32[{k}, {n}]; {b}: float32[{n}]")


def test_stacked_rows_of_one_weight_take_one_bias_add():
    """``X1 @ W + b ; X2 @ W + b ; X3 @ W + b``: the rows stack along M, no bias concat."""
    exprs = [_rows("X1", "B", 2), _rows("X2", "B", 1), _rows("X3", "B", 2)]
    prog = MERGE_SHARED_INPUT_BIAS(exprs)
    assert prog is not None and [s.kind for s in prog.operators] == ["matmul"]
    assert prog.operators[0].attrs["M"] == 5
    labels = [s.label for s in prog.stages if not s.is_operator]
    # one concatenation (of the rows: the pairwise ones fused), one add of the one bias
    assert labels.count("bias-add") == 1 and labels.count("concat") == 1
    assert "their one bias" in prog.explain()
    _check(prog, exprs)


def test_stacked_rows_with_different_biases_are_refused():
    """Guard ``one-bias``: rows stacked along M cannot add a bias per expression in one add."""
    assert MERGE_SHARED_INPUT_BIAS([_rows("X1", "B1", 2), _rows("X2", "B2", 2)]) is None
