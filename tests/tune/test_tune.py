"""Calibration, analytic cost and the MetaSchedule touchpoint (database reuse)."""

import logging
import os
import sys
from dataclasses import replace

import numpy as np
import pytest
import tvm
from tvm import relax

from tvm_ollie.derive.search import derive
from tvm_ollie.lift import lift_relax_call
from tvm_ollie.tune import STATS, Tuner, analytic, calibrate, compile_module
from tvm_ollie.target import normalize_target
from tvm_ollie.tune import cuda_calibration
from tvm_ollie.tune.calibrate import measure_cpu_roofline
from tvm_ollie.target import target_kind

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "transform"))
import small_models as sm  # noqa: E402

logging.getLogger("tvm_ollie.derive").setLevel(logging.CRITICAL)


def test_target_kind_and_normalize():
    assert target_kind("cuda") == target_kind("nvidia/nvidia-h100") == "cuda"
    assert target_kind({"kind": "llvm"}) == target_kind("llvm") == "llvm"
    t = normalize_target("llvm")
    assert t.kind.name == "llvm" and int(t.attrs["num-cores"]) >= 1
    c = normalize_target("cuda")
    assert c.kind.name == "cuda" and str(c.attrs["arch"]) == "sm_90"


def test_calibration_llvm_measured_and_cached():
    peak, bw = measure_cpu_roofline()
    assert peak > 1e8 and bw > 1e8
    assert measure_cpu_roofline() == (peak, bw)  # cached per process
    cal = calibrate("llvm")
    assert cal.source == "measured" and cal.peak_flops == peak
    cuda = calibrate("cuda")  # (sm_90: the H200's recorded device run, else the defaults)
    assert cuda.source == ("recorded" if cuda_calibration.read_recorded("sm_90") else "default")
    assert cuda.peak_flops > peak
    given = calibrate("llvm", 1e9, 1e9)
    assert given.source == "given" and given.peak_flops == 1e9


def test_analytic_cost_prefers_gemm_over_direct_conv():
    mod = sm.conv3x3()
    call = mod["main"].body.blocks[0].bindings[0].value
    expr = lift_relax_call(call)
    res = derive(expr, max_depth=0, verify=False)
    cal = sm.LLVM_CALIB
    before = analytic.original_seconds(expr, "relax.nn.conv2d", cal)
    im2col = next(p for p in res.candidates if "matmul" in p.kinds)
    direct = next(p for p in res.candidates if p.kinds == ("conv2d",))
    assert analytic.program_seconds(direct, cal) == pytest.approx(before, rel=0.05)
    assert analytic.program_seconds(im2col, cal) < before
    # untuned on a CPU a GEMM is no faster than the direct convolution: keep the original
    cpu = calibrate("llvm", 1e11, 2e10)
    assert analytic.program_seconds(im2col, cpu) >= analytic.original_seconds(
        expr, "relax.nn.conv2d", cpu)
    # on a GPU dlight has a matmul rule and only a fallback for convolutions (the efficiencies
    # alone: at this tiny size the recorded per-kernel launch cost would decide instead)
    cuda = replace(calibrate("cuda"), launch_s=0.0)
    assert analytic.program_seconds(im2col, cuda) < analytic.original_seconds(
        expr, "relax.nn.conv2d", cuda)


def test_launch_cost_is_charged_per_kernel():
    """``Calibration.launch_s`` (a GPU's per-kernel cost, fitted by a device run) is added to
    the original's one kernel and to every stage of a derived program."""
    mod = sm.conv3x3()
    expr = lift_relax_call(mod["main"].body.blocks[0].bindings[0].value)
    program = next(p for p in derive(expr, max_depth=0, verify=False).candidates
                   if "matmul" in p.kinds and len(p.stages) > 1)
    cal = replace(calibrate("cuda"), launch_s=0.0)
    with_launch = replace(cal, launch_s=5e-6)
    assert analytic.original_seconds(expr, "relax.nn.conv2d", with_launch) == pytest.approx(
        analytic.original_seconds(expr, "relax.nn.conv2d", cal) + 5e-6)
    assert analytic.program_seconds(program, with_launch) == pytest.approx(
        analytic.program_seconds(program, cal) + 5e-6 * len(program.stages))
    assert calibrate("llvm", 1e11, 2e10).launch_s == 0.0


def _tiny_matmul():
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((8, 16), "float32"))
    w = relax.Var("w", relax.TensorType((16, 8), "float32"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.matmul(x, w))
        bb.emit_func_output(out)
    return bb.get()


def test_tiny_tuning_and_database_reuse(tmp_path):
    """2 MetaSchedule trials on a tiny matmul; the second compile tunes nothing."""
    mod = _tiny_matmul()
    tuner = Tuner("llvm", str(tmp_path))
    calls, defaults = STATS.calls, STATS.defaults
    ex = compile_module(mod, "llvm", tuner, trials=2)
    assert STATS.calls == calls + 1
    # the matmul's untuned build is measured and recorded next to the tuned samples
    assert STATS.defaults == defaults + 1 and tuner.last_defaults.committed == 1
    assert tuner.record_count() >= 2
    assert any(f.startswith("database_") for f in os.listdir(tmp_path))
    args = sm.random_inputs(mod)
    np.testing.assert_allclose(sm.run(ex, args), args[0] @ args[1], rtol=1e-4, atol=1e-5)
    # a fresh Tuner on the same work dir (a second compile) finds every task recorded; a work
    # dir tuned before defaults were recorded (no marker) gets them, without new trials
    os.remove(os.path.join(tmp_path, "ollie_defaults.json"))
    again = Tuner("llvm", str(tmp_path))
    ex2 = compile_module(mod, "llvm", again, trials=2)
    assert STATS.calls == calls + 1
    assert STATS.defaults == defaults + 2 and again.last_defaults.committed == 1
    np.testing.assert_allclose(sm.run(ex2, args), args[0] @ args[1], rtol=1e-4, atol=1e-5)


@pytest.mark.tuning
def test_build_with_trials_reuses_database(tmp_path):
    from tvm_ollie.pipeline import build

    mod = sm.conv3x3()
    opts = dict(max_depth=1, search_time_s=3.0, calibration=sm.LLVM_CALIB, max_measured=1)
    calls = STATS.calls
    ex, report = build(mod, "llvm", trials=4, work_dir=str(tmp_path), **opts)
    assert STATS.calls > calls
    (d,) = report.decisions
    assert d.measured and d.before_s > 0
    assert report.tuning_calls >= 1
    # one budget for the module: the pass's measurements and the final kernels share 4 trials
    assert report.trials_budget == 4 and 0 < report.trials_spent <= 4, report.budget
    args = sm.random_inputs(mod)
    ref = sm.run(tvm.compile(mod, target="llvm"), args)
    sm.assert_close(sm.run(ex, args), ref)
    calls = STATS.calls
    ex2, report2 = build(mod, "llvm", trials=4, work_dir=str(tmp_path), **opts)
    assert STATS.calls == calls, "a second compile of the same model must not tune"
    assert report2.tuning_s == 0.0 and report2.decisions[0].chosen == d.chosen
    sm.assert_close(sm.run(ex2, args), ref)
