"""Compiling a rewritten module, with TVM's fusion or with kernel orchestration.

:mod:`tvm_ollie.tune` builds with TVM's fusion (and default CPU schedules on llvm); kernel
orchestration (:mod:`tvm_ollie.orchestrate`) sits a floor above it, so the choice between the
two is made here: :func:`default_pipeline` and :func:`compile_module` are
:func:`tvm_ollie.tune.metaschedule.default_pipeline` and
:func:`tvm_ollie.tune.measure.compile_module` with ``orchestrate`` (fission and BLP-chosen
kernels in place of ``FuseOps``, limited by ``orchestrate_config``).
"""

from __future__ import annotations

from typing import Optional

from ..compat import tvm
from ..config import OrchestrateConfig
from ..orchestrate.pipeline import ollie_orchestration
from ..orchestrate.tuned import ollie_tuned_build
from ..target import normalize_target
from ..tune import measure, metaschedule
from ..tune.metaschedule import Tuner

__all__ = ["compile_module", "default_pipeline"]


def default_pipeline(target, orchestrate: bool = False,
                     orchestrate_config: Optional[OrchestrateConfig] = None
                     ) -> "tvm.transform.Pass":
    """TVM's full default Relax pipeline for ``target`` (fusion, dlight on GPUs; on llvm plus
    the default CPU schedules: :func:`tvm_ollie.tune.metaschedule.default_pipeline`).
    ``orchestrate=True`` fissions composite operators and replaces TVM's greedy ``FuseOps`` by
    kernel orchestration (:func:`tvm_ollie.orchestrate.pipeline.ollie_orchestration`), limited
    by ``orchestrate_config`` (None: its defaults)."""
    if not orchestrate:
        return metaschedule.default_pipeline(target)
    target = normalize_target(target)
    if orchestrate_config is None:
        return ollie_orchestration(target)
    return ollie_orchestration(target, config=orchestrate_config)


def compile_module(mod: "tvm.IRModule", target, tuner: Optional[Tuner] = None,
                   trials: int = 0, orchestrate: bool = False,
                   orchestrate_config: Optional[OrchestrateConfig] = None
                   ) -> "tvm.runtime.Executable":
    """Legalize and fuse ``mod``, tune its untuned tasks (``trials``), apply the records, build
    (:func:`tvm_ollie.tune.measure.compile_module`).

    With ``orchestrate``, kernel orchestration instead of TVM's greedy fusion, limited by
    ``orchestrate_config``; with a tuner too, the kernels tuned and built are the ones
    orchestration chose (:func:`tvm_ollie.orchestrate.tuned.ollie_tuned_build`: the same
    fission and CPU schedules as the untuned build).
    """
    if not orchestrate:
        return measure.compile_module(mod, target, tuner, trials)

    def tuned_build(module, tgt, tuner_, trials_):
        return ollie_tuned_build(module, tgt, tuner_, trials_, config=orchestrate_config)

    return measure.compile_module(
        mod, target, tuner, trials,
        pipeline=default_pipeline(target, True, orchestrate_config) if tuner is None else None,
        tuned_build=tuned_build)
