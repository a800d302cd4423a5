"""Benchmark worker processes: something prepared and timed in a fresh process of its own.

A :class:`Worker` spawns a fresh interpreter (``multiprocessing``'s spawn context: nothing of
the coordinator's runtimes, thread pools or memory is inherited) that calls a factory, ships the
result and the first outputs back, and then takes timing commands: ``calibrate`` (returns the
calls per sample and the seconds of one call, :meth:`.CallSampler.calibrate`) and ``sample``
(``warmup`` untimed calls, then ``number`` back-to-back calls timed in the worker; returns
seconds per call); a call that raises is answered with ``failed`` and the worker exits. A
worker is a sampler of :func:`.timing.measure_rounds`, so a coordinator times several workers
in rotating rounds, one at a time, while the others block on their pipes. :meth:`Worker.settle`
waits until the worker's threads have stopped running (spinning thread pools included) so that
the next worker starts on idle cores.

A worker that dies (a crash, an abort in native code) or fails raises :class:`WorkerFailed`
in the coordinator; the coordinator goes on with the others.
"""

from __future__ import annotations

import contextlib
import glob
import importlib
import multiprocessing
import os
import threading
import time
from typing import Callable, Dict, Iterable, Iterator, Optional

from .timing import CallSampler


class WorkerFailed(Exception):
    """The worker process died or broke the protocol; the message says how."""


def serve(conn, factory: Callable[..., tuple], kwargs: dict, modules: Iterable[str]) -> None:
    """The worker's main loop (runs in the spawned process).

    ``modules`` are imported first (where the systems or models that ``factory`` looks up are
    registered, when that is outside the package). ``factory(**kwargs)`` returns
    ``(result dict, run or None, outputs or None)`` (:data:`.outcome.Outcome`); the reply is
    ``("ready", result, outputs)``. Then, while ``run`` exists, one reply per command.
    """
    for module in modules:
        importlib.import_module(module)
    result, run, outputs = factory(**kwargs)
    conn.send(("ready", result, outputs))
    sampler = CallSampler(run) if run is not None else None
    while True:
        try:
            command, arg = conn.recv()
        except EOFError:  # the coordinator went away
            return
        if command == "stop" or sampler is None:
            return
        try:
            if command == "calibrate":
                conn.send(("calibrated", sampler.calibrate(arg), sampler.call_s))
            elif command == "sample":
                number, warmup = arg if isinstance(arg, (tuple, list)) else (arg, 0)
                conn.send(("sampled", sampler.sample(number, warmup)))
            else:
                conn.send(("failed", f"unknown command {command!r}"))
        except Exception as err:  # pylint: disable=broad-except
            conn.send(("failed", f"{type(err).__name__}: {err}"[:500]))
            return


@contextlib.contextmanager
def _environ(env: Optional[Dict[str, str]]) -> Iterator[None]:
    """``os.environ`` replaced by ``env`` for the duration (a spawned child copies it)."""
    if env is None:
        yield
        return
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def cpu_seconds(pid: int) -> Optional[float]:
    """CPU time of every thread of process ``pid`` (nanosecond resolution, from Linux's
    ``/proc/<pid>/task/*/schedstat``); None where that is not available."""
    total = 0
    found = False
    for path in glob.glob(f"/proc/{pid}/task/*/schedstat"):
        try:
            with open(path, encoding="ascii") as f:
                total += int(f.read().split()[0])
            found = True
        except (OSError, ValueError, IndexError):
            continue  # a thread that ended meanwhile
    return total * 1e-9 if found else None


def running_threads(pid: int, exclude: Iterable[int] = ()) -> Optional[int]:
    """How many threads of process ``pid`` are running or runnable (state ``R`` in Linux's
    ``/proc/<pid>/task/*/stat``), leaving out the thread ids in ``exclude``; None where that is
    not available.

    A spinning thread pool is always ``R``; a pool that sleeps (a futex, a condition variable,
    a pipe read) is ``S``. Unlike CPU time, the state is current: a thread's CPU time in
    ``schedstat`` is brought up to date only at a scheduler tick or a switch (every 4 ms at
    250 Hz), so a thread that spins on its core without being switched out reads as idle over
    any window shorter than a tick. That hid ONNX Runtime's workers, which spin for about 30 ms
    of CPU after each run, from the first version of :func:`wait_idle` (2 ms windows): ollie's
    Candy was timed at 41 ms beside them instead of 3.7 ms.
    """
    skip = {int(tid) for tid in exclude}
    count = 0
    found = False
    for path in glob.glob(f"/proc/{pid}/task/*/stat"):
        try:
            if int(path.split("/")[-2]) in skip:
                continue
            with open(path, encoding="ascii", errors="replace") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
            found = True
        except (OSError, ValueError, IndexError):
            continue  # a thread that ended meanwhile
        count += state == "R"
    return count if found else None


