"""Which of several alternatives is fastest, timed so that the answer does not depend on luck.

On a shared machine one timing can be off by 10-100x, and a decision taken on it is frozen into
the executable: the same model built twice then runs at different speeds. Every timed decision
(a unit's alternatives in :mod:`tvm_ollie.transform`, the joint build's whole plans in
:mod:`tvm_ollie.pipeline.guard`) goes through :func:`compare`:

* **interleaved rounds**: round ``r`` takes one sample of every alternative, in an order rotated
  by ``r``, so that load drifting over time falls on all of them alike; a sample of a kernel
  faster than a millisecond is several calls (:func:`calls_per_sample`, the same count for every
  alternative);
* **until the leaders separate**: after ``min_rounds``, the rounds stop as soon as the fastest
  alternative (least median) *beats* every other one, or when the budget (``max_rounds``,
  ``time_s``) is spent. ``a`` beats ``b`` by a relative ``margin`` when their medians'
  confidence intervals are disjoint and the medians differ by the margin:

      beats(a, b) = hi(a) < lo(b)  and  median(a) < (1 - margin) * median(b)

  The intervals are the distribution-free order-statistic intervals of the median
  (:func:`median_interval`): for ``n`` sorted samples ``[x_k, x_(n+1-k)]`` with the largest
  ``k`` whose coverage ``1 - 2 P(Binomial(n, 1/2) < k)`` is at least ``confidence``. They
  assume nothing about the timing distribution (which has a long right tail here), need no
  random resampling (a bootstrap would make the decision depend on a seed), and ignore the
  ``k - 1`` most extreme samples at each end: one outlier widens the interval only until
  ``n = 8`` (at 90%), then it is ignored;
* **paired rounds**: the machine's speed drifts over seconds (on the 2-vCPU development VM
  the same library's median moved between 0.12 and 0.25 ms from one second to the next,
  docs/measuring.md), which widens every alternative's interval alike. Samples of the same
  round were taken side by side, so from :data:`PAIRED_MIN` rounds in which both were timed
  ``a`` also beats ``b`` when the median of the per-round ratios ``a_r / b_r`` is below
  ``1 - margin`` beyond doubt (the upper end of its order-statistic interval), and ``a``'s
  judged statistic is the lower: the drift divides out of a ratio::

      beats(a, b) = (hi(a) < lo(b)  and  median(a) < (1 - margin) * median(b))
                    or (hi(median_r a_r / b_r) < 1 - margin  and  median(a) < median(b))
* **a low quantile where the noise is one-sided** (``quantile``): the machine can only slow a
  sample down (a descheduled thread, a core taken by another process), never speed it up, so
  the decisions of :mod:`tvm_ollie.transform` judge the first quartile instead of the median,
  with its own order-statistic interval (:func:`quantile_interval`: the narrowest ``[x_l, x_u]``
  whose coverage ``P(l <= Binomial(n, q) < u)`` reaches ``confidence``, ``[min, max]`` below
  15 samples for the first quartile at 90%). Over 15 samples the median's interval is
  ``[x_4, x_12]``, so four slowed samples of the faster alternative hide its gain; the first
  quartile's is ``[x_2, x_8]`` (eight). The price: one sample faster than the alternative can
  run (which the machine does not produce) is ignored only from 15 samples on;
* **a stated tie-break**, never the luckier sample: when the fastest does not beat some
  others, those are *tied* with it, and the winner is the first of the tied alternatives in the
  caller's order of preference (``prefer``: e.g. the original, then the lower analytic cost,
  then the simpler program) that beats every alternative preferred over it outside the tie
  (the fastest always qualifies)::

      tied   = {fastest} + {b : not beats(fastest, b)}
      winner = first w in prefer, w in tied, with beats(w, p) for all p before w, p not in tied

* **a close separation is confirmed, not taken at the first look** (``clear``): the rounds
  are judged after every round from ``min_rounds`` on, and each look is a new chance for a
  burst of slowed samples to separate two alternatives that are near the margin (optional
  stopping). Three fresh builds of quick YOLOX (2026-12-05, docs/decisions.md) differed in 7
  of 45 unit decisions, four of them separated after 5-11 rounds by a gain of 16-22% (the
  margin 15%) that the other build, after 15 rounds, measured at 5-15% and tied. So the rounds
  stop early only on a separation by ``clear`` times the margin; a closer one goes on to
  ``max_rounds`` (or ``time_s``) and is judged once at the end by the margin itself. A clear
  gain costs what it did; repetitions are spent only where the decision is close::

      stop early    when separated by clear x margin   (clear = 1: any separation)
      at the end    winner = judge(margin)

* **hopeless alternatives leave early**: one whose fastest sample (of at least two) is more
  than ``hopeless`` times the leader's slowest cannot win, and is not timed again (a plan that
  runs for seconds where the others take milliseconds). Two samples, not one, decide it,
  unless the one sample lasted ``long_sample_s`` or more: a descheduled thread or a burst of
  load inflates a short sample many times, but a sample of a second spans hundreds of
  scheduler slices, and load that lasts that long slows the other alternatives of the round
  too. A first call given as ``initial`` (the whole-model guard's, which also sets the calls
  per sample) is not one of them: it pays what only a first call pays (a library's
  primitives created, weights packed, pages touched), so a plan is hopeless by two samples
  taken after it (one long one), its slowest sample still counted in its favour;
* **a ceiling on slow samples** (``time_cap_s``): ``min_rounds`` is waived once ``time_cap_s``
  seconds are spent and every alternative still in the rounds has two samples. Untuned TVM
  alternatives at paper size take 15-30 s a sample (Longformer's attention, Segformer's
  decode head): five rounds of them held a build for over ten minutes. Two rounds still give
  every alternative the second sample that retires the hopeless ones, and samples that long
  are each an average over seconds; what is not separated then goes to the tie-break.

:class:`Comparison` says, per alternative, the median and interval, whether the winner is
separated or tied, the rounds used and why they stopped; it round-trips through a dict
(:meth:`Comparison.to_dict`) so that a decision's evidence is recorded in the work dir and
reused.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

__all__ = ["PAIRED_MIN", "WARM_SAMPLE_S", "WARM_WARMUP", "Comparison", "Margin", "Sampler",
           "Timing", "beats", "calls_per_sample", "clocked", "compare", "from_seconds", "judge",
           "median_interval", "paired_ratio_interval", "quantile_interval"]

#: ``sampler() -> seconds of one call`` (one sample; None or an exception: it failed).
Sampler = Callable[[], Optional[float]]
#: A relative margin, or ``margin(faster, other) -> relative margin`` per pair of names.
Margin = Union[float, Callable[[str, str], float]]

#: Rounds of two alternatives from which :func:`beats` also judges their per-round ratios
#: (module docstring, "paired rounds"): from 8 the median's 90% interval leaves out the most
#: extreme ratio at each end, so that one outlying round cannot decide.
PAIRED_MIN = 8

#: Why the rounds stopped (:attr:`Comparison.stop`).
STOPS = ("separated", "rounds", "time", "single", "failed", "given")


def median_interval(samples: Sequence[float], confidence: float = 0.9) -> Tuple[float, float]:
    """The order-statistic confidence interval of the median of ``samples`` (module docstring);
    ``[min, max]`` when too few samples reach ``confidence``."""
    xs = sorted(samples)
    n = len(xs)
    if n == 0:
        return (math.nan, math.nan)
    k, below = 1, 0.0  # below = P(Binomial(n, 1/2) < j): the coverage of k = j is 1 - 2 below
    for j in range(1, (n + 1) // 2 + 1):
        below += math.comb(n, j - 1) / 2.0 ** n
        if 1.0 - 2.0 * below < confidence:
            break
        k = j
    return (xs[k - 1], xs[n - k])


def quantile_interval(samples: Sequence[float], quantile: float,
                      confidence: float = 0.9) -> Tuple[float, float]:
    """The order-statistic confidence interval of the ``quantile`` of ``samples`` (module
    docstring): the narrowest ``[x_l, x_u]`` (in ranks; the higher ``l`` among the narrowest)
    whose coverage ``P(l <= Binomial(n, quantile) < u)`` is at least ``confidence``; ``[min,
    max]`` when none is. The median's is :func:`median_interval`."""
    if quantile == 0.5:
        return median_interval(samples, confidence)
    xs = sorted(samples)
    n = len(xs)
    if n == 0:
        return (math.nan, math.nan)
    below = [0.0]  # below[j] = P(Binomial(n, quantile) < j)
    for j in range(n + 1):
        below.append(below[-1] + math.comb(n, j) * quantile ** j * (1 - quantile) ** (n - j))
    best = None
    for lo in range(1, n + 1):
        hi = next((u for u in range(lo + 1, n + 1) if below[u] - below[lo] >= confidence), None)
        if hi is not None and (best is None or hi - lo <= best[1] - best[0]):
            best = (lo, hi)
    lo, hi = best if best is not None else (1, n)
    return (xs[lo - 1], xs[hi - 1])


