"""TVM builds of a decision's merged modules in worker processes, several at once.

A cold build of a model with many units spends most of its time in TVM: GCN quick's 38 and
Segformer quick's 74 merged builds (:mod:`.batched`) and the LLVM code generation of their
executables were 38-49 % of those builds (docs/compile-time.md), one after the other in the
compiling process, while the machine's other cores waited. Threads cannot share that work:
TVM's build is not thread-safe (TE's ``tag_scope`` is one process-wide stack; two builds in
two threads failed one test run in three with ``nested op_tag is not allowed``). Processes can:
a :class:`BuildPool` keeps ``workers`` spawned processes, each with TVM and this package
imported once; :meth:`BuildPool.build` sends each module as TVM's JSON, the worker builds it
exactly as the compiling process would (:func:`~tvm_ollie.tune.measure.compile_module` for the
same target) and exports the executable as a shared library, and the compiling process loads
the libraries (a ``dlopen``: the LLVM code was generated in the worker). The builds of one call
all finish before it returns, so no timing ever runs beside a build (the measuring rule).

Exactly as the compiling process would includes its cached allocations
(:mod:`~tvm_ollie.codegen.cached_alloc`): whether the CPU pipeline lifts planned allocations is
a switch of the calling context (the build's ``cached_alloc_scope``), which a worker does not
share, so each request carries the switch as it stands where the build was asked for
(``cached_alloc.enabled()``), and the worker builds under it, the native library loaded.
Without it the worker built with its own default (on), whatever the caller's config said, and
the whole-model guard could not send its library plan to a worker under the default config
(``cached_alloc`` on): the plan would have been built differently from the one this process
builds.

The workers are plain interpreters started with :data:`WORKER_CODE` (requests and answers as
length-prefixed pickles on their stdin and stdout). Why not a fork of the compiling process: it
runs TVM's and the native library's thread pools, and a fork copies their locks in whatever
state they are in. Why not ``multiprocessing``'s spawned processes: they import the parent's
``__main__`` again, which runs a user's unguarded script (and its build) once more in every
worker. Why not TVM's ``PopenPoolExecutor``: its workers import torch (through ``tvm_ffi``), 2
s of a 4.7 s start here. Why the pool
is started only when first asked and kept for the process: a worker's start (a Python
interpreter importing TVM and this package) costs a second or two, paid once per process; the
decider asks only where a module has enough units to decide for the builds to repay it
(:data:`MIN_UNITS`).
"""

from __future__ import annotations

import atexit
import concurrent.futures as futures
import contextlib
import logging
import os
import pickle
import queue
import struct
import subprocess
import sys
import shutil
import tempfile
import threading
from typing import List, Optional, Sequence

from .. import native
from ..codegen import cached_alloc
from ..compat import tvm
from ..target import normalize_target
from ..tune.measure import compile_module

__all__ = ["BuildPool", "MAX_WORKERS", "MIN_UNITS", "PendingBuild", "WORKER_CODE",
           "running_pool", "serve", "shared_pool", "usable_cpus"]

LOG = logging.getLogger("tvm_ollie.transform")

#: Worker processes at most (never more than the CPUs this process may run on): the builds
#: of one decision are a few modules, and on the 2-core machines of this project two at once
#: is what the cores give.
MAX_WORKERS = 2

#: The decided units from which a module's decisions build in the pool: each merged build
#: saves about half its time with two workers (0.3-1 s a decision), and starting the workers
#: costs a second or two once per process; the demo's 3 units would lose it.
MIN_UNITS = 8


def usable_cpus() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _target_text(target) -> str:
    """``target`` as TVM's JSON (a Target does not pickle)."""
    return tvm.ir.save_json(normalize_target(target))


def _build_in_worker(text: str, target: str, path: str, cached: Optional[bool] = None) -> str:
    """In a worker: the module of TVM's JSON ``text`` built for the target of ``target`` and
    exported to ``path`` (returned); ``cached``: the caller's cached-allocations switch (None:
    the worker's own default)."""
    if cached:  # (the native builtin must be registered here for the passes to lift)
        native.load()
    switch = cached_alloc.cached_alloc_scope(cached) if cached is not None \
        else contextlib.nullcontext()
    with switch:
        ex = compile_module(tvm.ir.load_json(text), tvm.ir.load_json(target))
    ex.export_library(path)
    return path


#: How a worker starts: torch is kept out (``tvm_ffi`` imports it when it can, 2 s of a
#: worker's 4.7 s start here, and nothing a build does needs it), then it serves builds.
WORKER_CODE = "import sys; sys.modules['torch'] = None; " \
    "from tvm_ollie.transform.build_pool import serve; serve()"


def serve(reader=None, writer=None) -> None:
    """A worker's loop: reads ``(text, target, path, cached)`` requests (length-prefixed pickles)
    from stdin, answers ``(True, path)`` or ``(False, error)`` on stdout (``"ping"``:
    ``(True, "")``), until stdin closes."""
    reader = reader if reader is not None else sys.stdin.buffer
    if writer is None:  # the answers on a copy of stdout; what anything prints goes nowhere
        writer = os.fdopen(os.dup(1), "wb")
        os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
    while True:
        request = _read(reader)
        if request is None:
            return
        try:
            answer = (True, _build_in_worker(*request) if request != "ping" else "")
        except Exception as err:  # pylint: disable=broad-except
            answer = (False, f"{type(err).__name__}: {err}")
        _write(writer, answer)


def _write(stream, value) -> None:
    data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(struct.pack("<Q", len(data)) + data)
    stream.flush()


