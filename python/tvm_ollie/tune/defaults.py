"""The untuned build of every tuned task, measured and kept as one more tuning record.

With a small budget MetaSchedule gives a task one or two trials: samples of its design space
that can be much slower than the kernel the untuned build compiles (on llvm, the schedule of
:mod:`.cpu_schedule`'s rules or TVM's plain loop nest). Measured at 8 trials for the whole
quick Segformer (one thread): the tuned ollie build ran 8.3 ms against 3.7 ms untuned. Tuning
must never make a kernel slower than not tuning it, so after MetaSchedule has tuned a set of
tasks, :func:`commit_defaults` builds and runs each task's *default schedule* with the same
builder and runner and commits it to the database as a record. The database answers a query
with its fastest record, so the build applies the default schedule wherever the tuned samples
measured slower, and a later build of the same workload finds the choice already made.

The default schedule is kept as a schedule trace (what a record stores): the trace of the
first CPU rule that schedules the function or, when no rule applies, the function as TVM would
build it (a trace that only looks up the root block: the database skips records with empty
traces). A trace that does not replay to the same function is not committed. Only llvm
targets have default schedules here: a GPU kernel needs a thread binding that the tuned
records provide.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from typing import Iterable, List, Optional, Sequence

from tvm import s_tir

from ..compat import meta_schedule, tvm
from ..target import is_llvm, kind_name
from .cpu_schedule import default_rules, schedule_of

__all__ = ["DefaultsMarker", "DefaultsReport", "commit_defaults", "default_schedule"]

LOG = logging.getLogger(__name__)


@dataclass
class DefaultsReport:
    """What :func:`commit_defaults` measured: tasks whose default was committed, the ones where
    it beat every tuned record, and the ones skipped with why."""

    committed: int = 0
    faster: List[str] = field(default_factory=list)
    skipped: List[str] = field(default_factory=list)

    def summary(self) -> str:
        return (f"default schedules measured for {self.committed} task(s), faster than the "
                f"tuned records on {len(self.faster)}")


class DefaultsMarker:
    """The workloads of a work dir whose default schedules were measured (``ollie_defaults.json``:
    their structural hashes), so each is measured once, even where building it failed."""

    FILE = "ollie_defaults.json"

    def __init__(self, work_dir: str):
        self.path = os.path.join(work_dir, self.FILE)
        self.hashes: set = set()
        if os.path.exists(self.path):
            try:
                with open(self.path, encoding="utf-8") as f:
                    self.hashes = set(json.load(f))
            except (OSError, ValueError):  # a cut-short file: measure again
                self.hashes = set()

    def __contains__(self, workload_hash: int) -> bool:
        return workload_hash in self.hashes

    def add(self, hashes: Iterable[int]) -> None:
        self.hashes.update(int(h) for h in hashes)
        tmp = self.path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(sorted(self.hashes), f)
        os.replace(tmp, self.path)


def default_schedule(mod: "tvm.IRModule", target: "tvm.target.Target"):
    """The schedule the untuned llvm build gives ``mod["main"]`` (a task's workload): the first
    rule of :func:`~.cpu_schedule.default_rules` that applies, else the unscheduled function;
    None when the rule's trace does not replay onto ``mod`` to the same function."""


    found = schedule_of(mod["main"], target, default_rules())
    replay = s_tir.Schedule(mod)
    try:
        if found is not None:
            found[0].trace.apply_to_schedule(replay, remove_postproc=False)
            tvm.ir.assert_structural_equal(replay.mod["main"], found[0].mod["main"])
        if not replay.trace.insts:
            # the database never returns a record with an empty trace: name the root block
            replay.get_sblock("root")
    except Exception:  # pylint: disable=broad-except
        return None
    return replay


def _mean(secs) -> float:
    values = [float(s) for s in secs]
    return sum(values) / len(values)


def commit_defaults(workloads: Sequence["tvm.IRModule"], target: "tvm.target.Target",
                    database, builder, runner) -> DefaultsReport:
    """Build and run the default schedule of each workload (a tuned task's ``dispatched[0]``)
    with MetaSchedule's ``builder`` and ``runner`` and commit it to ``database`` as a record.

    Failures (a default that does not build or run) are skipped with the reason; the tuned
    records stay as they are.
    """
    ms = meta_schedule()
    report = DefaultsReport()
    if not is_llvm(target):
        report.skipped = [f"{len(workloads)} task(s): no default schedule for "
                          f"{kind_name(target)}"]
        return report
    todo = []
    for mod in workloads:
        sch = default_schedule(mod, target)
        if sch is None:
            report.skipped.append(f"{_name(mod)}: the rule's trace does not replay")
        else:
            todo.append((mod, sch))
    if not todo:
        return report
    built = builder.build([ms.builder.BuilderInput(sch.mod, target) for _, sch in todo])
    runs, kept = [], []
    for (mod, sch), res in zip(todo, built):
        if res.error_msg:
            report.skipped.append(f"{_name(mod)}: build failed")
            continue
        args = ms.arg_info.ArgInfo.from_prim_func(sch.mod["main"])
        runs.append(ms.runner.RunnerInput(res.artifact_path, "cpu", args))
        kept.append((mod, sch, args))
    for (mod, sch, args), future in zip(kept, runner.run(runs) if runs else []):
        result = future.result()
        if result.error_msg or not result.run_secs:
            report.skipped.append(f"{_name(mod)}: run failed")
            continue
        workload = database.commit_workload(mod)
        best = database.get_top_k(workload, 1)
        database.commit_tuning_record(ms.database.TuningRecord(
            sch.trace, workload, [float(s) for s in result.run_secs], target, args))
        report.committed += 1
        if not best or not best[0].run_secs or _mean(result.run_secs) < _mean(best[0].run_secs):
            report.faster.append(_name(mod))
    LOG.info("tuning: %s", report.summary())
    return report


def _name(mod: "tvm.IRModule") -> str:
    func = mod["main"]
    attrs = func.attrs
    name: Optional[str] = attrs.get("global_symbol") if attrs is not None else None
    return str(name) if name else "main"
