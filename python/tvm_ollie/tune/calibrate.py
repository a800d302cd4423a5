"""Calibration of the analytic roofline cost for a target.

The derivation engine's cost (:mod:`tvm_ollie.derive.cost`) is a roofline: each stage takes
``max(flops / peak, bytes / bandwidth)``. Two things make it a usable decision rule for a pass:

* the roof itself: on ``llvm`` it is measured once per process on this machine with a numpy
  micro-benchmark (a float32 GEMM through the BLAS for the compute roof, a large array copy for
  the bandwidth); on ``cuda`` the engine's defaults (an H100/H200-class GPU) are used, since the
  machine that compiles need not have the GPU;
* how close TVM's generated kernels get to it without tuning, per kind of kernel: this is the
  fraction of the roof in :data:`EFFICIENCY` (defaults), replaced on llvm by a measurement of
  TVM's own untuned build of a GEMM, a convolution and a transposed convolution here
  (:func:`measure_tvm_efficiency`). It is what makes the *original* operator
  comparable with a derived program: on a GPU dlight has a tuned rule for matmul but schedules a
  direct convolution with its generic fallback, and on a CPU an untuned GEMM loop nest
  vectorizes better than a seven-deep convolution nest. The numbers are the order of
  magnitude measured with TVM 0.27 on the development machines (see the pass benchmark,
  ``python -m tvm_ollie.bench.pass_bench``); the decision only needs them to rank kernels;
* how close the native library's kernels get (``native_matmul``, ``native_conv2d``,
  ``native_conv_transpose``, ``native_g2bmm``, ``native_gbmm``): measured here, once per
  process, by timing the library itself on a GEMM, a convolution, a transposed convolution and
  the two banded matmuls (:func:`measure_native_efficiency`), so that ``trials=0`` ranks what
  the library does.

On ``cuda`` with a GPU present the efficiencies (TVM's dlight kernels and the CUDA library's)
and the bandwidth roof are fitted to kernels timed on the device, once per device and cached
on disk (:mod:`.cuda_calibration`; ``TVM_OLLIE_CUDA_CALIBRATE=0`` turns it off). Without a GPU
the calibration recorded in the package for the target's architecture is used (measured on
such a device by a bundle run: :mod:`tvm_ollie.bundle.calibration`, ``tune/recorded/``), else
the hand-set ``EFFICIENCY["cuda"]`` row and :meth:`Calibration.describe` says "uncalibrated".
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import os
import sys
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Dict, Mapping, Optional, Tuple

import numpy as np
import tvm_ffi

from .. import compat, native, native_cuda
from .. import target as target_module
from ..codegen import builder
from ..codegen import library as lib
from ..codegen.builder import tensor_var
from ..compat import relax, tvm
from ..derive.cost import TARGET_DEFAULTS
from ..target import gpu_available, normalize_target, target_device, target_kind  # noqa: F401  (re-exported: tune.calibrate.target_kind)
from . import cpu_schedule, metaschedule
from . import cuda_calibration as cc
from .cpu_schedule import ENV_SWITCH as CPU_SCHEDULE_ENV
from .machine import machine_key, source_version
from .metaschedule import default_pipeline
from .records import MachineStore
from .spread_timing import spread_best

LOG = logging.getLogger(__name__)

__all__ = ["CUDA_LIBRARY_EFFICIENCY", "Calibration", "EFFICIENCY", "calibrate",
           "measure_cpu_roofline", "measure_native_efficiency", "measure_tvm_efficiency",
           "target_kind"]

#: Fraction of the compute roof reached by untuned TVM kernels, per target kind and stage kind
#: (``eop`` is a memory-bound eOperator: its fraction applies to the bandwidth roof).
EFFICIENCY: Dict[str, Dict[str, float]] = {
    # Hand-set (uncalibrated): used on CUDA where no GPU is here to fit them
    # (:mod:`.cuda_calibration`).
    "cuda": {"matmul": 0.6, "batch_matmul": 0.5, "conv2d": 0.05, "conv_transpose": 0.04,
             "g2bmm": 0.1, "gbmm": 0.1, "tir": 0.05, "eop": 0.6},
    # Untuned TVM on a CPU: no schedule at all, so a GEMM loop nest is no faster than a direct
    # convolution (measured: conv3x3 1x512x7x7 118 ms direct vs 139 ms im2col+GEMM); only a
    # derivation that removes work (e.g. a strided transposed convolution) wins here.
    "llvm": {"matmul": 0.15, "batch_matmul": 0.15, "conv2d": 0.15, "conv_transpose": 0.15,
             "g2bmm": 0.1, "gbmm": 0.1, "tir": 0.1, "eop": 0.5},
}

#: Hand-set efficiencies of the CUDA library's kernels (cuBLAS, cuDNN), the starting point of a
#: CUDA calibration: they are offered only where a GPU is present, which is also where the
#: calibration replaces these by fitted values (they remain if those kernels fail to time).
CUDA_LIBRARY_EFFICIENCY: Dict[str, float] = {"native_matmul": 0.7, "native_conv2d": 0.5}


@dataclass(frozen=True)
class Calibration:
    """Roof and per-kind efficiencies of one target kind.

    Attributes
    ----------
    kind : str
        ``"llvm"`` or ``"cuda"`` (the row of :data:`EFFICIENCY` used).
    peak_flops, bandwidth : float
        The compute roof (FLOP/s) and memory roof (bytes/s).
    efficiency : dict
        Fraction of the roof per stage kind (see :data:`EFFICIENCY`).
    source : str
        Where the roof and efficiencies came from (``"measured"``, ``"default"``, ``"given"``,
        ``"calibrated"``).
    note : str
        A word on the source (the device calibrated on and the cache file, or why not).
    launch_s : float
        Seconds every kernel costs besides its roofline time (a GPU's launch and the wait for
        the kernel before it; fitted from a device run, :mod:`tvm_ollie.bundle.calibration`;
        0 on CPUs, where a kernel is a function call): a derived program of many small stages
        pays it per stage.
    """

    kind: str
    peak_flops: float
    bandwidth: float
    efficiency: Mapping[str, float] = field(default_factory=dict)
    source: str = "default"
    note: str = ""
    launch_s: float = 0.0

    def describe(self) -> str:
        """One line for reports: the target kind, where the numbers came from and why."""
        what = {"measured": "measured on this machine", "given": "roof given by the caller",
                "calibrated": "calibrated on the device",
                "recorded": "calibrated by a recorded device run",
                "default": "uncalibrated (hand-set efficiencies)"}.get(self.source, self.source)
        return f"{self.kind} {what}" + (f": {self.note}" if self.note else "")

    def eff(self, kind: str) -> float:
        """The efficiency of a stage kind (the generic ``tir`` value if unknown)."""
        return float(self.efficiency.get(kind, self.efficiency.get("tir", 0.1)))

    def with_roof(self, peak_flops: float, bandwidth: float) -> "Calibration":
        """The same efficiencies under another roof."""
        return replace(self, peak_flops=float(peak_flops), bandwidth=float(bandwidth),
                       source="given")


def _best_time(fn, repeat: int) -> float:
    """Fastest of ``repeat`` runs: the roof is what the machine can reach, not its load."""
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.min(times))


#: The names OpenBLAS builds give the call that sets its thread count (numpy's wheels bundle
#: ``scipy_openblas64``), in the order tried.
_OPENBLAS_SET_THREADS = ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads",
                         "openblas_set_num_threads64_", "openblas_set_num_threads")


def _openblas_thread_setter():
    """The loaded OpenBLAS's ``set_num_threads`` and ``get_num_threads`` (ctypes), numpy's own
    first (``numpy.libs``), or None (another BLAS, or no ``/proc/self/maps`` to find it in)."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as fh:
            found = {line.split()[-1] for line in fh
                     if "openblas" in os.path.basename(line.split()[-1]).lower()
                     and ".so" in line.split()[-1]}
    except OSError:
        return None
    numpy_dir = os.path.dirname(os.path.abspath(np.__file__))
    paths = sorted(found, key=lambda p: (not p.startswith(numpy_dir), p))
    for path in paths:
        try:
            blas = ctypes.CDLL(path)
        except OSError:
            continue
        for name in _OPENBLAS_SET_THREADS:
            getter = name.replace("set_num_threads", "get_num_threads")
            if hasattr(blas, name) and hasattr(blas, getter):
                return getattr(blas, name), getattr(blas, getter)
    return None


