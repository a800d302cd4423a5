"""Full compilation with the rewrite: :func:`build` and the registered ``"ollie"`` pipeline.

``relax_pipeline=`` replaces TVM's whole Relax pipeline, so the ``"ollie"`` pipeline runs
:class:`OllieOptimize` and then ``relax.get_default_pipeline(target)`` (fusion on CPU, dlight
GPU schedules on CUDA): ``tvm.compile(mod, target, relax_pipeline="ollie")``.

:func:`build` additionally applies tuning: with ``trials > 0`` (or a ``work_dir`` holding a
MetaSchedule database from an earlier compile) the rewritten module is legalized and fused
(by TVM's ``FuseOps``, or by kernel orchestration with ``orchestrate``), its kernels without
records are tuned with what the pass left of the module's trial budget
(:mod:`tvm_ollie.tune.budget`), and ``MetaScheduleApplyDatabase`` puts the best schedules in
before TVM's default pipeline builds it.

Never slower than TVM alone, measured: the pass decides one unit at a time, and units that each
won can lose together (a mobile classifier built 7% slower than TVM alone with 32 of 54 calls
rewritten). When the pass rewrote something and the build can time here (the local CPU, or a
GPU present here; not over RPC), :func:`build` also builds the module as given the same way
(same compile path, tuning records and ``orchestrate`` flag; nothing more is tuned for it) and
times the two executables whole under the guard's protocol (:func:`~.guard.guard_plans`:
alternating rounds, at least 15, judged on the first quartile as the joint build's guard,
:data:`~.joint_plans.GUARD_TIMING`: with 7 rounds on the median a tie under load kept TVM
alone; outputs checked against the original's). The simplest plan is TVM's build
of the original, so it wins ties::

    kept = rewritten if rewritten computes the same and is separated faster, else original

When the original is kept, every rewritten decision and region is reported reverted with the
guard's verdict as the reason; ``report.model_guard`` holds the evidence
(``OllieConfig.model_guard``, test hook ``plan_timer``), and ``work_dir`` keeps the verdict
(:class:`RecordedVerdict`) for the next build of the same model. With the per-user cache on
(``derivation_cache``, ``TVM_OLLIE_CACHE_DIR``) the verdict is also kept there, keyed by this
machine, its threads, the target, TVM, the native library and the code
(:class:`~tvm_ollie.tune.records.MachineStore`): a later build of the same modules, in this
work dir or any other, reads it back and builds only the plan it kept (the others are not
built at all): the same modules, built by the same code, TVM and library on the same machine,
were compared before. A verdict timed under load is reused while the machine is still loaded
and timed again once it is quiet (:func:`~tvm_ollie.tune.evidence.resolvable`);
``TVM_OLLIE_REMEASURE='model guard'`` times it again anyway.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from typing import Any, Dict, Optional, Tuple

import tvm_ffi

from .. import native
from ..codegen.cached_alloc import cached_alloc_scope
from ..compat import relax, tvm
from ..compile_profile import profile_scope, stage
from ..config import OllieConfig, resolve_config
from ..orchestrate.cost import sample_args
from ..target import gpu_available, is_gpu_target, is_llvm, kind_name, normalize_target
from ..transform.build_pool import PendingBuild, running_pool
from ..transform.measuring import DecisionRecords
from ..transform.optimize import OllieOptimize, optimize_module
from ..transform.precision import to_precision
from ..transform.report import OptimizeReport
from ..tune.budget import TrialBudget
from ..tune.compare import Comparison, from_seconds
from ..tune.evidence import doubts, evidence, machine_load, resolvable
from ..tune.machine import REMEASURE_ENV, machine_key, remeasure
from ..tune.metaschedule import Tuner
from ..tune.records import MachineStore
from ..tune.workdir import prepare_work_dir, work_dir_lock
from .compile import compile_module, default_pipeline
from .guard import (GUARD_MARGIN, GuardError, GuardReport, PlanOutcome, PlanSkipped,
                    alternating, guard_plans)
from .hopeless import fastest_call, hopeless_original
from .joint import library_plan
from .joint_plans import GUARD_TIMING, joint_build

__all__ = ["MODEL_PREFERENCE", "PIPELINE_NAME", "RecordedVerdict", "build", "cuda_source",
           "model_guard_on", "ollie_pipeline"]

LOG = logging.getLogger("tvm_ollie.transform")  # the name it logged under before the move

PIPELINE_NAME = "ollie"


def build(mod: "tvm.IRModule", target=None, config: Optional[OllieConfig] = None, *,
          timer=None, checker=None, chooser=None, tuner=None, cost_model=None, plan_timer=None,
          **options: Any) -> Tuple["tvm.runtime.Executable", OptimizeReport]:
    """Rewrite ``mod`` with the pass, then compile it to a Relax executable.

    The options are one :class:`~tvm_ollie.config.OllieConfig` (``config``, default: the
    :func:`~tvm_ollie.config.config_scope`'s, else the defaults); ``target`` and the other
    keywords that are not None override its fields (validated by
    :meth:`~tvm_ollie.config.OllieConfig.replace`: an unknown name is a
    :class:`~tvm_ollie.config.ConfigError`).

    Parameters
    ----------
    mod : IRModule
        The Relax module.
    target : str | dict | Target, optional
        ``"llvm"``, ``"cuda"`` (sm_90, llvm host; builds without a GPU), a tag or a Target
        (default: the config's, else ``Target.current()``, else llvm).
    config : OllieConfig, optional
        The options.
    timer, checker, chooser, tuner, cost_model : optional
        The test hooks of :func:`optimize_module`.
    plan_timer : PlanTimer, optional
        The never-worse guards' (the joint build's and the whole model's,
        :data:`~tvm_ollie.pipeline.guard.PlanTimer`).
    **options
        Overrides of the config's fields: those below, which :func:`build` reads itself, and
        the pass's (``max_depth``, ``search_time_s``, ``calibration``...).

    Other Parameters
    ----------------
    trials : int, optional
        MetaSchedule trials for the whole module (0: no tuning; GPU targets are never tuned
        without a GPU): the pass's tuned measurements and the rewritten module's kernels share
        them by expected gain (:mod:`tvm_ollie.tune.budget`); ``report.budget`` says how they
        were spent.
    work_dir : str, optional
        MetaSchedule database directory; records found there are applied even with
        ``trials=0``, and nothing already recorded is tuned again. Files cut short by a crash
        are repaired (with a warning), and the directory is locked for the whole build, so
        that processes sharing it take turns.
    rpc : RPCConfig, optional
        Measure on the devices behind this RPC tracker: the pass's timings and every tuning
        trial (GPU targets are then tuned without a GPU here); builds stay local.
    orchestrate : bool, optional
        Fission composite operators and choose the kernels by binary linear programming
        (:mod:`tvm_ollie.orchestrate`) instead of TVM's greedy fusion; with ``trials``, the
        chosen kernels are the ones tuned with the final task's share of the budget
        (:mod:`tvm_ollie.orchestrate.tuned`).
    dtype : str, optional
        ``"float16"``: convert the model with TVM's ``ToMixedPrecision`` (float16 operators,
        convolutions and matmuls accumulating in float32) before the pass; its inputs and
        outputs keep their types (:func:`~tvm_ollie.transform.precision.to_precision`). Default
        (or ``"float32"``): the model as given.

    Returns
    -------
    (Executable, OptimizeReport)
    """
    hooks = {k: v for k, v in dict(timer=timer, checker=checker, chooser=chooser, tuner=tuner,
                                   cost_model=cost_model, plan_timer=plan_timer).items()
             if v is not None}
    cfg = resolve_config(config, target=target, **options)
    tgt = normalize_target(cfg.target)
    cfg = cfg.replace(target=tgt)
    mod = to_precision(mod, cfg.dtype)
    remote = cfg.rpc is not None
    if cfg.trials > 0 and cfg.work_dir is None and (
            remote or not (is_gpu_target(tgt) and not gpu_available(tgt))):
        cfg = cfg.replace(work_dir=tempfile.mkdtemp(prefix="ollie_tune_"))
    # One process at a time tunes in a work dir: MetaSchedule's database refers to workloads
    # by line number, so two processes appending to it at once would mix their records up.
    with profile_scope() as prof, work_dir_lock(cfg.work_dir), \
            cached_alloc_scope(cfg.cached_alloc):
        prepare_work_dir(cfg.work_dir)
        ex, report = _build(mod, cfg, hooks)
    report.compile_profile = prof  # (the whole build's: the pass's stages and TVM's build)
    return ex, report


#: Share of the trial budget kept for the rewritten module's kernels (the final task).
FINAL_SHARE = 0.5

#: Who wins a tie of the whole-model guard: the original (TVM's build, the simplest plan),
#: then the library plan, then the rewritten module, unless one is separated faster. The
#: library plan before the rewritten module: it is fixed by a rule (every unit on its library
#: kernel), so every build of a model writes the same one, while the rewritten module is the
#: outcome of every unit's timed decision and differs from build to build where those sit
#: near their margins. Three fresh builds of Longformer quick (weights as parameters, load
#: 5) wrote three rewritten modules and one library plan; the two builds where they tied kept
#: their own rewritten module (3 libraries of 3), docs/decisions.md (2026-12-03 evening).
MODEL_PREFERENCE = ("original", "library", "rewritten")


def _build(mod: "tvm.IRModule", cfg: OllieConfig, hooks: dict
           ) -> Tuple["tvm.runtime.Executable", OptimizeReport]:
    tgt, trials, work_dir = cfg.target, cfg.trials, cfg.work_dir
    tunable = trials > 0 and (cfg.rpc is not None or not is_gpu_target(tgt)
                              or gpu_available(tgt))
    if cfg.joint and cfg.orchestrate and cfg.rpc is None and (trials == 0 or tunable):
        joint = _joint(mod, cfg, hooks)
        if joint is not None:
            return joint
    hooks = dict(hooks)
    plan_timer = hooks.pop("plan_timer", None)
    budget = TrialBudget(trials, final_share=FINAL_SHARE if tunable else 0.0)
    if trials > 0 and not tunable:
        budget.notes.append(f"no {kind_name(tgt)} device here to measure on: nothing tuned")
    new_mod, report = optimize_module(mod, config=cfg, budget=budget, **hooks)
    library = _library_plan(mod, new_mod, cfg, hooks)
    has_db = bool(work_dir) and os.path.isdir(work_dir) and any(
        f.endswith(".json") and "workload" in f for f in os.listdir(work_dir))
    tuner = Tuner(tgt, work_dir, rpc=cfg.rpc) if (tunable or has_db) else None
    orch = cfg.orchestrate_config() if cfg.orchestrate else None
    report.budget = budget

    def as_given(module):  # built as the rewritten module is, with the records it left
        return lambda: compile_module(module, tgt, budget.metered(tuner), 0, cfg.orchestrate,
                                      orchestrate_config=orch)

    verdict = _recorded_verdict(mod, new_mod, library, report, cfg, plan_timer)
    known = None
    if verdict is not None:
        with stage("model guard"):  # (hashing the modules to look the verdict up)
            known = verdict.known()
    if known is not None and known.winner in ("original", "library"):  # build only the kept
        report.model_guard = _read_back(verdict, known)
        if known.winner == "original":
            original = mod if _rewritten_units(report) else new_mod
            _revert(report, _reverted_because(report.model_guard))
            return _compile_final(original, cfg, tuner, budget, tunable, orch), report
        _adopt(report, library[1], _library_because(report.model_guard))
        return _compile_final(library[0], cfg, tuner, budget, tunable, orch), report
    # the guard will build the library plan: in a worker while this process builds the
    # rewritten module, where a pool runs (the module's decisions started it)
    pending = _library_in_pool(library, verdict, cfg, tuner)
    try:
        ex = _compile_final(new_mod, cfg, tuner, budget, tunable, orch)
    except Exception as err:  # pylint: disable=broad-except
        if not report.rewritten:
            raise
        # Never worse: the original module is what TVM would have built anyway.
        why = f"the rewritten module failed to build for {kind_name(tgt)}: " \
              f"{type(err).__name__}: {str(err).strip().splitlines()[-1][:200]}"
        LOG.warning("ollie: %s; building the original module", why)
        _revert(report, why)
        return _compile_final(mod, cfg, tuner, budget, tunable, orch), report
    if verdict is None:
        return ex, report
    plans = [("rewritten", lambda: ex)]
    if not _rewritten_units(report):  # nothing rewritten: what was built is the original
        plans = [("original", lambda: ex)]
    if library is not None:
        with stage("model guard"):  # (waiting for the worker: nothing is timed beside a build)
            pooled = pending.result() if pending is not None else None
        plans.append(("library", _once(as_given(library[0]) if pooled is None
                                       else lambda: pooled)))
    if _rewritten_units(report):  # built last: not at all where it cannot win (.hopeless)
        plans.append(("original", _unless_hopeless(as_given(mod), mod, dict(plans), report,
                                                   tgt, verdict)))
    with stage("model guard"):
        return _model_guard(mod, plans, report, tgt, verdict,
                            library[1] if library else None), report


def _library_in_pool(library, verdict: Optional["RecordedVerdict"], cfg: OllieConfig,
                     tuner) -> Optional[PendingBuild]:
    """The library plan's build started in this process's build pool
    (:mod:`tvm_ollie.transform.build_pool`), or None: no plan, no guard to time it, a verdict
    read back (nothing more is built), no pool running, or a build the workers would not make
    as this process makes it (a tuner's records, orchestration: each a setting of this process
    only; the cached allocations' switch travels with the request)."""
    pool = running_pool()
    if library is None or verdict is None or verdict.known() is not None or pool is None or \
            tuner is not None or cfg.orchestrate or not is_llvm(cfg.target):
        return None
    return pool.submit(library[0], cfg.target)


def _library_plan(given: "tvm.IRModule", rewritten: "tvm.IRModule", cfg: OllieConfig,
                  hooks: dict) -> Optional[Tuple["tvm.IRModule", OptimizeReport]]:
    """The library plan (:attr:`OllieConfig.library_plan`): ``given`` with every operator the
    native library has on its kernel and the pass's other steps as configured (inference
    folds, epilogues, blocked layouts), no derivation; None where the guard does not run, the
    caller forces the decisions (a ``chooser``), the library is off or absent here, or the plan
    is the rewritten module itself or changes nothing."""
    if not (cfg.library_plan and model_guard_on(cfg) and is_llvm(cfg.target)) or \
            cfg.library is False or "chooser" in hooks or not native.load():
        return None
    with stage("library plan"):
        plan = library_plan(given, cfg, hooks.get("checker"))
    if plan is None or tvm_ffi.structural_equal(plan[0], rewritten):
        return None
    return plan


def _recorded_verdict(given, rewritten, library, report: OptimizeReport, cfg: OllieConfig,
                      plan_timer) -> Optional["RecordedVerdict"]:
    """The whole-model guard's timer when the guard runs (something rewritten or a library
    plan, and :func:`model_guard_on`), its verdict kept in ``work_dir`` and, with the per-user
    cache on and no test timer, in the per-machine cache; None when the guard does not run."""
    if not ((_rewritten_units(report) or library is not None) and model_guard_on(cfg)):
        return None
    shared = MachineStore.for_run(cfg.target, "model guard",
                                  cfg.derivation_cache and plan_timer is None)
    modules = dict(original=given, rewritten=rewritten,
                   library=library[0] if library is not None else None)
    return RecordedVerdict(DecisionRecords(cfg.work_dir, shared), modules, cfg, plan_timer)


def model_guard_on(cfg: OllieConfig) -> bool:
    """Whether the whole-model guard runs for ``cfg`` (:attr:`OllieConfig.model_guard`): asked
    for (or by default, without a fixed ``calibration``), and the executables run here (the
    local CPU, or a GPU present here; RPC builds are timed remotely, whole models are not)."""
    if cfg.model_guard is False or cfg.model_guard is None and cfg.calibration is not None:
        return False
    return cfg.rpc is None and (is_llvm(cfg.target) or gpu_available(cfg.target))


def _rewritten_units(report: OptimizeReport) -> list:
    """The decisions and regions that replaced their calls."""
    return list(report.rewritten) + [r for r in report.regions if r.rewritten]


def _revert(report: OptimizeReport, why: str) -> None:
    """Report every rewritten unit as kept original (the original module is what is built)."""
    for unit in _rewritten_units(report):
        unit.chosen, unit.after_s, unit.explain, unit.reason = "original", unit.before_s, "", why
    report.epilogues = {}  # (folded into kernels of the rewritten module only)
    report.layouts = None


def _adopt(report: OptimizeReport, library: OptimizeReport, why: str) -> None:
    """Report the library plan's decisions as what is built (the rewritten module's are not);
    the search's own figures stay (they were spent)."""
    report.decisions, report.regions = library.decisions, library.regions
    report.epilogues, report.inference_folds = library.epilogues, library.inference_folds
    report.layouts = library.layouts
    for unit in _rewritten_units(report):
        unit.reason = why


def _model_guard(given: "tvm.IRModule", plans, report: OptimizeReport, tgt, timer=None,
                 library: Optional[OptimizeReport] = None):
    """The executable of the plan the whole-model guard keeps among ``plans`` (``(name,
    build)``: the rewritten module when something was rewritten, the original, the library
    plan when there is one; module docstring); the evidence goes to ``report.model_guard``."""
    first = plans[0]
    known = timer.known() if isinstance(timer, RecordedVerdict) else None
    if known is not None and known.winner == first[0]:  # compared here before: no build
        report.model_guard = _read_back(timer, known)
        return first[1]()
    try:
        args = sample_args(given["main"])
    except Exception as err:  # pylint: disable=broad-except
        report.model_guard = GuardReport(winner=first[0], title=GUARD_TITLE, notes=[
            f"not timed: no main with static tensor inputs ({type(err).__name__})"])
        return first[1]()
    try:
        kept, winner, guard = guard_plans(plans, args, reference=("original", "library"),
                                          timer=timer,
                                          target=tgt, prefer=MODEL_PREFERENCE)
    except GuardError as err:  # none ran here: keep what the pass built
        guard = GuardReport(winner=first[0], notes=[f"not timed: {err}"])
        kept, winner = first[1](), first[0]
    guard.title = GUARD_TITLE
    if guard.comparison is None and isinstance(timer, RecordedVerdict):
        timer.record_alone(winner)  # (the original skipped, nothing else ran: nothing timed)
    if getattr(timer, "read_back", False):
        guard.notes.append(f"verdict read back from {timer.source} (timed by an earlier "
                           "build of the same modules)")
    elif getattr(timer, "retimed", None):
        guard.notes.append("a recorded verdict was timed again: " + "; ".join(timer.retimed))
    report.model_guard = guard
    if winner == "original" and _rewritten_units(report):
        why = _reverted_because(guard)
        LOG.info("ollie: %s", why)
        _revert(report, why)
    elif winner == "library":
        _adopt(report, library, _library_because(guard))
    return kept


def _once(build):
    """``build`` run on the first call only; later calls return (or raise) what it did."""
    done: list = []

    def first():
        if not done:
            try:
                done.append((build(), None))
            except Exception as err:  # pylint: disable=broad-except
                done.append((None, err))
        ex, err = done[0]
        if err is not None:
            raise err
        return ex

    return first


def _unless_hopeless(build_original, given: "tvm.IRModule", built: Dict[str, Any], report,
                     tgt, verdict=None):
    """The original plan's build, raising :class:`~.guard.PlanSkipped` instead where it
    cannot win (:func:`~.hopeless.hopeless_original`, on a CPU target, against the fastest of
    the plans ``built`` before it, ``name -> build``, each timed here; the reason is kept with
    the verdict, ``verdict.skipped``)."""

    def build_or_skip():
        if is_llvm(tgt):
            leader = _fastest_plan(given, built)
            why = hopeless_original(report, *leader) if leader is not None else None
            if why is not None:
                if isinstance(verdict, RecordedVerdict):
                    verdict.skipped, verdict.leader = why, leader
                raise PlanSkipped(why)
        return build_original()

    return build_or_skip


def _fastest_plan(given: "tvm.IRModule", built: Dict[str, Any]) -> Optional[Tuple[float, str]]:
    """``(seconds, name)`` of the fastest of the plans ``built`` (:func:`~.hopeless.
    fastest_call` of each that builds and runs here; None: none does)."""
    best = None
    try:
        inputs = [tvm.runtime.tensor(a) for a in sample_args(given["main"])]
    except Exception:  # pylint: disable=broad-except
        return None
    for name, build in built.items():
        try:
            main = relax.VirtualMachine(build(), tvm.cpu())["main"]
            seconds = fastest_call(lambda m=main: m(*inputs))
        except Exception:  # pylint: disable=broad-except
            continue  # (the guard says why it does not run)
        if best is None or seconds < best[0]:
            best = (seconds, name)
    return best


#: The first words of the whole-model guard's report.
GUARD_TITLE = "whole-model guard: the rewritten module, the library plan and TVM's build " \
              "of the original, timed whole"


def _read_back(verdict: "RecordedVerdict", comparison: Comparison) -> GuardReport:
    """The guard's report of a verdict read back (:meth:`RecordedVerdict.known`): the kept
    module alone was built; the note says where the verdict came from and the doubts it was
    reused with."""
    plans = [PlanOutcome(name, comparison.seconds(name)) for name in comparison.timings]
    others = ", ".join(p.name for p in plans if p.name != comparison.winner) or "nothing else"
    notes = [f"verdict read back from {verdict.source} (the same modules built and compared "
             f"on this machine before); {others} not built"]
    if verdict.carried:
        notes.append("reused with its doubts (" + "; ".join(verdict.carried) + "): timing it "
                     "again under the load of now would carry them too; "
                     f"{REMEASURE_ENV}='model guard' times it again")
    return GuardReport(plans=plans, winner=comparison.winner, reference="original",
                       comparison=comparison, title=GUARD_TITLE, notes=notes)


class RecordedVerdict:
    """The whole-model guard's timer (a :data:`~.guard.PlanTimer`) with its verdict kept in
    ``work_dir`` (:class:`~tvm_ollie.transform.measuring.DecisionRecords`), as the unit
    decisions keep theirs, and in the per-machine cache: a later build of the same modules
    (structural hashes of every plan) for the same target, ``orchestrate`` and ``trials`` on
    the same machine (:func:`~tvm_ollie.tune.machine.machine_key`: the CPU, the threads, TVM,
    the native library, the code; in the work dir's key too) reads the comparison back, times
    nothing and builds only the plan it kept (:meth:`known`), so the same model compiled twice
    keeps the same build. ``modules``: the plans' modules by name (``original``,
    ``rewritten``, ``library``; None: no such plan). ``timer``: None, the protocol
    (:func:`~.guard.alternating`); else a test's. ``read_back``: whether it did.

    Each verdict is kept with the conditions it was timed in (:mod:`tvm_ollie.tune.evidence`:
    the load average before and after the rounds, the cores, each plan's spread between
    quartiles, how many times it was timed). A verdict with a doubt that timing it now can
    resolve (:func:`~tvm_ollie.tune.evidence.resolvable`: no evidence; timed under load and
    the machine quiet now; noisy rounds or a wide tie, timed once, and the machine quiet now)
    is timed again (``retimed``: those doubts) and the new verdict replaces it; one whose
    doubts the present cannot resolve is reused with them (``carried``, in the report).
    ``TVM_OLLIE_REMEASURE`` naming ``model guard`` (or ``1``) reads neither the work dir's
    verdict nor the per-machine cache's: everything is built and timed again. ``load``: the
    load probe (tests give one)."""

    def __init__(self, records: DecisionRecords, modules: Dict[str, Optional["tvm.IRModule"]],
                 cfg: OllieConfig, timer=None, load=None):
        self.records, self.timer, self.read_back = records, timer, False
        self.load = load if load is not None else machine_load
        self.retimed: list = []
        #: the doubts a verdict read back was reused with (the present could not resolve them)
        self.carried: list = []
        #: where the verdict read back came from
        self.source = ""
        #: why the original was not built (:mod:`.hopeless`), kept with the verdict, and the
        #: ``(seconds, plan)`` it was found hopeless against
        self.skipped: Optional[str] = None
        self.leader: Optional[Tuple[float, str]] = None
        self.modules = {k: m for k, m in modules.items() if m is not None}
        self._keyed: Optional[Tuple[str, str]] = None
        self._known: Optional[Tuple[Optional[Comparison]]] = None
        machine = hashlib.sha256(machine_key(cfg.target).encode()).hexdigest()[:16]
        self.model = f"model guard {cfg.target} orchestrate={cfg.orchestrate} " \
                     f"trials={cfg.trials} machine={machine}"

    def _key(self) -> Tuple[str, str]:
        """``(key, signature)``: hashed once, when first asked (the modules may be large)."""
        if self._keyed is None:
            h = {k: int(tvm_ffi.structural_hash(m)) for k, m in self.modules.items()}
            signature = f"whole model {h['original']} -> {h['rewritten']}"
            if "library" in h:
                signature += f" | library {h['library']}"
            self._keyed = DecisionRecords.key(self.model, signature), signature
        return self._keyed

    def _entry(self) -> Optional[dict]:
        """The recorded verdict of these modules (the work dir's, else the per-machine
        cache's; ``source`` says which), or None (none, or re-timing asked for)."""
        if remeasure("model guard"):
            return None
        key, _ = self._key()
        entry = self.records.data.get(key)
        self.source = f"work_dir/{DecisionRecords.FILE}"
        if not isinstance(entry, dict) and self.records.shared is not None:
            entry, self.source = self.records.shared.get(key), "the per-machine cache"
        return entry if isinstance(entry, dict) else None

    def _trusted(self, entry: Optional[dict], res: Comparison) -> bool:
        """Whether ``res`` (recorded in ``entry``) may be reused: no doubt that timing it now
        could resolve (:func:`~tvm_ollie.tune.evidence.resolvable`; those go to ``retimed``,
        the others to ``carried``)."""
        recorded = (entry or {}).get("evidence")
        found = resolvable(res, recorded, self.load())
        if found:
            self.retimed = found
            return False
        self.carried = doubts(res, recorded)
        return True

    def known(self) -> Optional[Comparison]:
        """The recorded comparison of these modules when the plan it kept can be built alone
        (the kept plan and the original both ran, or the original was not built because it
        could not win, :mod:`.hopeless`; their outputs agreed, and :meth:`_trusted`); None
        when there is none (then the guard builds every plan and compares). Judged once per
        build: the load may move between two questions."""
        if self._known is None:
            self._known = (self._lookup(),)
        return self._known[0]

    def _lookup(self) -> Optional[Comparison]:
        entry = self._entry()
        try:
            res = Comparison.from_dict(entry["comparison"]) if entry else None
        except (KeyError, TypeError, ValueError):
            return None
        if res is None:
            return None
        skipped = (entry.get("evidence") or {}).get("original skipped")
        needed = (res.winner,) if skipped else ("original", res.winner)
        if res.winner not in self.modules or \
                any(res.seconds(n) is None for n in needed) or \
                not self._trusted(entry, res):
            return None
        self.read_back = True
        return res

    def record_alone(self, winner: str) -> None:
        """Keep the verdict of a guard where only ``winner`` ran because the original was
        skipped as hopeless against it (the library plan absent or the same module): nothing
        was timed, so :meth:`__call__` recorded nothing, and every later build built the
        original again wherever its hopeless check, a few calls timed in a loaded moment,
        came out the other way (the demo warm: 6-8 s of 7-9 s). The record is the leader's
        fastest call, given (not rounds), with the reason the original was skipped."""
        if not self.skipped or self.leader is None or self.leader[1] != winner:
            return
        key, signature = self._key()
        res = from_seconds({winner: self.leader[0]}, MODEL_PREFERENCE, GUARD_MARGIN)
        load = self.load()
        found = evidence(res, load, load)
        found["original skipped"] = self.skipped
        self.records.put(key, signature, res, found)

    def __call__(self, runs) -> Comparison:
        key, signature = self._key()
        entry = self._entry()
        try:
            recorded = Comparison.from_dict(entry["comparison"]) if entry else None
        except (KeyError, TypeError, ValueError):
            recorded = None
        if recorded is not None and set(recorded.timings) == set(runs) and \
                self._trusted(entry, recorded):
            self.read_back = True
            return recorded
        before = self.load()
        timed = self.timer(runs) if self.timer is not None else \
            alternating(runs, prefer=MODEL_PREFERENCE, margin=GUARD_MARGIN, **GUARD_TIMING)
        if not isinstance(timed, Comparison):
            timed = from_seconds(timed, MODEL_PREFERENCE, GUARD_MARGIN)
        found = evidence(timed, before, self.load(),
                         previous=(entry or {}).get("evidence") if entry else None)
        if self.skipped and "original" not in runs:
            found["original skipped"] = self.skipped
        self.records.put(key, signature, timed, found)
        return timed


def _timed_plans(guard: GuardReport, tie: str) -> str:
    """``the rewritten module took 1.200ms, the original 2.000ms (separated)``, with each timed
    plan; ``tie``: what a tie did."""
    what = {"rewritten": "the rewritten module took", "library": "the library plan",
            "original": "the original"}
    times = guard.times()
    parts = [f"{what[n]} {times[n] * 1e3:.3f}ms" for n in what if n in times]
    how = "separated" if guard.comparison is not None and guard.comparison.separated \
        else f"not separated: {tie}"
    return f"{', '.join(parts)} ({how})"


def _reverted_because(guard: GuardReport) -> str:
    """The reason given to every reverted unit when the guard kept the original."""
    rewritten = next((p for p in guard.plans if p.name == "rewritten"), None)
    if rewritten is not None and rewritten.dropped:
        return f"whole-model guard: the rewritten module {rewritten.dropped}; TVM's build of " \
               "the original kept"
    return f"whole-model guard: {_timed_plans(guard, 'a tie keeps the original')}; TVM's " \
           "build of the original kept"


def _library_because(guard: GuardReport) -> str:
    """The reason given to every unit of the library plan when the guard kept it."""
    return f"whole-model guard: {_timed_plans(guard, 'a tie keeps the library plan')}" \
           "; the library plan kept"


def _compile_final(mod, cfg: OllieConfig, tuner, budget: TrialBudget, tunable: bool, orch):
    """The module's kernels tuned with everything left of the budget (the final task)."""
    trials = budget.final() if tunable else 0
    with stage("tvm build"):
        return compile_module(mod, cfg.target, budget.metered(tuner), trials, cfg.orchestrate,
                              orchestrate_config=orch)


def _joint(mod: "tvm.IRModule", cfg: OllieConfig, hooks: dict):
    """The joint build (derivation alternatives and kernel boundaries chosen by one selection,
    :mod:`tvm_ollie.pipeline.joint`), or None when it fails (the sequential build follows)."""
    # the never-worse guard times whole plans: only where they run (the local CPU or a GPU
    # present here, on the target's device; joint builds are local already)
    guard = cfg.joint_guard and cfg.rpc is None and (
        is_llvm(cfg.target) or gpu_available(cfg.target))
    opts = dict(config=cfg, guard=guard, **hooks)
    if cfg.trials > 0:  # one budget: the decisions first, then the kept plan's kernels
        budget = TrialBudget(cfg.trials, final_share=FINAL_SHARE)
        opts.update(trials=cfg.trials, budget=budget,
                    plan_tuner=budget.metered(Tuner(cfg.target, cfg.work_dir)))
    try:  # derivation and kernel boundaries chosen together (docs/orchestration.md)
        with stage("orchestration"):
            return tuple(joint_build(mod, **opts)[:2])
    except Exception as err:  # pylint: disable=broad-except
        LOG.warning("ollie: joint selection failed (%s: %s); sequential build",
                    type(err).__name__, str(err).splitlines()[0][:200] if str(err) else "")
        return None


def cuda_source(ex: "tvm.runtime.Executable") -> str:
    """The CUDA C source of every CUDA module in an executable (empty if none)."""
    found, stack = [], [ex.mod]
    while stack:
        cur = stack.pop()
        if cur.kind == "cuda":
            found.append(cur.inspect_source())
        stack.extend(cur.imports)
    return "\n".join(found)


def ollie_pipeline(target=None, config: Optional[OllieConfig] = None, *, timer=None,
                   checker=None, chooser=None, cost_model=None,
                   **options: Any) -> "tvm.transform.Pass":
    """:class:`OllieOptimize` followed by TVM's default pipeline for the target (with
    ``orchestrate``: fission and kernel orchestration in place of TVM's greedy fusion).

    ``relax.get_pipeline("ollie", config=cfg)`` or ``relax_pipeline="ollie"`` (then the config
    of :func:`~tvm_ollie.config.config_scope`, read when the pipeline runs). ``options``
    override the config's fields (validated here); ``timer``, ``checker``, ``chooser`` and
    ``cost_model`` are :class:`OllieOptimize`'s hooks. The target is read from
    ``Target.current()`` when the pipeline runs (``tvm.compile`` runs its pipeline under
    ``with target``) unless the config or ``target`` gives one. A pipeline transforms one
    module and cannot build another to compare with, so it has no whole-model guard
    (:func:`build` has).
    """
    hooks = dict(timer=timer, checker=checker, chooser=chooser, cost_model=cost_model)
    overrides = dict(target=target, **options)
    resolve_config(config, **overrides)  # invalid options fail here, not inside tvm.compile

    @tvm.transform.module_pass(opt_level=0, name="OlliePipeline")
    def _pipeline(mod: "tvm.IRModule", _ctx) -> "tvm.IRModule":
        cfg = resolve_config(config, **overrides)
        tgt = cfg.target if cfg.target is not None else \
            tvm.target.Target.current(allow_none=True)
        tgt = normalize_target(tgt or "llvm")
        cfg = cfg.replace(target=tgt)
        mod = OllieOptimize(config=cfg, **hooks)(mod)
        orch = cfg.orchestrate_config() if cfg.orchestrate else None
        with tgt, cached_alloc_scope(cfg.cached_alloc):
            return default_pipeline(tgt, orchestrate=cfg.orchestrate,
                                    orchestrate_config=orch)(mod)

    return _pipeline


def _register() -> None:
    if PIPELINE_NAME not in relax.pipeline.PIPELINE_MAP:
        relax.register_pipeline(PIPELINE_NAME)(ollie_pipeline)


_register()
