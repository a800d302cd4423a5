"""build(..., dtype="float16"): TVM's ToMixedPrecision, then the pass, within float16 accuracy."""

import numpy as np
import pytest
import tvm

import small_models as sm
from tvm import relax
from tvm_ollie.derive.program import Program, Stage
from tvm_ollie.ir.nodes import Call, IterVar, Scope, Tensor, Var
from tvm_ollie.pipeline import build
from tvm_ollie.transform import emit_program
from tvm_ollie.transform.precision import to_precision
from tvm_ollie.verify.tolerance import tolerance

OPTS = dict(max_depth=2, search_time_s=4.0, calibration=sm.LLVM_CALIB)


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


def _emit(prog, dtype, shapes, out_shape):
    bb = relax.BlockBuilder()
    params = [relax.Var(n, relax.TensorType(s, dtype)) for n, s in shapes.items()]
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(emit_program(bb, prog, dict(zip(shapes, params)), out_shape))
        bb.emit_func_output(out)
    return bb.get()


def test_emitted_matmul_accumulates_in_float32_with_mixed_operands():
    """``Σ float32(A[m, k]) * float32(B[k, n])`` is R.matmul(out_dtype=float32); with one operand
    an earlier float32 stage, the float16 one is widened first."""

    m, k, n = Var("m"), Var("k"), Var("n")
    a, b = Tensor("A", (4, 8), "float16"), Tensor("B", (8, 3), "float16")
    body = Call("float32", (a[m, k],)) * Call("float32", (b[k, n],))
    mm = Scope([IterVar(m, 0, 4), IterVar(n, 0, 3)], [IterVar(k, 0, 8)], body)
    rng = np.random.default_rng(0)
    args = [rng.uniform(-1, 1, (4, 8)).astype("float16"), rng.uniform(-1, 1, (8, 3))
            .astype("float16")]
    want = args[0].astype(np.float32) @ args[1].astype(np.float32)
    shapes = {"A": (4, 8), "B": (8, 3)}
    direct = Program([Stage("T0", "matmul", mm)], mm, "T0")
    widen = Scope([IterVar(m, 0, 4), IterVar(k, 0, 8)], [], Call("float32", (a[m, k],)))
    t0 = Tensor("T0", (4, 8), "float32")
    mixed_mm = Scope(mm.loops, mm.reduce, t0[m, k] * Call("float32", (b[k, n],)))
    mixed = Program([Stage("T0", "eop", widen, label="elementwise"),
                     Stage("T1", "matmul", mixed_mm)], mm, "T1")
    for prog in (direct, mixed):
        mod = _emit(prog, "float16", shapes, (4, 3))
        assert "relax.matmul" in sm.ops_in(mod)
        got = sm.run(tvm.compile(mod, target="llvm"), args)
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
