"""Whether a recorded timing verdict may be reused: the conditions it was timed under.

A verdict kept in a work dir or the per-machine cache (:class:`~tvm_ollie.transform.measuring.
DecisionRecords`) is reused by later builds without timing anything, so a verdict timed while
the machine was busy would be frozen into every later build: a benchmark run under load read
back the whole-model guard's "rewritten 42.4 ms, original 23.4 ms" for Candy and kept TVM's
build of the original, 13x slower than the rewritten module on the quiet machine. So each
verdict is recorded with its *evidence* (:func:`evidence`): the machine's load average before
and after the rounds, its cores, and each alternative's relative interquartile spread,

    spread(a) = (q3(a) - q1(a)) / q1(a)        over the samples of alternative a

and a reader asks :func:`doubts` first: a verdict with a doubt is timed again instead of
reused. The rules are data (:data:`RULES`), each with its name and its condition on the
evidence ``e`` and the comparison ``c``:

* ``unrecorded``: no evidence (a record written before this check): ``e is None``;
* ``loaded``: the load average (1 minute) before or after the rounds exceeded the cores,
  ``max(e.load) > LOAD_PER_CPU * e.cpus``: some thread waited for a core while it was timed;
* ``noisy``: an alternative's samples spread more than :data:`SPREAD` and the winner is not
  separated, ``max_a spread(a) > SPREAD and not c.separated`` (at least :data:`MIN_SAMPLES`
  samples; the quartiles of fewer say nothing): the rounds did not measure one steady state,
  and the noise may have decided. One outlier in 15 samples moves neither quartile, so it
  raises no doubt; a winner separated in spite of the noise (its confidence interval clear of
  every other's, which the noise widens) does not either: timing it again finds the same
  plan (the quick zoo's warm builds timed five such verdicts again, BERT's library plan
  separated at 0.114 ms against 0.171, and each kept the same plan);
* ``tie``: the winner is not separated from every other alternative and the tie-break kept
  one whose judged statistic reads more than :data:`SPREAD` slower than the fastest's,
  ``not c.separated and center(c.winner) * (1 - SPREAD) > center(c.fastest)``: a gap that
  large left unseparated is noise in the rounds, and a quieter build may separate it. A tie
  between plans that read alike (within :data:`SPREAD`) is reused: its tie-break gives the
  same plan again, and either plan costs the same.

A timer that returns given seconds (tests, tools: ``stop == "given"``) vouches for them: the
load rule does not apply to them. Nothing here depends on the wall clock or a random seed.

A doubt says the verdict may be wrong; it does not say that timing it again now would give a
better one. :func:`resolvable` keeps the doubts that the present moment can resolve, and a
reader times again only for those (the others are reported with the verdict read back):

* ``unrecorded``: always (nothing is known of how it was timed);
* ``loaded``: only when the machine is not loaded now (``load_now <= LOAD_PER_CPU * cpus``):
  timed again under load, the rounds would carry the same doubt, at the same cost;
* ``noisy``, ``tie``: only when the machine is not loaded now and the verdict was timed fewer
  than :data:`MAX_TIMINGS` times (``e.timings``, counted by :func:`evidence`): rounds that
  were noisy on a quiet machine once get one more chance, not one in every build.

Why: on the shared 2-core machine the load average is above the cores most of the time, so
every verdict was recorded ``loaded`` and every warm build timed the whole model again
(8-17 s of the demo's 8.5-17.8 s warm build, against TVM alone's 0.1-0.3 s), to record
another ``loaded`` verdict. ``TVM_OLLIE_REMEASURE`` (``model guard``) times it again anyway.
"""

from __future__ import annotations

import os
import statistics
from dataclasses import dataclass
from typing import Callable, List, Optional

from .compare import Comparison

__all__ = ["LOAD_PER_CPU", "MAX_TIMINGS", "MIN_SAMPLES", "RULES", "SPREAD", "DoubtRule", "doubts",
           "evidence", "loaded_now", "machine_load", "relative_spread", "resolvable"]

#: Load average (1 minute) per core above which the rounds ran on a busy machine.
LOAD_PER_CPU = 1.0
#: Relative interquartile spread above which an alternative's samples are noise.
SPREAD = 0.15
#: Samples below which the quartiles are not judged.
MIN_SAMPLES = 4
#: Timings of one verdict after which a ``noisy`` or ``tie`` doubt no longer times it again.
MAX_TIMINGS = 2


