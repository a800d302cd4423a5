"""Loading the CUDA kernel library (``libtvm_ollie_cuda.so``): cuBLAS GEMMs, cuDNN convolutions.

The library is built beside the CPU one (:mod:`tvm_ollie.native`) when the CUDA toolkit is found
at install time. It registers tvm-ffi globals with the CPU kernels' calling convention
(destination-passing, ``attrs`` first, ``Out`` last; tensors on a CUDA device):
:data:`MATMUL`, :data:`BATCH_MATMUL`, :data:`CONV2D`. cuBLAS and cuDNN are not linked: the
library opens them on first use, from the paths in ``TVM_OLLIE_CUBLAS_LIB`` /
``TVM_OLLIE_CUDNN_LIB`` when set, else by their sonames. :func:`load` sets those variables to
the files of the ``nvidia-cublas``/``nvidia-cudnn`` wheels when they are installed
(``pip install tvm-ollie[cuda]``) and the user did not.

Unlike the CPU library, it is loaded on demand (the pass asks for it on CUDA targets only), and
loading it needs neither a GPU nor cuBLAS/cuDNN: :func:`kernel_error` says per kernel why it
cannot run here. Environment: ``TVM_OLLIE_CUDA_LIB`` (the library's path),
``TVM_OLLIE_DISABLE_NATIVE=1`` (do not load it either).
"""

from __future__ import annotations

import ctypes
import os
from typing import Dict, List, Optional

from .library_loader import LibraryLoader, LoadState, candidate_paths, disabled, find_dist_file

__all__ = ["BATCH_MATMUL", "CONV2D", "DEVICE_COUNT", "INFO", "KERNELS", "LIBRARY_NAME", "MATMUL",
           "VENDOR_ERROR", "VENDOR_OF", "available", "device_count", "info", "kernel_error",
           "library_path", "load", "unavailable_reason", "vendor_error"]

MATMUL = "tvm_ollie.cuda.matmul"
BATCH_MATMUL = "tvm_ollie.cuda.batch_matmul"
CONV2D = "tvm_ollie.cuda.conv2d"
INFO = "tvm_ollie.cuda.info"
VENDOR_ERROR = "tvm_ollie.cuda.vendor_error"
DEVICE_COUNT = "tvm_ollie.cuda.device_count"
#: The kernels and the vendor library each needs.
VENDOR_OF: Dict[str, str] = {MATMUL: "cublas", BATCH_MATMUL: "cublas", CONV2D: "cudnn"}
KERNELS = tuple(VENDOR_OF)

LIBRARY_NAME = "libtvm_ollie_cuda.so"

#: Wheel files of the vendor libraries: ``(environment variable, [(distribution, file)])``.
_WHEELS = {
    "cublas": ("TVM_OLLIE_CUBLAS_LIB", [("nvidia-cublas", "libcublas.so.13"),
                                        ("nvidia-cublas-cu12", "libcublas.so.12")]),
    "cudnn": ("TVM_OLLIE_CUDNN_LIB", [("nvidia-cudnn-cu13", "libcudnn.so.9"),
                                      ("nvidia-cudnn-cu12", "libcudnn.so.9")]),
}

_HANDLES: List[ctypes.CDLL] = []


def _point_at_wheels() -> None:
    """Set ``TVM_OLLIE_CUBLAS_LIB``/``TVM_OLLIE_CUDNN_LIB`` to the installed wheels' libraries
    (the library reads them when it first opens cuBLAS/cuDNN); the user's values win."""
    for env, wheels in _WHEELS.values():
        if os.environ.get(env):
            continue
        for dist, name in wheels:
            path = find_dist_file(dist, name)
            if path:
                os.environ[env] = path
                break


def _open(state: LoadState) -> bool:
    """The library only: cuBLAS and cuDNN are opened by the library when a kernel first runs."""
    if disabled(state):
        return False
    paths = candidate_paths(LIBRARY_NAME, "TVM_OLLIE_CUDA_LIB")
    lib = next((p for p in paths if p.is_file()), None)
    if lib is None:
        state.reason = (f"{LIBRARY_NAME} not found (built only where the CUDA toolkit is "
                        "found at install; looked in "
                        + ", ".join(str(p.parent) for p in paths[:3]) + ", ...)")
        return False
    # lazy: tvm_ffi loads libtvm_ffi.so; this module imports no TVM until the library loads
    import tvm_ffi  # pylint: disable=import-outside-toplevel  (loads libtvm_ffi.so first)

    _point_at_wheels()
    _HANDLES.append(ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL))
    if tvm_ffi.get_global_func(MATMUL, allow_missing=True) is None:
        state.reason = f"{lib} loaded but {MATMUL} is not registered"
        return False
    state.path = str(lib)
    return True


_LOADER = LibraryLoader("tvm-ollie CUDA library", _open)


def load() -> bool:
    """Load the CUDA library (once per process); False with :func:`unavailable_reason` when it
    is not there or does not load (libcudart missing, ...). Never raises."""
    return _LOADER.load()


def available() -> bool:
    """Whether the CUDA library is loaded (loads it on first call)."""
    return _LOADER.load()


def unavailable_reason() -> str:
    """Why the CUDA library is not loaded ("" when it is)."""
    return _LOADER.reason()


def library_path() -> Optional[str]:
    """The loaded library's path, or None."""
    return _LOADER.path()


def info() -> str:
    """CUDA runtime, driver and devices; cuBLAS and cuDNN (loaded from where, or why not)."""
    return str(_LOADER.func(INFO)())


def vendor_error(name: str) -> str:
    """"" when the vendor library ``name`` (``"cublas"`` or ``"cudnn"``) loads, else why not."""
    if not load():
        return unavailable_reason()
    return str(_LOADER.func(VENDOR_ERROR)(name))


def device_count() -> int:
    """CUDA devices the library sees (0 without a driver or a device, or without the library)."""
    return int(_LOADER.func(DEVICE_COUNT)()) if load() else 0


#: ``TVM_OLLIE_CUDA_KERNELS=assume``: the CUDA kernels are offered when the library loads here,
#: without cuBLAS/cuDNN or a device here: a build for another machine that has them (a device
#: bundle, ``tvm-ollie bundle --cuda-library``), whose executables carry this library.
ASSUME_ENV = "TVM_OLLIE_CUDA_KERNELS"


def assumed() -> bool:
    """Whether the CUDA kernels are assumed to run where the build will run (:data:`ASSUME_ENV`)."""
    return os.environ.get(ASSUME_ENV, "").strip() == "assume"


def kernel_error(func: str) -> str:
    """Why the kernel ``func`` (:data:`KERNELS`) cannot run here ("" when it can): no library,
    no cuBLAS/cuDNN, or no CUDA device (only the first with :func:`assumed`)."""
    if func not in VENDOR_OF:
        raise ValueError(f"unknown CUDA kernel {func!r} (expected one of {KERNELS})")
    if not load():
        return unavailable_reason()
    if assumed():
        return ""
    why = vendor_error(VENDOR_OF[func])
    if why:
        return why
    return "" if device_count() > 0 else "no CUDA device"