def _quantile(samples: Sequence[float], quantile: float) -> float:
    """The ``quantile`` of ``samples`` (linear between order statistics; the median for 0.5)."""
    xs = sorted(samples)
    if not xs:
        return math.nan
    pos = quantile * (len(xs) - 1)
    i = int(math.floor(pos))
    j = min(i + 1, len(xs) - 1)
    return xs[i] + (xs[j] - xs[i]) * (pos - i)


@dataclass
class Timing:
    """The samples of one alternative (seconds of one call each) and what they say."""

    name: str
    samples: List[float] = field(default_factory=list)
    failed: str = ""
    retired: bool = False
    confidence: float = 0.9
    quantile: float = 0.5  # the statistic judged (module docstring)
    #: leading samples that were first calls (``compare``'s ``initial``): not evidence that
    #: an alternative is hopeless (module docstring)
    cold: int = 0

    @property
    def median(self) -> float:
        """Median seconds of one call (nan without samples)."""
        xs = sorted(self.samples)
        n = len(xs)
        if n == 0:
            return math.nan
        return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])

    @property
    def center(self) -> float:
        """The judged statistic: the ``quantile`` of the samples (the median by default)."""
        return _quantile(self.samples, self.quantile)

    @property
    def interval(self) -> Tuple[float, float]:
        """The judged statistic's confidence interval (:func:`quantile_interval`)."""
        return quantile_interval(self.samples, self.quantile, self.confidence)

    @property
    def spread(self) -> float:
        """The interval's width relative to the judged statistic (0 for identical samples)."""
        lo, hi = self.interval
        mid = self.center
        return (hi - lo) / mid if mid > 0 else 0.0

    def to_dict(self) -> dict:
        """JSON-able form."""
        out = {"name": self.name, "samples": [float(s) for s in self.samples]}
        if self.failed:
            out["failed"] = self.failed
        if self.retired:
            out["retired"] = True
        if self.cold:
            out["cold"] = self.cold
        return out


