"""One trial budget per module: allotment by expected gain, and the ledger the report shows."""

import importlib
import os
import sys

import pytest

from tvm_ollie.tune.budget import FINAL_TASK, TrialBudget


class CountingTuner:
    """A fake tuner: runs every trial it is granted (or ``cap`` at most), counts them."""

    def __init__(self, cap=None):
        self.cap, self.runs = cap, []

    def tune(self, _mod, trials):
        ran = trials if self.cap is None else min(trials, self.cap)
        self.runs.append(ran)
        return ran

    def apply(self, mod):
        return mod


def _run_task(budget, name, tuner, parts_used):
    with budget.task(name):
        metered = budget.metered(tuner)
        for _ in range(parts_used):
            metered.tune(None, budget.grant(name))


def test_allotment_follows_expected_gain_and_final_gets_the_rest():
    budget = TrialBudget(64, final_share=0.5)
    budget.add_task("heavy", 3.0, parts=2)
    budget.add_task("light", 1.0, parts=2)
    tuner = CountingTuner()
    _run_task(budget, "heavy", tuner, 2)
    # heavy: 64 * 3 / (3 + 1 + 4) = 24, split evenly between its two parts
    assert tuner.runs == [12, 12] and budget.tasks["heavy"].allotted == 24
    # light: 40 left * 1 / (1 + 4); one part fewer than planned ran: 4 go back to the pool
    _run_task(budget, "light", tuner, 1)
    assert budget.tasks["light"].allotted == 8 and budget.tasks["light"].spent == 4
    left = budget.final()
    assert left == 64 - 28 and budget.metered(tuner).tune(None, left) == left
    assert budget.spent == 64 == sum(tuner.runs)
    text = budget.to_text()
    assert text.splitlines()[0] == "trials: 64 spent / 64 budget"
    assert "heavy: 24 spent of 24 allotted" in text and f"{FINAL_TASK}: 36 spent" in text


def test_unspent_trials_flow_to_later_tasks():
    """Records already in the work dir (the tuner runs nothing) leave the trials to others."""
    budget = TrialBudget(30)
    for name in ("a", "b", "c"):
        budget.add_task(name, 1.0)
    _run_task(budget, "a", CountingTuner(cap=0), 1)
    assert budget.tasks["a"].allotted == 10 and budget.spent == 0
    _run_task(budget, "b", CountingTuner(), 1)
    assert budget.tasks["b"].allotted == 15
    _run_task(budget, "c", CountingTuner(), 1)
    assert budget.tasks["c"].allotted == 15 and budget.spent == 30


def test_small_budgets_never_overspend():
    budget = TrialBudget(3)
    budget.add_task("only", 1.0, parts=4)
    tuner = CountingTuner()
    _run_task(budget, "only", tuner, 4)
    assert tuner.runs == [1, 1, 1, 0]  # the original is tuned first
    assert budget.spent == 3 and budget.pool == 0
    assert TrialBudget(0).grant("x") == 0
    with pytest.raises(ValueError):
        TrialBudget(-1)


def test_grant_outside_a_declared_task():
    budget = TrialBudget(8)
    assert budget.grant("adhoc") == 8
    budget.spend(8, "adhoc")
    assert budget.spent == 8 and "adhoc: 8 spent of 8 allotted" in budget.to_text()