def machine_load() -> Optional[float]:
    """The 1-minute load average (None where the system has none)."""
    try:
        return float(os.getloadavg()[0])
    except (AttributeError, OSError):
        return None


def relative_spread(samples: List[float]) -> Optional[float]:
    """``(q3 - q1) / q1`` of ``samples`` (module docstring); None below :data:`MIN_SAMPLES`."""
    if len(samples) < MIN_SAMPLES:
        return None
    q1, _, q3 = statistics.quantiles(samples, n=4, method="inclusive")
    return (q3 - q1) / q1 if q1 > 0 else None


def evidence(comparison: Comparison, load_before: Optional[float],
             load_after: Optional[float], cpus: Optional[int] = None,
             previous: Optional[dict] = None) -> dict:
    """The evidence recorded beside ``comparison`` (JSON-able; module docstring);
    ``previous``: the evidence of the verdict it replaces (its ``timings`` are counted on)."""
    spreads = {name: relative_spread(t.samples) for name, t in comparison.timings.items()
               if t.samples and not t.failed}
    before = int((previous or {}).get("timings", 1)) if previous else 0
    return {"load": [v for v in (load_before, load_after) if v is not None],
            "cpus": int(cpus or os.cpu_count() or 1),
            "spread": {k: round(v, 4) for k, v in spreads.items() if v is not None},
            "timed": comparison.stop != "given", "timings": before + 1}


@dataclass(frozen=True)
class DoubtRule:
    """A reason not to reuse a verdict: ``applies(evidence, comparison)`` (module docstring)."""

    name: str
    applies: Callable[[Optional[dict], Comparison], bool]
    says: str


def _loaded(e: Optional[dict], _c: Comparison) -> bool:
    return bool(e and e.get("timed") and e.get("load")
                and max(e["load"]) > LOAD_PER_CPU * e.get("cpus", 1))


def _noisy(e: Optional[dict], c: Comparison) -> bool:
    return bool(e and any(v > SPREAD for v in e.get("spread", {}).values())
                and not c.separated)


def _tie(_e: Optional[dict], c: Comparison) -> bool:
    if c.separated or len(c.tied) < 2 or c.fastest == c.winner:
        return False
    kept, fastest = c.timings.get(c.winner), c.timings.get(c.fastest)
    if kept is None or fastest is None or not kept.samples or not fastest.samples:
        return False
    return kept.center * (1.0 - SPREAD) > fastest.center


#: The rules, in the order their reasons are given.
RULES = (
    DoubtRule("unrecorded", lambda e, _c: e is None, "no record of the conditions it was timed in"),
    DoubtRule("loaded", _loaded, "timed with a load average above the cores"),
    DoubtRule("noisy", _noisy, f"samples spread more than {SPREAD:.0%} between quartiles"),
    DoubtRule("tie", _tie, f"a tie kept a plan more than {SPREAD:.0%} slower than the "
              "fastest (the margin within the noise)"),
)


def loaded_now(load_now: Optional[float], cpus: Optional[int] = None) -> bool:
    """Whether a load average of ``load_now`` (None: unknown, taken as quiet) is above the
    cores (``cpus``, default this machine's)."""
    return load_now is not None and load_now > LOAD_PER_CPU * int(cpus or os.cpu_count() or 1)


def resolvable(comparison: Comparison, recorded: Optional[dict], load_now: Optional[float],
               cpus: Optional[int] = None) -> List[str]:
    """The doubts (:func:`doubts`) about ``comparison`` that timing it again now can resolve
    (module docstring): all of them where there is no evidence; none while the machine is
    loaded (``load_now`` above ``cpus``); ``noisy`` and ``tie`` only until the verdict was
    timed :data:`MAX_TIMINGS` times. Empty: reuse the verdict."""
    found = doubts(comparison, recorded)
    if recorded is None:
        return found
    if loaded_now(load_now, cpus):
        return []
    spent = int(recorded.get("timings", 1)) >= MAX_TIMINGS
    return [d for d in found if not (spent and d.split(":")[0] in ("noisy", "tie"))]


def doubts(comparison: Comparison, recorded: Optional[dict]) -> List[str]:
    """The reasons (:data:`RULES`) not to reuse ``comparison`` recorded with the evidence
    ``recorded``; empty: reuse it."""
    return [f"{rule.name}: {rule.says}" for rule in RULES if rule.applies(recorded, comparison)]

