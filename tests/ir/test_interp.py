"""Tests of the numpy reference interpreter against hand-written numpy and a naive evaluator.

The references here never go through ``interp.py``: convolutions and pools are written with
explicit slicing, and :func:`naive_evaluate` walks the iteration space element by element with
Python scalars (tiny shapes only), following the semantics in the ``nodes.py`` docstring.
"""

from __future__ import annotations

import itertools
import math
import time

import numpy as np
import pytest
import scipy.special
from hypothesis import HealthCheck, given, settings
from strategies import conv_like_scopes, scopes

from tvm_ollie.ir import interp
from tvm_ollie.ir.interp import OutOfBoundsError, evaluate, random_inputs
from tvm_ollie.ir.nodes import Access, BinOp, Call, Const, IterVar, Scope, Tensor, Var

# ---------------------------------------------------------------------------------------------
# A deliberately naive evaluator: one Python scalar at a time.
# ---------------------------------------------------------------------------------------------


def naive_evaluate(expr, inputs):
    """Evaluate ``expr`` with nested Python loops over every iterator (float64)."""
    memo = {}

    def scope(s):
        if s in memo:
            return memo[s]
        out = np.zeros(s.shape, dtype=np.float64)
        for vals in itertools.product(*(range(iv.begin, iv.end) for iv in s.loops)):
            env = {iv.var: v for iv, v in zip(s.loops, vals)}
            if not s.reduce:
                acc = float(scalar(s.body, env))
            else:
                acc = 0.0 if s.reducer == "sum" else -math.inf
                for rvals in itertools.product(*(range(iv.begin, iv.end) for iv in s.reduce)):
                    env.update({iv.var: v for iv, v in zip(s.reduce, rvals)})
                    x = float(scalar(s.body, env))
                    acc = acc + x if s.reducer == "sum" else max(acc, x)
            pos = tuple(v - iv.begin + lo for v, iv, (lo, _) in zip(vals, s.loops, s.pad))
            out[pos] = acc
        memo[s] = out
        return out

    def scalar(node, env):
        if isinstance(node, Var):
            return env[node]
        if isinstance(node, Const):
            return node.value
        if isinstance(node, BinOp):
            a, b = scalar(node.a, env), scalar(node.b, env)
            ops = {
                "+": lambda: a + b, "-": lambda: a - b, "*": lambda: a * b,
                "//": lambda: a // b, "%": lambda: a % b, "/": lambda: a / b,
                "<": lambda: a < b, "<=": lambda: a <= b, ">": lambda: a > b,
                ">=": lambda: a >= b, "==": lambda: a == b, "!=": lambda: a != b,
                "and": lambda: bool(a) and bool(b), "or": lambda: bool(a) or bool(b),
            }
            return ops[node.op]()
        if isinstance(node, Call):
            if node.func == "select":  # lazy, like a guarded read
                return scalar(node.args[1] if scalar(node.args[0], env) else node.args[2], env)
            args = [scalar(x, env) for x in node.args]
            funcs = {
                "relu": lambda x: max(x, 0.0), "tanh": math.tanh,
                "sigmoid": lambda x: 1.0 / (1.0 + math.exp(-x)), "exp": math.exp,
                "log": math.log, "erf": math.erf, "sqrt": math.sqrt,
                "rsqrt": lambda x: 1.0 / math.sqrt(x), "abs": abs, "neg": lambda x: -x,
                "max": max, "min": min, "pow": math.pow,
            }
            return funcs[node.func](*args)
        if isinstance(node, Access):
            idx = [scalar(i, env) for i in node.indices]
            assert all(isinstance(i, int) for i in idx)
            src = node.source
            if isinstance(src, Tensor):
                for i, n, (lo, hi) in zip(idx, src.shape, src.pad):
                    if not -lo <= i < n + hi:
                        raise OutOfBoundsError(f"naive: {node}")
                if all(0 <= i < n for i, n in zip(idx, src.shape)):
                    return float(inputs[src.name][tuple(idx)])
                return src.pad_value
            arr = scope(src)
            pos = []
            for i, iv, (lo, hi) in zip(idx, src.loops, src.pad):
                if not iv.begin - lo <= i < iv.end + hi:
                    raise OutOfBoundsError(f"naive: {node}")
                pos.append(i - iv.begin + lo)
            return float(arr[tuple(pos)])
        raise TypeError(type(node).__name__)

    if isinstance(expr, Scope):
        return scope(expr)
    return np.asarray(float(scalar(expr, {})))


