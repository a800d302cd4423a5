"""Latency measured in rounds: every system takes one sample per round, in rotating order.

Alternating puts all systems under the same machine conditions (other load, frequency
changes), and the per-round pairs give each system's ratio to a reference measured side by side.
The systems take turns in this process (:func:`measure_interleaved`) or each in its own worker
process, one worker at a time (:func:`measure_rounds` with the samplers of :mod:`.worker`).

**What one sample measures** (:class:`Protocol`). By default (:data:`WARM`) a system's *warm
steady state*, what ONNX Runtime's perf test and TVM's ``time_evaluator`` report and what a
serving loop gets: before each sample some untimed warm-up calls (at least one, lasting at
least ``warmup_s``), then ``number`` back-to-back calls lasting at least ``min_sample_s``, their
mean per call. Until 2026-12-03 a sample was the calls of about 2 ms with no warm-up, right after
another system (or worker process) had used the cores: one call for most models, so the
benchmark timed *cold* single calls (caches of the other process, thread pools asleep): YOLOX in
ollie 2.9 ms against 1.3 ms in a warm loop of the same build, ONNX Runtime 1.1-1.6 against 0.5.
That protocol is kept as :data:`COLD` (exactly one call per sample, no warm-up; ``--cold``),
reported as such: it is what a call after idle time costs, and a different question.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from typing import Callable, Dict, List, Optional, Protocol, Tuple

from ..tune.compare import WARM_SAMPLE_S, WARM_WARMUP


@dataclasses.dataclass(frozen=True)
class Protocol:
    """How each sample is taken: ``warmup_calls(number)`` untimed calls, then ``number`` timed
    back-to-back calls (``number``: calls that last at least ``min_sample_s``, from the
    sampler's :meth:`~CallSampler.calibrate`).

    Attributes
    ----------
    name : str
        ``"warm"``, ``"cold"``, or what a caller names its own.
    min_sample_s : float
        A sample lasts at least this long (0: one call per sample).
    warmup_s : float
        The untimed calls before each sample last about this long ...
    min_warmup : int
        ... and are at least this many.
    """

    name: str
    min_sample_s: float
    warmup_s: float = 0.0
    min_warmup: int = 0

    def warmup_calls(self, number: int) -> int:
        """Untimed calls before a sample of ``number`` calls: as many as last ``warmup_s``
        (``number`` calls last about ``min_sample_s``), at least ``min_warmup``."""
        if self.warmup_s <= 0 or self.min_sample_s <= 0:
            return self.min_warmup
        return max(self.min_warmup, math.ceil(number * self.warmup_s / self.min_sample_s))

    def to_dict(self) -> dict:
        """JSON-able form (recorded in the benchmarks' results)."""
        return dataclasses.asdict(self)

    def describe(self) -> str:
        """One phrase for a report's first line."""
        if self.min_sample_s <= 0 and self.min_warmup == 0:
            return f"{self.name} protocol: one call per sample, no warm-up"
        return (f"{self.name} protocol: samples of at least {self.min_sample_s * 1e3:g} ms of "
                f"back-to-back calls after at least {self.min_warmup} untimed warm-up call(s) "
                f"of {self.warmup_s * 1e3:g} ms")


#: Warm steady state (the default; module docstring): samples of at least 20 ms after at least
#: 10 ms of untimed calls (at least one). Right after another process had burnt both cores for
#: 20 ms, a sample of one or two calls read 1.5-4.7x the warm loop, and one of at least 50 ms
#: 1.1x (docs/measuring.md, "Warm samples"); 20 ms after 10 ms keeps a round of three systems
#: near 100 ms. The whole-model guards take their samples alike
#: (:data:`~tvm_ollie.tune.compare.WARM_SAMPLE_S`, :data:`~tvm_ollie.tune.compare.WARM_WARMUP`).
WARM = Protocol("warm", min_sample_s=WARM_SAMPLE_S, warmup_s=WARM_SAMPLE_S * WARM_WARMUP,
                min_warmup=1)

#: One call per sample, right after whatever ran before (the other systems, in the benchmark's
#: rounds): what a call costs after idle time (``--cold``).
COLD = Protocol("cold", min_sample_s=0.0)

PROTOCOLS = {"warm": WARM, "cold": COLD}


def resolve_protocol(protocol: Optional[Protocol] = None,
                     min_sample_s: Optional[float] = None) -> Protocol:
    """The protocol of a measurement: ``protocol`` (default :data:`WARM`) with its sample
    length replaced by ``min_sample_s`` when given; only ``min_sample_s`` given: samples of
    that length with no warm-up (what the kernel benchmarks that pass it have always timed)."""
    if protocol is None:
        if min_sample_s is None:
            return WARM
        return Protocol("fixed", min_sample_s=min_sample_s)
    if min_sample_s is None:
        return protocol
    return dataclasses.replace(protocol, min_sample_s=min_sample_s)


@dataclasses.dataclass
class Samples:
    """Per-call seconds of one system, one entry per round."""

    number: int
    seconds: List[float]
    warmup: int = 0
    #: timed once, in calibration, not in the rounds (:func:`measure_rounds`'s ``slow_call_s``)
    once: bool = False

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)


class CallSampler:
    """Samples of a callable in this process: ``number`` back-to-back calls per sample."""

    def __init__(self, fn: Callable[[], object]):
        self.fn = fn
        #: seconds of one call found by the last :meth:`calibrate` (None: not timed)
        self.call_s: Optional[float] = None

    def calibrate(self, min_sample_s: float) -> int:
        """The calls per sample that last at least ``min_sample_s`` (1 when it is 0, after one
        untimed call): from up to three timed calls after an untimed one, since a first call
        after other work runs slower than the calls that follow it (:func:`calibrate_calls`).
        Their median is kept as :attr:`call_s`."""
        number, self.call_s = calibrate_calls(self.fn, min_sample_s)
        return number

    def sample(self, number: int, warmup: int = 0) -> float:
        """Seconds per call over ``number`` back-to-back calls, after ``warmup`` untimed ones."""
        fn = self.fn
        for _ in range(warmup):
            fn()
        start = time.perf_counter()
        for _ in range(number):
            fn()
        return (time.perf_counter() - start) / number


def calls_for(fn: Callable[[], object], min_sample_s: float, cap: int = 1000,
              max_s: float = 0.5) -> int:
    """Calls of ``fn`` that last at least ``min_sample_s`` (at most ``cap``; :meth:`CallSampler.
    calibrate`), from the median of up to three timed calls after an untimed one (the fastest
    would let one lucky call on a busy machine stretch every sample). The timed calls stop
    early once they took ``max_s``."""
    return calibrate_calls(fn, min_sample_s, cap, max_s)[0]


def calibrate_calls(fn: Callable[[], object], min_sample_s: float, cap: int = 1000,
                    max_s: float = 0.5) -> Tuple[int, Optional[float]]:
    """``(calls, seconds of one call)``: :func:`calls_for` and the median of its timed calls
    (None when ``min_sample_s`` is 0: then only the untimed call runs)."""
    fn()
    if min_sample_s <= 0:
        return 1, None
    took, spent = [], 0.0
    for _ in range(3):
        start = time.perf_counter()
        fn()
        took.append(time.perf_counter() - start)
        spent += took[-1]
        if spent >= max_s:
            break
    once = statistics.median(took)
    return max(1, min(cap, math.ceil(min_sample_s / max(once, 1e-9)))), once


class Sampler(Protocol):
    """What :func:`measure_rounds` times (see there)."""

    def calibrate(self, min_sample_s: float) -> int: ...

    def sample(self, number: int, warmup: int = 0) -> float: ...


def measure_interleaved(
    runs: Dict[str, Callable[[], object]],
    budget_s: float = 5.0,
    min_rounds: int = 5,
    max_rounds: int = 200,
    min_sample_s: Optional[float] = None,
    hard_min_rounds: int = 3,
    gap_s: float = 0.005,
    protocol: Optional[Protocol] = None,
    slow_call_s: Optional[float] = None,
) -> Dict[str, Samples]:
    """Time every callable in ``runs`` in interleaved rounds, all in this process.

    Parameters
    ----------
    runs : dict of name -> callable
        Each callable performs one complete inference (including any device synchronization).
    budget_s, min_rounds, max_rounds, min_sample_s, hard_min_rounds, protocol, slow_call_s
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
                          hard_min_rounds, settle=settle, protocol=protocol,
                          slow_call_s=slow_call_s)  # fmt: skip


def warm_samples(fn: Callable[[], object], samples: int,
                 protocol: Optional[Protocol] = None) -> Samples:
    """``samples`` samples of ``fn`` alone in this process under ``protocol`` (default
    :data:`WARM`): the warm steady state of a model, as the benchmark times it (the profiler's
    "model without the profiler" on both sides, :mod:`tvm_ollie.profiler`)."""
    return measure_rounds({"fn": CallSampler(fn)}, budget_s=0.0, min_rounds=samples,
                          max_rounds=samples, hard_min_rounds=samples,
                          protocol=protocol)["fn"]  # fmt: skip


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
    min_sample_s: Optional[float] = None,
    hard_min_rounds: int = 3,
    settle: Optional[Callable[[Optional[str]], None]] = None,
    failures: Optional[Dict[str, str]] = None,
    protocol: Optional[Protocol] = None,
    slow_call_s: Optional[float] = None,
) -> Dict[str, Samples]:
    """Time every sampler in rounds: one sample each per round, in rotating order.

    A sampler has ``calibrate(min_sample_s) -> number`` (calls per sample) and ``sample(number,
    warmup) -> seconds per call`` (``warmup`` untimed calls first); it may run in this process
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
    min_sample_s : float, optional
        Least duration of one sample (a sample is ``number`` back-to-back calls); replaces the
        protocol's (:func:`resolve_protocol`).
    settle : callable, optional
        Called before each sample with the name of the sampler that ran last (None before the
        first): waits until that one has gone idle (a pause, or a wait for a worker's threads
        to stop spinning).
    failures : dict, optional
        Receives ``name -> reason`` for each sampler that raised; it is dropped (with its
        samples) and the others go on.
    protocol : Protocol, optional
        How a sample is taken (default :data:`WARM`: untimed warm-up calls, then at least
        20 ms of calls; :data:`COLD`: one call).
    slow_call_s : float, optional
        A sampler whose calibration found one call at least this long (its ``call_s``
        attribute, where it has one) is timed once, by that calibration (one timed call after
        an untimed one), and leaves the rounds: its :class:`Samples` has that one call and
        ``once`` set. At paper sizes TVM's untuned kernels take 1-55 s a call, and the rounds
        (an untimed warm-up call and a timed one each, three rounds at least) would spend
        minutes on a system 10-100x slower than the others, whose ratio needs no quartiles.
        None or 0: every sampler takes part in the rounds.

    Returns
    -------
    dict of name -> Samples
        The samplers that did not fail.
    """
    failed = {} if failures is None else failures
    proto = resolve_protocol(protocol, min_sample_s)
    numbers: Dict[str, int] = {}
    once: Dict[str, Samples] = {}
    for name, sampler in samplers.items():
        try:
            numbers[name] = sampler.calibrate(proto.min_sample_s)
        except Exception as err:  # pylint: disable=broad-except
            failed[name] = f"{type(err).__name__}: {err}"[:500]
            continue
        call_s = getattr(sampler, "call_s", None)
        if slow_call_s and call_s is not None and call_s >= slow_call_s:
            once[name] = Samples(1, [call_s], 0, once=True)
    names = [name for name in samplers if name in numbers and name not in once]
    samples = {name: Samples(numbers[name], [], proto.warmup_calls(numbers[name]))
               for name in names}
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
                samples[name].seconds.append(_sample(samplers[name], samples[name]))
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
    samples.update(once)
    return {name: samples[name] for name in samplers if name in samples}


def _sample(sampler: "Sampler", samples: Samples) -> float:
    """One sample; ``warmup`` is passed only when there is one (a sampler written before the
    protocol had warm-up takes ``sample(number)``)."""
    if samples.warmup:
        return sampler.sample(samples.number, samples.warmup)
    return sampler.sample(samples.number)


def _pairs(samples: Samples, reference: Samples) -> List[float]:
    return [a / b for a, b in zip(samples.seconds, reference.seconds) if b > 0]


def paired_ratio(samples: Samples, reference: Samples) -> Optional[float]:
    """Median over rounds of ``t_system / t_reference`` (rounds are paired by index); where
    either was timed once (``once``, not in the rounds), the ratio of their medians."""
    if samples.once or reference.once:
        return samples.median / reference.median if reference.median > 0 else None
    pairs = _pairs(samples, reference)
    return statistics.median(pairs) if pairs else None


def paired_ratio_quartiles(samples: Samples, reference: Samples) -> Optional[Tuple[float, float]]:
    """First and third quartiles over rounds of ``t_system / t_reference``.

    The spread says how far one run's ratio can be trusted: two systems whose quartile ranges
    both contain 1 are a tie at this machine's noise. None with fewer than two rounds, or
    where either was timed once (no rounds to pair).
    """
    if samples.once or reference.once:
        return None
    pairs = sorted(_pairs(samples, reference))
    if len(pairs) < 2:
        return None
    q = statistics.quantiles(pairs, n=4, method="inclusive")
    return q[0], q[2]