def paired_ratio_interval(a: Timing, b: Timing) -> Optional[Tuple[float, float]]:
    """The confidence interval of the median per-round ratio ``a_r / b_r`` (module docstring,
    "paired rounds"), or None with fewer than :data:`PAIRED_MIN` rounds of both (an
    alternative that retired or failed has fewer samples than the others)."""
    if len(a.samples) != len(b.samples) or len(a.samples) < PAIRED_MIN:
        return None
    ratios = [x / y for x, y in zip(a.samples, b.samples) if y > 0]
    if len(ratios) < PAIRED_MIN:
        return None
    return median_interval(ratios, min(a.confidence, b.confidence))


def beats(a: Timing, b: Timing, margin: float = 0.0) -> bool:
    """Whether ``a`` is faster than ``b`` beyond doubt: disjoint intervals and judged statistics
    (medians by default) apart by ``margin`` (relative to ``b``'s), or, over paired rounds, a
    median ratio below ``1 - margin`` beyond doubt (module docstring)."""
    if not a.samples or not b.samples:
        return bool(a.samples)
    if a.interval[1] < b.interval[0] and a.center < (1.0 - margin) * b.center:
        return True
    ratio = paired_ratio_interval(a, b)
    return ratio is not None and ratio[1] < 1.0 - margin and a.center < b.center


