"""The choose stage of a decision: which costed, checked alternative replaces a unit.

Never worse: an alternative is chosen only when it is cheaper than the original by
:data:`MARGIN` under the deciding cost (``t_alt < t_original * (1 - MARGIN)``) and held up under
the check; anything else keeps the original and says why (the :class:`Choice`'s ``reason``).

The analytic estimate shortlists (:func:`shortlist`); :func:`choose_analytic` takes the first
shortlisted alternative that holds up, :func:`choose_measured` times the checked ones and
takes the fastest (the original on its native kernel unless a derived program beats it by
:data:`NATIVE_MARGIN`), :func:`choose_forced` takes a :data:`Chooser`'s pick if it holds up. The
check and the measurement are passed in (``check(alt) -> (ok, why)``,
``measure(alt) -> seconds or None``, or ``rounds(alts) -> Rounds``): this stage only orders
and compares.

Timed decisions are made on rounds (:func:`stable_winner`): every round times each checked
alternative once more (interleaved, :mod:`.costing`), the decision (:func:`measured_winner`) is
taken on the medians so far, and the rounds stop when two consecutive ones agree, or at a time
cap; a decision that did not settle and involved the original keeps it. A derived program must
also beat the original on its native kernel (when that was timed) by :data:`NATIVE_MARGIN`:
that is what runs when the program is not taken (a region that is kept has its heavy call
decided alone).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence, Tuple

from ..derive.program import Program
from .alternatives import Alternative
from .costing import FixedRounds, Rounds

__all__ = ["MARGIN", "MAX_ROUNDS", "MAX_VERIFY", "NATIVE_MARGIN", "ROUNDS_CAP_S", "Choice",
           "Chooser",
           "choose_analytic", "choose_forced", "choose_measured", "chosen", "format_seconds",
           "kept_by_estimate", "kind_leaders", "measured_winner", "shortlist", "stable_winner"]

LOG = logging.getLogger("tvm_ollie.transform")

#: A candidate must be at least this much cheaper than the original (relative).
MARGIN = 0.03
#: A derived program must be at least this much faster than the original on its native kernel
#: (when that was measured) to replace it. Untuned timings of small kernels on a shared machine
#: vary by more than :data:`MARGIN`: DCGAN's 1x64x4x4 -> 32 transposed convolution chose a
#: dense-band matmul (2x the useful multiply-adds) measured at 67 us over the library's 74 us,
#: and it ran at 250 us in the model, the library kernel at 75 us.
NATIVE_MARGIN = 0.1
#: Candidates verified before giving up (cheapest first) when choosing by the analytic cost.
MAX_VERIFY = 3
#: Most timing rounds of one decision, and the seconds after which no new round starts.
MAX_ROUNDS = 8
ROUNDS_CAP_S = 3.0

#: ``chooser(signature, alternatives) -> alternative or None``: forces the choice for a unit
#: signature among its non-baseline alternatives (cheapest estimate first, then by label); the
#: forced one is still checked (a failure keeps the original), but neither pruned by cost nor
#: timed. ``None`` leaves the decision to the cost model.
Chooser = Callable[[str, List[Alternative]], Optional[Alternative]]
CheckStep = Callable[[Alternative], Tuple[bool, str]]
MeasureStep = Callable[[Alternative], Optional[float]]
#: ``rounds(alternatives) -> Rounds``: timing rounds of the alternatives (:mod:`.costing`).
RoundsStep = Callable[[List[Alternative]], Rounds]


@dataclass
class Choice:
    """The decision for one signature (shared by every unit with it)."""

    program: Optional[Program]
    names: List[str]
    reason: str
    before_s: float = 0.0
    after_s: float = 0.0
    measured: bool = False
    candidates: int = 0
    explain: str = ""
    impl: str = "tvm"
    #: timing rounds the decision took (0: not timed in rounds)
    rounds: int = 0
    #: largest relative spread (``MAD / median``) of the timed alternatives' samples
    spread: float = 0.0

    @property
    def rewritten(self) -> bool:
        """Whether the unit is replaced (by a program, or by its native kernel)."""
        return self.program is not None or self.impl != "tvm"

    @property
    def label(self) -> str:
        """What runs in place of the unit (``"original"`` when it is kept)."""
        return Alternative(self.program, self.impl).label


def kind_leaders(alts: List[Alternative]) -> List[Alternative]:
    """The cheapest alternative of each operator kind (g2bmm, gbmm, matmul, ...) among ``alts``
    (cheapest first): a region's few measured slots then try every kind of rewrite."""
    leaders, kinds = [], set()
    for alt in alts:
        new = set() if alt.program is None else \
            {s.kind for s in alt.program.stages if s.is_operator} - kinds
        if new:
            kinds |= new
            leaders.append(alt)
    return leaders


