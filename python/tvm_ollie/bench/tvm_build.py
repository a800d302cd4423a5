"""TVM's own build of a Relax model: default pipeline, or MetaSchedule-tuned, with a cached DB.

With ``trials > 0`` this is TVM's ``relax.pipeline.static_shape_tuning_pipeline`` in the two-step
form ``ex = tvm.compile(pipeline(mod), target)`` (passing the pipeline as ``relax_pipeline=``
fails in VM codegen in 0.27). Three adjustments:

* on CPU, MetaSchedule's LocalBuilder gets :func:`fast_build`: the default build function
  imports ``tvm.s_tir.tensor_intrin`` (20-30 s) in every freshly spawned worker, and the
  builder respawns its pool every batch, so builds time out. The pipeline calls the global
  function ``tvm.s_tir.meta_schedule.tune_relax``; :func:`_install_fast_tuning_builder`
  re-registers it once per process with the builder swapped for CPU targets (never restored:
  restoring it crashed the interpreter at exit).
* ``max_trials_per_task`` is ``ceil(trials / tasks)`` so that every task gets trials (left
  unset, a small budget all goes to the first task);
* tuning records persist in ``work_dir`` with a ``tuned.json`` marker holding the module's
  structural hash and the trials spent: a rerun with no more trials than recorded only applies
  the database (``total_trials=0``), so nothing is tuned twice.

With ``trials == 0`` the build is ``tvm.compile(mod, target, relax_pipeline=
relax.get_default_pipeline(target))`` (legalize, fuse, and dlight on GPUs).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
from typing import Optional

import tvm_ffi

from ..compat import RemoveWeightLayoutRewriteBlock, relax, tvm

_TUNE_RELAX = "tvm.s_tir.meta_schedule.tune_relax"
_MARKER = "tuned.json"


@dataclasses.dataclass
class TVMBuild:
    """A built executable and what it cost."""

    executable: object
    compile_s: float
    tune_s: float
    trials: int
    reused_db: bool


def fast_build(mod, target, _params):
    """MetaSchedule build function for CPU candidates that skips the tensor-intrinsic import.

    Same as MetaSchedule's ``default_build`` without ``import tvm.s_tir.tensor_intrin`` (only
    tensorized schedules need it; the llvm search space here does not tensorize).
    """
    mod = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod)
    return tvm.compile(mod, target=target).mod


def make_target(kind: str, threads: int):
    """``llvm`` -> ``{"kind": "llvm", "num-cores": threads}``; ``cuda`` -> the H100 tag."""

    if kind == "llvm":
        return tvm.target.Target({"kind": "llvm", "num-cores": int(threads)})
    if kind == "cuda":
        tags = tvm.target.list_tags()
        tag = "nvidia/nvidia-h200" if "nvidia/nvidia-h200" in tags else "nvidia/nvidia-h100"
        return tvm.target.Target(tag)
    raise ValueError(f"unsupported target {kind!r} (use 'llvm' or 'cuda')")


#: The registered ``tune_relax`` this module replaced (None until it did).
_ORIGINAL_TUNE_RELAX = None


def _install_fast_tuning_builder() -> None:
    """Once per process: make the tuning pipeline use :func:`fast_build` for CPU targets.

    The replacement is registered once and never restored: TVM's C++ side keeps a reference to
    the function it looked up, and restoring the original left that reference to be released
    after Python shut down (a crash at exit). Other targets are handed to the original.
    """
    global _ORIGINAL_TUNE_RELAX  # pylint: disable=global-statement
    if _ORIGINAL_TUNE_RELAX is not None:
        return
    # pylint: disable=import-outside-toplevel
    # lazy: MetaSchedule is slow to import (compat keeps it lazy)
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.meta_schedule import relax_integration

    original = tvm_ffi.get_global_func(_TUNE_RELAX)

    def tune_with_fast_builder(mod, params, tgt, work_dir, max_trials_global, *rest):
        if tgt.kind.name != "llvm":
            return original(mod, params, tgt, work_dir, max_trials_global, *rest)
        max_trials_per_task = rest[0] if rest else None
        op_names = rest[1] if len(rest) > 1 else None
        # What the registered function does (tune, then return the module unchanged), with
        # the builder swapped.
        relax_integration.tune_relax(
            mod, params, tgt, work_dir, int(max_trials_global),
            max_trials_per_task=None if max_trials_per_task is None else int(max_trials_per_task),
            op_names=op_names, seed=0,
            builder=ms.builder.LocalBuilder(f_build=fast_build, timeout_sec=60.0),
        )  # fmt: skip
        return mod

    tvm_ffi.register_global_func(_TUNE_RELAX, tune_with_fast_builder, override=True)
    _ORIGINAL_TUNE_RELAX = original


def count_tasks(mod, target) -> int:
    """Number of MetaSchedule tasks the tuning pipeline will extract from ``mod``.

    Used to spread the trials: with ``max_trials_per_task`` unset the pipeline lets each task
    take up to ``total_trials``, so a small budget goes entirely to the first task (TVM's
    docstring recommends setting both). Runs the pipeline's own pre-tuning passes.
    """
    # pylint: disable=import-outside-toplevel
    # lazy: MetaSchedule is slow to import (compat keeps it lazy)
    from tvm.s_tir import meta_schedule as ms

    with target:
        fused = tvm.transform.Sequential(
            [
                relax.transform.DecomposeOpsForInference(),
                relax.transform.CanonicalizeBindings(),
                relax.pipeline.zero_pipeline(),
            ]
        )(mod)
    return max(1, len(ms.relax_integration.extract_tasks(fused, target)))


def database_key(mod, target) -> str:
    """What a tuning database is valid for: the module's structure and the exact target."""

    return f"{tvm_ffi.structural_hash(mod)}:{target}"


