"""Latency measured in rounds: every system takes one sample per round, in rotating order.

Alternating puts all systems under the same machine conditions (other load, frequency
changes), and the per-round pairs give each system's ratio to a reference measured side by side.
The systems take turns in this process (:func:`measure_interleaved`) or each in its own worker
process, one worker at a time (:func:`measure_rounds` with the samplers of :mod:`.worker`).
Each sample repeats a call ``number`` times (chosen so a sample lasts about ``min_sample_s``) so
that microsecond-scale models are not dominated by timer resolution.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from typing import Callable, Dict, List, Optional, Protocol, Tuple


@dataclasses.dataclass
class Samples:
    """Per-call seconds of one system, one entry per round."""

    number: int
    seconds: List[float]

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)


class CallSampler:
    """Samples of a callable in this process: ``number`` back-to-back calls per sample."""

    def __init__(self, fn: Callable[[], object]):
        self.fn = fn

    def calibrate(self, min_sample_s: float) -> int:
        """One warm-up call; returns the calls per sample that last about ``min_sample_s``."""
        start = time.perf_counter()
        self.fn()
        once = time.perf_counter() - start
        return max(1, min(1000, math.ceil(min_sample_s / max(once, 1e-9))))

    def sample(self, number: int) -> float:
        """Seconds per call over ``number`` back-to-back calls."""
        fn = self.fn
        start = time.perf_counter()
        for _ in range(number):
            fn()
        return (time.perf_counter() - start) / number


class Sampler(Protocol):
    """What :func:`measure_rounds` times (see there)."""

    def calibrate(self, min_sample_s: float) -> int: ...

    def sample(self, number: int) -> float: ...


def measure_interleaved(
    runs: Dict[str, Callable[[], object]],
    budget_s: float = 5.0,
    min_rounds: int = 5,
    max_rounds: int = 200,
    min_sample_s: float = 2e-3,
    hard_min_rounds: int = 3,
    gap_s: float = 0.005,
) -> Dict[str, Samples]:
    """Time every callable in ``runs`` in interleaved rounds, all in this process.

    Parameters
    ----------
    runs : dict of name -> callable
        Each callable performs one complete inference (including any device synchronization).
    budget_s, min_rounds, max_rounds, min_sample_s, hard_min_rounds
        As for :func:`measure_rounds`.
    gap_s : float
        Pause before each sample when several systems alternate: thread pools (OpenMP, TVM,
        ONNX Runtime) spin for a while after their last task, and without a pause that spinning
        would compete with the next system for the cores.

    Returns
    -------
    dict of name -> Samples
    """

    def settle(_previous: Optional[str]) -> None:
        if gap_s > 0 and len(runs) > 1:
            time.sleep(gap_s)

    samplers = {name: CallSampler(fn) for name, fn in runs.items()}
    return measure_rounds(samplers, budget_s, min_rounds, max_rounds, min_sample_s,
                          hard_min_rounds, settle=settle)  # fmt: skip


def rotation(names: List[str], round_index: int) -> List[str]:
    """The order of round ``round_index``: ``names`` rotated left by the round's index, so
    that every system comes first (right after the round's start) equally often."""
    shift = round_index % len(names) if names else 0
    return names[shift:] + names[:shift]


def measure_rounds(
    samplers: Dict[str, "Sampler"],
    budget_s: float = 5.0,
    min_rounds: int = 5,
    max_rounds: int = 200,
    min_sample_s: float = 2e-3,
    hard_min_rounds: int = 3,
    settle: Optional[Callable[[Optional[str]], None]] = None,
    failures: Optional[Dict[str, str]] = None,
) -> Dict[str, Samples]:
    """Time every sampler in rounds: one sample each per round, in rotating order.

    A sampler has ``calibrate(min_sample_s) -> number`` (one warm-up call; calls per sample)
    and ``sample(number) -> seconds per call``; it may run in this process
    (:class:`CallSampler`) or drive a worker process (:mod:`.worker`). Samplers take turns, one
    at a time, so each round puts all of them under the same machine conditions, and the
    per-round pairs give each one's ratio to a reference measured side by side.

    Parameters
    ----------
    samplers : dict of name -> sampler
    budget_s : float
        Wall time after which no new round starts once ``min_rounds`` are done. A round that
        alone exceeds the budget still gives ``hard_min_rounds`` rounds, so every system gets a
        median of at least that many samples.
    min_rounds, max_rounds : int
        Bounds on the number of rounds.
    min_sample_s : float
        Target duration of one sample (a sample is ``number`` back-to-back calls).
    settle : callable, optional
        Called before each sample with the name of the sampler that ran last (None before the
        first): waits until that one has gone idle (a pause, or a wait for a worker's threads
        to stop spinning).
    failures : dict, optional
        Receives ``name -> reason`` for each sampler that raised; it is dropped (with its
        samples) and the others go on.

    Returns
    -------
    dict of name -> Samples
        The samplers that did not fail.
    """
    failed = {} if failures is None else failures
    numbers: Dict[str, int] = {}
    for name, sampler in samplers.items():
        try:
            numbers[name] = sampler.calibrate(min_sample_s)
        except Exception as err:  # pylint: disable=broad-except
            failed[name] = f"{type(err).__name__}: {err}"[:500]
    names = [name for name in samplers if name in numbers]
    samples = {name: Samples(numbers[name], []) for name in names}
    previous = None
    start_all = time.perf_counter()
    for round_index in range(max_rounds):
        if not names:
            break
        for name in rotation(names, round_index):
            if settle is not None:
                settle(previous)
            previous = name
            try:
                samples[name].seconds.append(samplers[name].sample(numbers[name]))
            except Exception as err:  # pylint: disable=broad-except
                failed[name] = f"{type(err).__name__}: {err}"[:500]
                names.remove(name)
                del samples[name]
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