def wait_idle(pid: int, max_wait_s: float = 0.5, poll_s: float = 0.001, quiet_polls: int = 3,
              fallback_s: float = 0.005) -> float:  # fmt: skip
    """Wait until no thread of process ``pid`` is running (:func:`running_threads`) in
    ``quiet_polls`` consecutive polls ``poll_s`` apart (its thread pools stopped spinning), at
    most ``max_wait_s``; returns the seconds waited. Where ``pid`` is this process, the calling
    thread is left out. Without per-thread states, waits ``fallback_s``."""
    start = time.perf_counter()
    exclude = (threading.get_native_id(),) if pid == os.getpid() else ()
    quiet = 0
    while time.perf_counter() - start < max_wait_s:
        running = running_threads(pid, exclude)
        if running is None:
            time.sleep(fallback_s)
            break
        quiet = quiet + 1 if running == 0 else 0
        if quiet >= quiet_polls:
            break
        time.sleep(poll_s)
    return time.perf_counter() - start


class Worker:
    """A fresh process that runs ``factory(**kwargs)`` and serves timing commands.

    Parameters
    ----------
    name : str
        What the worker holds (for messages).
    factory : callable
        A module-level function (spawn pickles it by name) returning an
        :data:`.outcome.Outcome`.
    kwargs : dict
        Its arguments (picklable).
    modules : iterable of str
        Modules the worker imports first.
    env : dict, optional
        The worker's whole environment (default: this process's).
    reply_timeout_s : float
        Longest wait for a timing reply; the first reply (preparing, tuning) has none.
    """

    def __init__(self, name: str, factory: Callable[..., tuple], kwargs: dict,
                 modules: Iterable[str] = (), env: Optional[Dict[str, str]] = None,
                 reply_timeout_s: float = 600.0):  # fmt: skip
        self.name = name
        self.reply_timeout_s = reply_timeout_s
        #: seconds of one call found by the last :meth:`calibrate` (None: not timed)
        self.call_s: Optional[float] = None
        context = multiprocessing.get_context("spawn")
        self._conn, child = context.Pipe()
        self.process = context.Process(target=serve, args=(child, factory, kwargs, list(modules)),
                                       name=f"bench-worker-{name}", daemon=True)  # fmt: skip
        with _environ(env):
            self.process.start()
        child.close()  # the child's end lives in the child: its exit ends our reads

    def _receive(self, expect: str, timeout_s: Optional[float]):
        start = time.perf_counter()
        while not self._conn.poll(0.2):
            if not self.process.is_alive() and not self._conn.poll(0.2):
                raise WorkerFailed(f"worker {self.name} exited with code {self.process.exitcode}")
            if timeout_s is not None and time.perf_counter() - start > timeout_s:
                raise WorkerFailed(f"worker {self.name}: no reply in {timeout_s:.0f} s")
        try:
            reply = self._conn.recv()
        except (EOFError, OSError) as err:
            self.process.join(5)
            raise WorkerFailed(f"worker {self.name} exited with code {self.process.exitcode}") \
                from err
        if reply[0] == "failed":
            raise WorkerFailed(f"worker {self.name}: {reply[1]}")
        if reply[0] != expect:
            raise WorkerFailed(f"worker {self.name}: expected {expect!r}, got {reply[0]!r}")
        return reply[1:]

    def ready(self) -> tuple:
        """``(result, outputs)`` once the factory has returned (waits as long as it takes)."""
        return self._receive("ready", None)

    def calibrate(self, min_sample_s: float) -> int:
        """The calls per sample, found in the worker (see :class:`.CallSampler`); the seconds
        of one call it found go to :attr:`call_s`."""
        self._send("calibrate", min_sample_s)
        number, self.call_s = self._receive("calibrated", self.reply_timeout_s)
        return number

    def sample(self, number: int, warmup: int = 0) -> float:
        """Seconds per call over ``number`` calls timed in the worker after ``warmup`` untimed
        ones."""
        self._send("sample", (number, warmup))
        return self._receive("sampled", self.reply_timeout_s)[0]

    def settle(self) -> float:
        """Wait until the worker's threads are idle (:func:`wait_idle`); the seconds waited."""
        return wait_idle(self.process.pid) if self.process.is_alive() else 0.0

    def _send(self, command: str, arg) -> None:
        try:
            self._conn.send((command, arg))
        except (BrokenPipeError, OSError) as err:
            raise WorkerFailed(f"worker {self.name} is gone ({err})") from err

    def close(self) -> None:
        """Ask the worker to exit; terminate it if it does not within a few seconds."""
        with contextlib.suppress(BrokenPipeError, OSError):
            self._conn.send(("stop", None))
        self.process.join(5)
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(5)
        self._conn.close()
