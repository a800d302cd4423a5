"""Interleaved latency measurement: every system runs once per round, in rotating order.

Interleaving puts all systems under the same machine conditions (other load, frequency
changes), and the per-round pairs give each system's ratio to a reference measured side by side.
Each sample repeats a call ``number`` times (chosen so a sample lasts about ``min_sample_s``) so
that microsecond-scale models are not dominated by timer resolution.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from typing import Callable, Dict, List, Optional, Tuple


@dataclasses.dataclass
class Samples:
    """Per-call seconds of one system, one entry per round."""

    number: int
    seconds: List[float]

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)


def measure_interleaved(
    runs: Dict[str, Callable[[], object]],
    budget_s: float = 5.0,
    min_rounds: int = 5,
    max_rounds: int = 200,
    min_sample_s: float = 2e-3,
    hard_min_rounds: int = 3,
    gap_s: float = 0.005,
) -> Dict[str, Samples]:
    """Time every callable in ``runs`` in interleaved rounds.

    Parameters
    ----------
    runs : dict of name -> callable
        Each callable performs one complete inference (including any device synchronization).
    budget_s : float
        Wall time after which no new round starts once ``min_rounds`` are done. A round that
        alone exceeds the budget still gives ``hard_min_rounds`` rounds, so every system gets a
        median of at least that many samples.
    min_rounds, max_rounds : int
        Bounds on the number of rounds.
    min_sample_s : float
        Target duration of one sample (a sample is ``number`` back-to-back calls).
    gap_s : float
        Pause before each sample when several systems alternate: thread pools (OpenMP, TVM,
        ONNX Runtime) spin for a while after their last task, and without a pause that spinning
        would compete with the next system for the cores.

    Returns
    -------
    dict of name -> Samples
    """
    names = list(runs)
    if not names:
        return {}
    numbers = {}
    for name in names:  # one warm-up call each, which also calibrates ``number``
        start = time.perf_counter()
        runs[name]()
        once = time.perf_counter() - start
        numbers[name] = max(1, min(1000, math.ceil(min_sample_s / max(once, 1e-9))))
    samples = {name: Samples(numbers[name], []) for name in names}
    start_all = time.perf_counter()
    for round_index in range(max_rounds):
        order = names[round_index % len(names) :] + names[: round_index % len(names)]
        for name in order:
            fn, number = runs[name], numbers[name]
            if gap_s > 0 and len(names) > 1:
                time.sleep(gap_s)
            start = time.perf_counter()
            for _ in range(number):
                fn()
            samples[name].seconds.append((time.perf_counter() - start) / number)
        elapsed = time.perf_counter() - start_all
        done = round_index + 1
        if done >= min_rounds and elapsed >= budget_s:
            break
        if done >= hard_min_rounds and elapsed >= 3 * budget_s:
            break
    return samples


def _pairs(samples: Samples, reference: Samples) -> List[float]:
    return [a / b for a, b in zip(samples.seconds, reference.seconds) if b > 0]


def paired_ratio(samples: Samples, reference: Samples) -> Optional[float]:
    """Median over rounds of ``t_system / t_reference`` (rounds are paired by index)."""
    pairs = _pairs(samples, reference)
    return statistics.median(pairs) if pairs else None


def paired_ratio_quartiles(samples: Samples, reference: Samples) -> Optional[Tuple[float, float]]:
    """First and third quartiles over rounds of ``t_system / t_reference``.

    The spread says how far one run's ratio can be trusted: two systems whose quartile ranges
    both contain 1 are a tie at this machine's noise. None with fewer than two rounds.
    """
    pairs = sorted(_pairs(samples, reference))
    if len(pairs) < 2:
        return None
    q = statistics.quantiles(pairs, n=4, method="inclusive")
    return q[0], q[2]