def _iv(name, end, begin=0):
    return IterVar(name, begin, end)


def _close(got, want, tol=1e-5):
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


i, j, k, b, n, c, h, w, f, r, s = (Var(x) for x in "ijkbnchwfrs")

# ---------------------------------------------------------------------------------------------
# Elementwise, functions, dtypes
# ---------------------------------------------------------------------------------------------


def test_elementwise_broadcast_indexing():
    A, B, C = Tensor("A", (3, 4)), Tensor("B", (4,)), Tensor("C", (4, 3))
    e = Scope([_iv("i", 3), _iv("j", 4)], [], A[i, j] * B[j] - C[j, i] / 2.0 + 1.5)
    ins = random_inputs(e, seed=1)
    want = ins["A"] * ins["B"][None, :] - ins["C"].T / 2.0 + 1.5
    got = evaluate(e, ins)
    assert got.shape == (3, 4) and got.dtype == np.float32
    _close(got, want)
    _close(naive_evaluate(e, ins), want)


def test_loop_not_used_by_body_broadcasts_and_result_is_fresh():
    A = Tensor("A", (4,))
    e = Scope([_iv("i", 3), _iv("j", 4)], [], A[j])
    ins = random_inputs(e)
    got = evaluate(e, ins)
    np.testing.assert_array_equal(got, np.broadcast_to(ins["A"], (3, 4)))
    ident = evaluate(Scope([_iv("j", 4)], [], A[j]), ins)
    ident[:] = 7.0  # the result must never alias an input
    assert not np.any(ins["A"] == 7.0)


UNARY_REF = {
    "relu": lambda x: np.maximum(x, 0), "tanh": np.tanh,
    "sigmoid": lambda x: 1 / (1 + np.exp(-x)), "exp": np.exp, "log": np.log,
    "erf": scipy.special.erf, "sqrt": np.sqrt, "rsqrt": lambda x: 1 / np.sqrt(x),
    "abs": np.abs, "neg": lambda x: -x,
}


@pytest.mark.parametrize("func", sorted(UNARY_REF))
def test_unary_functions(func):
    A = Tensor("A", (2, 5))
    e = Scope([_iv("i", 2), _iv("j", 5)], [], Call(func, (A[i, j],)))
    x = np.linspace(-2, 2, 10).reshape(2, 5)
    if func in ("log", "sqrt", "rsqrt"):
        x = np.abs(x) + 0.25
    got = evaluate(e, {"A": x.astype(np.float32)})
    assert got.dtype == np.float32
    _close(got, UNARY_REF[func](x))
    _close(evaluate(e, {"A": x}, dtype=np.float64), UNARY_REF[func](x), 1e-12)
    _close(naive_evaluate(e, {"A": x}), UNARY_REF[func](x), 1e-12)


@pytest.mark.parametrize("func", ["max", "min", "pow"])
def test_binary_functions(func):
    A, B = Tensor("A", (6,)), Tensor("B", (6,))
    e = Scope([_iv("i", 6)], [], Call(func, (A[i], B[i])))
    x = np.array([0.5, 1.0, 2.0, 3.0, 0.25, 1.5])
    y = np.array([2.0, -1.0, 0.5, 3.0, 1.0, 0.0])
    want = {"max": np.maximum, "min": np.minimum, "pow": np.power}[func](x, y)
    _close(evaluate(e, {"A": x, "B": y}), want, 1e-12)
    _close(naive_evaluate(e, {"A": x, "B": y}), want, 1e-12)


