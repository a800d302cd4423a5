"""Calibration of the analytic cost on a CUDA device: efficiencies fitted to measured kernels.

On llvm :mod:`.calibrate` measures the roof and TVM's and the native library's efficiencies in
every process (under a second). On CUDA the same needs a GPU and takes longer (each kernel is
built with nvcc), so it runs once per device, TVM version and set of library kernels and is
cached as JSON (:func:`cache_path`). Without a GPU the hand-set table
(:data:`.calibrate.EFFICIENCY` ``["cuda"]``) is used and the report says "uncalibrated".

What is measured (:func:`measure_cuda`): TVM's default CUDA build (dlight schedules, what
``trials=0`` emits) of a GEMM, a batched GEMM, two 3x3 convolutions, a stride-2 transposed
convolution and an elementwise add; the CUDA library's GEMM and convolutions on the same
shapes when they run here; the bandwidth roof from a device-to-device copy. The fit
(:func:`fit_efficiency`) inverts the roofline the cost uses, per sample:
``t = max(F / (P * e), B / W)`` gives ``e = F / (P * t)`` for a compute kernel whose time is
above its memory time ``B / W`` (a memory-bound sample says nothing about ``e`` and is dropped),
and ``t = max(F / P, B / (W * e))`` gives ``e = B / (W * t)`` for an eOperator; a kind's
efficiency is the geometric mean of its samples, clipped to ``[1e-4, 1]``.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple
import time

import numpy as np

from .. import native_cuda
from ..codegen import library as lib
from ..codegen.builder import single_function_module, tensor_var
from ..compat import relax, tvm
from ..target import target_device
from .metaschedule import default_pipeline

__all__ = ["KernelTiming", "CudaCalibration", "cache_path", "calibrate_cuda", "fit_efficiency",
           "measure_cuda", "read_recorded", "recorded_path", "workloads", "write_recorded"]

LOG = logging.getLogger(__name__)

#: Lowest efficiency a fit gives (a broken measurement must not make a kernel look free).
MIN_EFFICIENCY = 1e-4
#: Cache format; a file of another version is measured again.
CACHE_VERSION = 1


@dataclass(frozen=True)
class KernelTiming:
    """One measured kernel: its efficiency key (``"matmul"``, ``"native_conv2d"``, ``"eop"``...),
    useful FLOPs, bytes moved (inputs + output) and best seconds."""

    kind: str
    flops: float
    bytes: float
    seconds: float


@dataclass(frozen=True)
class CudaCalibration:
    """A fitted calibration: the device, the roof and the per-kind efficiencies."""

    device: str
    peak_flops: float
    bandwidth: float
    efficiency: Mapping[str, float]
    timings: Tuple[KernelTiming, ...] = ()
    #: seconds per kernel besides its roofline time (:attr:`.calibrate.Calibration.launch_s`)
    launch_s: float = 0.0


def fit_efficiency(timings: Sequence[KernelTiming], peak_flops: float,
                   bandwidth: float) -> Dict[str, float]:
    """Per kind, the fraction of the roof its kernels reach (see the module docstring):
    ``e = F / (P * t)`` for compute kernels not bound by ``B / W``, ``e = B / (W * t)`` for
    ``eop``; the geometric mean over the kind's samples, clipped to ``[1e-4, 1]``. Kinds with
    no informative sample are left out (the caller keeps its default)."""
    samples: Dict[str, List[float]] = {}
    for t in timings:
        if t.seconds <= 0 or not math.isfinite(t.seconds):
            continue
        if t.kind == "eop":
            if t.seconds <= t.flops / peak_flops:
                continue
            e = t.bytes / (bandwidth * t.seconds)
        else:
            if t.seconds <= t.bytes / bandwidth:
                continue  # memory-bound here: the time says nothing about the compute efficiency
            e = t.flops / (peak_flops * t.seconds)
        samples.setdefault(t.kind, []).append(e)
    return {kind: float(min(1.0, max(MIN_EFFICIENCY, math.exp(np.mean(np.log(v))))))
            for kind, v in samples.items()}


# -- measurement on the device ---------------------------------------------------------------

def _conv_out(size: int, k: int, stride: int, pad: int) -> int:
    return (size + 2 * pad - k) // stride + 1


def workloads(native_kinds: Sequence[str]):
    """``(kind, shapes, body, flops, bytes)`` of every kernel to time. ``body(bb, *vars)``
    builds the Relax expression; library kernels are ``call_dps_packed`` of the CUDA
    library (only the kinds in ``native_kinds``)."""

    out = []
    n = 1024
    out.append(("matmul", [(n, n), (n, n)], lambda bb, a, b: relax.op.matmul(a, b),
                2.0 * n ** 3, 4.0 * 3 * n * n))
    bt, m = 8, 256
    out.append(("batch_matmul", [(bt, m, m), (bt, m, m)], lambda bb, a, b: relax.op.matmul(a, b),
                2.0 * bt * m ** 3, 4.0 * 3 * bt * m * m))
    convs = [(1, 64, 56, 64), (1, 256, 14, 256)]  # N, C, H(=W), O; 3x3, pad 1
    for nb, c, h, o in convs:
        flops = 2.0 * nb * o * c * 9 * h * h
        moved = 4.0 * (nb * c * h * h + o * c * 9 + nb * o * h * h)
        shapes = [(nb, c, h, h), (o, c, 3, 3)]
        out.append(("conv2d", shapes, lambda bb, x, w: relax.op.nn.conv2d(x, w, padding=1),
                    flops, moved))
        if "native_conv2d" in native_kinds:
            call = lib.LibCall(lib.CUDA_CONV2D, lib.conv2d_call(
                (1, 1), (1, 1, 1, 1), (1, 1), 1, "NCHW", "OIHW").attrs)
            oshape = (nb, o, h, h)
            out.append(("native_conv2d", shapes,
                        lambda bb, x, w, call=call, oshape=oshape: lib.emit_call(call, [x, w],
                                                                                 oshape),
                        flops, moved))
    c, h, o = 64, 28, 32
    oh = (h - 1) * 2 - 2 + 4
    out.append(("conv_transpose", [(1, c, h, h), (c, o, 4, 4)],
                lambda bb, x, w: relax.op.nn.conv2d_transpose(x, w, strides=2, padding=1),
                2.0 * c * h * h * o * 16, 4.0 * (c * h * h + c * o * 16 + o * oh * oh)))
    size = 1 << 22
    out.append(("eop", [(size,), (size,)], lambda bb, a, b: relax.op.add(a, b),
                float(size), 4.0 * 3 * size))
    if "native_matmul" in native_kinds:
        call = lib.LibCall(lib.CUDA_MATMUL, lib.matmul_call().attrs)
        out.append(("native_matmul", [(n, n), (n, n)],
                    lambda bb, a, b: lib.emit_call(call, [a, b], (n, n)),
                    2.0 * n ** 3, 4.0 * 3 * n * n))
    return out


def _device_seconds(target, shapes, body, repeat: int) -> float:
    """Best seconds of a one-call Relax module built by TVM's default pipeline for ``target``
    and timed on device 0 by the VM's time evaluator (device-synchronized)."""

    names = [f"x{k}" for k in range(len(shapes))]
    mod = single_function_module([tensor_var(nm, s) for nm, s in zip(names, shapes)], body)
    ex = tvm.compile(mod, target=target, relax_pipeline=default_pipeline(target))
    dev = target_device(target)
    vm = relax.VirtualMachine(ex, dev)
    rng = np.random.default_rng(0)
    args = [tvm.runtime.tensor(rng.standard_normal(s, dtype=np.float32), dev) for s in shapes]
    timer = vm.time_evaluator("main", dev, number=10, repeat=repeat, min_repeat_ms=20)
    return float(min(timer(*args).results))


