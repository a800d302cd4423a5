"""Loading the native kernel library (``libtvm_ollie_native.so``).

The library holds vendor-library kernels (oneDNN, OpenBLAS) registered as tvm-ffi global
functions in destination-passing style, so a Relax module calls them with
``relax.call_dps_packed(MATMUL, (attrs, a, b, ...), out_ty)``. Its functions exist only after
:func:`load` has run in the process (``import tvm_ollie`` does that).

The interface of the kernels (attribute strings, argument order) is documented in
``docs/native-library.md``.

Environment variables:

* ``TVM_OLLIE_NATIVE_LIB``: path of the library to load (before the usual locations);
* ``TVM_OLLIE_DISABLE_NATIVE=1``: do not load it (:func:`available` is then False);
* ``TVM_NUM_THREADS``: thread count of the kernels, as for TVM's own thread pool (default: the
  number of cores available to the process);
* ``TVM_OLLIE_SERIAL_FLOPS``: a oneDNN kernel call of less work (floating-point operations)
  runs on the calling thread alone, without entering an OpenMP region (default
  :data:`DEFAULT_SERIAL_FLOPS`; 0: never), see :func:`set_serial_flops` and docs/per-call.md;
* ``TVM_OLLIE_PARALLEL_RUNTIME``: where the parallel loops of TVM's CPU kernels run in this
  process, ``openmp`` (the OpenMP pool of the native kernels: one pool for both; the default,
  :data:`DEFAULT_PARALLEL_RUNTIME`) or ``tvm`` (TVM's own thread pool), see
  :func:`set_parallel_runtime` and docs/threads.md;
* ``TVM_OLLIE_OPENMP_CHECK=0``: no warning when the process holds two OpenMP runtimes
  (:mod:`tvm_ollie.native_openmp`);
* ``TVM_OLLIE_STALL_FALLBACK=0``: no stall fallback (parallel calls stay parallel after one
  waited for a descheduled worker), see :func:`stall_stats` and docs/threads.md.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import sys
from typing import Dict, Iterator, List, Optional, Tuple

from . import native_openmp
from .library_loader import LibraryLoader, LoadState, candidate_paths, disabled, find_dist_file

__all__ = [
    "MATMUL",
    "CONV2D",
    "CONV2D_TRANSPOSE",
    "G2BMM",
    "GBMM",
    "INFO",
    "SET_NUM_THREADS",
    "GET_NUM_THREADS",
    "CACHE_STATS",
    "SET_SERIAL_FLOPS",
    "GET_SERIAL_FLOPS",
    "DEFAULT_SERIAL_FLOPS",
    "CONV2D_PACKED_SIZE",
    "CONV2D_PACK_WEIGHT",
    "MATMUL_PACKED_SIZE",
    "MATMUL_PACK_WEIGHT",
    "CONV2D_PREFERRED_FORMAT",
    "CONV2D_INT8",
    "MATMUL_INT8",
    "INT8_EXACT_PRODUCTS",
    "CONV2D_INT8_PACKED_SIZE",
    "CONV2D_INT8_PACK_WEIGHT",
    "LIBRARY_NAME",
    "load",
    "available",
    "unavailable_reason",
    "library_path",
    "library_files",
    "set_num_threads",
    "get_num_threads",
    "set_serial_flops",
    "get_serial_flops",
    "info",
    "conv2d_packed_size",
    "conv2d_preferred_format",
    "provides",
    "takes_activation",
    "int8_exact_products",
    "DEFAULT_PARALLEL_RUNTIME",
    "set_parallel_runtime",
    "get_parallel_runtime",
    "parallel_runtime",
    "parallel_stats",
    "STALL_STATS",
    "SET_STALL_FALLBACK",
    "HOLD_SERIAL",
    "IS_STALL",
    "IS_STALL_FOR_WORK",
    "stall_stats",
    "set_stall_fallback",
    "hold_serial",
]

#: Global function names (tvm-ffi) registered by the library.
MATMUL = "tvm_ollie.cpu.matmul"
CONV2D = "tvm_ollie.cpu.conv2d"
CONV2D_TRANSPOSE = "tvm_ollie.cpu.conv2d_transpose"
#: The banded batched matmuls (dilated sliding-window attention), see docs/native-library.md.
G2BMM = "tvm_ollie.cpu.g2bmm"
GBMM = "tvm_ollie.cpu.gbmm"
INFO = "tvm_ollie.cpu.info"
SET_NUM_THREADS = "tvm_ollie.cpu.set_num_threads"
GET_NUM_THREADS = "tvm_ollie.cpu.get_num_threads"
CACHE_STATS = "tvm_ollie.cpu.cache_stats"
SET_SERIAL_FLOPS = "tvm_ollie.cpu.set_serial_flops"
GET_SERIAL_FLOPS = "tvm_ollie.cpu.get_serial_flops"
#: Where TVM's CPU kernels run their parallel loops (docs/threads.md, "One pool").
SET_PARALLEL_RUNTIME = "tvm_ollie.cpu.set_parallel_runtime"
GET_PARALLEL_RUNTIME = "tvm_ollie.cpu.get_parallel_runtime"
PARALLEL_STATS = "tvm_ollie.cpu.parallel_stats"
#: The stall fallback (``tvm_ollie/stall.cc``): a parallel call far slower than its call site's
#: fastest waited for a worker that was not on a core (other processes hold the cores), and
#: parallel calls then run on the calling thread for a while (docs/threads.md, "Stalled workers").
STALL_STATS = "tvm_ollie.cpu.stall_stats"
SET_STALL_FALLBACK = "tvm_ollie.cpu.set_stall_fallback"
HOLD_SERIAL = "tvm_ollie.cpu.hold_serial"
IS_STALL = "tvm_ollie.cpu.is_stall"
#: ``is_stall``, or a call of known work slower than any core runs it (its first runs too).
IS_STALL_FOR_WORK = "tvm_ollie.cpu.is_stall_for_work"
#: The parallel runtime set when the library loads, unless ``TVM_OLLIE_PARALLEL_RUNTIME`` says
#: otherwise: ``"openmp"`` runs TVM's parallel loops on the OpenMP threads of the oneDNN kernels,
#: so that a model mixing both has one pool of threads (docs/threads.md, "One pool").
DEFAULT_PARALLEL_RUNTIME = "openmp"
PARALLEL_RUNTIMES = ("openmp", "tvm")

#: The library's default of ``TVM_OLLIE_SERIAL_FLOPS`` (``kDefaultSerialFlops`` in common.h):
#: below this many floating-point operations a kernel call wakes no OpenMP worker. Waking the
#: workers and joining them costs microseconds per parallel region (and a blocked oneDNN conv
#: opens several: its reorders and the conv), more than a second thread saves on such a call.
#: docs/per-call.md has the measurement.
DEFAULT_SERIAL_FLOPS = 1_000_000
#: Optional weight prepacking for conv2d (see docs/native-library.md): size query and DPS packer.
CONV2D_PACKED_SIZE = "tvm_ollie.cpu.conv2d_packed_size"
CONV2D_PACK_WEIGHT = "tvm_ollie.cpu.conv2d_pack_weight"
#: The float matmul's constant ``B`` packed once into oneDNN's format, for calls with
#: ``wpacked=1`` (:mod:`tvm_ollie.transform.matmul_pack`): size query and DPS packer.
MATMUL_PACKED_SIZE = "tvm_ollie.cpu.matmul_packed_size"
MATMUL_PACK_WEIGHT = "tvm_ollie.cpu.matmul_pack_weight"
#: The activation formats oneDNN prefers for a conv (``src_fmt``/``dst_fmt`` values: nchw, nhwc,
#: nChw{B}c; docs/layouts.md).
CONV2D_PREFERRED_FORMAT = "tvm_ollie.cpu.conv2d_preferred_format"
#: 8-bit integer convolution and matmul (oneDNN int8), see docs/native-library.md; and whether
#: their u8 x s8 products are exact on this CPU (VNNI) or only for weights in [-64, 63].
CONV2D_INT8 = "tvm_ollie.cpu.conv2d_int8"
MATMUL_INT8 = "tvm_ollie.cpu.matmul_int8"
INT8_EXACT_PRODUCTS = "tvm_ollie.cpu.int8_exact_products"
#: The int8 convolution's weights packed once into oneDNN's blocked format (with the source zero
#: point's compensation), for calls with ``wpacked=1``.
CONV2D_INT8_PACKED_SIZE = "tvm_ollie.cpu.conv2d_int8_packed_size"
CONV2D_INT8_PACK_WEIGHT = "tvm_ollie.cpu.conv2d_int8_pack_weight"

LIBRARY_NAME = "libtvm_ollie_native.so"

#: GNU OpenMP's waiting policy, applied when this module is imported (before TVM loads a
#: libgomp: :func:`_default_omp_wait_policy`), unless the user set ``OMP_WAIT_POLICY``: None
#: keeps GNU OpenMP's own (spin a while after a parallel region, then sleep). With one pool
#: (TVM's parallel loops on OpenMP, the default :data:`DEFAULT_PARALLEL_RUNTIME`) every TVM
#: kernel opens a parallel region, and sleeping workers woke for each: ``PASSIVE`` ran Candy
#: quick in 4.5-4.8 ms against 1.67 ms on a quiet machine (docs/threads.md, "One pool").
DEFAULT_OMP_WAIT_POLICY: Optional[str] = None
#: The policy when TVM's own pool runs TVM's kernels (``TVM_OLLIE_PARALLEL_RUNTIME=tvm``): two
#: pools take turns on the cores, and OpenMP's spinning workers starved TVM's (docs/threads.md,
#: "Two pools in one call").
TWO_POOLS_OMP_WAIT_POLICY = "PASSIVE"

_LOG = logging.getLogger(__name__)
_HANDLES: List[ctypes.CDLL] = []  # keep the libraries loaded
_PARALLEL_RUNTIME_SET: List[str] = []  # the runtime once set (by the default or the user)


def _default_omp_wait_policy() -> None:
    """``OMP_WAIT_POLICY`` = :data:`DEFAULT_OMP_WAIT_POLICY` (:data:`TWO_POOLS_OMP_WAIT_POLICY`
    with ``TVM_OLLIE_PARALLEL_RUNTIME=tvm``) unless the user set it (or
    ``TVM_OLLIE_OMP_WAIT_POLICY`` says otherwise). libgomp reads it once, when it initializes,
    and ``import tvm`` already loads one (torch's, in this environment): setting it when the
    library loads (:func:`_open`) was too late in every process that imported TVM first, i.e.
    all of them, and the native calls ran under GNU OpenMP's default policy. So it is set when
    this module is imported, which ``import tvm_ollie`` does before anything imports TVM. Seen
    as oneDNN int8 calls of 12 us taking 4-48 ms (the scheduler's tick) with two threads beside
    TVM's pool on the loaded 2-core machine (:mod:`tvm_ollie.transform.int8_choice`)."""
    two_pools = os.environ.get("TVM_OLLIE_PARALLEL_RUNTIME") == "tvm"
    default = TWO_POOLS_OMP_WAIT_POLICY if two_pools else DEFAULT_OMP_WAIT_POLICY
    policy = os.environ.get("TVM_OLLIE_OMP_WAIT_POLICY", default or "unset")
    if policy not in ("", "unset"):
        os.environ.setdefault("OMP_WAIT_POLICY", policy)


_default_omp_wait_policy()


def _dependency_paths() -> List[str]:
    """libdnnl.so.3 (from onednn-cpu-gomp, in <prefix>/lib) and OpenBLAS (scipy-openblas32)."""
    paths = []
    dnnl = find_dist_file("onednn-cpu-gomp", "libdnnl.so.3")
    if dnnl is None:
        for prefix in (sys.prefix, sys.base_prefix):
            p = os.path.join(prefix, "lib", "libdnnl.so.3")
            if os.path.exists(p):
                dnnl = p
                break
    if dnnl is None:
        raise OSError("libdnnl.so.3 not found (pip install onednn-cpu-gomp==2023.2.0)")
    paths.append(dnnl)
    try:
        # lazy: scipy-openblas32 is optional (only the native library's BLAS needs it)
        import scipy_openblas32  # pylint: disable=import-outside-toplevel
    except ImportError as err:
        raise OSError("scipy-openblas32 is not installed") from err
    lib_dir = scipy_openblas32.get_lib_dir()
    blas = os.path.join(lib_dir, "lib" + scipy_openblas32.get_library() + ".so")
    if not os.path.exists(blas):
        raise OSError(f"OpenBLAS library not found at {blas}")
    paths.append(blas)
    return paths


def _open(state: LoadState) -> bool:
    """oneDNN and OpenBLAS first (the library links them by soname), then the library."""
    if disabled(state):
        return False
    paths = candidate_paths(LIBRARY_NAME, "TVM_OLLIE_NATIVE_LIB")
    lib = next((p for p in paths if p.is_file()), None)
    if lib is None:
        state.reason = (
            f"{LIBRARY_NAME} not found (was the C++ build skipped at pip install? looked in "
            + ", ".join(str(p.parent) for p in paths[:3])
            + ", site-packages/tvm_ollie/lib)"
        )
        return False
    # lazy: tvm_ffi loads libtvm_ffi.so; this module imports no TVM until the library loads
    import tvm_ffi  # pylint: disable=import-outside-toplevel  (loads libtvm_ffi.so first)

    for dep in _dependency_paths():
        _HANDLES.append(ctypes.CDLL(dep, mode=ctypes.RTLD_GLOBAL))
    _HANDLES.append(ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL))
    if tvm_ffi.get_global_func(MATMUL, allow_missing=True) is None:
        state.reason = f"{lib} loaded but {MATMUL} is not registered"
        return False
    state.path = str(lib)
    native_openmp.check(str(lib))  # a second OpenMP runtime (a renamed copy) is worth a warning
    return True


_LOADER = LibraryLoader("tvm-ollie native library", _open, logger=_LOG)


def load() -> bool:
    """Load the native library (once per process) so that its global functions register.

    Returns
    -------
    bool
        True when the kernels are available. On failure one warning with the reason is logged
        (see :func:`unavailable_reason`) and False is returned; nothing raises.
    """
    ok = _LOADER.load()
    if ok and not _PARALLEL_RUNTIME_SET:
        _default_parallel_runtime()
    return ok


def available() -> bool:
    """Whether the native kernels are loaded (loads them on first call)."""
    return _LOADER.load()


def unavailable_reason() -> str:
    """Why the native library is not available ("" when it is)."""
    return _LOADER.reason()


def library_path() -> Optional[str]:
    """The path of the loaded library, or None."""
    return _LOADER.path()


def library_files() -> List[str]:
    """The files a process without this package loads to call the kernels, in load order:
    oneDNN and OpenBLAS, then the library (empty when it is unavailable). A deployment bundle
    carries them (:mod:`tvm_ollie.bundle.libraries`)."""
    if not load():
        return []
    return _dependency_paths() + [str(_LOADER.path())]


def provides(name: str) -> bool:
    """Whether the loaded library registers the global function ``name``.

    A library built from an older checkout lacks the newer kernels (e.g. ``CONV2D_TRANSPOSE``);
    the pass asks before it offers one, so that a stale build degrades to TVM's kernels.
    """
    return _LOADER.provides(name)


_ACTIVATION_PROBES: Dict[str, bool] = {}


def takes_activation(act: str) -> bool:
    """Whether the loaded library's CPU kernels accept ``act=ACT`` (e.g. ``scale_0.125``).

    A library built before an activation was added rejects it at run time ("bad activation");
    the epilogue pass asks before it folds a newer one, so that a stale build keeps TVM's
    kernel. Probed once per value with a 1x1 OpenBLAS matmul. True when no library is loaded
    (no native call runs then; the pass only rewrites modules)."""
    if not available():
        return True
    if act not in _ACTIVATION_PROBES:
        import numpy as np  # pylint: disable=import-outside-toplevel
        import tvm_ffi  # pylint: disable=import-outside-toplevel

        one, out = np.ones((1, 1), "float32"), np.zeros((1, 1), "float32")
        try:
            _LOADER.func(MATMUL)(f"act={act};lib=openblas", tvm_ffi.from_dlpack(one),
                                 tvm_ffi.from_dlpack(one), tvm_ffi.from_dlpack(out))
            _ACTIVATION_PROBES[act] = True
        except (TypeError, ValueError):
            _ACTIVATION_PROBES[act] = False
    return _ACTIVATION_PROBES[act]


def int8_exact_products() -> bool:
    """Whether the int8 kernels sum ``u8 x s8`` products exactly on this CPU for any int8
    weight (VNNI); without VNNI oneDNN adds pairs of products in saturating int16, exact only
    for weights in ``[-64, 63]``. False when the library lacks the int8 kernels."""
    if not provides(INT8_EXACT_PRODUCTS):
        return False
    return bool(_LOADER.func(INT8_EXACT_PRODUCTS)())


def set_num_threads(n: int) -> None:
    """Set the thread count of the native kernels (OpenMP for oneDNN, and OpenBLAS).

    Use the same count as TVM's thread pool (``TVM_NUM_THREADS``) to avoid oversubscription.
    """
    if int(n) < 1:
        raise ValueError(f"set_num_threads: expected n >= 1, got {n}")
    _LOADER.func(SET_NUM_THREADS)(int(n))


def get_num_threads() -> int:
    """The thread count of the native kernels."""
    return int(_LOADER.func(GET_NUM_THREADS)())


def set_serial_flops(flops: int) -> None:
    """Run kernel calls of fewer than ``flops`` floating-point operations single-threaded
    (0: every call uses :func:`get_num_threads` threads); for this process, from now on.

    Overrides ``TVM_OLLIE_SERIAL_FLOPS``. Primitives are cached per thread count, so changing it
    between calls is safe (a call whose side of the threshold changed prepares its kernel once
    more).
    """
    if int(flops) < 0:
        raise ValueError(f"set_serial_flops: expected flops >= 0, got {flops}")
    _LOADER.func(SET_SERIAL_FLOPS)(int(flops))


def get_serial_flops() -> int:
    """The work below which a kernel call runs single-threaded (see :func:`set_serial_flops`)."""
    return int(_LOADER.func(GET_SERIAL_FLOPS)())


def set_parallel_runtime(name: str) -> None:
    """Where the parallel loops of TVM's CPU kernels run: ``"openmp"`` or ``"tvm"``.

    TVM's generated kernels launch their parallel loops through a function that each compiled
    library receives when it loads. ``"openmp"`` gives the libraries loaded from now on the
    native library's launch: every parallel loop becomes an OpenMP parallel region on the same
    threads as the oneDNN kernels, ``get_num_threads()`` of them, so that a model alternating
    library calls and TVM kernels has one pool of threads instead of two taking turns on the
    cores (docs/threads.md, "One pool"). ``"tvm"`` gives them TVM's thread pool again. A library
    keeps the launch it got when it loaded: an exported library when it is loaded, an in-memory
    executable when a ``VirtualMachine`` is made from it; those made before the call are
    unchanged.

    Raises
    ------
    ValueError
        For another name.
    RuntimeError
        When TVM's runtime is not loaded yet (``import tvm`` first), or the library is missing.
    """
    if name not in PARALLEL_RUNTIMES:
        raise ValueError(f"set_parallel_runtime: expected one of {PARALLEL_RUNTIMES}, got {name!r}")
    if not provides(SET_PARALLEL_RUNTIME):
        raise RuntimeError(f"set_parallel_runtime: {unavailable_reason() or 'the native library'}"
                           " lacks it")
    _LOADER.func(SET_PARALLEL_RUNTIME)(name)
    _PARALLEL_RUNTIME_SET[:] = [name]


@contextlib.contextmanager
def parallel_runtime(name: str) -> Iterator[None]:
    """:func:`set_parallel_runtime` for the libraries loaded (and virtual machines made) inside
    the block, then the previous runtime again; e.g. TVM alone measured on TVM's own pool
    beside tvm-ollie's executables. Without the native library the block runs unchanged."""
    if not provides(SET_PARALLEL_RUNTIME):
        yield
        return
    previous = get_parallel_runtime()
    set_parallel_runtime(name)
    try:
        yield
    finally:
        set_parallel_runtime(previous)


def get_parallel_runtime() -> str:
    """``"openmp"`` or ``"tvm"``: where the libraries loaded now run TVM's parallel loops
    (``"tvm"`` without the native library)."""
    if not provides(GET_PARALLEL_RUNTIME):
        return "tvm"
    return str(_LOADER.func(GET_PARALLEL_RUNTIME)())


def _counters(text) -> Dict[str, int]:
    """The library's ``name=value;name=value`` counter string as a dict of ints."""
    return {k: int(v) for k, v in (item.split("=") for item in str(text).split(";"))}


def parallel_stats() -> Dict[str, int]:
    """How many parallel loops of TVM's kernels ran on the OpenMP pool in this process
    (``launches``) and how many times one of their tasks waited at a barrier (``barriers``);
    zeros without the native library. Counters, for tests and the profiler."""
    if not provides(PARALLEL_STATS):
        return {"launches": 0, "barriers": 0}
    return _counters(_LOADER.func(PARALLEL_STATS)())


def stall_stats() -> Dict[str, int]:
    """The stall fallback's counters in this process: parallel calls seen to stall
    (``stalls``), calls run on the calling thread because of one (``serial_calls``), the last
    window's length and what is left of it (``window_us``, ``left_us``), and whether it is on
    (``enabled``); empty without a library that has it."""
    if not provides(STALL_STATS):
        return {}
    return _counters(_LOADER.func(STALL_STATS)())


def set_stall_fallback(on: bool) -> None:
    """Turn the stall fallback on or off for this process (overrides
    ``TVM_OLLIE_STALL_FALLBACK``); off also ends a window in progress."""
    _LOADER.func(SET_STALL_FALLBACK)(bool(on))


def hold_serial(us: int) -> None:
    """Run the parallel kernel calls of the next ``us`` microseconds on the calling thread, as
    after a stall (0: end the window now). For a caller that knows the cores are taken."""
    if int(us) < 0:
        raise ValueError(f"hold_serial: expected us >= 0, got {us}")
    _LOADER.func(HOLD_SERIAL)(int(us))


def _default_parallel_runtime() -> None:
    """Apply ``TVM_OLLIE_PARALLEL_RUNTIME`` (default :data:`DEFAULT_PARALLEL_RUNTIME`) once TVM's
    runtime is loaded; before that there is nothing to replace, and ``import tvm_ollie`` calls
    this again after importing TVM. An invalid value is logged and ignored."""
    name = os.environ.get("TVM_OLLIE_PARALLEL_RUNTIME", DEFAULT_PARALLEL_RUNTIME)
    if "tvm" not in sys.modules or not provides(SET_PARALLEL_RUNTIME):
        return
    if name not in PARALLEL_RUNTIMES:
        _LOG.warning("TVM_OLLIE_PARALLEL_RUNTIME=%r ignored (expected one of %s)", name,
                     PARALLEL_RUNTIMES)
        _PARALLEL_RUNTIME_SET[:] = ["tvm"]
        return
    try:
        set_parallel_runtime(name)
    except RuntimeError as err:  # TVM's runtime not loaded yet: the next load() tries again
        _LOG.debug("parallel runtime not set yet: %s", err)


def info() -> str:
    """Library versions, thread count and the implementation choices of each kernel."""
    return str(_LOADER.func(INFO)())


def conv2d_packed_size(attrs: str, data_shape, weight_shape) -> int:
    """Number of float32 elements of the packed weight for ``conv2d_pack_weight``.

    Parameters
    ----------
    attrs : str
        The conv2d attributes of the call that will use the packed weight (without ``wpacked``).
    data_shape, weight_shape : sequence of int
        The data shape (in ``layout``) and the weight shape (in ``klayout``).
    """
    return int(_LOADER.func(CONV2D_PACKED_SIZE)(attrs, [int(d) for d in data_shape],
                                                [int(d) for d in weight_shape]))


def conv2d_preferred_format(attrs: str, data_shape, weight_shape) -> Tuple[str, str]:
    """The formats oneDNN picks for this convolution's source and destination when it may
    choose (``format_tag::any``) on this CPU, as ``src_fmt``/``dst_fmt`` values of the conv2d
    kernel: ``"nchw"``, ``"nhwc"`` (channels-last), ``"nChw{B}c"`` (B in 4, 8, 16), or
    ``"other"``.

    Chains of convolutions keep their activations in that format
    (:mod:`tvm_ollie.transform.blocked_layout`), so that no call reorders them.

    Parameters
    ----------
    attrs : str
        The conv2d attributes of the call (``layout=NCHW``; ``src_fmt``/``dst_fmt`` ignored).
    data_shape, weight_shape : sequence of int
        The NCHW data shape and the weight shape (in ``klayout``).
    """
    src, dst = _LOADER.func(CONV2D_PREFERRED_FORMAT)(
        attrs, [int(d) for d in data_shape], [int(d) for d in weight_shape])
    return str(src), str(dst)
