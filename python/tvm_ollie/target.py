"""What a target is: the one place that knows target kinds (floor 0, see DESIGN.md).

Everything else asks here: :func:`normalize_target` (a Target from a str, dict or Target),
:func:`kind_name`, :func:`is_llvm`, whether it is a GPU target (:func:`is_gpu_target`) and
whether a device for it is here (:func:`gpu_available`), which cost tables apply
(:func:`target_kind`: ``"cuda"`` or ``"llvm"``), and where its executables run
(:func:`device_kind`, :func:`target_device`).
"""

from __future__ import annotations

import os

from .compat import cuda_target, tvm

__all__ = ["GPU_KINDS", "device_kind", "gpu_available", "is_gpu_target", "is_llvm", "kind_name",
           "normalize_target", "target_device", "target_kind"]

#: Target kinds whose programs run on a GPU.
GPU_KINDS = ("cuda", "rocm", "vulkan", "metal", "opencl")

#: Target kinds (and tag prefixes) costed with the CUDA tables (:func:`target_kind`).
_CUDA_KINDS = ("cuda", "nvptx")


def normalize_target(target) -> "tvm.target.Target":
    """A Target from a str/dict/Target (None: ``Target.current()``, else llvm); ``"cuda"`` ->
    sm_90 with an llvm host; llvm gets ``num-cores`` (MetaSchedule needs it) from
    ``TVM_NUM_THREADS`` or the CPU count."""
    if target is None:
        target = tvm.target.Target.current(allow_none=True) or "llvm"
    if isinstance(target, str) and target.strip() == "cuda":
        return cuda_target()
    if not isinstance(target, tvm.target.Target):
        target = tvm.target.Target(target)
    if target.kind.name == "llvm" and "num-cores" not in target.attrs:
        cores = int(os.environ.get("TVM_NUM_THREADS", 0)) or os.cpu_count() or 1
        config = dict(target.export())
        config["num-cores"] = cores
        target = tvm.target.Target(config)
    return target


def kind_name(target) -> str:
    """The kind of a Target (``"llvm"``, ``"cuda"``...); a str/dict is normalized first."""
    if not isinstance(target, tvm.target.Target):
        target = normalize_target(target)
    return str(target.kind.name)


def is_llvm(target) -> bool:
    """Whether ``target`` is an llvm (CPU) target; None is not."""
    return target is not None and kind_name(target) == "llvm"


def is_gpu_target(target) -> bool:
    """Whether ``target`` runs on a GPU (its kind is one of :data:`GPU_KINDS`)."""
    return kind_name(target) in GPU_KINDS


def gpu_available(target) -> bool:
    """Whether a device for ``target`` exists on this machine."""
    try:
        return bool(tvm.device(kind_name(target), 0).exist)
    except Exception:  # pylint: disable=broad-except
        return False


def target_kind(target) -> str:
    """The cost tables of ``target``: ``"cuda"`` for NVIDIA GPU targets (kind cuda or nvptx, an
    ``nvidia/`` tag), ``"llvm"`` otherwise (str, dict or Target; None: llvm). Reads the kind
    without normalizing, so a tag or a dict costs nothing to classify."""
    if isinstance(target, str):
        name = target.split()[0] if target.split() else "llvm"
    elif isinstance(target, dict):
        name = str(target.get("kind", "llvm"))
    else:
        name = str(getattr(getattr(target, "kind", None), "name", "llvm"))
    if name.startswith("nvidia/") or name in _CUDA_KINDS:
        return "cuda"
    return "llvm"


def device_kind(target) -> str:
    """The runtime device name of a target (``"cpu"`` for llvm/c, else the target kind)."""
    kind = kind_name(target)
    return "cpu" if kind in ("llvm", "c") else kind


def target_device(target=None) -> "tvm.runtime.Device":
    """Device 0 of ``target``'s kind (:func:`device_kind`; the CPU without a target): where an
    executable built for ``target`` runs, so that a CUDA build is never run on the host."""
    return tvm.device(device_kind(target) if target is not None else "cpu", 0)