@contextlib.contextmanager
def _one_blas_thread():
    """Run numpy's BLAS on one thread inside (restored on exit); yields whether it could."""
    found = _openblas_thread_setter()
    if found is None:
        yield False
        return
    set_threads, get_threads = found
    before = int(get_threads())
    set_threads(1)
    try:
        yield True
    finally:
        set_threads(before)


def kernel_threads() -> int:
    """The threads the compiled kernels run with: ``TVM_NUM_THREADS``, else the CPUs this
    process may run on."""
    try:
        threads = int(os.environ.get("TVM_NUM_THREADS", "0") or 0)
    except ValueError:
        threads = 0
    if threads > 0:
        return threads
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


@functools.lru_cache(maxsize=1)
def measure_cpu_roofline(n: int = 384, mib: int = 64, repeat: int = 5) -> tuple:
    """``(peak FLOP/s, bytes/s)`` of this CPU: an ``n``-cube float32 GEMM and a ``mib`` copy.

    The compute roof is the GEMM on one BLAS thread times :func:`kernel_threads` (where the
    BLAS is OpenBLAS, numpy's; another BLAS runs it on its own threads). Why: numpy's OpenBLAS
    on two threads of the shared 2-core machine ran the GEMM at 3.5-7 GFLOP/s in some processes
    and at 100-160 in others (the same code, the same minute), while on one thread it ran at
    93-96 in every process; a roof 30x too low capped every measured efficiency at 1 (the
    library's GEMM and convolution looked as fast as the roof) and moved every estimate, the
    search bounds and the decisions with it. The one-thread rate times the threads is a roof
    the kernels cannot pass (they run on that many threads), so no measured efficiency is
    capped by it.

    Cached per process: it takes well under a second and the roof does not change.
    """
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    with _one_blas_thread() as single:
        # (on one thread by its CPU clock, spread over rounds, :func:`_spread_native`: five
        # calls in a row drew 76-167 GFLOP/s in fresh processes at load 4-7)
        gemm = spread_best({"gemm": lambda: a @ b}, rounds=repeat, repeat=1,
                           clock=time.thread_time if single else time.perf_counter)["gemm"]
        peak = 2.0 * n ** 3 / max(gemm, 1e-9)
    if single:
        peak *= kernel_threads()
    src = np.ones(mib * (1 << 20) // 4, dtype=np.float32)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    bandwidth = 2.0 * src.nbytes / max(_best_time(lambda: np.copyto(dst, src), repeat), 1e-9)
    return float(peak), float(bandwidth)


@contextlib.contextmanager
def _native_threads(count: int):
    """The native kernels (and TVM's parallel loops, on their OpenMP threads) on ``count``
    threads inside (restored on exit)."""
    before = native.get_num_threads()
    native.set_num_threads(count)
    try:
        yield
    finally:
        native.set_num_threads(before)


def _spread_native(calls: Mapping[str, Callable[[], object]]) -> Dict[str, float]:
    """``{name: seconds}`` of kernel ``calls`` on one thread, by the calling thread's CPU
    clock, the kernels timed in turns over rounds (:func:`~.spread_timing.spread_best`).

    Why one thread and its CPU clock: it is the only time of a call on the shared 2-core
    machine that does not depend on what else runs. On two threads a call waits for its
    second thread whenever another process holds that core (4-60 ms instead of 0.1-3 ms: the
    low mode, docs/compile-time.md), and even on one thread the wall time of a 1-3 ms call
    includes the slices another process took from it (the library convolution's best of five
    one-thread calls: 10.9 and 14.5 ms in two of five fresh processes at load 4, nice 19,
    2.9-3.2 ms in the others; docs/compile-time.md, cold13's section). Which kernel drew which mode set the kinds' ratio, and with it the searches'
    bounds and stops. A kernel on one thread runs on the calling thread (OpenMP's team of
    one; TVM's parallel loops run on those threads, :mod:`tvm_ollie.native`), so the calling
    thread's CPU seconds are the call's own. The roof is one thread's times the threads
    (:func:`measure_cpu_roofline`), so these one-thread rates over it are the efficiencies
    at the kernels' threads under the roof's own assumption: the threads scale every kind
    alike."""
    if not native.load():
        return spread_best(calls)
    # (TVM's kernels on TVM's own pool, TVM_OLLIE_PARALLEL_RUNTIME=tvm, run on its workers:
    # not on the calling thread, so by the wall clock)
    own = native.get_parallel_runtime() == "openmp"
    with _native_threads(1):
        return spread_best(calls, clock=time.thread_time if own else time.perf_counter)


def _native_call(func_name: str, attrs: str, arrays, out_shape) -> Callable[[], object]:
    """One native kernel call on float32 ``arrays`` (DPS: output last), operands bound."""
    func = tvm_ffi.get_global_func(func_name)
    args = [tvm.runtime.tensor(a) for a in arrays]
    out = tvm.runtime.tensor(np.zeros(out_shape, dtype="float32"))
    return lambda: func(attrs, *args, out)


@functools.lru_cache(maxsize=1)
def measure_native_efficiency() -> Dict[str, float]:
    """Fraction of this CPU's compute roof the native kernels reach: ``native_matmul`` on a
    384-cube GEMM, ``native_conv2d`` on a 3x3 convolution 1x64x56x56 -> 64 (ResNet's first
    stage), ``native_conv_transpose`` on a stride-2 4x4 transposed convolution, ``native_g2bmm``
    and ``native_gbmm`` on a dilated band (when the library has those kernels), all timed
    together, in rounds (:func:`_spread_native`). Empty when the native library is not loaded.
    Cached per process."""

    if not native.load():
        return {}
    peak, _ = measure_cpu_roofline()
    cases = _native_cases(np.random.default_rng(0))
    seconds = _spread_native({kind: call for kind, (call, _) in cases.items()})
    return {kind: min(1.0, flops / seconds[kind] / peak) for kind, (_, flops) in cases.items()}


def _native_cases(rng) -> Dict[str, Tuple[Callable[[], object], float]]:
    """``{kind: (call, flops)}`` of the calibration's native kernels (the library's own)."""
    n = 384
    a, b = (rng.standard_normal((n, n), dtype=np.float32) for _ in range(2))
    cases = {"native_matmul": (_native_call(lib.MATMUL, "ta=0;tb=0", (a, b), (n, n)),
                               2.0 * n ** 3)}
    x = rng.standard_normal((1, 64, 56, 56), dtype=np.float32)
    w = rng.standard_normal((64, 64, 3, 3), dtype=np.float32)
    conv = lib.conv2d_call((1, 1), (1, 1, 1, 1), (1, 1), 1, "NCHW", "OIHW")
    cases["native_conv2d"] = (_native_call(lib.CONV2D, conv.text(), (x, w), (1, 64, 56, 56)),
                              2.0 * 64 * 64 * 9 * 56 * 56)
    if native.provides(lib.CONV2D_TRANSPOSE):  # an older build of the library lacks it
        cases["native_conv_transpose"] = _native_conv_transpose_case(rng)
    cases.update(_native_band_cases(rng))
    return cases


def _native_band_cases(rng) -> Dict[str, Tuple[Callable[[], object], float]]:
    """``native_g2bmm``/``native_gbmm``: the banded kernels on 4 bands of 256 rows, 64 columns,
    width 16 and dilation 2, in the operators' FLOPs (``2 * batch * L * (2W + 1) * K``; the
    kernels also compute part of the GEMM blocks outside the band, which this efficiency
    absorbs). Only the kernels the loaded library has."""

    batch, length, cols, width, dil = 4, 256, 64, 16, 2
    window = 2 * width + 1
    flops = 2.0 * batch * length * window * cols
    text = lib.band_call("g2bmm", width, dil).text()
    a, b = (rng.standard_normal((batch, length, cols), dtype=np.float32) for _ in range(2))
    s = rng.standard_normal((batch, length, window), dtype=np.float32)
    cases = {"g2bmm": ((a, b), (batch, length, window)), "gbmm": ((s, b), (batch, length, cols))}
    return {f"native_{kind}": (_native_call(lib.BAND_KERNELS[kind], text, arrays, out_shape),
                               flops)
            for kind, (arrays, out_shape) in cases.items()
            if native.provides(lib.BAND_KERNELS[kind])}


def _native_conv_transpose_case(rng) -> Tuple[Callable[[], object], float]:
    """``native_conv_transpose``: the stride-2 4x4 transposed convolution 1x32x14x14 -> 32 that
    :func:`measure_tvm_efficiency` times TVM on, counted in the same useful FLOPs."""

    x = rng.standard_normal((1, 32, 14, 14), dtype=np.float32)
    w = rng.standard_normal((32, 32, 4, 4), dtype=np.float32)
    call = lib.conv2d_transpose_call((2, 2), (1, 1, 1, 1), (0, 0), (1, 1), 1)
    return (_native_call(lib.CONV2D_TRANSPOSE, call.text(), (x, w), (1, 32, 28, 28)),
            2.0 * 32 * 32 * 16 * 14 * 14)


def _tvm_seconds(build_body, shapes, target, repeat: int) -> float:
    """Best seconds of a one-call Relax module built by TVM's default pipeline (untuned), on
    ``target``'s device (a GPU call ends with a synchronization)."""
    return _tvm_seconds_of({"main": (build_body, shapes)}, target, repeat)["main"]


def _tvm_seconds_of(cases: Mapping[str, tuple], target, repeat: int) -> Dict[str, float]:
    """``{name: best seconds}`` of ``cases`` (``{name: (build_body, shapes)}``), one Relax
    function each, all built in one module by TVM's default pipeline (untuned): one build
    instead of one per case (each build of these one-kernel modules cost 0.2-0.4 s of fixed
    work); on a CPU the functions timed in turns, in rounds (:func:`_spread_native`), on a GPU
    each alone (a call ends with a synchronization)."""
    bb = relax.BlockBuilder()
    for name, (build_body, shapes) in cases.items():
        params = [tensor_var(f"x{k}", s) for k, s in enumerate(shapes)]
        with bb.function(name, params):
            with bb.dataflow():
                out = bb.emit_output(build_body(bb, *params))
            bb.emit_func_output(out)
    ex = tvm.compile(bb.get(), target=target, relax_pipeline=default_pipeline(target))
    dev = target_device(target)
    vm = relax.VirtualMachine(ex, dev)
    on_cpu = dev.dlpack_device_type() == tvm.cpu(0).dlpack_device_type()
    rng = np.random.default_rng(0)
    calls = {}
    for name, (_, shapes) in cases.items():
        func = vm[name]
        args = [tvm.runtime.tensor(rng.standard_normal(s, dtype=np.float32), dev)
                for s in shapes]
        calls[name] = functools.partial(func, *args)
    if on_cpu:  # (their parallel loops run on the library's threads, native.py)
        return _spread_native(calls)
    out = {}
    for name, call in calls.items():
        call()
        out[name] = _best_time(lambda c=call: (c(), dev.sync()), repeat)
    return out


#: measured untuned-TVM efficiencies per target (``str(target)``)
_TVM_EFFICIENCY: Dict[str, Dict[str, float]] = {}


def _measure_tvm_efficiency(target, repeat: int) -> Dict[str, float]:
    peak, _ = measure_cpu_roofline()
    n = 128
    conv = ((1, 32, 28, 28), (32, 32, 3, 3))
    convt = ((1, 32, 14, 14), (32, 32, 4, 4))
    t = _tvm_seconds_of({
        "matmul": (lambda bb, a, b: relax.op.matmul(a, b), [(n, n), (n, n)]),
        "conv2d": (lambda bb, x, w: relax.op.nn.conv2d(x, w, padding=1), conv),
        "conv_transpose": (lambda bb, x, w: relax.op.nn.conv2d_transpose(
            x, w, strides=2, padding=1), convt)}, target, repeat)
    conv_flops = 2.0 * 32 * 32 * 9 * 28 * 28
    convt_flops = 2.0 * 32 * 32 * 16 * 14 * 14  # useful work: each input point times a kernel
    eff = {"matmul": 2.0 * n ** 3 / t["matmul"] / peak,
           "conv2d": conv_flops / t["conv2d"] / peak,
           "conv_transpose": convt_flops / t["conv_transpose"] / peak}
    eff["batch_matmul"] = eff["matmul"]
    return {k: float(min(1.0, v)) for k, v in eff.items()}


def measure_tvm_efficiency(target, repeat: int = 3) -> Dict[str, float]:
    """Fraction of this CPU's compute roof TVM's untuned build reaches (``matmul``,
    ``batch_matmul``, ``conv2d``, ``conv_transpose``): a 128-cube GEMM, a 3x3 convolution
    1x32x28x28 -> 32 and a stride-2 4x4 transposed convolution 1x32x14x14 -> 32, built with
    the pipeline the pass builds with. Cached per process and target."""

    tgt = normalize_target(target)
    key = str(tgt)
    if key not in _TVM_EFFICIENCY:
        _TVM_EFFICIENCY[key] = _measure_tvm_efficiency(tgt, repeat)
    return dict(_TVM_EFFICIENCY[key])


def calibrate(target, peak_flops: Optional[float] = None,
              bandwidth: Optional[float] = None, cache: bool = False) -> Calibration:
    """The calibration of ``target``: measured roof on llvm, defaults on cuda.

    ``peak_flops``/``bandwidth`` override the roof (tests use this for reproducible decisions).
    ``cache``: on llvm, read the measurement back from the per-user cache when this machine,
    its threads, the target, TVM, the native library and the code measured it before
    (:class:`~.records.MachineStore`), and store a new one there: the decisions of a later
    compile then rank the alternatives by the same numbers (the shortlist, the checks and the
    timings it asks for are the same), and it measures nothing.
    """
    kind = target_kind(target)
    eff = dict(EFFICIENCY[kind])
    if peak_flops is not None and bandwidth is not None:
        return Calibration(kind, float(peak_flops), float(bandwidth), eff, "given")
    if kind != "llvm":
        return _cuda_calibration(target, eff, peak_flops, bandwidth)
    peak, bw, measured, note = _cpu_calibration(target, cache)
    eff.update(measured)
    return Calibration(kind, float(peak_flops or peak), float(bandwidth or bw), eff, "measured",
                       note)


def _cpu_calibration(target, cache: bool) -> Tuple[float, float, Dict[str, float], str]:
    """``(peak, bandwidth, efficiencies, note)`` measured here, or read back (module docs)."""
    tgt = normalize_target(target)
    store = MachineStore.for_run(tgt, "calibration", cache, machine=_calibration_key(tgt))
    stored = store.get("llvm", _stored_roof) if store is not None else None
    if stored is not None:
        return (*stored, "read from the per-machine cache")
    peak, bw = measure_cpu_roofline()
    eff = {**measure_tvm_efficiency(tgt), **measure_native_efficiency()}
    if store is not None:
        store.put("llvm", {"peak_flops": peak, "bandwidth": bw, "efficiency": eff})
    return peak, bw, eff, ""


def _calibration_key(target) -> str:
    """The per-machine key of the CPU calibration: :func:`~.machine.machine_key` with the code
    part the sources of what it runs (this module, the builder of its modules, the pipeline
    they are built with, the native library's calls and loader) and the CPU schedules'
    switch. Why not every source of the package: the calibration was measured again after
    any change anywhere (2-5 s of every first build after an edit or an update)."""
    code = source_version([sys.modules[__name__], builder, compat, cpu_schedule, lib,
                           metaschedule, native, target_module])
    return machine_key(target, f"cpu_schedule={os.environ.get(CPU_SCHEDULE_ENV, '')}", code)


def _stored_roof(value) -> Tuple[float, float, Dict[str, float]]:
    """``(peak, bandwidth, efficiencies)`` of a stored calibration (raises when malformed)."""
    eff = {str(k): float(v) for k, v in dict(value["efficiency"]).items()}
    peak, bw = float(value["peak_flops"]), float(value["bandwidth"])
    if not all(x > 0 for x in (peak, bw, *eff.values())):
        raise ValueError("a roof or an efficiency is not positive")
    return peak, bw, eff


def _device_label(target) -> str:
    """The name and compute capability of device 0 of ``target`` (the calibration's key)."""

    dev = target_device(target)
    return f"{dev.device_name} sm_{str(dev.compute_version).replace('.', '')}"


#: CUDA calibrations of this process, by target
_CUDA: Dict[str, Calibration] = {}


def _cuda_calibration(target, eff: Dict[str, float], peak_flops: Optional[float],
                      bandwidth: Optional[float]) -> Calibration:
    """The fitted calibration of the GPU here (cached per process and on disk), or the
    hand-set table, "uncalibrated", with the reason."""

    peak, bw = TARGET_DEFAULTS["cuda"]
    peak, bw = float(peak_flops or peak), float(bandwidth or bw)
    tgt = normalize_target(target)
    if os.environ.get("TVM_OLLIE_CUDA_CALIBRATE", "1") in ("0", "off", "false"):
        return Calibration("cuda", peak, bw, eff, "default", "TVM_OLLIE_CUDA_CALIBRATE=0")
    if native_cuda.assumed():  # (the library's kernels are offered: their efficiencies)
        eff = {**CUDA_LIBRARY_EFFICIENCY, **eff}
    if not gpu_available(tgt):
        arch = str(tgt.attrs.get("arch", ""))
        recorded = cc.read_recorded(arch)
        if recorded is None:
            return Calibration("cuda", peak, bw, eff, "default", "no CUDA device here")
        note = (f"measured on {recorded.device} by a device bundle run (no CUDA device here; "
                f"{cc.recorded_path(arch).name})")
        return Calibration("cuda", peak, float(bandwidth or recorded.bandwidth),
                           {**eff, **recorded.efficiency}, "recorded", note, recorded.launch_s)
    key = str(tgt)
    eff = {**CUDA_LIBRARY_EFFICIENCY, **eff}
    if key not in _CUDA:
        device = _device_label(tgt)
        try:
            fit, path, cached = cc.calibrate_cuda(tgt, peak, device, tvm.__version__,
                                                  cc.native_kinds_here())
        except Exception as err:  # pylint: disable=broad-except
            LOG.warning("ollie: CUDA calibration failed (%s); using the hand-set efficiencies",
                        err)
            return Calibration("cuda", peak, bw, eff, "default", f"calibration failed: {err}")
        eff = {**eff, **fit.efficiency}
        note = f"{device}, {'read from' if cached else 'written to'} {path}"
        _CUDA[key] = Calibration("cuda", peak, float(bandwidth or fit.bandwidth), eff,
                                 "calibrated", note)
    return _CUDA[key]
