"""The one place tvm-ollie drives MetaSchedule: tune Relax functions, keep records, apply them.

A :class:`Tuner` owns a MetaSchedule JSON database in a work directory. ``tune`` legalizes and
fuses a Relax module exactly as TVM's own pipeline does (so the tasks are the kernels the final
build will compile), skips every task whose workload already has records, and tunes the rest
with the XGBoost cost model; then each tuned task's untuned build (its default schedule) is
measured the same way and committed as one more record, so that the database's best record is
never slower than not tuning (:mod:`.defaults`). A second compile of the same model therefore
spends no tuning time: :data:`STATS` counts the tuning calls, tasks and trials so tests can check
that.

Two practical fixes for TVM 0.27 on a CPU (see ``research/tvm-0.27-notes.md``):

* LocalBuilder's default build function imports ``tvm.s_tir.tensor_intrin`` in every fresh
  worker (20-30 s, more under load), inside its 30 s build timeout: :func:`fast_build` compiles
  without it (plain llvm needs no tensor intrinsics);
* ``TuneContext`` imports the same package in the tuning process. For llvm targets, whose
  default schedule rules use no tensor intrinsics, :func:`_without_tensor_intrin` stands in an
  empty module for the duration of the tuning call only (removed afterwards, so a later real
  import, e.g. by dlight for fp16 on a GPU, still registers everything).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
import types
from dataclasses import dataclass
from typing import List, Optional

from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock
import tvm_ffi

from ..compat import meta_schedule, relax, tvm
from ..compile_profile import stage
from ..target import gpu_available, is_gpu_target, is_llvm, normalize_target  # noqa: F401
from .cpu_schedule import cpu_pipeline
from .defaults import DefaultsMarker, DefaultsReport, commit_defaults
from .rpc import RPCConfig, RPCError
from .workdir import open_database

__all__ = ["STATS", "TuningStats", "Tuner", "fast_build", "normalize_target", "is_gpu_target",
           "gpu_available"]

LOG = logging.getLogger(__name__)


@dataclass
class TuningStats:
    """Process-wide counters of MetaSchedule work (``calls``: tuning runs actually started)."""

    calls: int = 0
    tasks: int = 0
    trials: int = 0
    skipped_tasks: int = 0
    seconds: float = 0.0
    defaults: int = 0  # default schedules measured and committed (:mod:`.defaults`)
    defaults_faster: int = 0  # ... that beat every tuned record of their task

    def reset(self) -> None:
        self.calls = self.tasks = self.trials = self.skipped_tasks = 0
        self.defaults = self.defaults_faster = 0
        self.seconds = 0.0


#: Counters of every tuning call in this process.
STATS = TuningStats()


def fast_build(mod, target, _params):
    """LocalBuilder build function that skips the tensor-intrinsics import (llvm only)."""

    mod = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod)
    return tvm.compile(mod, target=target).mod


@contextlib.contextmanager
def _without_tensor_intrin(target):
    name = "tvm.s_tir.tensor_intrin"
    if not is_llvm(target) or name in sys.modules:
        yield
        return
    stub = types.ModuleType(name)
    stub.__doc__ = "tvm-ollie: stand-in while tuning llvm (no tensor intrinsics used)"
    sys.modules[name] = stub
    try:
        yield
    finally:
        if sys.modules.get(name) is stub:
            del sys.modules[name]
            parent = sys.modules.get("tvm.s_tir")
            if parent is not None and getattr(parent, "tensor_intrin", None) is stub:
                delattr(parent, "tensor_intrin")


@contextlib.contextmanager
def _unnamed_handlers_detached():
    """Detach handlers without a name from MetaSchedule's logger while it sets up its logs.

    MetaSchedule lists the logger's handlers by name in a ``dictConfig`` and fails on one
    without a name (``'NoneType' object has no attribute 'format'``). pytest >= 8 attaches its
    unnamed capture handlers to every non-propagating logger, MetaSchedule's included, so the
    second tuning run in a test process failed; the handlers are put back afterwards.
    """
    logger = logging.getLogger("tvm.s_tir.meta_schedule")
    detached = [h for h in logger.handlers if h.get_name() is None]
    for handler in detached:
        logger.removeHandler(handler)
    try:
        yield
    finally:
        for handler in detached:
            logger.addHandler(handler)


def search_strategy(trials_per_task: int):
    """Evolutionary search sized to the budget.

    MetaSchedule's defaults (a population of 512, 4 genetic iterations) cost about a minute
    of search per task on a loaded 2-core machine, for any number of trials; with a handful of
    trials per task a smaller population finds as good a schedule in a fraction of the time.
    """
    ms = meta_schedule()
    if trials_per_task >= 64:
        return ms.search_strategy.EvolutionarySearch()
    return ms.search_strategy.EvolutionarySearch(
        population_size=min(512, max(64, 16 * trials_per_task)),
        init_min_unmeasured=min(50, max(16, 4 * trials_per_task)),
        genetic_num_iters=2 if trials_per_task >= 8 else 1)


def _is_view(task) -> bool:
    """A pure reshape kernel: TVM's build turns it into a view, nothing to tune."""
    try:
        funcs = [f for _, f in task.dispatched[0].functions_items()]
        return len(funcs) == 1 and bool(relax.analysis.has_reshape_pattern(funcs[0]))
    except Exception:  # pylint: disable=broad-except
        return False