def _margin(margin: Margin, faster: str, other: str) -> float:
    return float(margin(faster, other)) if callable(margin) else float(margin)


@dataclass
class Comparison:
    """The outcome of :func:`compare` (module docstring)."""

    timings: Dict[str, Timing] = field(default_factory=dict)
    winner: str = ""
    fastest: str = ""
    separated: bool = False
    tied: List[str] = field(default_factory=list)
    tie_break: str = ""
    rounds: int = 0
    stop: str = ""
    recorded: bool = False  # read back from recorded evidence, nothing timed

    def medians(self) -> Dict[str, float]:
        """Median seconds of every alternative that has samples."""
        return {n: t.median for n, t in self.timings.items() if t.samples and not t.failed}

    def seconds(self, name: str) -> Optional[float]:
        """The median of ``name`` (None: failed or not compared)."""
        t = self.timings.get(name)
        return t.median if t is not None and t.samples and not t.failed else None

    def to_dict(self) -> dict:
        """JSON-able form (:meth:`from_dict` reads it back)."""
        return {"timings": [t.to_dict() for t in self.timings.values()], "winner": self.winner,
                "fastest": self.fastest, "separated": self.separated, "tied": list(self.tied),
                "tie_break": self.tie_break, "rounds": self.rounds, "stop": self.stop,
                "confidence": next((t.confidence for t in self.timings.values()), 0.9),
                "quantile": next((t.quantile for t in self.timings.values()), 0.5)}

    @classmethod
    def from_dict(cls, data: dict) -> "Comparison":
        """The comparison :meth:`to_dict` wrote (``recorded`` set)."""
        conf, quant = float(data.get("confidence", 0.9)), float(data.get("quantile", 0.5))
        timings = {t["name"]: Timing(t["name"], [float(s) for s in t.get("samples", [])],
                                     t.get("failed", ""), bool(t.get("retired", False)), conf,
                                     quant, int(t.get("cold", 0)))
                   for t in data.get("timings", [])}
        return cls(timings, data.get("winner", ""), data.get("fastest", ""),
                   bool(data.get("separated", False)), list(data.get("tied", [])),
                   data.get("tie_break", ""), int(data.get("rounds", 0)),
                   data.get("stop", ""), True)

    def verdict(self) -> str:
        """``"separated"``, or the tie and the tie-break that decided it."""
        if self.separated or len(self.tied) < 2:
            return "separated"
        return f"tie of {', '.join(self.tied)} -> {self.winner} ({self.tie_break})"

    def to_text(self, fmt: Callable[[float], str] = lambda s: f"{s * 1e3:.3f}ms") -> str:
        """One line: every alternative's median [the judged statistic's interval], the rounds,
        the statistic when it is not the median, and the verdict."""
        parts = []
        for t in self.timings.values():
            if t.failed:
                parts.append(f"{t.name} failed ({t.failed})")
                continue
            if not t.samples:
                continue
            lo, hi = t.interval
            extra = ", retired" if t.retired else ""
            parts.append(f"{t.name} {fmt(t.median)} [{fmt(lo)}-{fmt(hi)}{extra}]")
        how = "recorded, " if self.recorded else ""
        quant = next((t.quantile for t in self.timings.values()), 0.5)
        stat = f", judged on the {quant:.0%} quantile" if quant != 0.5 else ""
        return (f"{', '.join(parts)} ({how}{self.rounds} rounds, stop: {self.stop}{stat}; "
                f"{self.verdict()})")


