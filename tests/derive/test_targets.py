"""The target-operator table: each row's matcher, expression, signature and FLOPs agree.

For every row a scope written in the operator's own form is matched by that row's matcher; the
row's expression over the matched operands computes the scope exactly, and the row's FLOPs are
twice the multiply-adds the scope performs (every point of its loop x reduction box).
"""

import numpy as np
import pytest

from tvm_ollie.derive.program import instantiate
from tvm_ollie.derive.targets import (TARGET_NAMES, TARGET_OPS, match_scope, operator_flops,
                                      target_op)
from tvm_ollie.ir.interp import evaluate, random_inputs
from tvm_ollie.ir.parser import parse

#: One scope per target operator, written as the operator computes it.
OWN_FORM = {
    "matmul": "L<i:0:4, j:0:5> Σ<k:0:3> { A[i, k] * B[k, j] } "
              "where A: float32[4, 3]; B: float32[3, 5]",
    "batch_matmul": "L<b:0:2, i:0:4, j:0:5> Σ<k:0:3> { A[b, i, k] * B[b, k, j] } "
                    "where A: float32[2, 4, 3]; B: float32[2, 3, 5]",
    "conv2d": "L<n:0:1, f:0:4, h:0:6, w:0:6> Σ<c:0:3, r:0:3, s:0:3> "
              "{ X<pad=[0, 0, 1, 1]>[n, c, h + r - 1, w + s - 1] * W[f, c, r, s] } "
              "where X: float32[1, 3, 6, 6]; W: float32[4, 3, 3, 3]",
    "g2bmm": "L<b:0:2, m:0:16, w:0:5> Σ<k:0:4> { A[b, m, k] * B<pad=[0, 2, 0]>[b, m + w - 2, k] } "
             "where A: float32[2, 16, 4]; B: float32[2, 16, 4]",
    "gbmm": "L<b:0:2, m:0:16, n:0:4> Σ<w:0:5> { A[b, m, w] * B<pad=[0, 2, 0]>[b, m + w - 2, n] } "
            "where A: float32[2, 16, 5]; B: float32[2, 16, 4]",
}


def test_every_row_has_a_case_and_names_are_unique():
    assert set(OWN_FORM) == set(TARGET_OPS)
    assert TARGET_NAMES == tuple(TARGET_OPS)
    assert all(name == op.name for name, op in TARGET_OPS.items())


@pytest.mark.parametrize("name", sorted(OWN_FORM))
def test_row_matches_its_own_form_exactly(name):
    expr = parse(OWN_FORM[name])
    found = [m for m in match_scope(expr, (name,)) if m.kind == name]
    assert found, f"{name}'s matcher does not match its own form"
    for m in found:
        prog = instantiate(expr, expr, m)
        ins = random_inputs(expr, seed=0, integer=True)
        np.testing.assert_array_equal(prog.evaluate(ins, np.float64),
                                      evaluate(expr, ins, np.float64))
        assert m.signature() == TARGET_OPS[name].signature(m.attrs)
        assert m.signature().startswith(name + "[")


@pytest.mark.parametrize("name", sorted(OWN_FORM))
def test_row_flops_count_every_multiply_add(name):
    expr = parse(OWN_FORM[name])
    m = match_scope(expr, (name,))[0]
    box = np.prod([iv.extent for iv in expr.loops + expr.reduce])
    assert operator_flops(name, m.attrs) == 2.0 * box


def test_implementation_fields_name_known_families():
    assert {op.relax_op for op in TARGET_OPS.values()} <= {None, "matmul", "conv2d"}
    assert {op.library for op in TARGET_OPS.values()} <= {None, "matmul", "conv2d", "g2bmm",
                                                          "gbmm"}


def test_unknown_operator_is_one_line_error():
    with pytest.raises(ValueError, match="unknown target operator 'fft'.*matmul"):
        target_op("fft")
