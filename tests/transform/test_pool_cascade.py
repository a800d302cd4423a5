"""Stride-1 "same" max pools of one input computed from each other
(transform/pool_cascade.py): the guard, Before/Expected modules compared structurally, and
numerics against TVM's build of the module as given."""

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R

from tvm_ollie.transform.pool_cascade import pool_cascade, same_pool_kernel

op = relax.op


def _module(shape, kernels, layout="NCHW", strides=1, ceil=False, pads=None, concat=True):
    """main(x) = concat(x, pool_k(x) for k in kernels) along the channels (the pools' tuple
    without ``concat``)."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            pools = []
            for k in kernels:
                kk = k if isinstance(k, tuple) else (k, k)
                pad = pads if pads is not None else (kk[0] // 2, kk[1] // 2)
                pools.append(bb.emit(op.nn.max_pool2d(x, kk, strides, pad, 1, ceil,
                                                      layout=layout)))
            gv = bb.emit_output(op.concat([x] + pools, axis=layout.index("C")) if concat
                                else relax.Tuple(pools))
        bb.emit_func_output(gv)
    return bb.get()


def _run(mod, x):
    ex = tvm.compile(mod, target="llvm")
    return relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()


def _pool_call(**kw):
    mod = _module((1, 2, 6, 6), [kw.pop("k", 5)], concat=False, **kw)
    return mod["main"].body.blocks[0].bindings[0].value


def test_same_pool_kernel_guards():
    assert same_pool_kernel(_pool_call()) == (5, 5)
    assert same_pool_kernel(_pool_call(k=(3, 7))) == (3, 7)
    assert same_pool_kernel(_pool_call(strides=2)) is None
    assert same_pool_kernel(_pool_call(k=4)) is None            # even kernel
    assert same_pool_kernel(_pool_call(pads=(1, 1))) is None    # not k // 2
    assert same_pool_kernel(_pool_call(ceil=True)) is None


@I.ir_module
class Before:
    @R.function
    def main(x: R.Tensor((1, 8, 8, 4), "float32")) -> R.Tensor((1, 8, 8, 16), "float32"):
        with R.dataflow():
            a = R.nn.max_pool2d(x, pool_size=[5, 5], strides=[1, 1], padding=[2, 2, 2, 2],
                                layout="NHWC", out_layout="NHWC")
            b = R.nn.max_pool2d(x, pool_size=[9, 9], strides=[1, 1], padding=[4, 4, 4, 4],
                                layout="NHWC", out_layout="NHWC")
            c = R.nn.max_pool2d(x, pool_size=[13, 13], strides=[1, 1], padding=[6, 6, 6, 6],
                                layout="NHWC", out_layout="NHWC")
            d = R.concat((x, a, b, c), axis=3)
            R.output(d)
        return d


@I.ir_module
class Expected:
    @R.function
    def main(x: R.Tensor((1, 8, 8, 4), "float32")) -> R.Tensor((1, 8, 8, 16), "float32"):
        with R.dataflow():
            a = R.nn.max_pool2d(x, pool_size=[5, 5], strides=[1, 1], padding=[2, 2, 2, 2],
                                layout="NHWC", out_layout="NHWC")
            b = R.nn.max_pool2d(a, pool_size=[5, 5], strides=[1, 1], padding=[2, 2, 2, 2],
                                layout="NHWC", out_layout="NHWC")
            c = R.nn.max_pool2d(b, pool_size=[5, 5], strides=[1, 1], padding=[2, 2, 2, 2],
                                layout="NHWC", out_layout="NHWC")
            d = R.concat((x, a, b, c), axis=3)
            R.output(d)
        return d


def test_before_expected_spp():
    got, count = pool_cascade(Before)
    assert count == 2
    tvm.ir.assert_structural_equal(got, Expected)


def test_no_earlier_pool_is_left_alone():
    mod = _module((1, 2, 6, 6), [13, 5])  # the larger first: nothing earlier to start from
    got, count = pool_cascade(mod)
    assert count == 0 and got is mod


@pytest.mark.parametrize("shape,kernels,layout", [
    ((1, 16, 13, 13), [5, 9, 13], "NCHW"),        # YOLOX's SPP at 416x416
    ((2, 7, 9, 4), [3, 5, 9], "NHWC"),
    ((1, 3, 5, 11), [(3, 5), (7, 9), (7, 7), 3], "NCHW"),  # rectangular; 3 after larger ones
    ((1, 4, 6, 6), [13, 5, 9, 9, 5], "NCHW"),      # 9 from 5, repeated kernels are reused
])
def test_numerics_against_tvm(shape, kernels, layout):
    mod = _module(shape, kernels, layout=layout)
    got, count = pool_cascade(mod)
    assert count >= 1
    x = np.random.default_rng(0).standard_normal(shape).astype("float32") - 3.0
    np.testing.assert_array_equal(_run(got, x), _run(mod, x))