def judge(timings: Dict[str, Timing], prefer: Optional[Sequence[str]] = None,
          margin: Margin = 0.0) -> Tuple[str, str, bool, List[str], str]:
    """``(winner, fastest, separated, tied, tie_break)`` of the alternatives with samples
    (module docstring); ``prefer`` orders the tie-break (default: the order of ``timings``)."""
    live = [n for n, t in timings.items() if t.samples and not t.failed]
    if not live:
        return "", "", False, [], ""
    order = [n for n in (prefer or []) if n in live] + \
        [n for n in timings if n in live and n not in (prefer or [])]
    fastest = min(live, key=lambda n: (timings[n].center, order.index(n)))
    tied = [n for n in order
            if n == fastest or not beats(timings[fastest], timings[n],
                                         _margin(margin, fastest, n))]
    if len(tied) == 1:
        return fastest, fastest, True, tied, ""
    for w in tied:
        before = order[:order.index(w)]
        if all(beats(timings[w], timings[p], _margin(margin, w, p))
               for p in before if p not in tied):
            break
    else:  # unreachable: the fastest beats every alternative outside the tie
        w = fastest
    rule = "first in the order of preference among the tied" if w == tied[0] else \
        "first in the order of preference that beats those preferred over it"
    return w, fastest, False, tied, rule


#: A warm sample of a whole model, for the benchmark (:data:`tvm_ollie.bench.timing.WARM`) and
#: the whole-model guards (:data:`tvm_ollie.pipeline.guard.WARM_TIMING`) alike: at least this
#: many seconds of back-to-back calls, their mean per call ...
WARM_SAMPLE_S = 0.02

#: ... after untimed calls of the same program lasting this fraction of a sample (at least one).
#: One protocol for both, so that the guard's timing of the plan it keeps is what the benchmark
#: reads for the finished executable: over calls whose times have a long tail (a descheduled
#: worker, another process's slice), the median of short samples is systematically below the
#: median of long ones (docs/measuring.md, "The guard's timing against the benchmark's").
WARM_WARMUP = 0.5


def calls_per_sample(seconds: float, floor_s: float = 1e-3, cap: int = 100) -> int:
    """Calls in one sample so that a sample lasts about ``floor_s`` (at most ``cap``)."""
    return max(1, min(cap, math.ceil(floor_s / max(seconds, 1e-9))))


def clocked(run: Callable[[], object], number: int = 1,
            clock: Callable[[], float] = time.perf_counter, warmup: int = 0) -> Sampler:
    """A sampler timing ``number`` calls of ``run`` with ``clock`` (seconds per call), after
    ``warmup`` untimed calls (caches and thread pools back to this alternative's steady state
    after the others ran)."""

    def sample() -> float:
        for _ in range(warmup):
            run()
        start = clock()
        for _ in range(number):
            run()
        return (clock() - start) / number

    return sample


