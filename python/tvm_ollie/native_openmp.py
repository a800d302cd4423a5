"""Which OpenMP runtimes a process holds, and which one the native kernels run on.

oneDNN (the native kernels' library, ``onednn-cpu-gomp``) and the native library link GNU
OpenMP by soname (``libgomp.so.1``); so does PyTorch's ``libtorch_cpu.so``. The dynamic loader
loads one file per soname: whichever process loads first (``import tvm`` imports PyTorch when it
is installed, through tvm-ffi) decides which file, and every later library binds to it. Then
PyTorch's parallel regions and ours run on one team of worker threads, the team of the calling
thread, and no idle team spins against the running one (docs/threads.md, "One OpenMP runtime").

A wheel that carries a renamed copy (a soname such as ``libgomp-<hash>.so.1``, as auditwheel
makes) would bring a second runtime: two teams, each spinning after its own regions on the same
cores. :func:`check` says so once, when the native library loads; ``TVM_OLLIE_OPENMP_CHECK=0``
silences it.
"""

from __future__ import annotations

import ctypes
import logging
import os
from typing import List, Optional

__all__ = ["OPENMP_FILES", "openmp_libraries", "symbol_file", "check"]

#: File-name prefixes of OpenMP runtimes: GNU (also PyTorch's renamed ``libgomp-<hash>``),
#: Intel's and LLVM's.
OPENMP_FILES = ("libgomp", "libiomp5", "libomp.", "libomp-")

_LOG = logging.getLogger(__name__)
_WARNED: List[bool] = []


class _DlInfo(ctypes.Structure):
    """``Dl_info`` of ``dladdr(3)``."""

    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]  # fmt: skip


def openmp_libraries() -> List[str]:
    """The OpenMP runtime files mapped into this process (``/proc/self/maps``), real paths in
    the order they were first mapped; empty where ``/proc`` is unavailable."""
    try:
        with open("/proc/self/maps", encoding="utf-8") as maps:
            lines = maps.read().splitlines()
    except OSError:
        return []
    found: List[str] = []
    for line in lines:
        fields = line.split(maxsplit=5)
        if len(fields) < 6 or not fields[5].startswith("/"):
            continue
        name = os.path.basename(fields[5])
        path = os.path.realpath(fields[5])
        if name.startswith(OPENMP_FILES) and path not in found:
            found.append(path)
    return found


def symbol_file(symbol: str, library: Optional[str] = None) -> Optional[str]:
    """The file whose definition of ``symbol`` a lazy binding from ``library`` would get: the
    process's global scope first (the program, then the libraries loaded ``RTLD_GLOBAL``), then
    ``library``'s own dependencies, as the dynamic loader looks; None when neither defines it.

    ``symbol_file("GOMP_parallel", native_library)`` is the OpenMP runtime whose team runs the
    native kernels' parallel regions. A ``library`` not loaded in this process adds no scope."""
    scopes = [ctypes.CDLL(None)]
    if library is not None:
        try:  # RTLD_NOLOAD: only a library already loaded, never load one here
            scopes.append(ctypes.CDLL(library, mode=os.RTLD_NOLOAD | os.RTLD_LAZY))
        except OSError:
            pass
    for scope in scopes:
        try:
            address = ctypes.cast(getattr(scope, symbol), ctypes.c_void_p).value
        except AttributeError:
            continue
        info = _DlInfo()
        found = ctypes.CDLL(None).dladdr(ctypes.c_void_p(address), ctypes.byref(info))
        if found and info.dli_fname:
            return os.path.realpath(info.dli_fname.decode())
    return None


def check(library: Optional[str] = None) -> List[str]:
    """The OpenMP runtimes mapped now; with more than one, a warning (once per process, unless
    ``TVM_OLLIE_OPENMP_CHECK=0``) naming them and the one ``library``'s regions run on."""
    found = openmp_libraries()
    if len(found) > 1 and not _WARNED and os.environ.get("TVM_OLLIE_OPENMP_CHECK", "1") != "0":
        _WARNED.append(True)
        ours = symbol_file("GOMP_parallel", library) if library else None
        _LOG.warning(
            "%d OpenMP runtimes in this process (%s); the native kernels run on %s. Each keeps "
            "its own worker threads, which spin after their regions and take the cores from the "
            "other's: see docs/threads.md, 'One OpenMP runtime' (TVM_OLLIE_OPENMP_CHECK=0 "
            "silences this)", len(found), ", ".join(found), ours or "an unknown one")
    return found
