"""The default schedules committed next to the tuned records (tune/defaults.py)."""

import tvm
from tvm import te

from tvm_ollie.compat import meta_schedule
from tvm_ollie.target import normalize_target
from tvm_ollie.tune.cpu_schedule import default_rules, schedule_func
from tvm_ollie.tune.defaults import commit_defaults, default_schedule
from tvm_ollie.tune.metaschedule import fast_build


def _workload(kind: str) -> tvm.IRModule:
    a = te.placeholder((64, 128), name="a")
    if kind == "matmul":
        b = te.placeholder((128, 32), name="b")
        k = te.reduce_axis((0, 128), name="k")
        out = te.compute((64, 32), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="mm")
        func = te.create_prim_func([a, b, out])
    else:
        out = te.compute((64, 128), lambda i, j: te.max(a[i, j] * 2.0, 0.0), name="relu2")
        func = te.create_prim_func([a, out])
    return tvm.IRModule({"main": func.with_attr("global_symbol", kind)})


def test_default_schedule_replays_the_rule():
    target = normalize_target({"kind": "llvm", "num-cores": 2})
    for kind in ("matmul", "relu"):
        mod = _workload(kind)
        sch = default_schedule(mod, target)
        assert sch is not None
        expected = schedule_func(mod["main"], target, default_rules())
        assert sch.trace.insts  # the database skips records with empty traces
        if expected is None:  # no rule applies: the unscheduled function
            tvm.ir.assert_structural_equal(sch.mod["main"], mod["main"])
        else:
            tvm.ir.assert_structural_equal(
                sch.mod["main"], expected.without_attr("tirx.is_scheduled").without_attr(
                    "ollie.cpu_schedule_rule"))


def test_commit_defaults_beats_a_slow_tuned_record(tmp_path):
    ms = meta_schedule()
    target = normalize_target({"kind": "llvm", "num-cores": 1})
    mod = _workload("matmul")
    db = ms.database.JSONDatabase(work_dir=str(tmp_path))
    workload = db.commit_workload(mod)
    slow = tvm.s_tir.Schedule(mod)  # a "tuned" record measured at 1 s
    args = ms.arg_info.ArgInfo.from_prim_func(mod["main"])
    db.commit_tuning_record(ms.database.TuningRecord(slow.trace, workload, [1.0], target, args))
    builder = ms.builder.LocalBuilder(f_build=fast_build, max_workers=1)
    report = commit_defaults([mod], target, db, builder, ms.runner.LocalRunner())
    assert report.committed == 1 and report.faster == ["matmul"], report
    (best,) = db.get_top_k(workload, 1)
    assert float(best.run_secs[0]) < 1.0


def test_no_defaults_for_gpu_targets():
    report = commit_defaults([_workload("relu")], normalize_target("cuda"), None, None, None)
    assert report.committed == 0 and "cuda" in report.skipped[0]


def test_marker_remembers_measured_workloads(tmp_path):
    from tvm_ollie.tune.defaults import DefaultsMarker

    marker = DefaultsMarker(str(tmp_path))
    assert 5 not in marker
    marker.add([5, 7])
    again = DefaultsMarker(str(tmp_path))
    assert 5 in again and 7 in again and 6 not in again
    with open(again.path, "w", encoding="utf-8") as f:
        f.write("[5, 7")  # cut short: measured again rather than failing
    assert 5 not in DefaultsMarker(str(tmp_path))
