"""build(..., dtype="float16"): TVM's ToMixedPrecision, then the pass, within float16 accuracy."""

import numpy as np
import pytest
import tvm

import small_models as sm
from tvm_ollie.transform import build
from tvm_ollie.transform.precision import to_precision
from tvm_ollie.verify.tolerance import tolerance

OPTS = dict(max_depth=2, time_budget_s=4.0, calibration=sm.LLVM_CALIB)


def test_float16_build_matches_float32_within_float16_tolerance():
    mod = sm.conv3x3()
    args = sm.random_inputs(mod, seed=3)
    ref = sm.run(tvm.compile(mod, target="llvm"), args)
    ex, report = build(mod, target="llvm", dtype="float16", **OPTS)
    got = sm.run(ex, args)
    assert got.dtype == np.float32  # the model's own output type: run() is called as before
    sm.assert_close(got, ref, rtol=tolerance("float16"))
    # the pass saw the float16 convolution (accumulating in float32) and rewrote it
    [decision] = report.decisions
    assert "float16" in decision.signature and decision.rewritten, report.to_text()


def test_to_precision_keeps_the_signature_and_refuses_what_tvm_cannot_convert():
    mod = sm.conv3x3()
    assert to_precision(mod, "float32") is mod and to_precision(mod, None) is mod
    half = to_precision(mod, "float16")
    assert [str(p.ty.dtype) for p in half["main"].params] == ["float32", "float32"]
    assert "float16" in half.script()
    with pytest.raises(ValueError, match="float16 only"):
        to_precision(mod, "bfloat16")
