"""Interleaved timing: several executables timed in alternating blocks, one round at a time.

Timing one implementation after the other on a machine that other processes share lets a
change of load land on one of them only: a 2x swing of the machine makes the slower one look
faster. :class:`InterleavedTimer` times them in turns instead. One *round* is one *block* of
each executable, the executables in a rotated order each round; a block is one untimed call
(it pays for caches and for the other runtime's spinning threads) and then timed calls until
``block_s`` has passed (at least one, at most ``max_calls``). A block's sample is its fastest
call (a descheduled call inflates one call, not the sample); what a caller compares is the
median over the rounds of each executable's samples (a loaded phase inflates some rounds, not
the median), with its relative spread ``MAD / median``.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable, List, Optional, Sequence

from ..compat import relax, tvm

__all__ = ["InterleavedTimer", "relative_spread", "vm_runner"]

#: ``run()``: one call of an executable on its inputs (returns when the result is ready).
Runner = Callable[[], object]


def vm_runner(ex: "tvm.runtime.Executable", args: Sequence, device=None) -> Runner:
    """One call of ``ex``'s ``main`` on ``args`` (numpy arrays, copied to ``device`` once; the
    CPU by default), synchronized with the device."""
    dev = device if device is not None else tvm.cpu()
    vm = relax.VirtualMachine(ex, dev)
    main = vm["main"]
    targs = [tvm.runtime.tensor(a, dev) for a in args]
    sync = dev.device_name != tvm.cpu().device_name

    def run():
        out = main(*targs)
        if sync:
            dev.sync()
        return out

    return run


def relative_spread(samples: Sequence[float]) -> float:
    """``median(|x - median(x)|) / median(x)`` of ``samples`` (0 for fewer than two)."""
    if len(samples) < 2:
        return 0.0
    mid = statistics.median(samples)
    if mid <= 0:
        return 0.0
    return statistics.median(abs(x - mid) for x in samples) / mid


class InterleavedTimer:
    """Rounds of alternating blocks over ``runners`` (module docstring); ``None`` runners
    (failed to build) and runners that raise give ``None`` samples.

    Parameters
    ----------
    runners : sequence of Runner or None
        The executables (:func:`vm_runner`).
    block_s : float
        Timed seconds of one block (after its untimed call).
    max_calls : int
        Most timed calls of one block.
    clock : callable
        ``() -> seconds`` (tests pass a fake clock).
    """

    def __init__(self, runners: Sequence[Optional[Runner]], block_s: float = 0.01,
                 max_calls: int = 8, clock: Callable[[], float] = time.perf_counter):
        self.runners = list(runners)
        self.block_s = float(block_s)
        self.max_calls = max(int(max_calls), 1)
        self.clock = clock
        self.samples: List[List[float]] = [[] for _ in self.runners]
        self.rounds = 0

    def round(self) -> List[Optional[float]]:
        """Time one more round; returns each runner's median so far (None: it failed)."""
        n = len(self.runners)
        for j in range(n):
            k = (j + self.rounds) % n
            if self.runners[k] is None:
                continue
            try:
                self.samples[k].append(self._block(self.runners[k]))
            except Exception:  # pylint: disable=broad-except  # a failing run is no sample
                self.runners[k] = None
                self.samples[k] = []
        self.rounds += 1
        return self.medians()

    def medians(self) -> List[Optional[float]]:
        """Median sample of each runner (None: failed or never timed)."""
        return [statistics.median(s) if s else None for s in self.samples]

    def spreads(self) -> List[float]:
        """:func:`relative_spread` of each runner's samples."""
        return [relative_spread(s) for s in self.samples]

    def _block(self, run: Runner) -> float:
        run()  # untimed: caches, and the threads another runtime left spinning
        best, spent, calls = float("inf"), 0.0, 0
        while calls < self.max_calls and (calls == 0 or spent < self.block_s):
            t0 = self.clock()
            run()
            dt = self.clock() - t0
            best, spent, calls = min(best, dt), spent + dt, calls + 1
        return best