def _read(stream):
    """The next value (None: the stream closed)."""
    head = stream.read(8)
    if len(head) < 8:
        return None
    (size,) = struct.unpack("<Q", head)
    data = stream.read(size)
    if len(data) < size:
        return None
    return pickle.loads(data)


class _Worker:
    """One worker process (:data:`WORKER_CODE`), asked one build at a time."""

    def __init__(self):
        self.proc = subprocess.Popen([sys.executable, "-c", WORKER_CODE],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL)

    def ask(self, request) -> str:
        """The path built for ``request`` (raises the worker's error, or when it died)."""
        _write(self.proc.stdin, request)
        answer = _read(self.proc.stdout)
        if answer is None:
            raise RuntimeError(f"the build worker exited ({self.proc.poll()})")
        ok, value = answer
        if not ok:
            raise RuntimeError(value)
        return value

    def close(self) -> None:
        """Close its stdin (it exits) and wait for it."""
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=10)
        except Exception:  # pylint: disable=broad-except
            self.proc.kill()


class BuildPool:
    """Worker processes that build modules for the compiling process.

    Parameters
    ----------
    workers : int
        How many processes (at least 1).
    """

    def __init__(self, workers: int):
        self.workers = max(1, int(workers))
        self._dir = tempfile.mkdtemp(prefix="ollie_builds_")
        self._count = 0
        self._lock = threading.Lock()
        self._idle: "queue.Queue[_Worker]" = queue.Queue()
        self._all = [_Worker() for _ in range(self.workers)]  # (starting meanwhile)
        for worker in self._all:
            self._idle.put(worker)
        self._threads = futures.ThreadPoolExecutor(max_workers=self.workers)
        #: modules built here, and how many failed (each is then built in the caller)
        self.built = 0
        self.failed = 0

    def start(self) -> None:
        """Wait until every worker has imported TVM and this module."""
        for worker in self._all:  # (the answer comes once it is up)
            worker.ask("ping")

    def _run(self, request) -> str:
        worker = self._idle.get()
        try:
            return worker.ask(request)
        finally:
            self._idle.put(worker)

    def submit(self, mod: "tvm.IRModule", target) -> "PendingBuild":
        """Start building ``mod`` for ``target`` in a worker, with this context's cached
        allocations switch (module docstring); :meth:`PendingBuild.result` waits for it."""
        with self._lock:
            self._count += 1
            path = os.path.join(self._dir, f"part{self._count}.so")
        try:
            job = self._threads.submit(self._run, (tvm.ir.save_json(mod), _target_text(target),
                                                   path, cached_alloc.enabled()))
        except Exception as err:  # pylint: disable=broad-except
            job = futures.Future()  # (not serializable, or the pool broken: fails its result)
            job.set_exception(err)
        return PendingBuild(self, job)

    def build(self, modules: Sequence["tvm.IRModule"], target
              ) -> List[Optional["tvm.runtime.Executable"]]:
        """Each module built for ``target`` in a worker, at most :attr:`workers` at once, and
        loaded here as an executable (its library, whose code is ready to run; None where its
        build failed: the caller builds it itself, and learns why). Returns when every build
        has finished."""
        jobs = [self.submit(mod, target) for mod in modules]
        return [job.result() for job in jobs]

    def close(self) -> None:
        """Stop the workers and remove the libraries' directory."""
        self._threads.shutdown(wait=True)
        for worker in self._all:
            worker.close()
        shutil.rmtree(self._dir, ignore_errors=True)


class PendingBuild:
    """A build started in a :class:`BuildPool` (:meth:`BuildPool.submit`)."""

    def __init__(self, pool: BuildPool, job: "futures.Future"):
        self.pool, self.job = pool, job

    def result(self) -> Optional["tvm.runtime.Executable"]:
        """The executable, loaded here, once built (None: the build failed in the worker, or
        the worker died; the caller builds the module itself)."""
        try:
            path = self.job.result()
            ex = tvm.runtime.Executable(tvm.runtime.load_module(path))
            os.unlink(path)  # (loaded: the file is no longer needed)
        except Exception as err:  # pylint: disable=broad-except
            LOG.info("ollie: a pool build failed (%s: %s); building it here",
                     type(err).__name__, (str(err).strip().splitlines() or [""])[-1][:200])
            self.pool.failed += 1
            return None
        self.pool.built += 1
        return ex


_SHARED: List[Optional[BuildPool]] = []
_SHARED_LOCK = threading.Lock()


def running_pool() -> Optional[BuildPool]:
    """This process's pool if it has been started (never starts one)."""
    with _SHARED_LOCK:
        return _SHARED[0] if _SHARED else None


def shared_pool() -> Optional[BuildPool]:
    """This process's pool (started on the first call, kept until the process exits), or None
    when the process may run on one CPU only or the pool cannot start (then it is not asked
    again: every module is built in the caller)."""
    with _SHARED_LOCK:
        if not _SHARED:
            _SHARED.append(_start_pool())
        return _SHARED[0]


def _start_pool() -> Optional[BuildPool]:
    workers = min(MAX_WORKERS, usable_cpus())
    if workers < 2:
        return None
    pool = None
    try:
        pool = BuildPool(workers)
        pool.start()
    except Exception as err:  # pylint: disable=broad-except
        LOG.info("ollie: no build pool (%s: %s); building in this process",
                 type(err).__name__, err)
        if pool is not None:
            pool.close()
        return None
    atexit.register(pool.close)
    return pool
