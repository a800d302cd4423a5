"""Full compilation with the rewrite: :func:`build` and the registered ``"ollie"`` pipeline.

``relax_pipeline=`` replaces TVM's whole Relax pipeline, so the ``"ollie"`` pipeline runs
:class:`OllieOptimize` and then ``relax.get_default_pipeline(target)`` (fusion on CPU, dlight
GPU schedules on CUDA): ``tvm.compile(mod, target, relax_pipeline="ollie")``.

:func:`build` additionally applies tuning: with ``trials > 0`` (or a ``work_dir`` holding a
MetaSchedule database from an earlier compile) the rewritten module is legalized and fused,
its kernels without records are tuned, and ``MetaScheduleApplyDatabase`` puts the best
schedules in before TVM's default pipeline builds it.
"""

from __future__ import annotations

import logging
import os
from typing import Optional, Tuple

from ..compat import relax, tvm
from ..tune.measure import compile_module
from ..tune.metaschedule import Tuner, default_pipeline, gpu_available, is_gpu_target, \
    normalize_target
from ..tune.rpc import RPCConfig
from ..tune.workdir import prepare_work_dir, work_dir_lock
from .optimize import OllieOptimize, optimize_module
from .report import OptimizeReport

__all__ = ["build", "cuda_source", "ollie_pipeline", "PIPELINE_NAME"]

LOG = logging.getLogger("tvm_ollie.transform")

PIPELINE_NAME = "ollie"


def build(mod: "tvm.IRModule", target="llvm", trials: int = 0, work_dir: Optional[str] = None,
          rpc: Optional[RPCConfig] = None, orchestrate: bool = False, **opts
          ) -> Tuple["tvm.runtime.Executable", OptimizeReport]:
    """Rewrite ``mod`` with the pass, then compile it to a Relax executable.

    Parameters
    ----------
    mod : IRModule
        The Relax module.
    target : str | dict | Target
        ``"llvm"``, ``"cuda"`` (sm_90, llvm host; builds without a GPU), a tag or a Target.
    trials : int
        MetaSchedule trials per tuned implementation in the pass, and per remaining kernel of
        the rewritten module here (0: no tuning; GPU targets are never tuned without a GPU).
    work_dir : str, optional
        MetaSchedule database directory; records found there are applied even with
        ``trials=0``, and nothing already recorded is tuned again. Files cut short by a crash
        are repaired (with a warning), and the directory is locked for the whole build, so
        that processes sharing it take turns.
    orchestrate : bool
        Fission composite operators and choose the kernels by binary linear programming
        (:mod:`tvm_ollie.orchestrate`) instead of TVM's greedy fusion (untuned builds only);
        with ``joint=True`` in ``opts``, the derivation alternatives and the kernel boundaries
        are chosen by one selection (:mod:`tvm_ollie.orchestrate.joint`).
    rpc : RPCConfig, optional
        Measure on the devices behind this RPC tracker: the pass's timings and every tuning
        trial (GPU targets are then tuned without a GPU here); builds stay local.
    **opts
        Passed to :func:`optimize_module` (``max_depth``, ``time_budget_s``, ``calibration``...;
        ``chooser`` forces a verified alternative per operator, for differential tests).

    Returns
    -------
    (Executable, OptimizeReport)
    """
    tgt = normalize_target(target)
    remote = rpc is not None
    if trials > 0 and work_dir is None and (remote or not (is_gpu_target(tgt) and
                                                            not gpu_available(tgt))):
        import tempfile  # pylint: disable=import-outside-toplevel

        work_dir = tempfile.mkdtemp(prefix="ollie_tune_")
    # One process at a time tunes in a work dir: MetaSchedule's database refers to workloads
    # by line number, so two processes appending to it at once would mix their records up.
    with work_dir_lock(work_dir):
        prepare_work_dir(work_dir)
        return _build(mod, tgt, trials, work_dir, rpc, orchestrate, opts)


def _build(mod: "tvm.IRModule", tgt, trials: int, work_dir: Optional[str],
           rpc: Optional[RPCConfig], orchestrate: bool, opts: dict
           ) -> Tuple["tvm.runtime.Executable", OptimizeReport]:
    remote = rpc is not None
    if opts.pop("joint", False) and orchestrate and trials == 0 and not remote:
        from ..orchestrate.joint import joint_build  # pylint: disable=import-outside-toplevel

        try:  # derivation and kernel boundaries chosen together (docs/orchestration.md)
            return joint_build(mod, tgt, work_dir, **opts)[:2]
        except Exception as err:  # pylint: disable=broad-except
            LOG.warning("ollie: joint selection failed (%s: %s); sequential build",
                        type(err).__name__, str(err).splitlines()[0][:200] if str(err) else "")
    new_mod, report = optimize_module(mod, tgt, trials=trials, work_dir=work_dir, rpc=rpc,
                                      **opts)
    tunable = trials > 0 and (remote or not is_gpu_target(tgt) or gpu_available(tgt))
    has_db = bool(work_dir) and os.path.isdir(work_dir) and any(
        f.endswith(".json") and "workload" in f for f in os.listdir(work_dir))
    tuner = Tuner(tgt, work_dir, rpc=rpc) if (tunable or has_db) else None
    try:
        ex = compile_module(new_mod, tgt, tuner, trials if tunable else 0, orchestrate)
    except Exception as err:  # pylint: disable=broad-except
        if not report.rewritten:
            raise
        # Never worse: the original module is what TVM would have built anyway.
        why = f"the rewritten module failed to build for {tgt.kind.name}: " \
              f"{type(err).__name__}: {str(err).strip().splitlines()[-1][:200]}"
        LOG.warning("ollie: %s; building the original module", why)
        for d in report.rewritten:
            d.chosen, d.after_s, d.explain, d.reason = "original", d.before_s, "", why
        ex = compile_module(mod, tgt, tuner, trials if tunable else 0, orchestrate)
    return ex, report


def cuda_source(ex: "tvm.runtime.Executable") -> str:
    """The CUDA C source of every CUDA module in an executable (empty if none)."""
    found, stack = [], [ex.mod]
    while stack:
        cur = stack.pop()
        if cur.kind == "cuda":
            found.append(cur.inspect_source())
        stack.extend(cur.imports)
    return "\n".join(found)


def ollie_pipeline(target=None, orchestrate: bool = False, **opts) -> "tvm.transform.Pass":
    """:class:`OllieOptimize` followed by TVM's default pipeline for the target (with
    ``orchestrate``: fission and kernel orchestration in place of TVM's greedy fusion).

    The target is read from ``Target.current()`` when the pipeline runs (``tvm.compile`` runs
    its pipeline under ``with target``) unless given.
    """

    @tvm.transform.module_pass(opt_level=0, name="OlliePipeline")
    def _pipeline(mod: "tvm.IRModule", _ctx) -> "tvm.IRModule":
        tgt = target if target is not None else tvm.target.Target.current(allow_none=True)
        tgt = normalize_target(tgt or "llvm")
        mod = OllieOptimize(target=tgt, **opts)(mod)
        with tgt:
            return default_pipeline(tgt, orchestrate=orchestrate)(mod)

    return _pipeline


def _register() -> None:
    from tvm.relax import pipeline as rp  # pylint: disable=import-outside-toplevel

    if PIPELINE_NAME not in rp.PIPELINE_MAP:
        relax.register_pipeline(PIPELINE_NAME)(ollie_pipeline)


_register()
