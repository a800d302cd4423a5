"""Casts in the IR: text, types, interpreter rounding, simplification, fingerprints, exact check."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from tvm_ollie.ir.fingerprint import fingerprint
from tvm_ollie.ir.interp import evaluate
from tvm_ollie.ir.nodes import Access, BinOp, Call, Const, IterVar, Scope, Tensor, Var, value_dtype
from tvm_ollie.ir.parser import parse
from tvm_ollie.ir.simplify import simplify
from tvm_ollie.verify.finite_field import NotPolynomial, polynomial_degree
from tvm_ollie.verify.tolerance import expr_tolerance, tolerance

I, J, K = Var("i"), Var("j"), Var("k")


def _matmul(dtype: str, acc: str) -> Scope:
    """``Σ_k acc(A[i, k]) * acc(B[k, j])`` with ``dtype`` inputs."""
    a, b = Tensor("A", (4, 8), dtype), Tensor("B", (8, 3), dtype)
    body = Call(acc, (a[I, K],)) * Call(acc, (b[K, J],))
    return Scope([IterVar(I, 0, 4), IterVar(J, 0, 3)], [IterVar(K, 0, 8)], body)


def _elementwise(body_of, dtype="float32", shape=(6,)) -> Scope:
    x = Tensor("x", shape, dtype)
    return Scope([IterVar(I, 0, shape[0])], [], body_of(x[I]))


@pytest.mark.parametrize("expr", [
    _matmul("float16", "float32"),
    _matmul("bfloat16", "float32"),
    _elementwise(lambda x: Call("float16", (x,)) * Const(0.1, "float16") + Const(-2.5, "float16")),
    _elementwise(lambda x: Call("int32", (x,)) + Const(3, "int64")),
    _elementwise(lambda x: x / Call("float32", (I + 1,))),
])
def test_casts_and_typed_literals_print_and_parse_back(expr):
    assert parse(str(expr)) is expr, str(expr)


def test_a_cast_of_a_literal_is_a_typed_literal():
    assert Call("float16", (Const(0.1),)) is Const(0.0999755859375, "float16")
    assert Call("int32", (Const(-2.7),)) is Const(-2, "int32")
    assert Call("bfloat16", (Const(3.14159),)).value == 3.140625
    assert str(Const(0.5, "float16")) == "float16(0.5)"


def test_types_follow_casts_and_literals_adapt():
    mm = _matmul("float16", "float32")
    assert mm.dtype == "float32" and value_dtype(mm.body) == "float32"
    down = _elementwise(lambda x: Call("float16", (x,)) * 0.5)
    assert down.dtype == "float16"  # the float32 literal adapts to the float16 operand
    assert _elementwise(lambda x: x * 2.0, "bfloat16").dtype == "bfloat16"
    assert value_dtype(BinOp(">", Call("float32", (I,)), Const(0.0))) == "bool"


def test_interpreter_rounds_casts_and_16_bit_stages():
    rng = np.random.default_rng(0)
    x = rng.uniform(-3, 3, 6).astype(np.float32)
    for dtype, np_type in (("float16", np.float16), ("bfloat16", ml_dtypes.bfloat16)):
        got = evaluate(_elementwise(lambda v, d=dtype: Call(d, (v,))), {"x": x})
        np.testing.assert_array_equal(got, x.astype(np_type).astype(np.float32))
    trunc = evaluate(_elementwise(lambda v: Call("float32", (Call("int32", (v,)),))), {"x": x})
    np.testing.assert_array_equal(trunc, np.trunc(x))
    # A float16 stage stores its (float32-computed) value rounded to float16.
    inner = _elementwise(lambda v: Call("float16", (Call("float32", (v,)) * 3.0,)), "float16")
    outer = Scope([IterVar(I, 0, 6)], [], Call("float32", (Access(inner, (I,)),)))
    x16 = x.astype(np.float16)
    want = (x16.astype(np.float32) * 3).astype(np.float16).astype(np.float32)
    np.testing.assert_array_equal(evaluate(outer, {"x": x16}), want)
    # rounding=False: exact arithmetic (the finite-field check's semantics)
    exact = evaluate(_elementwise(lambda v: Call("float16", (v,))), {"x": x}, np.float64,
                     rounding=False)
    np.testing.assert_array_equal(exact, x.astype(np.float64))


def test_float16_matmul_accumulates_in_float32():
    rng = np.random.default_rng(1)
    a = rng.uniform(-1, 1, (4, 8)).astype(np.float16)
    b = rng.uniform(-1, 1, (8, 3)).astype(np.float16)
    got = evaluate(_matmul("float16", "float32"), {"A": a, "B": b})
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, a.astype(np.float32) @ b.astype(np.float32), rtol=1e-6)


def test_simplify_drops_only_value_preserving_casts():
    x16 = Tensor("x", (6,), "float16")[I]
    x32 = Tensor("y", (6,), "float32")[I]
    loops = [IterVar(I, 0, 6)]
    same = simplify(Scope(loops, [], Call("float32", (x32,)) + 1.0))
    assert same.body is x32 + 1.0
    round_trip = simplify(Scope(loops, [], Call("float16", (Call("float32", (x16,)),))))
    assert round_trip.body is x16
    narrowing = Scope(loops, [], Call("float32", (Call("float16", (x32,)),)))
    assert simplify(narrowing) is narrowing


def test_fingerprint_tells_cast_types_apart():
    x = Tensor("x", (6,), "float32")
    a = _elementwise(lambda v: Call("float16", (v,)))
    b = _elementwise(lambda v: Call("bfloat16", (v,)))
    assert fingerprint(a) != fingerprint(b)
    assert fingerprint(a) == fingerprint(Scope([IterVar("j", 0, 6)], [],
                                               Call("float16", (x[Var("j")],))))


def test_exact_check_accepts_widening_casts_only():
    assert polynomial_degree(_matmul("float16", "float32")) == 2
    with pytest.raises(NotPolynomial, match="cast"):
        polynomial_degree(_elementwise(lambda v: Call("float16", (v,))))
    with pytest.raises(NotPolynomial, match="cast"):
        polynomial_degree(_matmul("float16", "bfloat16"))


def test_tolerance_scales_with_the_narrowest_type():
    assert tolerance("float32") == 1e-4
    assert tolerance("float16") > tolerance("float32") and tolerance("bfloat16") > \
        tolerance("float16")
    assert expr_tolerance(_matmul("float16", "float32")) == tolerance("float16")
    assert expr_tolerance(_elementwise(lambda v: v + 1.0)) == tolerance("float32")
