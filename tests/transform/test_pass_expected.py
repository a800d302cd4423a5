"""OllieOptimize as a pass, TVM style: a Before module through the pass with the decision
core's stages replaced by fakes, compared with an Expected module
(``tvm.ir.assert_structural_equal``)."""

import logging
import math

import numpy as np
import tvm
from tvm.script import ir as I
from tvm.script import relax as R
from tvm.script import tirx as T

import small_models as sm
from tvm_ollie.transform import OllieOptimize
from tvm_ollie.transform.checking import Checker
from tvm_ollie.transform.costing import UnitCostModel

logging.getLogger("tvm_ollie.derive").setLevel(logging.CRITICAL)

#: (no payback stop: the searches run to their depth, as these expected modules assume; with
#: it, the search of this 10 kFLOP convolution stops before the offset-add form, which its
#: few microseconds could not repay: ``CostBound.paid_back``)
OPTS = dict(target="llvm", library=False, max_depth=2, search_time_s=2.0,
            calibration=sm.LLVM_CALIB, search_payback_runs=math.inf)


class FakeCost(UnitCostModel):
    """The original 1 ms; a program 0.1 ms when ``cheap(label)``, else 5 ms."""

    def __init__(self, cheap=lambda label: False):
        self.cheap = cheap

    def seconds(self, unit, alt):
        if alt.program is None:
            return 1e-3
        return 1e-4 if self.cheap(alt.label) else 5e-3


class AcceptAll(Checker):
    def check(self, unit, alt):
        return True, ""


class RejectAll(Checker):
    def check(self, unit, alt):
        return False, "rejected by the fake checker"


@I.ir_module
class Conv3x3:
    @R.function
    def main(x: R.Tensor((1, 4, 6, 6), "float32"),
             w: R.Tensor((8, 4, 3, 3), "float32")) -> R.Tensor((1, 8, 6, 6), "float32"):
        with R.dataflow():
            y = R.nn.conv2d(x, w, padding=[1, 1, 1, 1])
            R.output(y)
        return y


# pylint: disable=line-too-long,invalid-name
@I.ir_module
class Conv3x3OffsetAdd:
    """Conv 3x3 as the derivation's matmul + offset-add: gather the input rows (one padded
    axis), permute the weights, one matmul over (channel, kernel column), then add the three
    kernel rows' partial results at their row offsets (the padded reduction)."""

    @T.prim_func(private=True, s_tir=True)
    def ollie_conv2d_eop_0(x: T.Buffer((T.int64(1), T.int64(4), T.int64(6), T.int64(6)), "float32"), ollie_conv2d_eop_0: T.Buffer((T.int64(1), T.int64(6), T.int64(6), T.int64(4), T.int64(3)), "float32")):
        T.func_attr({"tirx.noalias": True})
        for i0, i1, i2, r0, r1 in T.grid(T.int64(1), T.int64(6), T.int64(6), T.int64(4), T.int64(3)):
            with T.sblock("ollie_conv2d_eop_0"):
                v_i0, v_i1, v_i2, v_r0, v_r1 = T.axis.remap("SSSSS", [i0, i1, i2, r0, r1])
                T.reads(x[T.int64(0), v_r0, v_i1, v_i2 + v_r1 - T.int64(1)])
                T.writes(ollie_conv2d_eop_0[v_i0, v_i1, v_i2, v_r0, v_r1])
                ollie_conv2d_eop_0[v_i0, v_i1, v_i2, v_r0, v_r1] = T.if_then_else(T.int64(1) <= v_i2 + v_r1 and v_i2 + v_r1 < T.int64(7), x[T.int64(0), v_r0, v_i1, v_i2 + v_r1 - T.int64(1)], T.float32(0.0))

    @T.prim_func(private=True, s_tir=True)
    def ollie_conv2d_eop_1(w: T.Buffer((T.int64(8), T.int64(4), T.int64(3), T.int64(3)), "float32"), ollie_conv2d_eop_1: T.Buffer((T.int64(8), T.int64(3), T.int64(4), T.int64(3)), "float32")):
        T.func_attr({"tirx.noalias": True})
        for i3, i4, r0, r1 in T.grid(T.int64(8), T.int64(3), T.int64(4), T.int64(3)):
            with T.sblock("ollie_conv2d_eop_1"):
                v_i3, v_i4, v_r0, v_r1 = T.axis.remap("SSSS", [i3, i4, r0, r1])
                T.reads(w[v_i3, v_r0, v_i4, v_r1])
                T.writes(ollie_conv2d_eop_1[v_i3, v_i4, v_r0, v_r1])
                ollie_conv2d_eop_1[v_i3, v_i4, v_r0, v_r1] = w[v_i3, v_r0, v_i4, v_r1]

    @T.prim_func(private=True, s_tir=True)
    def ollie_conv2d_eop_3(lv5: T.Buffer((T.int64(1), T.int64(6), T.int64(6), T.int64(8), T.int64(3)), "float32"), ollie_conv2d_eop_3: T.Buffer((T.int64(1), T.int64(8), T.int64(6), T.int64(6)), "float32")):
        T.func_attr({"tirx.noalias": True})
        for i0, i1, i2, i3, r0 in T.grid(T.int64(1), T.int64(8), T.int64(6), T.int64(6), T.int64(3)):
            with T.sblock("ollie_conv2d_eop_3"):
                v_i0, v_i1, v_i2, v_i3, v_r0 = T.axis.remap("SSSSR", [i0, i1, i2, i3, r0])
                T.reads(lv5[T.int64(0), v_i2 + v_r0 - T.int64(1), v_i3, v_i1, v_r0])
                T.writes(ollie_conv2d_eop_3[v_i0, v_i1, v_i2, v_i3])
                with T.init():
                    ollie_conv2d_eop_3[v_i0, v_i1, v_i2, v_i3] = T.float32(0.0)
                ollie_conv2d_eop_3[v_i0, v_i1, v_i2, v_i3] = ollie_conv2d_eop_3[v_i0, v_i1, v_i2, v_i3] + T.if_then_else(T.int64(1) <= v_i2 + v_r0 and v_i2 + v_r0 < T.int64(7), lv5[T.int64(0), v_i2 + v_r0 - T.int64(1), v_i3, v_i1, v_r0], T.float32(0.0))

    @T.prim_func(private=True, s_tir=True)
    def ollie_conv2d_matmul_2(lv2: T.Buffer((T.int64(36), T.int64(12)), "float32"), lv3: T.Buffer((T.int64(24), T.int64(12)), "float32"), ollie_conv2d_matmul_2: T.Buffer((T.int64(36), T.int64(24)), "float32")):
        T.func_attr({"tirx.noalias": True})
        for m, n, k in T.grid(T.int64(36), T.int64(24), T.int64(12)):
            with T.sblock("ollie_conv2d_matmul_2"):
                v_m, v_n, v_k = T.axis.remap("SSR", [m, n, k])
                T.reads(lv2[v_m, v_k], lv3[v_n, v_k])
                T.writes(ollie_conv2d_matmul_2[v_m, v_n])
                with T.init():
                    ollie_conv2d_matmul_2[v_m, v_n] = T.float32(0.0)
                ollie_conv2d_matmul_2[v_m, v_n] = ollie_conv2d_matmul_2[v_m, v_n] + lv2[v_m, v_k] * lv3[v_n, v_k]

    @R.function
    def main(x: R.Tensor((1, 4, 6, 6), dtype="float32"), w: R.Tensor((8, 4, 3, 3), dtype="float32")) -> R.Tensor((1, 8, 6, 6), dtype="float32"):
        cls = Conv3x3OffsetAdd
        with R.dataflow():
            lv = R.call_tir(cls.ollie_conv2d_eop_0, (x,), out_ty=R.Tensor((1, 6, 6, 4, 3), dtype="float32"))
            lv1 = R.call_tir(cls.ollie_conv2d_eop_1, (w,), out_ty=R.Tensor((8, 3, 4, 3), dtype="float32"))
            lv2: R.Tensor((36, 12), dtype="float32") = R.reshape(lv, R.shape([36, 12]))
            lv3: R.Tensor((24, 12), dtype="float32") = R.reshape(lv1, R.shape([24, 12]))
            lv4 = R.call_tir(cls.ollie_conv2d_matmul_2, (lv2, lv3), out_ty=R.Tensor((36, 24), dtype="float32"))
            lv5: R.Tensor((1, 6, 6, 8, 3), dtype="float32") = R.reshape(lv4, R.shape([1, 6, 6, 8, 3]))
            y = R.call_tir(cls.ollie_conv2d_eop_3, (lv5,), out_ty=R.Tensor((1, 8, 6, 6), dtype="float32"))
            R.output(y)
        return y