def shortlist(base: Alternative, others: List[Alternative], region: bool,
              measures: bool) -> List[Alternative]:
    """The alternatives worth checking, in order (``others`` sorted by estimate).

    To be chosen by the analytic cost an alternative must beat the original by :data:`MARGIN`;
    to be measured it must be no worse than the original within :data:`MARGIN` (ties are
    common where both sides are memory-bound, e.g. a small matmul on TVM or a library). The
    analytic cost of a region's original (several kernels) is rough: measured, the cheapest
    program of every operator kind is tried whatever its estimate; a region's shortlist leads
    with one alternative of each kind (after the region kept with its heavy call on the
    library, when that is the cheapest).
    """
    bound = base.estimate * ((1 + MARGIN) if measures else (1 - MARGIN))
    better = [a for a in others if a.estimate < bound]
    if region and measures:
        firsts = kind_leaders(others)
        better = firsts + [a for a in better if a not in firsts]
    if region and better:
        leaders = kind_leaders(better)
        natives = [a for a in better if a.program is None]
        # the region kept with its heavy call on the library leads when it is the cheapest
        first = natives if natives and natives[0].estimate <= better[0].estimate else []
        better = first + leaders + [a for a in better if a not in leaders and a not in first]
    return better


def kept_by_estimate(base: Alternative, others: List[Alternative], names, n_cand: int,
                     note: str) -> Choice:
    """The original kept: nothing on the shortlist."""
    best = format_seconds(others[0].estimate) if others else "none"
    return Choice(None, names, f"no candidate beats the original by the analytic cost "
                  f"({format_seconds(base.estimate)} vs best {best}; {n_cand} candidates{note})",
                  base.estimate, base.estimate, False, n_cand)


def choose_analytic(base: Alternative, better: List[Alternative], names, n_cand: int,
                    check: CheckStep) -> Choice:
    """The first of the :data:`MAX_VERIFY` cheapest shortlisted alternatives that holds up."""
    failures = []
    for alt in better[:MAX_VERIFY]:
        ok, why = check(alt)
        if ok:
            return chosen(alt, names, f"analytic {format_seconds(base.estimate)} -> "
                          f"{format_seconds(alt.estimate)}", base.estimate, alt.estimate,
                          False, n_cand)
        failures.append(f"{alt.label}: {why}")
        LOG.warning("ollie: candidate rejected: %s: %s", alt.label, why)
    return Choice(None, names, "no cheaper candidate held up: " + "; ".join(failures),
                  base.estimate, base.estimate, False, n_cand)


def measured_winner(alts: Sequence[Alternative], times: Sequence[Optional[float]]) -> int:
    """Index in ``alts`` (the baseline first) of the alternative that ``times`` choose; 0 keeps
    the original, -1: the original failed.

    The original on a native kernel is taken when ``t < t_0 (1 - MARGIN)``; a derived program
    when ``t < t_0 (1 - MARGIN)`` and ``t < t_native (1 - NATIVE_MARGIN)`` (``t_native``: the
    original's timed native kernels, what runs if the program is not taken); of those, the
    fastest.
    """
    if not times or times[0] is None:
        return -1
    natives = [t for a, t in zip(alts[1:], times[1:]) if a.program is None and t is not None]
    program_bound = min([times[0] * (1 - MARGIN)] + [t * (1 - NATIVE_MARGIN) for t in natives])
    best = 0
    for k, (alt, t) in enumerate(zip(alts, times)):
        if k == 0 or t is None:
            continue
        bound = times[0] * (1 - MARGIN) if alt.program is None else program_bound
        if t < bound and (best == 0 or t < times[best]):
            best = k
    return best


