"""The fastest call of each of a few kernels, its samples taken in turns and spread in time.

What the calibration (:mod:`.calibrate`) needs from a timing is what the machine *can* do:
the machine only ever slows a call down, so the fastest call is the statistic. Before, each
kernel was timed in one burst (five calls in a row on the kernels' threads, then five on one
thread), and on the shared 2-core machine a burst either fell in a stretch where both cores were free or in one
where another process held a core, for all its calls alike (docs/compile-time.md, cold13:
five fresh processes at load 4 measured the library convolution at 0.18-0.64 of the roof and
its transposed convolution at 0.22-0.35, every kernel's two-thread burst 10-60 ms in some
processes and 0.1-3 ms in others); which kernel drew which stretch set the kinds' ratio, and
with it whether the demo's search ran 0 or 22 s.

Here every kernel is called in each of ``rounds`` rounds, the kernels in turn within a round,
with a pause between rounds: a kernel's fastest call then comes from several stretches of the
machine, and the kernels drew from the same stretches. The calibration times them on one
thread by the calling thread's CPU clock (:func:`~.calibrate._spread_native`: what another
process takes from the core is not counted at all); the rounds are what is left for the
stretches that still slow a call (another process on the other core sharing the caches).
"""

from __future__ import annotations

import math
import time
from typing import Callable, Dict, Mapping

__all__ = ["PAUSE_S", "REPEAT", "ROUNDS", "spread_best"]

#: Rounds; timed calls of each kernel per round; seconds paused between rounds.
ROUNDS = 5
REPEAT = 2
PAUSE_S = 0.005


def spread_best(calls: Mapping[str, Callable[[], object]], rounds: int = ROUNDS,
                repeat: int = REPEAT, pause_s: float = PAUSE_S,
                clock: Callable[[], float] = time.perf_counter,
                sleep: Callable[[float], object] = time.sleep) -> Dict[str, float]:
    """``{name: fastest seconds by clock}`` of ``calls`` (each a kernel call, operands bound).

    Each of ``rounds`` rounds calls every kernel ``repeat`` times, in turn, then pauses
    ``pause_s`` seconds; the first round starts with one untimed call of each (a library
    kernel builds its primitive on its first call, a BLAS wakes its threads). ``clock``: the
    wall clock, or :func:`time.thread_time` for kernels that run on the calling thread alone
    (the seconds it ran, not those another process held its core: the module docstring).
    ``sleep``: tests pass a fake.
    """
    best = dict.fromkeys(calls, math.inf)
    for call in calls.values():
        call()
    for k in range(max(1, rounds)):
        if k and pause_s > 0:
            sleep(pause_s)
        for name, call in calls.items():
            for _ in range(max(1, repeat)):
                start = clock()
                call()
                best[name] = min(best[name], clock() - start)
    return best
