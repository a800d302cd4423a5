"""The generic TE and PrimFunc lifts against TVM builds of the same TE graphs."""

from __future__ import annotations

import numpy as np
import pytest

tvm = pytest.importorskip("tvm")

from tvm import te, tirx, topi  # noqa: E402

from tvm_ollie.ir.interp import evaluate  # noqa: E402
from tvm_ollie.ir.nodes import Access, Call, Scope, Tensor, iter_nodes  # noqa: E402
from tvm_ollie.lift import LiftError, lift, lift_primfunc, lift_te  # noqa: E402

F32 = "float32"


def _ph(name, shape):
    return te.placeholder(shape, F32, name)


def _run_tvm(placeholders, out, arrays):
    func = te.create_prim_func(list(placeholders) + [out])
    lib = tvm.compile(tvm.IRModule({"main": func}), "llvm")
    shape = [int(s) for s in out.shape]
    res = tvm.runtime.tensor(np.zeros(shape, F32))
    lib["main"](*[tvm.runtime.tensor(a) for a in arrays], res)
    return func, res.numpy()


def _check(placeholders, out, positive=False, primfunc=True):
    rng = np.random.default_rng(0)
    lo, hi = (0.5, 2.0) if positive else (-1.0, 1.0)
    arrays = [rng.uniform(lo, hi, [int(s) for s in p.shape]).astype(F32) for p in placeholders]
    func, ref = _run_tvm(placeholders, out, arrays)
    inputs = {p.op.name: a for p, a in zip(placeholders, arrays)}
    expr = lift(out)
    assert isinstance(expr, Scope)
    np.testing.assert_allclose(evaluate(expr, inputs), ref, rtol=1e-5, atol=1e-5,
                               err_msg=str(expr))
    if primfunc:
        expr_pf = lift(func)
        np.testing.assert_allclose(evaluate(expr_pf, inputs), ref, rtol=1e-5, atol=1e-5,
                                   err_msg=str(expr_pf))
    return expr


@pytest.mark.parametrize("stride,padding,dilation", [
    (1, 1, 1), (2, 1, 1), (1, 0, 2), (2, (1, 0, 2, 1), 1), ((1, 2), (0, 1), (2, 1)),
])
def test_topi_conv2d_nchw(stride, padding, dilation):
    a, w = _ph("A", (2, 3, 7, 8)), _ph("W", (4, 3, 3, 3))
    expr = _check([a, w], topi.nn.conv2d_nchw(a, w, stride, padding, dilation))
    # The pad stage is folded into a padded input tensor: one scope, no nesting (a dilated
    # kernel is TOPI's separate stage and stays a nested scope).
    if dilation == 1:
        assert not any(isinstance(n, Scope) and n is not expr for n in iter_nodes(expr))
    if padding != 0:
        assert any(isinstance(n, Tensor) and n.name == "A" and any(p != (0, 0) for p in n.pad)
                   for n in iter_nodes(expr))


@pytest.mark.parametrize("strides,padding,output_padding", [
    ((2, 2), (1, 1), (1, 1)), ((1, 1), (0, 0), (0, 0)), ((3, 2), (1, 0), (2, 1)),
])
def test_topi_conv2d_transpose_nchw(strides, padding, output_padding):
    a, w = _ph("A", (1, 3, 4, 5)), _ph("W", (3, 2, 3, 3))
    out = topi.nn.conv2d_transpose_nchw(a, w, strides, padding, F32, output_padding)
    _check([a, w], out)


@pytest.mark.parametrize("shape", [((4, 6), (5, 6)), ((1, 3), (2, 3)), ((3, 1), (4, 1))])
def test_topi_dense(shape):
    x, w = _ph("X", shape[0]), _ph("Wd", shape[1])
    _check([x, w], topi.nn.dense(x, w))


@pytest.mark.parametrize("transpose_b", [True, False])
@pytest.mark.parametrize("shapes", [((2, 3, 4), (2, 5, 4)), ((1, 3, 4), (2, 5, 4))])
def test_topi_batch_matmul(shapes, transpose_b):
    sa, sb = shapes
    if not transpose_b:
        sb = (sb[0], sb[2], sb[1])
    a, b = _ph("A", sa), _ph("B", sb)
    _check([a, b], topi.nn.batch_matmul(a, b, transpose_b=transpose_b))


def test_topi_matmul_and_elementwise_chain():
    x, y, bias = _ph("X", (3, 4)), _ph("Y", (4, 5)), _ph("bias", (5,))
    out = topi.nn.relu(topi.add(topi.matmul(x, y), bias))
    expr = _check([x, y, bias], out)
    # add and relu read the matmul as nested stages.
    assert sum(isinstance(n, Scope) for n in iter_nodes(expr)) == 3


def test_topi_softmax_multi_stage():
    x = _ph("x", (3, 5))
    _check([x], topi.nn.softmax(x, axis=1))


def test_topi_max_pool_and_unary():
    x = _ph("x", (1, 2, 7, 7))
    _check([x], topi.nn.pool2d(x, (3, 3), (2, 2), (1, 1), (1, 1, 1, 1), "max"))
    _check([x], topi.sigmoid(topi.tanh(x)))
    _check([x], topi.sqrt(topi.exp(x)))