def stable_winner(alts: Sequence[Alternative], rounds: Rounds, max_rounds: int = MAX_ROUNDS,
                  cap_s: float = ROUNDS_CAP_S, clock: Callable[[], float] = time.perf_counter
                  ) -> Tuple[int, List[Optional[float]], int, bool]:
    """Rounds until two consecutive ones choose the same alternative (:func:`measured_winner`),
    or ``max_rounds``, or ``cap_s`` seconds; a decision that did not settle keeps the original
    when either of the last two rounds chose it. Returns (winner, times, rounds, settled)."""
    start, history = clock(), []
    while True:
        times = rounds.round()
        history.append(measured_winner(alts, times))
        if not rounds.varies or (len(history) > 1 and history[-1] == history[-2]):
            return history[-1], times, len(history), True
        if len(history) >= max_rounds or clock() - start >= cap_s:
            winner = 0 if 0 in history[-2:] or -1 in history[-2:] else history[-1]
            return (winner if times[0] is not None else -1), times, len(history), False


def choose_measured(base: Alternative, better: List[Alternative], names, n_cand: int,
                    check: CheckStep, measure: Optional[MeasureStep], max_measured: int,
                    mode: str, rounds: Optional[RoundsStep] = None) -> Choice:
    """The alternative that the times of the first ``max_measured`` shortlisted programs (and
    the original on native kernels) that hold up choose (:func:`stable_winner`; ``mode``
    heads the reason). ``rounds`` times them together; without it, ``measure`` times each
    once."""
    # the original on native kernels is what a program must beat: timed in addition
    natives = [a for a in better if a.program is None]
    passed, failures = [], []
    for alt in natives + [a for a in better if a.program is not None][:max_measured]:
        ok, why = check(alt)
        if ok:
            passed.append(alt)
        else:
            failures.append(f"{alt.label}: {why}")
            LOG.warning("ollie: candidate rejected: %s: %s", alt.label, why)
    alts = [base] + passed
    timed = rounds(alts) if rounds is not None else FixedRounds([measure(a) for a in alts])
    winner, times, n_rounds, settled = stable_winner(alts, timed)
    if times[0] is None:
        return Choice(None, names, "the original operator failed to build or run",
                      base.estimate, base.estimate, False, n_cand)
    timed.finish(times)
    spreads = timed.spreads() or [0.0] * len(alts)
    shown = []
    for alt, t, spread in zip(alts, times, spreads):
        if t is None:
            if alt is not base:
                failures.append(f"{alt.label}: failed to build, tune or run")
            continue
        shown.append(f"{alt.label} {format_seconds(t)}" + (f" ±{spread:.0%}" if spread else ""))
    tail = ("; rejected: " + "; ".join(failures)) if failures else ""
    how = "" if not timed.varies else \
        f" ({n_rounds} interleaved rounds{'' if settled else ', not settled'})"
    summary = f"{mode}{how}: " + ", ".join(shown) + tail
    spread = max((s for s, t in zip(spreads, times) if t is not None), default=0.0)
    n_rounds = n_rounds if timed.varies else 0
    if winner <= 0:
        choice = Choice(None, names, summary, times[0], times[0], True, n_cand)
    else:
        choice = chosen(alts[winner], names, summary, times[0], times[winner], True, n_cand)
    choice.rounds, choice.spread = n_rounds, spread
    return choice


def choose_forced(base: Alternative, alt: Alternative, names, n_cand: int,
                  check: CheckStep) -> Choice:
    """The chooser's alternative if it holds up (the original otherwise)."""
    if alt.is_baseline:
        return Choice(None, names, "forced: original", base.estimate, base.estimate,
                      False, n_cand)
    ok, why = check(alt)
    if not ok:
        return Choice(None, names, f"forced {alt.label} rejected: {why}", base.estimate,
                      base.estimate, False, n_cand)
    return chosen(alt, names, "forced by the chooser", base.estimate, alt.estimate, False,
                  n_cand)


def chosen(alt: Alternative, names, reason: str, before: float, after: float, measured: bool,
           n_cand: int) -> Choice:
    """The :class:`Choice` replacing a unit by ``alt`` (with its explanation)."""
    explain = _explain(alt.program) if alt.program is not None else \
        f"original operator on the native {alt.impl} kernel"
    return Choice(alt.program, names, reason, before, after, measured, n_cand, explain, alt.impl)


def _explain(prog: Program) -> str:
    try:
        return prog.explain()
    except Exception:  # pylint: disable=broad-except
        return repr(prog)


def format_seconds(seconds: float) -> str:
    """Seconds as a short human string (ns/us/ms)."""
    if seconds < 1e-6:
        return f"{seconds * 1e9:.1f}ns"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f}us"
    return f"{seconds * 1e3:.2f}ms"