def _tunable(task) -> bool:
    """Whether MetaSchedule tunes ``task``: not already scheduled (dlight, records), not a
    view."""
    return not (task.mod.attrs and task.mod.attrs.get("tirx.is_scheduled", False)) \
        and not _is_view(task)


def workload_hash(mod: "tvm.IRModule") -> int:
    """Structural hash of a task's workload (how the database tells workloads apart)."""

    return int(tvm_ffi.structural_hash(mod))


def _task_gain(task) -> float:
    """Expected gain of tuning a task: its estimated FLOPs times its occurrences."""
    try:
        # lazy: inside try: a TVM without the FLOP estimate falls back to weight 1
        from tvm.s_tir.analysis import estimate_tir_flops  # pylint: disable=C0415

        return float(estimate_tir_flops(task.dispatched[0])) * float(task.weight)
    except Exception:  # pylint: disable=broad-except
        return float(task.weight)


def legalize_and_fuse(mod: "tvm.IRModule", target) -> "tvm.IRModule":
    """TVM's ``zero`` pipeline (legalize, fold constants, fuse) under ``target``."""
    with normalize_target(target):
        return relax.get_pipeline("zero")(mod)


class Tuner:
    """MetaSchedule tuning with a JSON database in ``work_dir``.

    Parameters
    ----------
    target : str | dict | Target
        The target (normalized by :func:`normalize_target`).
    work_dir : str
        Directory of the JSON database (created if missing); records persist across processes.
    seed : int
        Seed of the search.
    rpc : RPCConfig, optional
        Measure the trials on the devices behind this RPC tracker (``ms.runner.RPCRunner``,
        ``rpc.workers`` at a time) instead of on this machine; builds stay local and the
        records go to the same database.
    """

    def __init__(self, target, work_dir: str, seed: int = 0, rpc: Optional[RPCConfig] = None):
        self.target = normalize_target(target)
        self.work_dir = os.path.abspath(work_dir)
        os.makedirs(self.work_dir, exist_ok=True)
        self.seed = seed
        self.rpc = rpc
        self._db = None
        self._runner = None
        #: structural hashes of workloads tuned again even though they have records (those
        #: first tuned in this compile, topped up with what is left of its budget)
        self.retune: set = set()
        #: the workloads (IRModules) the last :meth:`tune` tuned
        self.last_tuned: list = []
        #: what measuring the default schedules of the last :meth:`tune` found
        self.last_defaults = DefaultsReport()

    @property
    def database(self):
        """The JSON database (opened on first use; a cut-short file is repaired first)."""
        if self._db is None:
            self._db = open_database(self.work_dir)
        return self._db

    def tasks(self, fused_mod: "tvm.IRModule") -> list:
        """MetaSchedule tasks of a legalized and fused module."""
        ms = meta_schedule()
        return list(ms.relax_integration.extract_tasks(fused_mod, self.target))

    def untuned(self, fused_mod: "tvm.IRModule") -> list:
        """Tasks of ``fused_mod`` without a valid (successfully measured) record yet.

        A workload whose trials all failed (e.g. its devices disconnected) has entries in the
        database but no valid record: it is tuned again, never taken as done.
        """
        out = []
        for task in filter(_tunable, self.tasks(fused_mod)):
            mod = task.dispatched[0]
            if not self.has_valid_record(mod) or (
                    self.retune and workload_hash(mod) in self.retune):
                out.append(task)
        return out

    def has_valid_record(self, mod: "tvm.IRModule") -> bool:
        """Whether the database holds a successfully measured schedule of ``mod``."""
        db = self.database
        if not db.has_workload(mod):
            return False
        return len(db.get_top_k(db.commit_workload(mod), 1)) > 0

    def tune(self, fused_mod: "tvm.IRModule", trials: int) -> int:
        """Tune the untuned tasks of ``fused_mod`` with up to ``trials`` trials in all.

        MetaSchedule's gradient task scheduler spends ``trials`` in all, each task getting at
        most ``ceil(trials / tasks)`` (an even split rounded up, so that no part of the budget
        is lost to the rounding: 16 trials over 10 tasks are 16 trials, not 10); with fewer
        trials than tasks, the heaviest ``trials`` tasks (estimated FLOPs times occurrences) get
        one each and the others keep TVM's default schedules. Returns the number of trials
        handed to MetaSchedule (0 when every task already had records); never more than
        ``trials``.
        """
        todo = self.untuned(fused_mod)
        tasks = self.tasks(fused_mod)
        STATS.skipped_tasks += len(tasks) - len(todo)
        if trials <= 0:
            return 0
        if not todo:
            self._commit_missing_defaults(tasks)
            return 0
        if trials < len(todo):
            todo = sorted(todo, key=_task_gain, reverse=True)[:trials]
        if self.rpc is not None:
            self.rpc.check()  # one clear line now rather than every trial failing later
        per_task = -(-trials // len(todo))
        total = min(trials, per_task * len(todo))
        t0 = time.perf_counter()
        with stage("tuning"), _without_tensor_intrin(self.target), \
                _unnamed_handlers_detached():
            builder, runner = self._builder(), self._runner_object()
            try:
                self._tune_tasks(todo, total, per_task, builder, runner)
            except Exception as err:  # pylint: disable=broad-except
                # one task's design space can fail a schedule primitive (a ScheduleError in
                # 'reverse-compute-at' on a kernel that orchestration fused), which stops the
                # whole run: the tasks are tuned one at a time and a failing one keeps its
                # default schedule
                LOG.warning("ollie: tuning %d tasks together failed (%s); one at a time",
                            len(todo), str(err).strip().splitlines()[0][:160])
                for task in todo:
                    try:
                        self._tune_tasks([task], per_task, per_task, builder, runner)
                    except Exception as one:  # pylint: disable=broad-except
                        LOG.warning("ollie: task %s not tuned: %s", task.task_name,
                                    str(one).strip().splitlines()[0][:160])
            self.last_tuned = [t.dispatched[0] for t in todo]
            # never slower than untuned: the default schedules compete with the tuned records
            self._commit_missing_defaults(tasks, builder, runner)
        STATS.calls += 1
        STATS.tasks += len(todo)
        STATS.trials += total
        STATS.seconds += time.perf_counter() - t0
        LOG.info("tuned %d task(s), %d trial(s) in all (at most %d each), in %.1fs; %s",
                 len(todo), total, per_task, time.perf_counter() - t0,
                 self.last_defaults.summary())
        if self.rpc is not None:
            self._check_remote_results(todo)
        return total

    def _tune_tasks(self, todo: list, total: int, per_task: int, builder, runner) -> None:
        """One MetaSchedule run over the extracted tasks ``todo`` (gradient scheduler)."""
        ms = meta_schedule()
        contexts, weights = ms.relax_integration.extracted_tasks_to_tune_contexts(
            extracted_tasks=todo, work_dir=self.work_dir, seed=self.seed,
            strategy=search_strategy(per_task))
        ms.tune.tune_tasks(
            tasks=contexts, task_weights=weights, work_dir=self.work_dir,
            max_trials_global=total, max_trials_per_task=per_task,
            num_trials_per_iter=min(per_task, 16), builder=builder, runner=runner,
            database=self.database,
            cost_model=ms.cost_model.XGBModel(
                extractor=ms.feature_extractor.PerStoreFeature(), adaptive_training=True,
                num_tuning_cores=self._cores()),
            task_scheduler="gradient")

    def _commit_missing_defaults(self, tasks: list, builder=None, runner=None) -> None:
        """Measure and record the default schedule of every tunable task that has tuning
        records but no default yet (:mod:`.defaults`; a work dir tuned before defaults were
        recorded gets them on its next tuned compile, without new trials)."""
        marker = DefaultsMarker(self.work_dir)
        todo = [t.dispatched[0] for t in filter(_tunable, tasks)]
        todo = [m for m in todo if workload_hash(m) not in marker
                and self.has_valid_record(m)]
        if not todo:
            self.last_defaults = DefaultsReport()
            return
        builder = builder if builder is not None else self._builder()
        runner = runner if runner is not None else self._runner_object()
        self.last_defaults = commit_defaults(todo, self.target, self.database, builder, runner)
        marker.add(workload_hash(m) for m in todo)
        STATS.defaults += self.last_defaults.committed
        STATS.defaults_faster += len(self.last_defaults.faster)

    def _cores(self) -> int:
        if is_llvm(self.target):
            return max(1, int(self.target.attrs.get("num-cores", 1)))
        return os.cpu_count() or 1

    def _builder(self):
        """MetaSchedule's LocalBuilder (with :func:`fast_build` on llvm)."""
        return meta_schedule().builder.LocalBuilder(
            f_build=fast_build if is_llvm(self.target) else None,
            max_workers=max(1, min(self._cores(), 2)), timeout_sec=60)

    def _runner_object(self):
        runner = self._measurer()
        return meta_schedule().runner.create(runner) if isinstance(runner, str) else runner

    def _measurer(self):
        """MetaSchedule's runner: local, or one RPCRunner kept for every tuning call.

        The RPCRunner's worker processes each import TVM (seconds), so they are started once
        per Tuner and not once per tuned implementation.
        """
        if self.rpc is None:
            return "local"
        if self._runner is None:
            self._runner = self.rpc.ms_runner()
        return self._runner

    def _check_remote_results(self, tasks: list) -> None:
        """Raise :class:`RPCError` when a task got no successful remote measurement.

        MetaSchedule records failed runs as errors and goes on; when every trial of a task
        failed remotely (its devices went away, none was free) the run must stop with the
        reason instead of building the task untuned as if it had been tuned.
        """
        failed = [t.task_name for t in tasks if not self.has_valid_record(t.dispatched[0])]
        if not failed:
            return
        try:
            servers = self.rpc.check()
            why = f"{servers} server(s) still registered; see the MetaSchedule logs in " \
                  f"{self.work_dir}/logs"
        except RPCError as err:
            why = str(err)
        raise RPCError(f"no trial of {', '.join(failed[:3])}"
                       f"{' ...' if len(failed) > 3 else ''} ran successfully on {self.rpc}: "
                       f"{why}")

    def apply(self, fused_mod: "tvm.IRModule") -> "tvm.IRModule":
        """``fused_mod`` with every task that has a record replaced by its best schedule.

        A record whose trace does not replay on its kernel (a ``ScheduleError``, seen with
        kernels that orchestration fused) would fail the whole build: then the records are
        applied kernel by kernel and a kernel whose record fails keeps its untuned form."""
        with self.target, self.database:
            try:
                return relax.transform.MetaScheduleApplyDatabase(enable_warning=False)(
                    fused_mod)
            except Exception as err:  # pylint: disable=broad-except
                LOG.warning("ollie: applying the tuning records failed (%s); applying them "
                            "kernel by kernel", str(err).strip().splitlines()[0][:160])
                return _apply_each(fused_mod)

    def record_count(self) -> int:
        """Number of tuning records in the database."""
        return len(self.database)


def _apply_each(fused_mod: "tvm.IRModule") -> "tvm.IRModule":
    """``MetaScheduleApplyDatabase`` (of the current target and database) on each PrimFunc of
    ``fused_mod`` alone; a PrimFunc whose record fails to apply is left as it is."""
    out = tvm.IRModule(dict(fused_mod.functions_items()), attrs=fused_mod.attrs)
    for gv, func in fused_mod.functions_items():
        if not isinstance(func, tvm.tirx.PrimFunc):
            continue
        try:
            applied = relax.transform.MetaScheduleApplyDatabase(enable_warning=False)(
                tvm.IRModule({gv: func}))
            out[gv] = applied[applied.get_global_var(gv.name_hint)]
        except Exception as err:  # pylint: disable=broad-except
            LOG.warning("ollie: the tuning record of %s does not apply (%s); kept untuned",
                        gv.name_hint, str(err).strip().splitlines()[0][:160])
    return out


def default_pipeline(target) -> "tvm.transform.Pass":
    """TVM's full default Relax pipeline for ``target`` (fusion, dlight on GPUs); for llvm the
    same plus default CPU schedules (``cpu_schedule.cpu_pipeline``, ``TVM_OLLIE_CPU_SCHEDULE=0``
    turns them off). Kernel orchestration in place of TVM's fusion is
    :func:`tvm_ollie.pipeline.default_pipeline` (``orchestrate=True``)."""
    target = normalize_target(target)
    if is_llvm(target):
        return cpu_pipeline(target)
    return relax.get_default_pipeline(target)


def task_names(tasks: List) -> List[str]:
    """Names of extracted tasks (for logs and reports)."""
    return [t.task_name for t in tasks]


def optional_database(work_dir: Optional[str]):
    """The JSON database of ``work_dir`` (broken lines dropped, see :mod:`.workdir`), or None
    when no work dir is given."""
    if not work_dir:
        return None

    return open_database(work_dir)
