"""The shared libraries a bundle carries: TVM's runtime, native kernel libraries, their deps.

A bundle runs where neither TVM nor this package is installed, so it carries

* the runtime: ``libtvm_ffi.so`` and ``libtvm_runtime.so`` (the runner links them), and for
  CUDA ``libtvm_runtime_cuda.so`` (the CUDA device API and module loader, loaded first);
* each native kernel library whose functions an executable calls (:func:`native_libraries`:
  the CPU library ``libtvm_ollie_native.so`` for ``tvm_ollie.cpu.*`` and, when the package
  provides one, ``libtvm_ollie_cuda.so`` for ``tvm_ollie.cuda.*``); a CUDA build of the pass
  offers native kernels on CPU targets only, so CUDA executables call none of the CPU ones;
* the closure of their shared-library dependencies found by ``ldd`` (``libcudart.so.13``,
  ``libstdc++.so.6``, oneDNN ...), except the C library (:data:`SYSTEM_PREFIXES`, which the
  device has; a newer copy would not load with its loader) and the GPU driver
  (:data:`DRIVER_PREFIXES`, ``libcuda.so.1``: it must match the device's kernel module).
"""

from __future__ import annotations

import dataclasses
import glob
import os
import shutil
import subprocess
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import tvm_ffi.libinfo

from .. import native
from ..compat import tvm
from .sizes import BundleError

__all__ = ["DRIVER_PREFIXES", "NativeLibrary", "SYSTEM_PREFIXES", "cuda_library_dirs",
           "dependency_closure", "native_libraries", "referenced_libraries",
           "runtime_libraries"]

#: Sonames of the C library and its loader: the device's own are used, never a copy.
SYSTEM_PREFIXES = ("linux-vdso", "ld-linux", "libc.so", "libm.so", "libdl.so", "libpthread.so",
                   "librt.so", "libutil.so", "libresolv.so")
#: Sonames of the GPU driver: they must come from the device (matched to its kernel module).
DRIVER_PREFIXES = ("libcuda.so", "libnvidia-")

#: Function-name prefix and file name of each native kernel library the package may provide.
NATIVE_PREFIXES = (("tvm_ollie.cpu.", "libtvm_ollie_native.so"),
                   ("tvm_ollie.cuda.", "libtvm_ollie_cuda.so"))


@dataclasses.dataclass(frozen=True)
class NativeLibrary:
    """A kernel library: the global-function prefix its kernels are registered under and its
    files in load order (dependencies first, the library last)."""

    prefix: str
    files: Tuple[str, ...]


def runtime_libraries(kind: str) -> List[str]:
    """Paths of TVM's runtime libraries for a device kind (``"cpu"`` or ``"cuda"``): the
    tvm-ffi and runtime libraries, plus ``libtvm_runtime_cuda.so`` for CUDA."""
    runtime = tvm.libinfo.find_libtvm_runtime()
    files = [tvm_ffi.libinfo.find_libtvm_ffi(), runtime]
    if kind == "cuda":
        cuda = os.path.join(os.path.dirname(runtime), "libtvm_runtime_cuda.so")
        if not os.path.isfile(cuda):
            raise BundleError(f"{cuda} not found: this TVM was built without CUDA")
        files.append(cuda)
    return files


def cuda_library_dirs() -> List[str]:
    """Where the CUDA toolkit's libraries are (``libcudart``): ``$CUDA_HOME``/``$CUDA_PATH``,
    the toolkit of the ``nvcc`` on ``PATH``, then ``/usr/local/cuda*``."""
    roots = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")]
    nvcc = shutil.which("nvcc")
    if nvcc:
        roots.append(os.path.dirname(os.path.dirname(os.path.realpath(nvcc))))
    roots += sorted(glob.glob("/usr/local/cuda*"), reverse=True)
    dirs = []
    for root in filter(None, roots):
        for sub in ("lib64", "lib", "targets/x86_64-linux/lib"):
            path = os.path.join(root, sub)
            if os.path.isdir(path) and path not in dirs:
                dirs.append(path)
    return dirs


def _ldd(path: str, search_dirs: Sequence[str]) -> Dict[str, Optional[str]]:
    """``soname -> resolved path`` (None: not found) of ``path``'s dependencies."""
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(
        list(search_dirs) + [p for p in env.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p])
    try:
        out = subprocess.run(["ldd", path], capture_output=True, text=True, env=env, check=True,
                             timeout=60).stdout
    except (OSError, subprocess.SubprocessError) as err:
        raise BundleError(f"ldd {path} failed: {err}") from err
    deps: Dict[str, Optional[str]] = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[1] == "=>":
            deps[parts[0]] = None if parts[2] == "not" else os.path.realpath(parts[2])
    return deps


def _kept_by_device(soname: str) -> bool:
    return soname.startswith(SYSTEM_PREFIXES) or soname.startswith(DRIVER_PREFIXES)


def dependency_closure(files: Iterable[str], search_dirs: Sequence[str] = ()
                       ) -> Tuple[Dict[str, str], List[str]]:
    """The libraries to carry for ``files`` and what cannot be found.

    Returns ``({name: path}, missing sonames)``: ``files`` themselves (by the base name given,
    e.g. ``libdnnl.so.3`` for a link to ``libdnnl.so.3.2``) and
    every dependency, transitively, that the device does not provide (:data:`SYSTEM_PREFIXES`,
    :data:`DRIVER_PREFIXES`); the base names of ``files`` and their directories (plus
    ``search_dirs``) resolve dependencies, as the bundle's ``lib/`` will.
    """
    files = list(files)
    dirs = list(dict.fromkeys([os.path.dirname(os.path.realpath(f)) for f in files]
                              + list(search_dirs)))
    carry = {os.path.basename(f): os.path.realpath(f) for f in files}
    todo, missing = list(carry.values()), []
    while todo:
        for soname, path in _ldd(todo.pop(), dirs).items():
            if soname in carry or _kept_by_device(soname):
                continue
            if path is None:
                if soname not in missing:
                    missing.append(soname)
                continue
            carry[soname] = path
            todo.append(path)
    return carry, [m for m in missing if m not in carry]


def native_libraries() -> List[NativeLibrary]:
    """The native kernel libraries this package provides here (:data:`NATIVE_PREFIXES`): the
    CPU library with oneDNN and OpenBLAS (:func:`tvm_ollie.native.library_files`) and a CUDA
    library (``$TVM_OLLIE_CUDA_LIB``, or ``libtvm_ollie_cuda.so`` beside the CPU library)
    when one exists."""

    out = []
    cpu_files = native.library_files()
    if cpu_files:
        out.append(NativeLibrary(NATIVE_PREFIXES[0][0], tuple(cpu_files)))
    candidates = [os.environ.get("TVM_OLLIE_CUDA_LIB", "")]
    if cpu_files:
        candidates.append(os.path.join(os.path.dirname(cpu_files[-1]), NATIVE_PREFIXES[1][1]))
    cuda = next((c for c in candidates if c and os.path.isfile(c)), None)
    if cuda:
        out.append(NativeLibrary(NATIVE_PREFIXES[1][0], (cuda,)))
    return out


def referenced_libraries(executable, libraries: Sequence[NativeLibrary]
                         ) -> List[NativeLibrary]:
    """The libraries among ``libraries`` whose functions ``executable`` (a Relax VM
    executable) calls: a ``call_dps_packed`` of a native kernel is a named global function in
    the executable's function table (its ``stats()``), or in its instructions."""
    text = executable.stats() + executable.as_text()
    return [lib for lib in libraries if lib.prefix in text]