def test_build_spends_the_module_budget_once(tmp_path, monkeypatch):
    """``build(trials=N)``: the pass's tuned measurements and the final kernels share N, the
    whole budget is spent, and the report's ledger adds up (a fake tuner counts the trials)."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "transform"))
    import small_models as sm  # pylint: disable=import-outside-toplevel
    build_mod = importlib.import_module("tvm_ollie.pipeline.build")
    from tvm_ollie.tune.metaschedule import Tuner  # pylint: disable=C0415

    runs = []

    class FakeTuner(Tuner):
        def tune(self, fused_mod, trials):  # pylint: disable=arguments-differ
            runs.append(trials)
            return trials

    monkeypatch.setattr(build_mod, "Tuner", FakeTuner)
    mod = sm.conv3x3()
    _, report = build_mod.build(mod, "llvm", trials=12, work_dir=str(tmp_path), max_depth=1,
                                search_time_s=2.0, calibration=sm.LLVM_CALIB, max_measured=1,
                                library=False, tuner=FakeTuner("llvm", str(tmp_path)))
    (d,) = report.decisions
    assert d.measured
    budget = report.budget
    # one signature (original + 1 candidate) and the final build: 12 * w / (w + w) = 6, 3 each
    assert runs == [3, 3, 6], runs
    assert budget.spent == report.trials_spent == 12 == report.trials_budget
    assert "trials: 12 spent / 12 budget" in report.to_text()


def _fake_tuning(monkeypatch, seen):
    """MetaSchedule faked: ``seen`` records the tasks and the trial caps it was given."""
    from tvm_ollie.compat import meta_schedule  # pylint: disable=C0415
    from tvm_ollie.tune import metaschedule  # pylint: disable=C0415
    from tvm_ollie.tune.defaults import DefaultsReport  # pylint: disable=C0415

    ms = meta_schedule()

    def fake_contexts(extracted_tasks, **_kw):
        seen["tasks"] = [t.task_name for t in extracted_tasks]
        return extracted_tasks, [1.0] * len(extracted_tasks)

    def fake_tune(**kw):
        seen["global"], seen["per_task"] = kw["max_trials_global"], kw["max_trials_per_task"]

    monkeypatch.setattr(ms.relax_integration, "extracted_tasks_to_tune_contexts", fake_contexts)
    monkeypatch.setattr(ms.tune, "tune_tasks", fake_tune)
    # no builder or runner worker processes, no cost model: nothing runs
    monkeypatch.setattr(ms.builder, "LocalBuilder", lambda **_kw: None)
    monkeypatch.setattr(ms.runner, "create", lambda *_a, **_kw: None)
    monkeypatch.setattr(ms.cost_model, "XGBModel", lambda **_kw: None)
    monkeypatch.setattr(ms.feature_extractor, "PerStoreFeature", lambda **_kw: None)
    # nor the measurement of the default schedules
    monkeypatch.setattr(metaschedule, "commit_defaults", lambda *_a: DefaultsReport())


def _two_task_module():
    from tvm import relax  # pylint: disable=import-outside-toplevel

    from tvm_ollie.codegen.builder import single_function_module  # pylint: disable=C0415
    from tvm_ollie.codegen.builder import tensor_var  # pylint: disable=C0415

    def body(bb, a, b, c):
        return relax.Tuple([bb.emit(relax.op.matmul(a, b)), bb.emit(relax.op.add(c, c))])

    return single_function_module(
        [tensor_var("a", (64, 64)), tensor_var("b", (64, 64)), tensor_var("c", (4, 4))], body)


def test_tuner_never_runs_more_trials_than_granted(tmp_path, monkeypatch):
    """Fewer trials than tasks: the heaviest tasks get one each (MetaSchedule is faked)."""
    from tvm_ollie.tune.metaschedule import Tuner, legalize_and_fuse  # pylint: disable=C0415

    seen = {}
    _fake_tuning(monkeypatch, seen)
    tuner = Tuner("llvm", str(tmp_path))
    fused = legalize_and_fuse(_two_task_module(), tuner.target)
    assert len(tuner.untuned(fused)) == 2
    assert tuner.tune(fused, 1) == 1
    assert seen["global"] == 1 and seen["per_task"] == 1
    assert len(seen["tasks"]) == 1 and "matmul" in seen["tasks"][0]


def test_tuner_spends_a_budget_that_tasks_do_not_divide(tmp_path, monkeypatch):
    """5 trials over 2 tasks: 5 in all (at most 3 each), not 2 x 2 = 4."""
    from tvm_ollie.tune.metaschedule import Tuner, legalize_and_fuse  # pylint: disable=C0415

    seen = {}
    _fake_tuning(monkeypatch, seen)
    tuner = Tuner("llvm", str(tmp_path))
    fused = legalize_and_fuse(_two_task_module(), tuner.target)
    assert tuner.tune(fused, 5) == 5
    assert seen["global"] == 5 and seen["per_task"] == 3 and len(seen["tasks"]) == 2


def test_final_task_tops_up_only_this_compiles_kernels():
    """Kernels a decision tuned in this compile may be tuned again by the final task; the
    tuner is told which (records of earlier compiles are never tuned twice)."""
    from tvm import relax  # pylint: disable=import-outside-toplevel

    from tvm_ollie.codegen.builder import single_function_module  # pylint: disable=C0415
    from tvm_ollie.codegen.builder import tensor_var  # pylint: disable=C0415
    from tvm_ollie.tune.metaschedule import workload_hash  # pylint: disable=C0415

    kernel = single_function_module([tensor_var("x", (2, 2))], lambda bb, x: relax.op.add(x, x))

    class RecordingTuner(CountingTuner):
        def __init__(self):
            super().__init__()
            self.retune, self.last_tuned, self.retune_seen = set(), [], []

        def tune(self, mod, trials):
            self.retune_seen.append(set(self.retune))
            self.last_tuned = [kernel] if trials else []
            return super().tune(mod, trials)

    budget = TrialBudget(8, final_share=0.5)
    budget.add_task("sig", 1.0)
    tuner = RecordingTuner()
    _run_task(budget, "sig", tuner, 1)
    assert budget.fresh == {workload_hash(kernel)}
    final = RecordingTuner()
    budget.metered(final).tune(None, budget.final())
    assert final.retune_seen == [{workload_hash(kernel)}] and budget.spent == 8