def test_select_comparisons_and_logic():
    A = Tensor("A", (7,))
    cond = BinOp("and", BinOp(">", A[i], Const(0.0)), BinOp("<", i, Const(5)))
    e = Scope([_iv("i", 7)], [], Call("select", (cond, A[i], Const(-1.0))))
    x = np.array([0.5, -1.0, 2.0, -0.1, 3.0, 4.0, -2.0])
    want = np.where((x > 0) & (np.arange(7) < 5), x, -1.0)
    _close(evaluate(e, {"A": x}), want, 0)
    # A comparison used as a number, and 'or'.
    e2 = Scope([_iv("i", 7)], [], BinOp("or", BinOp("==", i, Const(2)), BinOp(">=", i, Const(5)))
               * A[i])
    _close(evaluate(e2, {"A": x}), np.where(np.isin(np.arange(7), [2, 5, 6]), x, 0.0), 0)
    _close(naive_evaluate(e2, {"A": x}), evaluate(e2, {"A": x}), 0)


def test_select_guards_an_out_of_range_read():
    # select(i >= 1, A[i - 1], 0) never reads A[-1] where it matters: no error (like TVM guards).
    A = Tensor("A", (5,))
    e = Scope([_iv("i", 5)], [], Call("select", (BinOp(">=", i, Const(1)), A[i - 1], Const(0.0))))
    x = np.arange(1.0, 6.0)
    want = np.array([0.0, 1.0, 2.0, 3.0, 4.0])
    _close(evaluate(e, {"A": x}), want, 0)
    _close(naive_evaluate(e, {"A": x}), want, 0)
    # The taken branch is still checked.
    bad = Scope([_iv("i", 5)], [], Call("select", (BinOp(">=", i, Const(0)), A[i - 1],
                                                  Const(0.0))))
    with pytest.raises(OutOfBoundsError):
        evaluate(bad, {"A": x})


def test_dtype_follows_inputs_or_request():
    A = Tensor("A", (3,))
    e = Scope([_iv("i", 3)], [], A[i] * 2)
    assert evaluate(e, {"A": np.ones(3, np.float32)}).dtype == np.float32
    assert evaluate(e, {"A": np.ones(3, np.float64)}).dtype == np.float64
    assert evaluate(e, {"A": np.ones(3, np.float32)}, dtype=np.float64).dtype == np.float64
    with pytest.raises(TypeError):
        evaluate(e, {"A": np.ones(3)}, dtype=np.int32)


def test_index_only_body_and_true_division():
    e = Scope([_iv("i", 4), _iv("j", 3)], [], (i * 3 + j) / 2)
    want = (np.arange(4)[:, None] * 3 + np.arange(3)[None, :]) / 2
    _close(evaluate(e, {}), want, 0)


# ---------------------------------------------------------------------------------------------
# Contractions
# ---------------------------------------------------------------------------------------------


def test_matmul():
    A, B = Tensor("A", (5, 7)), Tensor("B", (7, 3))
    e = Scope([_iv("i", 5), _iv("j", 3)], [_iv("k", 7)], A[i, k] * B[k, j])
    ins = random_inputs(e, seed=3)
    _close(evaluate(e, ins), ins["A"] @ ins["B"])
    _close(naive_evaluate(e, ins), ins["A"].astype(np.float64) @ ins["B"])


def test_batched_matmul_with_transposes():
    A, B = Tensor("A", (2, 6, 4)), Tensor("B", (2, 5, 6))
    e = Scope([_iv("b", 2), _iv("i", 4), _iv("j", 5)], [_iv("k", 6)], A[b, k, i] * B[b, j, k])
    ins = random_inputs(e, seed=4)
    want = np.matmul(ins["A"].transpose(0, 2, 1), ins["B"].transpose(0, 2, 1))
    _close(evaluate(e, ins), want)
    _close(naive_evaluate(e, ins), want)


