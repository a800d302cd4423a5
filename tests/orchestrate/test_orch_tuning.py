"""Orchestration combined with tuning: the kernels tuned and built are the orchestrated ones."""

import importlib

import numpy as np
import pytest

from tvm_ollie.compat import cuda_target, relax, tvm
from tvm_ollie.codegen.builder import single_function_module, tensor_var
from tvm_ollie.orchestrate import OrchestrateConfig
from tvm_ollie.orchestrate.pipeline import _split_composites
from tvm_ollie.orchestrate.tuned import orchestrated_kernels, tuned_orchestrate_build
from tvm_ollie.pipeline import compile_module
from tvm_ollie.tune.metaschedule import legalize_and_fuse

from orch_helpers import const, random_args, run


def conv_softmax_norm():
    """conv + bias + relu, then a softmax and a layer norm over the channels' last axis."""
    def body(bb, x, w):
        c = bb.emit(relax.op.nn.conv2d(x, w, padding=1))
        r = bb.emit(relax.op.nn.relu(relax.op.add(c, const((1, 4, 1, 1), 1))))
        s = bb.emit(relax.op.nn.softmax(r, axis=-1))
        return relax.op.nn.layer_norm(s, const((8,), 2), const((8,), 3), axes=[-1])

    return single_function_module([tensor_var("x", (1, 4, 8, 8)),
                                   tensor_var("w", (4, 4, 3, 3))], body)


class FakeTuner:
    """Records what it is asked to tune and apply; tunes nothing."""

    def __init__(self):
        self.tuned, self.trials, self.applied = [], [], 0

    def tune(self, fused, trials):
        self.tuned.append(fused)
        self.trials.append(trials)
        return trials

    def apply(self, fused):
        self.applied += 1
        return fused


def kernels(mod):
    """Structural hashes of the PrimFuncs of a fused module."""
    import tvm_ffi

    return sorted(int(tvm_ffi.structural_hash(f)) for _, f in mod.functions_items()
                  if isinstance(f, tvm.tirx.PrimFunc))


@pytest.fixture(scope="module")
def case():
    """The module, its inputs, ``tvm.compile``'s outputs and the orchestrated kernels
    (computed once: orchestration is deterministic)."""
    mod = conv_softmax_norm()
    args = random_args(mod)
    ref = run(tvm.compile(mod, "llvm"), args)
    return mod, args, ref, kernels(orchestrated_kernels(mod, "llvm", fission=_split_composites))


def test_tuned_build_tunes_the_orchestrated_kernels(case):
    mod, args, ref, orchestrated = case
    tuner = FakeTuner()
    ex = compile_module(mod, "llvm", tuner, trials=3, orchestrate=True)
    assert tuner.trials == [3] and tuner.applied == 1
    assert kernels(tuner.tuned[0]) == orchestrated
    assert orchestrated != kernels(legalize_and_fuse(mod, "llvm"))
    np.testing.assert_allclose(run(ex, args), ref, rtol=1e-4, atol=1e-5)


def test_no_trials_applies_records_without_tuning():
    tuner = FakeTuner()
    tuned_orchestrate_build(conv_softmax_norm(), "llvm", tuner, 0)
    assert tuner.tuned == [] and tuner.applied == 1


def test_cuda_build_schedules_the_orchestrated_kernels():
    """On a GPU target (built without a GPU) the kernels without records get dlight's
    schedules after FuseTIR, as in the untuned build: the executable builds."""
    mod, tgt, tuner = conv_softmax_norm(), cuda_target(), FakeTuner()
    ex = tuned_orchestrate_build(mod, tgt, tuner, 2)
    assert kernels(tuner.tuned[0]) == kernels(orchestrated_kernels(mod, tgt))
    assert any(g.name_hint.startswith("orch_") for g, _ in tuner.tuned[0].functions_items())
    assert "main" in ex.as_text()


def _no_solution(problem, _time_limit_s):
    raise RuntimeError("no solver here")


def test_solver_failure_falls_back_to_single_kernels_under_tuning(case):
    mod, args, ref, _ = case
    tuner, reports = FakeTuner(), []
    ex = tuned_orchestrate_build(mod, "llvm", tuner, 2, config=OrchestrateConfig(
        solver=_no_solution), fission=_split_composites, reports=reports)
    rep = reports[0]
    assert rep.partitions and all("+singletons" in p.status for p in rep.partitions)
    assert all(len(k.primitives) == 1 for p in rep.partitions for k in p.kernels)
    names = [g.name_hint for g, f in tuner.tuned[0].functions_items()
             if isinstance(f, tvm.tirx.PrimFunc)]
    assert names and not any(n.startswith("orch_") for n in names)
    np.testing.assert_allclose(run(ex, args), ref, rtol=1e-4, atol=1e-5)


def test_build_gives_the_final_share_to_the_orchestrated_kernels(monkeypatch, case):
    """``build``: the pass runs, then the final task's trials go to the orchestrated kernels."""
    build_mod = importlib.import_module("tvm_ollie.pipeline.build")
    made = []

    class Recording(FakeTuner):
        def __init__(self, *_args, **_kwargs):
            super().__init__()
            made.append(self)

    monkeypatch.setattr(build_mod, "Tuner", Recording)
    mod, args, ref, orchestrated = case
    ex, report = build_mod.build(mod, "llvm", trials=4, orchestrate=True, derive=False,
                                 library=False, tuner=Recording())
    final = [t for t in made if t.tuned][-1]
    assert kernels(final.tuned[-1]) == orchestrated
    assert report.budget.spent <= report.budget.total == 4
    assert final.trials[-1] == report.budget.tasks["build"].allotted
    np.testing.assert_allclose(run(ex, args), ref, rtol=1e-4, atol=1e-5)


@pytest.mark.tuning
def test_orchestrated_build_with_real_tuning(tmp_path, case):
    """MetaSchedule (about 3 s a trial here) tunes the orchestrated kernels with 2 trials."""
    from tvm_ollie.pipeline import build

    mod, args, ref, _ = case
    ex, report = build(mod, "llvm", trials=2, orchestrate=True, work_dir=str(tmp_path))
    assert 0 < report.budget.spent <= 2, report.budget.to_text()
    np.testing.assert_allclose(run(ex, args), ref, rtol=1e-4, atol=1e-5)