# pylint: enable=line-too-long,invalid-name


@I.ir_module
class Matmul:
    @R.function
    def main(x: R.Tensor((4, 16), "float32"),
             w: R.Tensor((16, 8), "float32")) -> R.Tensor((4, 8), "float32"):
        with R.dataflow():
            y = R.matmul(x, w)
            R.output(y)
        return y


def test_conv3x3_becomes_matmul_and_offset_add():
    """The cost model makes the offset-add program the cheapest: it replaces the call."""
    opt = OllieOptimize(cost_model=FakeCost(lambda label: "offset-add" in label),
                        checker=AcceptAll(), **OPTS)
    after = opt(Conv3x3)
    (d,) = opt.last_report.decisions
    assert d.rewritten and "offset-add" in d.chosen, d.reason
    tvm.ir.assert_structural_equal(after, Conv3x3OffsetAdd)
    # the expected module computes the convolution (the fake checker compared nothing)
    args = sm.random_inputs(Conv3x3, seed=7)
    want = sm.run(tvm.compile(Conv3x3, target="llvm"), args)
    np.testing.assert_allclose(sm.run(tvm.compile(Conv3x3OffsetAdd, target="llvm"), args),
                               want, rtol=1e-5, atol=1e-5)


def test_conv3x3_kept_when_the_checker_rejects_everything():
    opt = OllieOptimize(cost_model=FakeCost(lambda label: True), checker=RejectAll(), **OPTS)
    after = opt(Conv3x3)
    (d,) = opt.last_report.decisions
    assert not d.rewritten and "rejected by the fake checker" in d.reason
    tvm.ir.assert_structural_equal(after, Conv3x3)


def test_matmul_kept_when_nothing_is_cheaper():
    opt = OllieOptimize(cost_model=FakeCost(), checker=AcceptAll(), **OPTS)
    after = opt(Matmul)
    (d,) = opt.last_report.decisions
    assert not d.rewritten and d.reason.startswith("untuned, measured: original 1.00ms"), d.reason
    tvm.ir.assert_structural_equal(after, Matmul)
