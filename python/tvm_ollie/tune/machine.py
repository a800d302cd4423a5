"""What a measurement taken on this machine depends on: the key of the per-machine caches.

A timing or a roofline measured in one process is reused by another (the per-user cache,
:mod:`.records`) only when it was measured on the same machine, the same way, by the same code.
:func:`machine_key` is that identity, as text:

* the CPU: its model name and a hash of its feature flags (``/proc/cpuinfo``; the platform's
  processor name where there is none), and the number of logical CPUs, and how many this
  process may run on (its affinity);
* the threads the kernels and the BLAS run with: ``TVM_NUM_THREADS``, ``OMP_NUM_THREADS``,
  ``OPENBLAS_NUM_THREADS``, ``MKL_NUM_THREADS`` (unset is part of the key too), and how TVM's
  pool waits between kernels (``TVM_THREAD_POOL_SPIN_COUNT``, :func:`sleeping_pool`);
* the target (its full text: ``num-cores``, ``mcpu``...), the TVM version and the loaded native
  library's identity (:func:`native_identity`: its content, and the vendor libraries it opens);
* the code: :func:`code_version`, a hash of every Python source of the package (any change to
  how a module is emitted, built, timed or compared makes every stored measurement a miss);
  a measurement that runs only a few modules (the calibration) keys on theirs instead
  (:func:`source_version`).

Why this much: a stored measurement skips the measuring, so everything that could make the
measurement come out differently must be in the key; a key too fine only costs a measurement.
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
from types import ModuleType
from typing import Optional, Sequence

from .. import native
from ..compat import tvm

__all__ = ["REMEASURE_ENV", "SPIN_ENV", "code_version", "cpu_identity", "machine_key",
           "native_identity", "remeasure", "sleeping_pool", "source_version"]

#: Set to 1 to measure again what the per-machine caches hold (the stored value is replaced).
REMEASURE_ENV = "TVM_OLLIE_REMEASURE"
#: How many rounds a worker of TVM's pool spins between parallel kernels before it sleeps (TVM
#: reads it once, when the pool starts: the first parallel kernel of the process).
SPIN_ENV = "TVM_THREAD_POOL_SPIN_COUNT"
_THREAD_ENVS = ("TVM_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                SPIN_ENV)


def remeasure(what: Optional[str] = None) -> bool:
    """Whether ``TVM_OLLIE_REMEASURE`` asks to measure ``what`` (a per-machine store's name:
    ``calibration``, ``decisions``, ``unit decisions``, ``model guard``) again instead of
    reading it back: ``1`` (``true``, ``yes``, ``on``) for everything, else a comma-separated
    list of the names measured again (the stability benchmark keeps this machine's calibration,
    what a user's second build reads back too, and times every decision again)."""
    value = os.environ.get(REMEASURE_ENV, "").strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    names = {part.strip() for part in value.split(",") if part.strip()}
    return what is not None and what.lower() in names


def sleeping_pool(environ: Optional[dict] = None) -> bool:
    """Let TVM's pool sleep between kernels (``TVM_THREAD_POOL_SPIN_COUNT=0``) in a process that
    builds, and so times decisions, but does not run the model afterwards (``tvm-ollie compile``,
    the stability benchmark's builds); unless the user set it. Returns whether it was set.

    Why: a spinning worker of TVM's pool uses up its share of a busy core, and the scheduler then
    runs it again only at its next tick (4 ms here): on the loaded 2-core machine a unit of a
    few microseconds timed 4.0 ms in most samples, and whether the median fell on the tick or on
    the kernel decided ties differently in each build (BERT, three fresh builds: 3 of 7 region
    decisions differed). A sleeping worker is woken at once. BERT's executables timed alone at
    load 5-6 (median of 200 calls): 20.4 / 22.2 ms with the pool spinning, 0.27 / 2.0 ms with
    it sleeping. TVM reads the count once per process, when its pool starts, so this is only
    for processes whose pool has not run yet and whose own runs do not matter; a user who
    builds and runs in one process decides it for that process."""
    environ = os.environ if environ is None else environ
    if SPIN_ENV in environ:
        return False
    environ[SPIN_ENV] = "0"
    return True


@functools.lru_cache(maxsize=1)
def cpu_identity() -> str:
    """The CPU's model name and a hash of its feature flags (``/proc/cpuinfo``), and the number
    of logical CPUs; the platform's processor name where ``/proc/cpuinfo`` is absent."""
    model, flags = "", ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                name, _, value = line.partition(":")
                name = name.strip()
                if name in ("model name", "Model", "cpu model") and not model:
                    model = value.strip()
                elif name in ("flags", "Features") and not flags:
                    flags = " ".join(sorted(value.split()))
    except OSError:
        pass
    model = model or platform.processor() or platform.machine()
    digest = hashlib.sha256(flags.encode()).hexdigest()[:12]
    return f"{model} flags:{digest} cpus:{os.cpu_count()}"


@functools.lru_cache(maxsize=8)
def _file_digest(path: str, size: int, mtime_ns: int) -> str:  # noqa: ARG001 (cache key)
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:16]


def native_identity() -> str:
    """The loaded native library's identity: a hash of its file's content (and the path, size
    and modification time of the vendor libraries it opens), or ``"none"``."""
    if not native.available():
        return "none"
    try:
        path = native.library_path()
        st = os.stat(path)
        parts = [_file_digest(path, st.st_size, st.st_mtime_ns)]
        for dep in native.library_files()[:-1]:
            dst = os.stat(dep)
            parts.append(f"{dep}:{dst.st_size}:{dst.st_mtime_ns}")
        return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]
    except (OSError, TypeError):
        return "unknown"


@functools.lru_cache(maxsize=1)
def code_version() -> str:
    """A hash of every ``.py`` file of the ``tvm_ollie`` package (paths and contents)."""
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    digest = hashlib.sha256()
    for folder, dirs, files in os.walk(pkg):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(f for f in files if f.endswith(".py")):
            path = os.path.join(folder, name)
            digest.update(os.path.relpath(path, pkg).encode())
            with open(path, "rb") as fh:
                digest.update(fh.read())
    return digest.hexdigest()[:16]


def source_version(modules: Sequence[ModuleType]) -> str:
    """A hash of the Python sources of ``modules`` (their package-relative paths and
    contents): the code part of a key whose measurement runs only that code
    (:func:`machine_key`'s ``code``)."""
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    digest = hashlib.sha256()
    for path in sorted({os.path.abspath(m.__file__) for m in modules}):
        digest.update(os.path.relpath(path, pkg).encode())
        with open(path, "rb") as fh:
            digest.update(fh.read())
    return digest.hexdigest()[:16]


def machine_key(target, extra: Optional[str] = None, code: Optional[str] = None) -> str:
    """The identity of a measurement taken here for ``target`` (module docstring), with
    ``extra`` (the caller's own part: what was measured, and how). ``code``: the code part
    (default :func:`code_version`, every source of the package; a measurement that runs only
    a few modules gives their :func:`source_version`, so that a change elsewhere keeps it)."""
    try:
        affinity = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        affinity = os.cpu_count()
    threads = ",".join(f"{k}={os.environ.get(k, '')}" for k in _THREAD_ENVS)
    parts = [f"cpu={cpu_identity()}", f"affinity={affinity}", threads, f"target={target}",
             f"tvm={tvm.__version__}", f"native={native_identity()}",
             f"code={code or code_version()}"]
    if extra:
        parts.append(str(extra))
    return "\n".join(parts)