def _conv_ref_nchw(a, kern, stride, dil, pads):
    """NCHW conv by explicit slicing: one einsum per kernel tap."""
    (pt, pb), (pl, pr) = pads
    ap = np.pad(a, ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    F, C, R, S = kern.shape
    oh = (ap.shape[2] - dil[0] * (R - 1) - 1) // stride[0] + 1
    ow = (ap.shape[3] - dil[1] * (S - 1) - 1) // stride[1] + 1
    out = np.zeros((a.shape[0], F, oh, ow))
    for rr in range(R):
        for ss in range(S):
            win = ap[:, :, rr * dil[0]: rr * dil[0] + stride[0] * (oh - 1) + 1: stride[0],
                     ss * dil[1]: ss * dil[1] + stride[1] * (ow - 1) + 1: stride[1]]
            out += np.einsum("nchw,fc->nfhw", win, kern[:, :, rr, ss])
    return out


@pytest.mark.parametrize("stride,dil,pads", [
    ((1, 1), (1, 1), ((1, 1), (1, 1))),
    ((2, 1), (1, 2), ((1, 0), (2, 1))),
    ((2, 2), (2, 1), ((0, 2), (0, 0))),
])
def test_conv2d_nchw(stride, dil, pads):
    N, C, H, W, F, R, S = 2, 3, 7, 6, 4, 3, 2
    a = np.random.default_rng(0).uniform(-1, 1, (N, C, H, W))
    kern = np.random.default_rng(1).uniform(-1, 1, (F, C, R, S))
    want = _conv_ref_nchw(a, kern, stride, dil, pads)
    _, _, OH, OW = want.shape
    A = Tensor("A", (N, C, H, W), pad=[0, 0, pads[0], pads[1]])
    K = Tensor("K", (F, C, R, S))
    row = h * stride[0] + r * dil[0] - pads[0][0]
    col = w * stride[1] + s * dil[1] - pads[1][0]
    body = A[n, c, row, col] * K[f, c, r, s]
    e = Scope([_iv("n", N), _iv("f", F), _iv("h", OH), _iv("w", OW)],
              [_iv("c", C), _iv("r", R), _iv("s", S)], body)
    _close(evaluate(e, {"A": a, "K": kern}), want, 1e-12)
    _close(naive_evaluate(e, {"A": a, "K": kern}), want, 1e-12)


def test_conv2d_nhwc_strided_padded():
    N, H, W, C, F, R, S = 1, 8, 7, 3, 5, 3, 3
    stride, dil, pads = (2, 2), (1, 1), ((1, 2), (0, 1))
    a = np.random.default_rng(2).uniform(-1, 1, (N, H, W, C)).astype(np.float32)
    kern = np.random.default_rng(3).uniform(-1, 1, (R, S, F, C)).astype(np.float32)
    # Reference through the NCHW slicing reference on transposed data.
    want = _conv_ref_nchw(a.transpose(0, 3, 1, 2), kern.transpose(2, 3, 0, 1), stride, dil, pads)
    want = want.transpose(0, 2, 3, 1)
    A = Tensor("A", (N, H, W, C), pad=[0, pads[0], pads[1], 0])
    K = Tensor("K", (R, S, F, C))
    e = Scope([_iv("n", N), _iv("h", want.shape[1]), _iv("w", want.shape[2]), _iv("f", F)],
              [_iv("c", C), _iv("r", R), _iv("s", S)],
              A[n, h * 2 + r - 1, w * 2 + s, c] * K[r, s, f, c])
    got = evaluate(e, {"A": a, "K": kern})
    assert got.dtype == np.float32
    _close(got, want)


def test_depthwise_conv_batch_axis_in_einsum():
    A, K = Tensor("A", (1, 3, 6, 6), pad=[0, 0, 1, 1]), Tensor("K", (3, 3, 3))
    e = Scope([_iv("n", 1), _iv("c", 3), _iv("h", 6), _iv("w", 6)], [_iv("r", 3), _iv("s", 3)],
              A[n, c, h + r - 1, w + s - 1] * K[c, r, s])
    ins = random_inputs(e, seed=5, dtype="float64")
    ap = np.pad(ins["A"], ((0, 0), (0, 0), (1, 1), (1, 1)))
    want = sum(ap[:, :, rr:rr + 6, ss:ss + 6] * ins["K"][None, :, rr, ss, None, None]
               for rr in range(3) for ss in range(3))
    _close(evaluate(e, ins), want, 1e-12)


# ---------------------------------------------------------------------------------------------
# Pools and reductions
# ---------------------------------------------------------------------------------------------


def test_max_pool_with_neg_inf_padding():
    A = Tensor("A", (1, 2, 5, 5), pad=[0, 0, 1, 1], pad_value=-math.inf)
    e = Scope([_iv("n", 1), _iv("c", 2), _iv("h", 3), _iv("w", 3)], [_iv("r", 3), _iv("s", 3)],
              A[n, c, h * 2 + r - 1, w * 2 + s - 1], reducer="max")
    a = np.random.default_rng(6).uniform(-5, -1, (1, 2, 5, 5))  # all negative: 0-padding would win
    ap = np.pad(a, ((0, 0), (0, 0), (1, 1), (1, 1)), constant_values=-np.inf)
    want = np.full((1, 2, 3, 3), -np.inf)
    for rr in range(3):
        for ss in range(3):
            want = np.maximum(want, ap[:, :, rr:rr + 5:2, ss:ss + 5:2])
    _close(evaluate(e, {"A": a}), want, 0)
    _close(naive_evaluate(e, {"A": a}), want, 0)


def test_avg_pool():
    A = Tensor("A", (2, 6, 6))
    e = Scope([_iv("c", 2), _iv("h", 3), _iv("w", 3)], [_iv("r", 2), _iv("s", 2)],
              A[c, h * 2 + r, w * 2 + s] * 0.25)
    a = np.random.default_rng(7).uniform(-1, 1, (2, 6, 6))
    want = a.reshape(2, 3, 2, 3, 2).mean(axis=(2, 4))
    _close(evaluate(e, {"A": a}), want, 1e-12)


def test_sum_and_max_reductions():
    A = Tensor("A", (4, 5))
    x = np.random.default_rng(8).uniform(-1, 1, (4, 5))
    row_sum = Scope([_iv("i", 4)], [_iv("j", 5)], A[i, j])
    row_max = Scope([_iv("i", 4)], [_iv("j", 5)], A[i, j], reducer="max")
    total = Scope([], [_iv("i", 4), _iv("j", 5)], A[i, j])
    _close(evaluate(row_sum, {"A": x}), x.sum(1), 1e-12)
    _close(evaluate(row_max, {"A": x}), x.max(1), 0)
    got = evaluate(total, {"A": x})
    assert got.shape == ()
    _close(got, x.sum(), 1e-12)


def test_sum_of_mixed_terms_and_absent_reduction_iterator():
    A, B, C = Tensor("A", (3, 4)), Tensor("B", (4,)), Tensor("C", (3,))
    body = Call("relu", (A[i, j],)) + B[j] * C[i] - Call("exp", (A[i, j],)) * 2.0 + A[i, 0]
    e = Scope([_iv("i", 3)], [_iv("j", 4), _iv("k", 2)], body)
    ins = random_inputs(e, seed=9, dtype="float64")
    a, bb, cc = ins["A"], ins["B"], ins["C"]
    want = 2 * (np.maximum(a, 0).sum(1) + cc * bb.sum() - 2 * np.exp(a).sum(1) + 4 * a[:, 0])
    _close(evaluate(e, ins), want, 1e-12)
    _close(naive_evaluate(e, ins), want, 1e-12)


def test_max_of_non_product_body():
    A, B = Tensor("A", (3, 4)), Tensor("B", (4,))
    e = Scope([_iv("i", 3)], [_iv("j", 4)], Call("tanh", (A[i, j] + B[j],)), reducer="max")
    ins = random_inputs(e, seed=10, dtype="float64")
    _close(evaluate(e, ins), np.tanh(ins["A"] + ins["B"]).max(1), 1e-12)


@pytest.mark.parametrize("reducer", ["sum", "max"])
def test_chunked_reduction_matches_unchunked(monkeypatch, reducer):
    A, K = Tensor("A", (2, 6, 4), pad=[0, 1, 0]), Tensor("K", (3, 4, 5))
    body = A[n, h + r - 1, c] * K[r, c, f]
    if reducer == "max":
        body = Call("relu", (body,)) + A[n, h, c]
    e = Scope([_iv("n", 2), _iv("h", 6), _iv("f", 5)], [_iv("c", 4), _iv("r", 3)], body,
              reducer=reducer)
    ins = random_inputs(e, seed=11, dtype="float64")
    whole = evaluate(e, ins)
    monkeypatch.setattr(interp, "MAX_TEMP_BYTES", 64 * 8)  # forces many chunks
    chunked = evaluate(e, ins)
    _close(chunked, whole, 1e-12)
    _close(naive_evaluate(e, ins), whole, 1e-12)


# ---------------------------------------------------------------------------------------------
# Nested scopes, indices, errors
# ---------------------------------------------------------------------------------------------


def test_nested_scope_padding_and_begin():
    A = Tensor("A", (4,))
    inner = Scope([_iv("i", 6, begin=2)], [], A[i - 2] * 2.0, pad=[(1, 2)])
    assert inner.shape == (7,)
    x = np.array([1.0, 2.0, 3.0, 4.0])
    np.testing.assert_array_equal(evaluate(inner, {"A": x}), [0, 2, 4, 6, 8, 0, 0])
    # Index v reads loop value v: v in [1, 8) is valid, 1 and 6..7 are margins.
    outer = Scope([_iv("j", 7)], [], inner[j + 1] + 1.0)
    want = np.array([1.0, 3.0, 5.0, 7.0, 9.0, 1.0, 1.0])
    _close(evaluate(outer, {"A": x}), want, 0)
    _close(naive_evaluate(outer, {"A": x}), want, 0)
    too_far = Scope([_iv("j", 8)], [], inner[j + 1])
    with pytest.raises(OutOfBoundsError, match="nested scope"):
        evaluate(too_far, {"A": x})
    with pytest.raises(OutOfBoundsError):
        naive_evaluate(too_far, {"A": x})


def test_split_conv_nested_form():
    # Σ_{r,s} (L<r,s,n,h,w,f> Σ_c A[n, h+r-1, w+s-1, c] * K[r, s, f, c])[r, s, n, h, w, f]
    A, K = Tensor("A", (1, 4, 4, 3), pad=[0, 1, 1, 0]), Tensor("K", (3, 3, 2, 3))
    loops = [_iv("n", 1), _iv("h", 4), _iv("w", 4), _iv("f", 2)]
    body = A[n, h + r - 1, w + s - 1, c] * K[r, s, f, c]
    flat = Scope(loops, [_iv("c", 3), _iv("r", 3), _iv("s", 3)], body)
    inner = Scope([_iv("r", 3), _iv("s", 3)] + loops, [_iv("c", 3)], body)
    split = Scope(loops, [_iv("r", 3), _iv("s", 3)], inner[r, s, n, h, w, f])
    ins = random_inputs(flat, seed=12, dtype="float64")
    ap = np.pad(ins["A"], ((0, 0), (1, 1), (1, 1), (0, 0)))
    want = sum(np.einsum("nhwc,fc->nhwf", ap[:, rr:rr + 4, ss:ss + 4], ins["K"][rr, ss])
               for rr in range(3) for ss in range(3))
    _close(evaluate(flat, ins), want, 1e-12)
    _close(evaluate(split, ins), want, 1e-12)
    _close(naive_evaluate(split, ins), want, 1e-12)


def test_shared_nested_scope_is_evaluated_once(monkeypatch):
    A = Tensor("A", (3, 4))
    inner = Scope([_iv("i", 3)], [_iv("j", 4)], A[i, j])
    outer = Scope([_iv("k", 3)], [], inner[k] * inner[2 - k] + inner[k])
    calls = []
    original = interp._Run._sum

    def counting(self, scope):
        calls.append(scope)
        return original(self, scope)

    monkeypatch.setattr(interp._Run, "_sum", counting)
    x = np.random.default_rng(13).uniform(-1, 1, (3, 4))
    rs = x.sum(1)
    _close(evaluate(outer, {"A": x}), rs * rs[::-1] + rs, 1e-12)
    assert calls == [inner]


def test_floor_div_mod_indices_reshape():
    A = Tensor("A", (3, 4))
    e = Scope([_iv("i", 12)], [], A[i // 4, i % 4])
    x = np.arange(12.0).reshape(3, 4)
    np.testing.assert_array_equal(evaluate(e, {"A": x}), x.reshape(12))
    # Negative values: floor semantics (-5 // 4 == -2, -5 % 4 == 3), as in Python.
    B = Tensor("B", (4, 4))
    e2 = Scope([_iv("i", 6, begin=-6)], [], B[i // 4 + 2, i % 4])
    y = np.arange(16.0).reshape(4, 4)
    want = np.array([y[v // 4 + 2, v % 4] for v in range(-6, 6)])
    np.testing.assert_array_equal(evaluate(e2, {"A": x, "B": y}), want)
    np.testing.assert_array_equal(naive_evaluate(e2, {"B": y}), want)


def test_clamped_index_with_max():
    A = Tensor("A", (5,))
    e = Scope([_iv("i", 5)], [], A[Call("max", (i - 1, Const(0)))])
    x = np.arange(5.0)
    np.testing.assert_array_equal(evaluate(e, {"A": x}), [0, 0, 1, 2, 3])


def test_tensor_padding_reads_pad_value():
    A = Tensor("A", (3,), pad=[(2, 1)], pad_value=9.0)
    e = Scope([_iv("i", 6)], [], A[i - 2])
    np.testing.assert_array_equal(evaluate(e, {"A": np.array([1.0, 2.0, 3.0])}),
                                  [9, 9, 1, 2, 3, 9])


def test_out_of_bounds_read_is_an_error():
    A = Tensor("A", (5,))
    e = Scope([_iv("i", 5)], [], A[i + 1])
    with pytest.raises(OutOfBoundsError, match=r"A\[i \+ 1\]") as info:
        evaluate(e, {"A": np.zeros(5)})
    assert isinstance(info.value, IndexError)
    assert "[1, 5]" in str(info.value) and "[0, 5)" in str(info.value)
    padded = Scope([_iv("i", 5)], [], A.with_pad([(0, 1)])[i + 1])
    np.testing.assert_array_equal(evaluate(padded, {"A": np.ones(5)}), [1, 1, 1, 1, 0])
    beyond = Scope([_iv("i", 5)], [], A.with_pad([(0, 1)])[i + 2])
    with pytest.raises(OutOfBoundsError):
        evaluate(beyond, {"A": np.ones(5)})


def test_input_errors_name_the_tensor():
    A, K = Tensor("A", (2, 3)), Tensor("K", (3,))
    e = Scope([_iv("i", 2)], [_iv("j", 3)], A[i, j] * K[j])
    with pytest.raises(ValueError, match="'K'.*\\(4,\\)"):
        evaluate(e, {"A": np.zeros((2, 3)), "K": np.zeros(4)})
    with pytest.raises(ValueError, match="missing input tensor 'K'"):
        evaluate(e, {"A": np.zeros((2, 3))})


def test_closed_scalar_expression_and_tensor():
    A = Tensor("A", (3,))
    row = Scope([_iv("i", 3)], [], A[i] * 2.0)
    x = np.array([1.0, 2.0, 3.0])
    got = evaluate(row[Const(1)] + 0.5, {"A": x})
    assert got.shape == () and float(got) == 4.5
    np.testing.assert_array_equal(evaluate(A, {"A": x}), x)
    with pytest.raises(ValueError, match="free iterators"):
        evaluate(A[i], {"A": x})


def test_random_inputs():
    A, K = Tensor("A", (2, 3)), Tensor("K", (3, 4))
    e = Scope([_iv("i", 2), _iv("j", 4)], [_iv("k", 3)], A[i, k] * K[k, j])
    ins = random_inputs(e, seed=5)
    assert list(ins) == ["A", "K"]
    assert ins["A"].shape == (2, 3) and ins["A"].dtype == np.float32
    assert np.all((ins["K"] >= -1) & (ins["K"] < 1))
    np.testing.assert_array_equal(random_inputs(e, seed=5)["K"], ins["K"])
    assert not np.array_equal(random_inputs(e, seed=6)["K"], ins["K"])
    ints = random_inputs(e, seed=5, integer=True, dtype="float64")
    assert ints["A"].dtype == np.float64
    assert np.all(ints["K"] == np.round(ints["K"])) and np.abs(ints["K"]).max() <= 3


# ---------------------------------------------------------------------------------------------
# Performance
# ---------------------------------------------------------------------------------------------


def _conv_nhwc(N, H, C, F, R, pad):
    A = Tensor("A", (N, H, H, C), pad=[0, pad, pad, 0])
    K = Tensor("K", (R, R, F, C))
    return Scope([_iv("n", N), _iv("h", H), _iv("w", H), _iv("f", F)],
                 [_iv("c", C), _iv("r", R), _iv("s", R)],
                 A[n, h + r - pad, w + s - pad, c] * K[r, s, f, c])


def test_conv3x3_512_is_fast(record_property, capsys):
    e = _conv_nhwc(1, 7, 512, 512, 3, 1)
    ins = random_inputs(e, seed=0)
    evaluate(e, ins)  # warm-up (BLAS threads, caches)
    start = time.perf_counter()
    got = evaluate(e, ins)
    elapsed = time.perf_counter() - start
    record_property("conv3x3_seconds", elapsed)
    with capsys.disabled():
        print(f"\nconv3x3 1x7x7x512 * 3x3x512x512: {elapsed * 1e3:.1f} ms")
    assert elapsed < 1.0
    ap = np.pad(ins["A"], ((0, 0), (1, 1), (1, 1), (0, 0))).astype(np.float64)
    want = sum(np.einsum("nhwc,fc->nhwf", ap[:, rr:rr + 7, ss:ss + 7], ins["K"][rr, ss])
               for rr in range(3) for ss in range(3))
    _close(got, want, 1e-3)


def test_conv5x5_batch16_is_fast():
    e = _conv_nhwc(16, 32, 32, 32, 5, 2)
    ins = random_inputs(e, seed=0)
    start = time.perf_counter()
    got = evaluate(e, ins)
    assert time.perf_counter() - start < 3.0
    assert got.shape == (16, 32, 32, 32) and np.isfinite(got).all()


# ---------------------------------------------------------------------------------------------
# Property tests against the naive evaluator
# ---------------------------------------------------------------------------------------------

@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scopes(max_extent=3, pad_values=(0.0, 1.5)))
def test_random_scopes_match_naive(expr):
    ins = random_inputs(expr, seed=0, dtype="float64")
    _close(evaluate(expr, ins), naive_evaluate(expr, ins), 1e-9)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conv_like_scopes(max_size=4))
def test_conv_like_scopes_match_naive(expr):
    ins = random_inputs(expr, seed=1, dtype="float64")
    _close(evaluate(expr, ins), naive_evaluate(expr, ins), 1e-9)