def _copy_bandwidth(target, mib: int = 256, repeat: int = 5) -> float:
    """Device memory bandwidth (bytes/s): a ``mib`` MiB device-to-device copy, read + write."""

    dev = target_device(target)
    count = mib * (1 << 20) // 4
    src = tvm.runtime.empty((count,), "float32", dev)
    dst = tvm.runtime.empty((count,), "float32", dev)
    src.copyto(dst)
    dev.sync()
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        src.copyto(dst)
        dev.sync()
        best = min(best, time.perf_counter() - t0)
    return 2.0 * count * 4 / best


def native_kinds_here() -> List[str]:
    """The library efficiency kinds whose CUDA kernel runs here (library, vendor, device)."""

    kinds = []
    if not native_cuda.kernel_error(native_cuda.MATMUL):
        kinds.append("native_matmul")
    if not native_cuda.kernel_error(native_cuda.CONV2D):
        kinds.append("native_conv2d")
    return kinds


def measure_cuda(target, native_kinds: Sequence[str], repeat: int = 3,
                 seconds_fn: Optional[Callable] = None,
                 bandwidth_fn: Optional[Callable] = None) -> Tuple[List[KernelTiming], float]:
    """The timings of :func:`workloads` on device 0 and the copy bandwidth
    (``seconds_fn(target, shapes, body, repeat)`` and ``bandwidth_fn(target)`` replace the
    device measurements). A workload that fails to build or run is left out with a warning (its
    kind keeps the default)."""
    seconds_fn = seconds_fn or _device_seconds
    timings = []
    for kind, shapes, body, flops, moved in workloads(native_kinds):
        try:
            t = seconds_fn(target, shapes, body, repeat)
        except Exception as err:  # pylint: disable=broad-except
            LOG.warning("ollie: CUDA calibration of %s %s failed: %s", kind, shapes, err)
            continue
        timings.append(KernelTiming(kind, flops, moved, t))
    return timings, (bandwidth_fn or _copy_bandwidth)(target)


