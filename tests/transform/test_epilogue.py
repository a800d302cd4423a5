"""fuse_epilogues: bias, residual and activation consumers folded into native kernel calls."""

import numpy as np
import pytest
import tvm
from tvm import relax

from tvm_ollie import native
from tvm_ollie.codegen import library as lib
from tvm_ollie.transform.epilogue import fuse_epilogues

CONV = lib.conv2d_call((1, 1), (1, 1, 1, 1), (1, 1), 1, "NCHW", "OIHW")
MATMUL = lib.matmul_call()


def _f32(shape):
    return relax.TensorType(shape, "float32")


def _build(params, body):
    """A one-function module: ``body(bb, *params)`` emits bindings and returns the output."""
    bb = relax.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(body(bb, *params))
        bb.emit_func_output(out)
    return bb.get()


def _conv_params():
    return [relax.Var("x", _f32((1, 4, 6, 6))), relax.Var("w", _f32((8, 4, 3, 3)))]


BIAS = np.arange(8, dtype="float32").reshape(1, 8, 1, 1)


def test_conv_bias_relu_folded_into_one_call():
    def before(bb, x, w):
        y = bb.emit(lib.emit_call(CONV, [x, w], (1, 8, 6, 6)))
        y = bb.emit(relax.op.add(y, relax.const(BIAS)))
        return relax.op.nn.relu(y)

    def expected(bb, x, w):
        call = CONV.with_attrs(bias=1, act="relu")
        return lib.emit_call(call, [x, w, relax.const(BIAS.reshape(8))], (1, 8, 6, 6))

    got, counts = fuse_epilogues(_build(_conv_params(), before))
    tvm.ir.assert_structural_equal(got, _build(_conv_params(), expected))
    assert counts == {"conv2d": 2}


def test_residual_then_clip_on_matmul():
    params = [relax.Var("a", _f32((5, 7))), relax.Var("b", _f32((7, 3))),
              relax.Var("r", _f32((5, 3)))]

    def before(bb, a, b, r):
        y = bb.emit(lib.emit_call(MATMUL, [a, b], (5, 3)))
        y = bb.emit(relax.op.add(r, y))
        return relax.op.clip(y, 0.0, 6.0)

    def expected(bb, a, b, r):
        return lib.emit_call(MATMUL.with_attrs(res=1, act="clip_0.0_6.0"), [a, b, r], (5, 3))

    got, _ = fuse_epilogues(_build(params, before))
    tvm.ir.assert_structural_equal(got, _build(params, expected))


def test_bias_variable_is_reshaped_first():
    params = _conv_params() + [relax.Var("bias", _f32((8, 1, 1)))]

    def before(bb, x, w, bias):
        y = bb.emit(lib.emit_call(CONV, [x, w], (1, 8, 6, 6)))
        return relax.op.add(y, bias)

    def expected(bb, x, w, bias):
        flat = bb.emit(relax.op.reshape(bias, (8,)))
        return lib.emit_call(CONV.with_attrs(bias=1), [x, w, flat], (1, 8, 6, 6))

    got, _ = fuse_epilogues(_build(params, before))
    tvm.ir.assert_structural_equal(got, _build(params, expected))


def _unchanged(params, body):
    mod = _build(params, body)
    got, counts = fuse_epilogues(mod)
    tvm.ir.assert_structural_equal(got, mod)
    assert counts == {}


def test_guard_used_twice():
    def body(bb, x, w):
        y = bb.emit(lib.emit_call(CONV, [x, w], (1, 8, 6, 6)))
        z = bb.emit(relax.op.nn.relu(y))
        return relax.op.add(z, y)

    _unchanged(_conv_params(), body)


def test_guard_bias_on_the_wrong_axis_and_broadcasting_add():
    def wrong_axis(bb, x, w):
        y = bb.emit(lib.emit_call(CONV, [x, w], (1, 8, 6, 6)))
        return relax.op.add(y, relax.const(np.ones((1, 1, 1, 6), "float32")))

    def widening(bb, x, w):
        y = bb.emit(lib.emit_call(CONV, [x, w], (1, 8, 6, 6)))
        return relax.op.add(y, relax.const(np.ones((2, 8, 1, 1), "float32")))

    _unchanged(_conv_params(), wrong_axis)
    _unchanged(_conv_params(), widening)


def test_guard_order_activation_before_bias():
    def body(bb, x, w):
        y = bb.emit(lib.emit_call(CONV.with_attrs(act="relu"), [x, w], (1, 8, 6, 6)))
        return relax.op.add(y, relax.const(BIAS))

    _unchanged(_conv_params(), body)


def test_non_library_calls_untouched():
    def body(bb, x, w):
        y = bb.emit(relax.op.nn.conv2d(x, w, padding=1))
        return relax.op.nn.relu(y)

    _unchanged(_conv_params(), body)


def test_band_kernels_take_no_epilogue():
    """The banded matmuls (g2bmm/gbmm) have no bias/res/act keys: consumers stay as they are."""
    params = [relax.Var("a", _f32((2, 8, 4))), relax.Var("b", _f32((2, 8, 4)))]

    def body(bb, a, b):
        y = bb.emit(lib.emit_call(lib.band_call("g2bmm", 1, 2), [a, b], (2, 8, 3)))
        return relax.op.nn.relu(bb.emit(relax.op.add(y, relax.const(np.ones(3, "float32")))))

    _unchanged(params, body)


@pytest.mark.skipif(not native.load(), reason="native library not loaded")
def test_folded_epilogue_numerics():
    rng = np.random.default_rng(0)
    params = _conv_params() + [relax.Var("r", _f32((1, 8, 6, 6)))]

    def body(bb, x, w, r):
        y = bb.emit(lib.emit_call(CONV, [x, w], (1, 8, 6, 6)))
        y = bb.emit(relax.op.add(y, relax.const(BIAS)))
        y = bb.emit(relax.op.add(y, r))
        return relax.op.nn.silu(y)

    mod = _build(params, body)
    fused, counts = fuse_epilogues(mod)
    assert counts == {"conv2d": 3}
    args = [rng.standard_normal(tuple(int(s) for s in p.ty.shape)).astype("float32")
            for p in params]

    def run(m):
        vm = relax.VirtualMachine(tvm.compile(m, target="llvm"), tvm.cpu())
        return vm["main"](*[tvm.runtime.tensor(a) for a in args]).numpy()

    np.testing.assert_allclose(run(fused), run(mod), rtol=1e-5, atol=1e-5)
