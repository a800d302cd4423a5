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
"""

from __future__ import annotations

import logging
import os
import tempfile
from typing import Any, Optional, Tuple

from ..compat import relax, tvm
from ..compile_profile import profile_scope, stage
from ..config import OllieConfig, resolve_config
from ..target import gpu_available, is_gpu_target, is_llvm, kind_name, normalize_target
from ..transform.optimize import OllieOptimize, optimize_module
from ..transform.precision import to_precision
from ..transform.report import OptimizeReport
from ..tune.budget import TrialBudget
from ..tune.metaschedule import Tuner
from ..tune.workdir import prepare_work_dir, work_dir_lock
from .compile import compile_module, default_pipeline
from .joint_plans import joint_build

__all__ = ["build", "cuda_source", "ollie_pipeline", "PIPELINE_NAME"]

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
        The joint build's never-worse guard's (:data:`~tvm_ollie.pipeline.guard.PlanTimer`).
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
    with profile_scope() as prof, work_dir_lock(cfg.work_dir):
        prepare_work_dir(cfg.work_dir)
        ex, report = _build(mod, cfg, hooks)
    report.compile_profile = prof  # (the whole build's: the pass's stages and TVM's build)
    return ex, report


#: Share of the trial budget kept for the rewritten module's kernels (the final task).
FINAL_SHARE = 0.5


def _build(mod: "tvm.IRModule", cfg: OllieConfig, hooks: dict
           ) -> Tuple["tvm.runtime.Executable", OptimizeReport]:
    tgt, trials, work_dir = cfg.target, cfg.trials, cfg.work_dir
    tunable = trials > 0 and (cfg.rpc is not None or not is_gpu_target(tgt)
                              or gpu_available(tgt))
    if cfg.joint and cfg.orchestrate and cfg.rpc is None and (trials == 0 or tunable):
        joint = _joint(mod, cfg, hooks)
        if joint is not None:
            return joint
    hooks = {k: v for k, v in hooks.items() if k != "plan_timer"}
    budget = TrialBudget(trials, final_share=FINAL_SHARE if tunable else 0.0)
    if trials > 0 and not tunable:
        budget.notes.append(f"no {kind_name(tgt)} device here to measure on: nothing tuned")
    new_mod, report = optimize_module(mod, config=cfg, budget=budget, **hooks)
    has_db = bool(work_dir) and os.path.isdir(work_dir) and any(
        f.endswith(".json") and "workload" in f for f in os.listdir(work_dir))
    tuner = Tuner(tgt, work_dir, rpc=cfg.rpc) if (tunable or has_db) else None
    orch = cfg.orchestrate_config() if cfg.orchestrate else None
    try:
        ex = _compile_final(new_mod, cfg, tuner, budget, tunable, orch)
    except Exception as err:  # pylint: disable=broad-except
        if not report.rewritten:
            raise
        # Never worse: the original module is what TVM would have built anyway.
        why = f"the rewritten module failed to build for {kind_name(tgt)}: " \
              f"{type(err).__name__}: {str(err).strip().splitlines()[-1][:200]}"
        LOG.warning("ollie: %s; building the original module", why)
        for d in report.rewritten:
            d.chosen, d.after_s, d.explain, d.reason = "original", d.before_s, "", why
        ex = _compile_final(mod, cfg, tuner, budget, tunable, orch)
    report.budget = budget
    return ex, report


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
    ``with target``) unless the config or ``target`` gives one.
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
        with tgt:
            return default_pipeline(tgt, orchestrate=cfg.orchestrate,
                                    orchestrate_config=orch)(mod)

    return _pipeline


def _register() -> None:
    if PIPELINE_NAME not in relax.pipeline.PIPELINE_MAP:
        relax.register_pipeline(PIPELINE_NAME)(ollie_pipeline)


_register()