def test_constant_pad_value_is_kept():
    x = _ph("x", (2, 3))
    out = topi.nn.pad(x, (1, 0), (0, 2), pad_value=-2.5)
    expr = _check([x], out)
    reads = [n for n in iter_nodes(expr) if isinstance(n, Access)]
    assert reads[0].source.pad == ((1, 0), (0, 2)) and reads[0].source.pad_value == -2.5


def test_pad_of_a_compute_stage_becomes_scope_padding():
    x = _ph("x", (3, 4))
    y = te.compute((3, 4), lambda i, j: x[i, j] * 2.0, name="y")
    out = topi.nn.pad(y, (1, 1), (0, 2))
    expr = _check([x], out)
    nested = [n.source for n in iter_nodes(expr) if isinstance(n, Access)
              and isinstance(n.source, Scope)]
    assert nested and nested[0].pad == ((1, 0), (1, 2))


def test_guarded_select_is_not_mistaken_for_padding():
    x = _ph("x", (4,))
    # Guards one element too many: not a pure pad, must still be exact.
    out = te.compute((6,), lambda i: tirx.if_then_else(tirx.all(i >= 1, i < 4), x[i - 1], 0.0))
    _check([x], out)


def test_shifted_pad_stage():
    x = _ph("x", (3,))
    # A left shift with a zero fill on the right: a pad with a negative offset.
    out = te.compute((3,), lambda i: tirx.if_then_else(i < 2, x[i + 1], 0.0), name="shift")
    expr = _check([x], out)
    assert str(expr).startswith("L<i:0:3> { x<pad=[0:1]>[i + 1] }")


def test_names_override_and_duplicates():
    a1, a2 = _ph("A", (2, 2)), _ph("A", (2, 2))
    out = te.compute((2, 2), lambda i, j: a1[i, j] - a2[j, i], name="out")
    expr = lift_te(out)
    assert sorted(t.name for t in expr.inputs) == ["in0", "in1"]
    expr = lift_te(out, names={a1: "first", a2: "second"})
    assert [t.name for t in expr.inputs] == ["first", "second"]
    rng = np.random.default_rng(1)
    u, v = rng.standard_normal((2, 2)), rng.standard_normal((2, 2))
    np.testing.assert_allclose(evaluate(expr, {"first": u, "second": v}), u - v.T)


def test_package_attribute_stays_callable():
    import tvm_ollie  # pylint: disable=import-outside-toplevel

    x = _ph("x", (2, 3))
    assert isinstance(tvm_ollie.lift(topi.exp(x)), Scope)


def test_create_prim_func_single_block():
    x, w = _ph("X", (4, 6)), _ph("Wd", (5, 6))
    func = te.create_prim_func([x, w, topi.nn.dense(x, w)])
    expr = lift_primfunc(func)
    assert [t.name for t in expr.inputs] == ["X", "Wd"]
    assert len(expr.reduce) == 1 and expr.reducer == "sum"
    expr = lift_primfunc(func, names=["p", "q"])
    assert [t.name for t in expr.inputs] == ["p", "q"]


def test_max_reduction_primfunc():
    x = _ph("x", (3, 4))
    expr = _check([x], topi.max(x, axis=1))
    assert expr.reducer == "max"


@pytest.mark.parametrize("make,match", [
    (lambda x: topi.argmax(x, axis=1), "multi"),
    (lambda x: te.compute((3, 4), lambda i, j: x[i, j].astype("int8"), name="c"), "cast"),
    (lambda x: te.compute((3, 4), lambda i, j: x[tirx.truncmod(i + j, 3), j], name="m"),
     "modulo"),
    (lambda x: te.compute((3, 4), lambda i, j: x[tirx.Div(i + j, 2), j], name="d"),
     "division"),
    (lambda x: topi.cumsum(x, axis=1), "ExternOp|ScanOp"),
    (lambda x: x, "ComputeOp"),
])
def test_te_refusals(make, match):
    x = _ph("x", (3, 4))
    with pytest.raises(LiftError, match=match):
        lift(make(x))


def test_reduction_identity_is_checked():
    x = _ph("x", (3, 4))
    plus_one = te.comm_reducer(lambda a, b: a + b, lambda t: tirx.const(1.0, dtype=t),
                               name="plus_one")
    k = te.reduce_axis((0, 4), "k")
    out = te.compute((3,), lambda i: plus_one(x[i, k], axis=k), name="out")
    with pytest.raises(LiftError, match="identity"):
        lift(out)


def test_symbolic_te_shape_raises():
    n = te.var("n")
    x = te.placeholder((n, 4), F32, "x")
    with pytest.raises(LiftError, match="static"):
        lift(topi.exp(x))


def test_avg_pool_te_lifts_its_count_cast():
    """TOPI divides by an int count cast to float: the cast is an IR cast of index arithmetic."""
    x = _ph("x", (1, 1, 5, 5))
    expr = _check([x], topi.nn.pool2d(x, (3, 3), (2, 2), (1, 1), (1, 1, 1, 1), "avg",
                                      count_include_pad=False))
    assert any(isinstance(n, Call) and n.func == "float32" for n in iter_nodes(expr))