# -- the cache -------------------------------------------------------------------------------

def cache_dir() -> Path:
    """``$TVM_OLLIE_CACHE_DIR``, else ``$XDG_CACHE_HOME/tvm_ollie``, else
    ``~/.cache/tvm_ollie``."""
    given = os.environ.get("TVM_OLLIE_CACHE_DIR")
    if given:
        return Path(given)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tvm_ollie"


def cache_path(device: str, tvm_version: str) -> Path:
    """The calibration file of a device (by name) and TVM version."""
    slug = re.sub(r"[^A-Za-z0-9.]+", "_", f"{device}_{tvm_version}").strip("_")
    return cache_dir() / f"cuda_calibration_{slug}.json"


def _read_cache(path: Path, native_kinds: Sequence[str]) -> Optional[CudaCalibration]:
    """The cached calibration, or None when absent, unreadable, of another format version or
    measured with another set of library kernels."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("version") != CACHE_VERSION:
            return None
        if sorted(data.get("native_kinds", [])) != sorted(native_kinds):
            return None
        return CudaCalibration(
            str(data["device"]), float(data["peak_flops"]), float(data["bandwidth"]),
            {str(k): float(v) for k, v in data["efficiency"].items()},
            tuple(KernelTiming(**t) for t in data.get("timings", [])),
            float(data.get("launch_s", 0.0)))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write_cache(path: Path, calib: CudaCalibration, native_kinds: Sequence[str]) -> None:
    """Write atomically (a concurrent reader sees the old file or the new one)."""
    data = {"version": CACHE_VERSION, "device": calib.device, "peak_flops": calib.peak_flops,
            "bandwidth": calib.bandwidth, "efficiency": dict(calib.efficiency),
            "native_kinds": sorted(native_kinds), "launch_s": calib.launch_s,
            "timings": [asdict(t) for t in calib.timings]}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True), encoding="utf-8")
        os.replace(tmp, path)
    except OSError as err:
        LOG.warning("ollie: could not write the CUDA calibration cache %s: %s", path, err)


def calibrate_cuda(target, peak_flops: float, device: str, tvm_version: str,
                   native_kinds: Sequence[str],
                   measure: Optional[Callable] = None) -> Tuple[CudaCalibration, Path, bool]:
    """The calibration of ``device``: from its cache file, else measured (``measure(target,
    native_kinds) -> (timings, bandwidth)``, default :func:`measure_cuda`), fitted and cached.
    Returns ``(calibration, cache file, from_cache)``. ``peak_flops`` is the compute roof the
    efficiencies are fractions of (the cost model's; only the ratio between kinds matters)."""
    path = cache_path(device, tvm_version)
    cached = _read_cache(path, native_kinds)
    if cached is not None:
        return cached, path, True
    timings, bandwidth = (measure or measure_cuda)(target, native_kinds)
    if not timings:
        raise RuntimeError("no calibration kernel could be built and timed")
    calib = CudaCalibration(device, float(peak_flops), float(bandwidth),
                            fit_efficiency(timings, peak_flops, bandwidth), tuple(timings))
    _write_cache(path, calib, native_kinds)
    return calib, path, False


# -- calibrations recorded in the package ------------------------------------------------------

#: Where calibrations measured on a device (by a bundle run: :mod:`tvm_ollie.bundle.calibration`)
#: are kept in the package, one file per CUDA architecture.
RECORDED_DIR = Path(__file__).resolve().parent / "recorded"


def recorded_path(arch: str) -> Path:
    """The recorded calibration file of ``arch`` (``sm_90``; ``sm_90a``, the same chip with its
    architecture-specific features, shares it)."""
    match = re.match(r"sm_(\d+)", arch)
    name = f"sm_{match.group(1)}" if match else re.sub(r"[^A-Za-z0-9]+", "_", arch)
    return RECORDED_DIR / f"cuda_{name}.json"


def read_recorded(arch: str) -> Optional[CudaCalibration]:
    """The calibration recorded for ``arch`` (None: none, or unreadable)."""
    return _read_cache(recorded_path(arch), ())


def write_recorded(calib: CudaCalibration, arch: str, path: Optional[Path] = None) -> Path:
    """Keep ``calib`` as the recorded calibration of ``arch`` (or at ``path``)."""
    path = Path(path) if path is not None else recorded_path(arch)
    _write_cache(path, calib, ())
    return path