def _read_marker(work_dir: str) -> Optional[dict]:
    try:
        with open(os.path.join(work_dir, _MARKER), encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def build_tvm(mod, target, trials: int = 0, work_dir: Optional[str] = None) -> TVMBuild:
    """Build ``mod`` for ``target``; tune with MetaSchedule when ``trials > 0``.

    Parameters
    ----------
    mod : tvm.IRModule
        High-level Relax module (as imported).
    target : tvm.target.Target
        Build target.
    trials : int
        Total MetaSchedule trials for the model (0: no tuning, default pipeline).
    work_dir : str, optional
        Tuning database directory for this model and target (required when ``trials > 0``).
    """

    if trials <= 0:
        start = time.perf_counter()
        ex = tvm.compile(mod, target=target, relax_pipeline=relax.get_default_pipeline(target))
        return TVMBuild(ex, time.perf_counter() - start, 0.0, 0, False)
    if not work_dir:
        raise ValueError("tuning needs a work_dir for its database")
    digest = database_key(mod, target)
    marker = _read_marker(work_dir)
    if marker is not None and marker.get("hash") != digest:
        shutil.rmtree(work_dir, ignore_errors=True)  # the model changed: old records are stale
        marker = None
    done = int(marker["trials"]) if marker else 0
    todo = max(0, trials - done)
    os.makedirs(work_dir, exist_ok=True)
    start = time.perf_counter()
    per_task = max(1, -(-todo // count_tasks(mod, target))) if todo else None
    _install_fast_tuning_builder()
    pipeline = relax.pipeline.static_shape_tuning_pipeline(
        total_trials=todo, target=target, work_dir=work_dir, max_trials_per_task=per_task
    )
    tuned = pipeline(mod)
    tune_s = time.perf_counter() - start
    if todo:
        with open(os.path.join(work_dir, _MARKER), "w", encoding="utf-8") as f:
            json.dump({"hash": digest, "trials": done + todo}, f)
    start = time.perf_counter()
    ex = tvm.compile(tuned, target=target)
    return TVMBuild(ex, time.perf_counter() - start, tune_s, done + todo, todo == 0)
