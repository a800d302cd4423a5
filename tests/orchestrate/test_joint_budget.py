"""The joint build's plans share one profiling budget, cached in the run's ``work_dir``.

Before, each orchestrated plan (joint, refined, sequential, orchestration-only) profiled with a
full budget of its own and in this process only (the run's ``OrchestrateConfig`` did not
reach them): profiling was 61-72% of BERT quick's joint compile time, and a second build profiled
everything again.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from tvm_ollie.compat import relax, tvm
from tvm_ollie.config import OrchestrateConfig
from tvm_ollie.orchestrate.cost import MeasuredCost
from tvm_ollie.orchestrate.profiled import forget_process_times
from tvm_ollie.pipeline import joint_plans
from tvm_ollie.pipeline.joint_plans import ORCHESTRATED, joint_build

from orch_helpers import CALIB

KERNELS = 6


def _model() -> "tvm.IRModule":
    """matmul + bias + relu, a softmax, a second matmul + bias: two heavy calls with
    epilogues and a reduction between them."""
    rng = np.random.default_rng(3)
    w1, b1, w2, b2 = [relax.const((rng.standard_normal(s) * 0.3).astype("float32"))
                      for s in [(32, 48), (48,), (48, 16), (16,)]]
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((8, 32), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            h = bb.emit(relax.op.matmul(x, w1))
            h = bb.emit(relax.op.nn.relu(bb.emit(relax.op.add(h, b1))))
            s = bb.emit(relax.op.nn.softmax(h, axis=-1))
            y = bb.emit(relax.op.matmul(s, w2))
            out = bb.emit_output(relax.op.add(y, b2))
        bb.emit_func_output(out)
    return bb.get()


def _timer(runs):
    """Plan timer: every plan runs once; ``derivation`` wins."""
    for run in runs.values():
        run()
    return {name: 1e-3 if name == "derivation" else 2e-3 for name in runs}


def _build(monkeypatch, work_dir):
    """Joint build with a six-kernel profiling budget; returns its report and PlanBuilder."""
    seen = []
    real = joint_plans.PlanBuilder

    class Recording(real):  # pylint: disable=too-few-public-methods
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            seen.append(self)

    monkeypatch.setattr(joint_plans, "PlanBuilder", Recording)
    orch = OrchestrateConfig(profile_max_kernels=KERNELS, profile_floor_s=0.0)
    ex, report, _ = joint_build(
        _model(), guard=True, plan_timer=_timer, target="llvm", calibration=CALIB,
        check_untuned=False, search_time_s=0.5, max_depth=1, derive=False, trials=0,
        derivation_cache=False, work_dir=str(work_dir), orchestration=orch)
    return ex, report, seen[0]


def _profiles(plans) -> dict:
    return {name: plans.reports[name][-1].profile for name in ORCHESTRATED
            if plans.reports.get(name) and plans.reports[name][-1] is not None}


@pytest.mark.slow
def test_the_plans_profile_within_one_budget_and_a_second_build_times_nothing(
        monkeypatch, tmp_path):
    forget_process_times()  # (kernels an earlier test timed in this process)
    ex, report, plans = _build(monkeypatch, tmp_path)
    profiles = _profiles(plans)
    assert {"joint", "sequential", "orchestration"} <= set(profiles), report.plans.to_text()
    # one budget: the kernels measured over all plans, each charged once
    assert sum(p.profiled for p in profiles.values()) <= KERNELS
    assert sum(p.max_kernels for p in profiles.values()) <= KERNELS + len(profiles)
    assert profiles["joint"].max_kernels < KERNELS  # a share, not the whole budget
    # the run's work_dir holds the profiled times (the config reached the plans)
    with open(os.path.join(tmp_path, MeasuredCost.FILE), encoding="utf-8") as fh:
        kernels = [k for k in json.load(fh) if not k.endswith("timing-overhead")]
    assert 0 < len(kernels) <= KERNELS
    assert "profiling" in report.plans.notes[-1], report.plans.to_text()
    x = np.random.default_rng(0).standard_normal((8, 32)).astype("float32")
    vm_out = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    want = relax.VirtualMachine(tvm.compile(_model(), "llvm"), tvm.cpu())["main"](
        tvm.runtime.tensor(x)).numpy()
    np.testing.assert_allclose(vm_out, want, rtol=1e-4, atol=1e-5)

    # a second build with the same work_dir reads every time back and chooses the same
    forget_process_times()  # (from the work_dir, not from this process's memory)
    _, _, again = _build(monkeypatch, tmp_path)
    again_profiles = _profiles(again)
    assert all(p.profiled == 0 for p in again_profiles.values())

    def kernels_of(builder, name):
        rep = builder.reports[name][-1]
        return [k.primitives for p in rep.partitions for k in p.kernels]

    for name in again_profiles:
        assert kernels_of(again, name) == kernels_of(plans, name)
