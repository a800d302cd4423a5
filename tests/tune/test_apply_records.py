"""Tuner.apply: a tuning record that does not replay on its kernel leaves that kernel untuned
instead of failing the build."""

from __future__ import annotations

import tvm
from tvm import relax, te

from tvm_ollie.tune import Tuner
from tvm_ollie.tune import metaschedule


def _prim(scale: float) -> "tvm.tirx.PrimFunc":
    a = te.placeholder((4,), "float32", name="a")
    b = te.compute((4,), lambda i: a[i] * scale, name="b")
    return te.create_prim_func([a, b])


_Two = tvm.IRModule({"good": _prim(1.0), "bad": _prim(2.0)})


def _fake_apply(enable_warning=False):  # noqa: ARG001
    """Applies a 'record' (an attribute) to every PrimFunc, and fails on any module that holds
    the PrimFunc named ``bad``, as MetaSchedule does when one trace does not replay."""

    def run(mod):
        names = [gv.name_hint for gv, _ in mod.functions_items()]
        if "bad" in names:
            raise RuntimeError("ScheduleError: reverse-compute-at")
        out = tvm.IRModule(dict(mod.functions_items()))
        for gv, func in mod.functions_items():
            out[gv] = func.with_attr("applied", 1)
        return out

    return run


def test_a_record_that_fails_leaves_only_its_kernel_untuned(tmp_path, monkeypatch, stand_in_log):
    log = stand_in_log
    monkeypatch.setattr(metaschedule, "LOG", log)
    monkeypatch.setattr(relax.transform, "MetaScheduleApplyDatabase", _fake_apply)
    out = Tuner("llvm", str(tmp_path)).apply(_Two)
    funcs = {gv.name_hint: f for gv, f in out.functions_items()}
    assert funcs["good"].attrs["applied"] == 1
    assert "applied" not in (funcs["bad"].attrs or {})
    assert funcs["bad"].same_as(_Two["bad"])
    assert "kernel by kernel" in log.text and "bad" in log.text


def _fused_two_tasks() -> "tvm.IRModule":
    """A fused module with two tuning tasks (an add and a multiply)."""
    from tvm_ollie.tune.metaschedule import legalize_and_fuse
    from tvm_ollie.target import normalize_target

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((16, 16), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.add(x, x))
            z = bb.emit(relax.op.matmul(y, y))
            out = bb.emit_output(z)
        bb.emit_func_output(out)
    return legalize_and_fuse(bb.get(), normalize_target("llvm"))


def test_a_task_that_fails_to_tune_does_not_stop_the_others(tmp_path, monkeypatch,
                                                            stand_in_log):
    """MetaSchedule raising for one task (a ScheduleError in its design space) stops a run
    of all tasks together: then each is tuned alone and only the failing one is skipped."""
    from tvm_ollie.compat import meta_schedule

    ms = meta_schedule()
    runs = []
    log = stand_in_log
    monkeypatch.setattr(metaschedule, "LOG", log)

    def fake_tune_tasks(tasks, **_kw):
        names = [t.task_name for t in tasks]
        runs.append(names)
        if len(names) > 1 or "matmul" in names[0]:
            raise RuntimeError("ScheduleError: reverse-compute-at")

    monkeypatch.setattr(ms.tune, "tune_tasks", fake_tune_tasks)
    monkeypatch.setattr(ms.relax_integration, "extracted_tasks_to_tune_contexts",
                        lambda extracted_tasks, **_kw: (extracted_tasks, [1.0] * len(
                            extracted_tasks)))
    tuner = Tuner("llvm", str(tmp_path))
    monkeypatch.setattr(tuner, "_builder", lambda: None)
    monkeypatch.setattr(tuner, "_runner_object", lambda: None)
    assert tuner.tune(_fused_two_tasks(), 4) == 4
    assert len(runs) == 3 and len(runs[0]) == 2 and [len(r) for r in runs[1:]] == [1, 1]
    assert "one at a time" in log.text and "not tuned" in log.text
