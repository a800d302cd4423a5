"""build(), the registered "ollie" pipeline, emission and the CUDA compile-only path."""

import logging

import numpy as np
import tvm
from tvm import relax

import small_models as sm
from tvm_ollie.derive.search import derive
from tvm_ollie.codegen.builder import single_function_module, tensor_var
from tvm_ollie.lift import lift_relax_call
from tvm_ollie.pipeline import PIPELINE_NAME, build, cuda_source
from tvm_ollie.transform import emit_program
from tvm_ollie.derive.cost import TARGET_DEFAULTS
from tvm_ollie.transform.decide import isolated_module
from tvm_ollie.tune.calibrate import EFFICIENCY, Calibration, calibrate

logging.getLogger("tvm_ollie.derive").setLevel(logging.CRITICAL)

OPTS = dict(max_depth=2, search_time_s=4.0, calibration=sm.LLVM_CALIB)


def test_pipeline_registered():
    from tvm.relax.pipeline import PIPELINE_MAP

    assert PIPELINE_NAME == "ollie" and "ollie" in PIPELINE_MAP


def test_tvm_compile_with_ollie_pipeline():
    mod = sm.conv1x1()  # derivation exhausts at once; the default options stay fast
    ex = tvm.compile(mod, target="llvm", relax_pipeline="ollie")
    args = sm.random_inputs(mod)
    ref = sm.run(tvm.compile(mod, target="llvm"), args)
    sm.assert_close(sm.run(ex, args), ref)
    # the registered factory takes the pass options
    ex = tvm.compile(mod, target="llvm",
                     relax_pipeline=relax.get_pipeline("ollie", calibration=sm.LLVM_CALIB))
    sm.assert_close(sm.run(ex, args), ref)
    assert "conv2d" not in ex.as_text()


def test_build_llvm():
    mod = sm.conv_stack()
    ex, report = build(mod, target="llvm", **OPTS)
    assert report.rewritten and report.total_s > 0
    args = sm.random_inputs(mod, seed=5)
    sm.assert_close(sm.run(ex, args), sm.run(tvm.compile(mod, target="llvm"), args))


def test_build_cuda_without_gpu(tmp_path):
    mod = sm.conv3x3()
    # the hand-set efficiencies: dlight has no conv rule, so the matmul form wins
    hand_set = Calibration("cuda", *TARGET_DEFAULTS["cuda"], dict(EFFICIENCY["cuda"]))
    ex, report = build(mod, target="cuda", max_depth=2, search_time_s=4.0, calibration=hand_set)
    assert report.target == "cuda"
    (d,) = report.decisions
    assert d.rewritten and not d.measured, d.reason
    src = cuda_source(ex)
    assert "__global__" in src
    path = tmp_path / "model.so"
    ex.export_library(str(path))
    assert path.stat().st_size > 0
    # the H200's recorded calibration charges each kernel's launch: at this size the original's
    # one kernel is cheaper than the matmul form's stages (measured so on the device)
    recorded = calibrate("cuda")
    if recorded.launch_s > 0:
        _, report = build(mod, target="cuda", max_depth=2, search_time_s=4.0)
        (d,) = report.decisions
        assert not d.rewritten and "analytic cost" in d.reason, d.reason


def test_emit_library_matmul_for_pointwise_conv():
    mod = sm.conv1x1()
    call = mod["main"].body.blocks[0].bindings[0].value
    res = derive(lift_relax_call(call), max_depth=0, verify=False)
    prog = next(p for p in res.candidates if p.kinds == ("matmul",))
    emitted = isolated_module(call, prog, ["x", "w"])
    ops = sm.ops_in(emitted)
    assert "relax.matmul" in ops or any("matmul" in o for o in ops)
    args = sm.random_inputs(mod)
    ref = sm.run(tvm.compile(mod, target="llvm"), args)
    sm.assert_close(sm.run(tvm.compile(emitted, target="llvm"), args), ref)
    # without the library path every stage is a call_tir
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 16, 6, 6), "float32"))
    w = relax.Var("w", relax.TensorType((8, 16, 1, 1), "float32"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            out = bb.emit_output(emit_program(bb, prog, {"x": x, "w": w}, (1, 8, 6, 6),
                                              impl="tir"))
        bb.emit_func_output(out)
    tir_only = bb.get()
    assert all(not o.startswith("relax.matmul") for o in sm.ops_in(tir_only))
    sm.assert_close(sm.run(tvm.compile(tir_only, target="llvm"), args), ref)
    assert np.isfinite(ref).all()


def test_emit_library_grouped_conv2d_keeps_its_groups():
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 8, 6, 6), "float32"))
    w = relax.Var("w", relax.TensorType((8, 1, 3, 3), "float32"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(relax.op.nn.conv2d(x, w, padding=1, groups=8)))
        bb.emit_func_output(out)
    mod = bb.get()
    call = mod["main"].body.blocks[0].bindings[0].value
    res = derive(lift_relax_call(call), targets=("conv2d",), max_depth=0, verify=False)
    prog = next(p for p in res.candidates
                if p.kinds == ("conv2d",) and p.stages[-1].attrs.get("groups") == 8)
    emitted = isolated_module(call, prog, ["x", "w"])
    assert any("conv2d" in o for o in sm.ops_in(emitted))
    args = sm.random_inputs(mod)
    ref = sm.run(tvm.compile(mod, target="llvm"), args)
    sm.assert_close(sm.run(tvm.compile(emitted, target="llvm"), args), ref)


def _softmax_mlp():
    """matmul + bias + relu -> softmax (a composite operator for fission)."""

    def body(bb, x, w, b):
        h = bb.emit(relax.op.nn.relu(relax.op.add(relax.op.matmul(x, w), b)))
        return relax.op.nn.softmax(h, axis=-1)

    return single_function_module([tensor_var("x", (4, 32)), tensor_var("w", (32, 16)),
                                      tensor_var("b", (16,))], body)


def test_build_with_orchestration_equals_tvm():
    """orchestrate=True: fission + BLP-chosen kernels instead of FuseOps, same outputs."""
    mod = _softmax_mlp()
    args = sm.random_inputs(mod)
    ref = sm.run(tvm.compile(mod, target="llvm"), args)
    ex, _ = build(mod, target="llvm", orchestrate=True, **OPTS)
    sm.assert_close(sm.run(ex, args), ref, rtol=1e-5)
    ex = tvm.compile(mod, target="llvm", relax_pipeline=relax.get_pipeline(
        "ollie", orchestrate=True, calibration=sm.LLVM_CALIB, max_depth=2))
    sm.assert_close(sm.run(ex, args), ref, rtol=1e-5)
    assert "softmax" not in ex.as_text()  # fissioned: its max/exp/sum are orchestrated
