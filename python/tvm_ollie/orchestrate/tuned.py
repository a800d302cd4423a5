"""Kernel orchestration combined with MetaSchedule tuning.

The untuned orchestrated build (:func:`.pipeline.ollie_orchestration`,
:func:`.pipeline.orchestrate_pipeline`) is TVM's default pipeline with :class:`Orchestrate` in
place of ``FuseOps``. A tuned build must tune the kernels that build will compile, so it runs
in three steps, as the tuned build without orchestration does (``legalize_and_fuse``, tune,
apply, build):

1. :func:`orchestrated_kernels`: the same pipeline up to ``FuseTIR``: library dispatch, the
   optional fission, ``LegalizeOps, AnnotateTIROpPattern, FoldConstant``, :class:`Orchestrate`
   (with its fallbacks: a chosen kernel that fails its check is banned and the program solved
   again, else the partition keeps single kernels) and ``FuseTIR``: one PrimFunc per chosen
   kernel;
2. the tuner tunes those PrimFuncs with the trials it is given and applies its records;
3. :func:`finish_pipeline`: the rest of the same default pipeline, with ``FuseOps`` a no-op so
   that the chosen kernels stay as chosen (TVM 0.27's ``FuseOps`` happens to leave fused
   PrimFuncs alone, which the tuned build without orchestration relies on; here it is not
   left to chance); every other pass, the CPU default schedules for what has no record
   included, is the untuned build's.
"""

from __future__ import annotations

from typing import Callable, List, Optional

from ..codegen.cached_alloc import finalize_passes
from ..compat import tvm
from ..config import OrchestrateConfig
from ..target import is_llvm
from ..tune.cpu_schedule import cpu_pipeline
from ..tune.gather_pattern import with_gathers_injective
from .cost import CostModel
from .joint import keep_alternatives
from .pipeline import (KernelCheck, Orchestrate, _backend, _fission_pass, _normalize,
                       _split_composites)

__all__ = ["finish_pipeline", "ollie_tuned_build", "orchestrated_kernels",
           "tuned_orchestrate_build"]

#: ``fission(mod) -> mod`` run before legalization (None: no fission).
Fission = Optional[Callable[["tvm.IRModule"], "tvm.IRModule"]]


@tvm.transform.module_pass(opt_level=0, name="KeepKernels")
def _keep_kernels(mod: "tvm.IRModule", _ctx) -> "tvm.IRModule":
    """``FuseOps`` of an already orchestrated module: nothing (the kernels are chosen)."""
    return mod


def _front_passes(tgt, orch, fission: Fission, wrap: Optional[dict] = None
                  ) -> List["tvm.transform.Pass"]:
    """The default pipeline's passes up to ``FuseTIR``, ``FuseOps`` replaced by ``orch``;
    ``wrap`` maps a pass's name to a function of the pass that replaces it (the joint
    selection keeps its alternatives through ``FoldConstant``)."""
    backend = _backend(tgt)
    legalize = with_gathers_injective(backend.legalize_passes(tgt))
    names = [p.info.name for p in legalize]
    legalize = legalize[:names.index("FuseTIR") + 1]
    legalize = [orch if p.info.name == "FuseOps" else p for p in legalize]
    if wrap:
        legalize = [wrap[p.info.name](p) if p.info.name in wrap else p for p in legalize]
    pre = [_fission_pass(fission)] if fission is not None else []
    return backend.library_dispatch_passes(tgt) + pre + legalize


def orchestrated_kernels(mod: "tvm.IRModule", target, cost: Optional[CostModel] = None,
                         config: Optional[OrchestrateConfig] = None, fission: Fission = None,
                         check: Optional[KernelCheck] = None,
                         reports: Optional[list] = None, joint=None) -> "tvm.IRModule":
    """``mod`` legalized, orchestrated and fused: one PrimFunc per chosen kernel (step 1 of
    the module docstring); the orchestration report is appended to ``reports``. With a
    ``joint`` table (:class:`~.joint.JointTable`; ``mod`` offers its alternatives, fission
    already done) the selection is the joint one."""

    tgt = _normalize(target)
    orch = Orchestrate(tgt, cost, config or OrchestrateConfig(), check, joint=joint)
    wrap = {"FoldConstant": keep_alternatives} if joint else None
    with tgt:
        out = tvm.transform.Sequential(_front_passes(tgt, orch, fission, wrap))(mod)
    if reports is not None:
        reports.append(orch.last_report)
    return out


def finish_pipeline(target, cpu_schedules: bool = True) -> "tvm.transform.Pass":
    """TVM's default pipeline for an orchestrated (fused) module: ``FuseOps`` does nothing,
    the rest is as in the untuned build; on llvm with the project's default CPU schedules
    after ``FuseTIR`` (for the kernels without a record) unless ``cpu_schedules`` is False
    (TVM's own pipeline)."""
    tgt = _normalize(target)
    if is_llvm(tgt):
        # the switch TVM_OLLIE_CPU_SCHEDULE decides, as in the untuned build
        return cpu_pipeline(tgt, fuse=_keep_kernels, enabled=None if cpu_schedules else False)
    backend = _backend(tgt)

    @tvm.transform.module_pass(opt_level=0, name="FinishOrchestrated")
    def _pipeline(mod: "tvm.IRModule", _ctx) -> "tvm.IRModule":
        legalize = [_keep_kernels if p.info.name == "FuseOps" else p
                    for p in with_gathers_injective(backend.legalize_passes(tgt))]
        with tgt:
            return tvm.transform.Sequential(
                backend.library_dispatch_passes(tgt) + legalize
                + backend.dataflow_lower_passes(tgt) + finalize_passes(tgt, backend))(mod)

    return _pipeline


def tuned_orchestrate_build(mod: "tvm.IRModule", target, tuner, trials: int,
                            cost: Optional[CostModel] = None,
                            config: Optional[OrchestrateConfig] = None,
                            fission: Fission = None, cpu_schedules: bool = True,
                            reports: Optional[list] = None, joint=None
                            ) -> "tvm.runtime.Executable":
    """Orchestrate ``mod``, tune its kernels with ``tuner`` (up to ``trials``; 0: only apply
    the records the tuner's database has), apply the records and build (the module
    docstring's three steps). ``tuner`` has ``tune(fused, trials)`` and ``apply(fused)``
    (:class:`~tvm_ollie.tune.metaschedule.Tuner`, or a budget-metered one); ``joint``: as in
    :func:`orchestrated_kernels`."""
    tgt = _normalize(target)
    fused = orchestrated_kernels(mod, tgt, cost, config, fission, reports=reports, joint=joint)
    if trials > 0:
        tuner.tune(fused, trials)
    fused = tuner.apply(fused)
    return tvm.compile(fused, target=tgt, relax_pipeline=finish_pipeline(tgt, cpu_schedules))


def ollie_tuned_build(mod: "tvm.IRModule", target, tuner, trials: int,
                      config: Optional[OrchestrateConfig] = None,
                      reports: Optional[list] = None) -> "tvm.runtime.Executable":
    """The tuned build of ``orchestrate=True``: :func:`tuned_orchestrate_build` with the
    untuned build's choices (:func:`.pipeline.ollie_orchestration`): composite operators
    split by fission, the kernel costs ``config.costs`` names, default CPU schedules on
    llvm."""
    return tuned_orchestrate_build(mod, target, tuner, trials, config=config,
                                   fission=_split_composites, reports=reports)
