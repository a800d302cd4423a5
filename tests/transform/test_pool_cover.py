"""Pools whose every window covers the whole input (transform/pool_cover.py): the guard on
each axis, Before/Expected modules compared structurally, and numerics against TVM's build of
the module as given (every layout, ``ceil_mode``, strides, uneven padding), plus the rule's
place in ``optimize_module`` after the channels-last layout step."""

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R

from tvm_ollie.transform.pool_cover import covers_input, pool_cover, pool_reduction

op = relax.op


def _module(shape, *pools, concat=None):
    """main(x) = the pools of x (a tuple, or their concatenation along ``concat``)."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            outs = [bb.emit(make(x)) for make in pools]
            out = op.concat(outs, axis=concat) if concat is not None else relax.Tuple(outs)
            gv = bb.emit_output(out)
        bb.emit_func_output(gv)
    return bb.get()


def _run(mod, x):
    ex = tvm.compile(mod, target="llvm")
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x))
    return [o.numpy() for o in out] if isinstance(out, (list, tuple)) or hasattr(
        out, "__getitem__") and not hasattr(out, "numpy") else [out.numpy()]


def _max(k, pad, stride=1, layout="NCHW", ceil=False, dilation=1):
    return lambda x: op.nn.max_pool2d(x, k, stride, pad, dilation, ceil, layout=layout)


def _avg(k, pad, stride=1, layout="NCHW", include_pad=False):
    return lambda x: op.nn.avg_pool2d(x, k, stride, pad, 1, False, include_pad, layout=layout)


def _x(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype("float32")


# --- the guard ----------------------------------------------------------------------------


@pytest.mark.parametrize("size,kernel,stride,dil,pad,outs,want", [
    (2, 5, 1, 1, 2, 2, True),      # SPP 5x5 on a 2x2 map
    (2, 13, 1, 1, 6, 2, True),
    (2, 3, 1, 1, 1, 2, True),      # 3x3 "same" on 2x2: each window is the whole map
    (3, 3, 1, 1, 1, 3, False),     # the first window ends at 1 < 2
    (4, 5, 1, 1, 2, 4, False),     # the last window starts at 1 > 0
    (4, 7, 1, 1, 3, 4, True),
    (4, 7, 2, 1, 3, 2, True),      # (O - 1) * s = 2 <= 3
    (4, 7, 4, 1, 3, 2, False),     # the second window starts at 1
    (2, 5, 1, 2, 2, 2, False),     # dilated: the window has holes
    (1, 1, 1, 1, 0, 1, True),      # a 1x1 pool of a 1x1 map
])
def test_covers_input(size, kernel, stride, dil, pad, outs, want):
    assert covers_input(size, kernel, stride, dil, pad, outs) is want


def test_pool_reduction_guards():
    """The rule returns None for a pool whose windows miss some input, an average that counts
    the padding, and any other call."""
    def call(make, shape=(1, 4, 2, 2)):
        bb = relax.BlockBuilder()
        x = relax.Var("x", relax.TensorType(shape, "float32"))
        with bb.function("f", [x]):
            v = bb.emit(make(x))
            bb.emit_func_output(v)
        return bb.get()["f"].body.blocks[0].bindings[0].value

    assert pool_reduction(call(_max(5, 2))) == ("max", (2, 3))
    assert pool_reduction(call(_max(5, 2, layout="NHWC"), (1, 2, 2, 4))) == ("max", (1, 2))
    assert pool_reduction(call(_avg(5, 2))) == ("mean", (2, 3))
    assert pool_reduction(call(_avg(5, 2, include_pad=True))) is None
    assert pool_reduction(call(_max(3, 1), (1, 4, 5, 5))) is None
    assert pool_reduction(call(_max(5, 2, dilation=2))) is None
    assert pool_reduction(call(lambda x: op.nn.relu(x))) is None


# --- Before / Expected --------------------------------------------------------------------


@I.ir_module
class Before:
    @R.function
    def main(x: R.Tensor((1, 2, 2, 8), "float32")) -> R.Tensor((1, 2, 2, 24), "float32"):
        with R.dataflow():
            a = R.nn.max_pool2d(x, pool_size=[5, 5], strides=[1, 1], padding=[2, 2, 2, 2],
                                layout="NHWC", out_layout="NHWC")
            b = R.nn.max_pool2d(x, pool_size=[9, 9], strides=[1, 1], padding=[4, 4, 4, 4],
                                layout="NHWC", out_layout="NHWC")
            c = R.nn.avg_pool2d(x, pool_size=[3, 3], strides=[1, 1], padding=[1, 1, 1, 1],
                                layout="NHWC", out_layout="NHWC")
            d = R.concat((a, b, c), axis=3)
            R.output(d)
        return d


@I.ir_module
class Expected:
    @R.function
    def main(x: R.Tensor((1, 2, 2, 8), "float32")) -> R.Tensor((1, 2, 2, 24), "float32"):
        with R.dataflow():
            a_max = R.max(x, axis=[1, 2], keepdims=True)
            a = R.broadcast_to(a_max, R.shape([1, 2, 2, 8]))
            b = R.broadcast_to(a_max, R.shape([1, 2, 2, 8]))
            c_mean = R.mean(x, axis=[1, 2], keepdims=True)
            c = R.broadcast_to(c_mean, R.shape([1, 2, 2, 8]))
            d = R.concat((a, b, c), axis=3)
            R.output(d)
        return d


def test_before_expected():
    """Channels-last SPP: the two max pools share one reduction, the average its own."""
    got, count = pool_cover(Before)
    assert count == 3
    tvm.ir.assert_structural_equal(got, Expected)


def test_untouched_module_is_returned_as_is():
    mod = _module((1, 4, 5, 5), _max(3, 1), _avg(5, 2, include_pad=True))
    got, count = pool_cover(mod)
    assert count == 0 and got is mod


# --- numerics against TVM's build ---------------------------------------------------------


@pytest.mark.parametrize("shape,pools,concat", [
    ((1, 16, 2, 2), [_max(5, 2), _max(9, 4), _max(13, 6)], 1),           # YOLOX's SPP
    ((2, 2, 2, 16), [_max(5, 2, layout="NHWC"), _max(13, 6, layout="NHWC")], 3),
    ((1, 3, 4, 3), [_max(7, 3), _max((7, 5), (3, 2)), _avg(7, 3)], None),  # H != W
    ((1, 3, 4, 4), [_max(7, 3, stride=2), _max(5, (3, 3, 1, 1)), _avg(7, 3, stride=2)], None),
    ((1, 3, 3, 3), [_max(5, 2, stride=2, ceil=True), _avg(5, 2, stride=3)], None),
    ((1, 4, 5, 5), [_max(3, 1), _max(11, 5), _avg(11, 5)], None),         # the first is kept
    ((1, 4, 2, 2), [_max(3, (0, 0, 2, 2)), _avg(3, (0, 0, 2, 2)), _max(3, 1)], None),  # kept
])
def test_numerics_against_tvm(shape, pools, concat):
    mod = _module(shape, *pools, concat=concat)
    got, count = pool_cover(mod)
    assert count >= 1
    x = _x(shape) - 3.0  # all-negative regions: a max that read padding would show a 0 or -inf
    for want, out in zip(_run(mod, x), _run(got, x)):
        np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-6)


def test_optimize_module_rewrites_pools_in_the_layout_chain():
    """In ``optimize_module`` the rule runs after the layout step (so the pools of an SPP block
    between two native convolutions are laid out with the chain first), and the result matches
    TVM's build of the module as given."""
    from tvm_ollie import native
    from tvm_ollie.config import OllieConfig
    from tvm_ollie.transform.choosing import native_everywhere
    from tvm_ollie.transform.optimize import optimize_module

    if not native.available():
        pytest.skip("the native library is not loaded")
    rng = np.random.default_rng(1)
    w1 = relax.const(rng.standard_normal((16, 8, 1, 1)).astype("float32") * 0.3)
    w2 = relax.const(rng.standard_normal((8, 48, 1, 1)).astype("float32") * 0.3)

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 8, 2, 2), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(op.nn.relu(bb.emit(op.nn.conv2d(x, w1))))
            pools = [bb.emit(_max(k, k // 2)(y)) for k in (5, 9)]
            cat = bb.emit(op.concat([y] + pools, axis=1))
            gv = bb.emit_output(op.nn.conv2d(cat, w2))
        bb.emit_func_output(gv)
    mod = bb.get()
    cfg = OllieConfig(target=tvm.target.Target("llvm"), derive=False, trials=0)
    new, report = optimize_module(mod, config=cfg, chooser=native_everywhere)
    assert report.inference_folds.get("pool_covers_input") == 2
    text = new.script()
    assert "max_pool2d" not in text and "R.max(" in text
    xv = _x((1, 8, 2, 2), 2)
    np.testing.assert_allclose(_run(new, xv)[0], _run(mod, xv)[0], rtol=1e-5, atol=1e-5)