def compare(samplers: Dict[str, Sampler], prefer: Optional[Sequence[str]] = None,
            margin: Margin = 0.0, min_rounds: int = 5, max_rounds: int = 25,
            time_s: Optional[float] = None, clock: Callable[[], float] = time.perf_counter,
            hopeless: float = math.inf, confidence: float = 0.9,
            initial: Optional[Dict[str, float]] = None, quantile: float = 0.5,
            time_cap_s: Optional[float] = None,
            long_sample_s: Optional[float] = None, clear: float = 1.0) -> Comparison:
    """Time ``samplers`` in interleaved rounds until the fastest is separated or the budget is
    spent; the winner by :func:`judge` (module docstring).

    Parameters
    ----------
    samplers : dict
        ``{name: sampler}``; the first sample of each is taken in this order.
    prefer : sequence of str, optional
        The tie-break order (default: the order of ``samplers``).
    margin : float or callable
        Relative margin by which the fastest must beat another to be separated from it.
    min_rounds, max_rounds : int
        Rounds before separation is judged; rounds at most.
    time_s : float, optional
        Stop after this many seconds of ``clock`` (once ``min_rounds`` are done).
    clock : callable
        Only measures the time budget (samplers time themselves).
    hopeless : float
        Ratio beyond which an alternative leaves the rounds (module docstring).
    confidence : float
        Coverage of the median intervals.
    initial : dict, optional
        A first sample of every alternative, taken by the caller (it counts as round 1).
    quantile : float
        The statistic judged: 0.5 the median, lower where the noise is one-sided.
    time_cap_s : float, optional
        Stop before ``min_rounds`` once this many seconds of ``clock`` are spent and every
        active alternative has two samples (module docstring: slow samples).
    long_sample_s : float, optional
        A hopeless alternative whose one sample lasted this long leaves after it (None: two
        samples always).
    clear : float
        The rounds stop before ``max_rounds`` only on a separation by ``clear`` times
        ``margin`` (module docstring: a close separation is confirmed); 1: on any separation.
    """
    timings = {n: Timing(n, confidence=confidence, quantile=quantile) for n in samplers}
    active = list(samplers)
    begin, rounds, stop = clock(), 0, "rounds"
    for r in range(max(1, max_rounds)):
        shift = r % len(active)
        for name in active[shift:] + active[:shift]:
            if r == 0 and initial is not None and name in initial:
                timings[name].samples.append(float(initial[name]))
                timings[name].cold = 1
                continue
            _sample(timings[name], samplers[name])
        active = [n for n in active if not timings[n].failed]
        rounds = r + 1
        if not active or sum(not t.failed for t in timings.values()) < 2:
            stop = "failed" if not active else "single"
            break
        _retire(timings, active, hopeless, long_sample_s)
        active = [n for n in active if not timings[n].retired]
        if rounds < min_rounds:
            if _capped(timings, active, clock() - begin, time_cap_s):
                stop = "time"
                break
            continue
        if judge(timings, prefer, _scaled(margin, clear))[2]:
            stop = "separated"
            break
        if time_s is not None and clock() - begin >= time_s:
            stop = "time"
            break
    winner, fastest, separated, tied, rule = judge(timings, prefer, margin)
    return Comparison(timings, winner, fastest, separated, tied, rule, rounds, stop)


def _scaled(margin: Margin, factor: float) -> Margin:
    """``margin`` times ``factor`` (the margin an early stop asks for, :func:`compare`)."""
    if factor == 1.0:
        return margin
    return lambda faster, other: factor * _margin(margin, faster, other)


def _sample(timing: Timing, sampler: Sampler) -> None:
    try:
        seconds = sampler()
    except Exception as err:  # pylint: disable=broad-except
        timing.failed = f"{type(err).__name__}: {str(err).strip()[:120]}"
        return
    if seconds is None or not seconds >= 0:
        timing.failed = "no time"
        return
    timing.samples.append(float(seconds))


def _capped(timings: Dict[str, Timing], active: List[str], spent_s: float,
            time_cap_s: Optional[float]) -> bool:
    """Whether slow samples end the rounds before ``min_rounds`` (``time_cap_s``)."""
    if time_cap_s is None or spent_s < time_cap_s:
        return False
    return all(len(timings[n].samples) >= 2 for n in active)


def _retire(timings: Dict[str, Timing], active: List[str], hopeless: float,
            long_sample_s: Optional[float] = None) -> None:
    if not math.isfinite(hopeless):
        return
    leader = min(active, key=lambda n: timings[n].center)
    worst = max(timings[leader].samples)
    for n in active:
        t = timings[n]
        warm = t.samples[t.cold:]
        enough = len(warm) >= 2 or (long_sample_s is not None and bool(warm)
                                    and min(warm) >= long_sample_s)
        if n != leader and enough and min(t.samples) > hopeless * worst:
            t.retired = True


def from_seconds(seconds: Dict[str, Optional[float]], prefer: Optional[Sequence[str]] = None,
                 margin: Margin = 0.0) -> Comparison:
    """A comparison of given times (one sample each; None: failed), judged alike: for timers
    that return one number per alternative (tests, tools)."""
    timings = {n: Timing(n, [float(s)] if s is not None else [], "" if s is not None
                         else "no time") for n, s in seconds.items()}
    winner, fastest, separated, tied, rule = judge(timings, prefer, margin)
    return Comparison(timings, winner, fastest, separated, tied, rule, 1, "given")
