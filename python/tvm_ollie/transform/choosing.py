"""The choose stage of a decision: which costed, checked alternative replaces a unit.

Never worse: an alternative is chosen only when it is cheaper than the original by
:data:`MARGIN` under the deciding cost (``t_alt < t_original * (1 - MARGIN)``) and held up under
the check; anything else keeps the original and says why (the
:class:`~.decision.Decision`'s ``reason``).

The analytic estimate shortlists (:func:`shortlist`); :func:`choose_analytic` takes the first
shortlisted alternative that holds up, :func:`choose_measured` times the checked ones together
(:mod:`tvm_ollie.tune.compare`: interleaved rounds until the fastest is separated beyond the
margins, at least :data:`REPRODUCIBLE_MARGIN`, ties to the original, then its native kernel,
then the lower estimate) and takes the winner (the original on its native kernel unless a
derived program beats it by :data:`NATIVE_MARGIN`), :func:`choose_forced` takes a
:data:`Chooser`'s pick if it holds up. The check and the measurement are passed in
(``check(alt) -> (ok, why)``, ``measure(alt) -> seconds or None`` per sample, or a
:data:`TimingStep`): this stage only orders and compares.
"""

from __future__ import annotations

import logging
from typing import Callable, List, Optional, Tuple

from ..derive.program import Program
from ..tune.compare import Comparison, Margin, compare
from .alternatives import Alternative
from .decision import Decision

__all__ = ["DECISION_QUANTILE", "FAR_BEHIND", "MARGIN", "MAX_VERIFY", "NATIVE_MARGIN", "REPRODUCIBLE_MARGIN",
           "Choice", "Chooser", "Decision", "TimingStep", "choose_analytic", "choose_forced",
           "choose_measured", "chosen", "decided", "decision_margin", "far_behind", "format_seconds",
           "kept_by_estimate", "kind_leaders", "native_everywhere", "preference", "sampled",
           "shortlist"]

LOG = logging.getLogger("tvm_ollie.transform")

#: A candidate must be at least this much cheaper than the original (relative).
MARGIN = 0.03
#: A derived program must be at least this much faster than the original on its native kernel
#: (when that was measured) to replace it. Untuned timings of small kernels on a shared machine
#: vary by more than :data:`MARGIN`: DCGAN's 1x64x4x4 -> 32 transposed convolution chose a
#: dense-band matmul (2x the useful multiply-adds) measured at 67 us over the library's 74 us,
#: and it ran at 250 us in the model, the library kernel at 75 us.
NATIVE_MARGIN = 0.1
#: No measured decision is separated by less (relative), whichever the pair: the same two
#: alternatives, timed in two fresh builds on one machine, differ by a ratio that itself varies
#: from build to build. BERT's two orientations of one native matmul (TVM's pool sleeping, load
#: 3-5): 0.85, 0.81 and 0.93 in three builds; at 3% the builds picked differently, at 15% all
#: three tie and take the same by the tie-break (:func:`preference`). Over last session's 134
#: decisions recorded by three builds of each quick model (TVM's pool spinning), 17 differed
#: between builds at the 3% margin and 12-14 at 10-15%: the rest were timings on the scheduler's
#: tick, which :func:`~tvm_ollie.tune.machine.sleeping_pool` removes. A flip within the margin
#: costs at most the margin on that unit; a gain below it is given up.
REPRODUCIBLE_MARGIN = 0.15
#: The statistic a measured decision judges: the first quartile of each alternative's samples
#: (:mod:`tvm_ollie.tune.compare`), since the machine only ever slows a sample down.
DECISION_QUANTILE = 0.25
#: Candidates verified before giving up (cheapest first) when choosing by the analytic cost.
MAX_VERIFY = 3
#: A derived program estimated this many times slower than the original on its library
#: kernel is not checked, built or timed in a measured decision (:func:`far_behind`). Not 10:
#: the calibration measured per process put two library kernels 15-20x apart where they time
#: within 2x (GCN: the library convolution at 0.888 of the roof, its GEMM at 0.057), and at 10x
#: Segformer's 1x1 convolution lost its ``matmul[64x256 @ 256x256]`` form, which the quiet
#: benchmark chose.
FAR_BEHIND = 100.0

#: ``chooser(signature, alternatives) -> alternative or None``: forces the choice for a unit
#: signature among its non-baseline alternatives (cheapest estimate first, then by label); the
#: forced one is still checked (a failure keeps the original), but neither pruned by cost nor
#: timed. ``None`` leaves the decision to the cost model.
Chooser = Callable[[str, List[Alternative]], Optional[Alternative]]
CheckStep = Callable[[Alternative], Tuple[bool, str]]


def native_everywhere(_signature: str, alternatives: List[Alternative]
                      ) -> Optional[Alternative]:
    """A :data:`Chooser`: every unit on its native library kernel when it has one (the
    whole-model guard's ``library`` plan, docs/per-call.md), else the cost model decides."""
    return next((a for a in alternatives if a.program is None and a.impl == "native"), None)

MeasureStep = Callable[[Alternative], Optional[float]]
#: ``timing(alternatives, prefer, margin) -> Comparison``: the alternatives (the original
#: first) timed together, judged with the labels' tie-break order ``prefer`` and ``margin``.
TimingStep = Callable[[List[Alternative], List[str], Margin], Comparison]


def decided(program: Optional[Program], names, reason: str, before_s: float = 0.0,
            after_s: float = 0.0, measured: bool = False, candidates: int = 0,
            explain: str = "", impl: str = "tvm") -> Decision:
    """The :class:`~.decision.Decision` of one signature (no unit yet): ``program`` on
    ``impl`` replaces the unit (``program=None, impl="tvm"``: the original is kept)."""
    return Decision(chosen=Alternative(program, impl).label, reason=reason, explain=explain,
                    before_s=before_s, after_s=after_s, measured=measured,
                    candidates=candidates, program=program, names=list(names), impl=impl)


#: The signature's decision under its name before calls, regions and groups shared one record
#: (:func:`decided`, same positional order); kept for one release.
Choice = decided


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
              measures: bool, library_form: bool = False) -> List[Alternative]:
    """The alternatives worth checking, in order (``others`` sorted by estimate).

    To be chosen by the analytic cost an alternative must beat the original by :data:`MARGIN`;
    to be measured it must be no worse than the original within :data:`MARGIN` (ties are
    common where both sides are memory-bound, e.g. a small matmul on TVM or a library). The
    analytic cost of a region's original (several kernels) is rough: measured, the cheapest
    program of every operator kind, and with ``library_form`` the region's library form (one
    call, :mod:`.layout_absorb`), are tried whatever their estimate; a region's shortlist
    leads with one alternative of each kind.
    """
    bound = base.estimate * ((1 + MARGIN) if measures else (1 - MARGIN))
    better = [a for a in others if a.estimate < bound]
    if region and measures:
        natives = [a for a in others if a.program is None] if library_form else []
        firsts = natives + kind_leaders(others)
        better = firsts + [a for a in better if a not in firsts]
    if region and better:
        leaders = kind_leaders(better)
        better = leaders + [a for a in better if a not in leaders]
    return better


def far_behind(better: List[Alternative], factor: float = FAR_BEHIND) -> List[Alternative]:
    """The shortlisted programs a measured decision leaves out: estimated at least ``factor``
    times the original on its library kernel (the cheapest such alternative of ``better``)::

        drop(p)  iff  estimate(p) >= factor * estimate(original [native])

    Why they cannot win: the timing retires an alternative 3x slower than the leader after two
    rounds (:data:`~.measuring.HOPELESS`) and keeps a program only when it is separated faster
    than the original on its library kernel; the estimates misjudge the library's kernels by
    2-4x on small units (:data:`~.alternatives.MEASURED_SEED_FLOPS`) and one library kind
    against another by up to 20x under a calibration measured on the loaded machine
    (:data:`FAR_BEHIND`), so at 100x the program would have to be misjudged 5 times worse than
    the worst seen. What it saves: the demo's transposed
    convolution shortlisted ``matmul[1x32768 @ 32768x65536]`` (estimated 1.18 s against the
    library's 180 us, under TVM's 3.5 s), whose merged build took 145 s of a 180 s cold build
    and each sample 2.5 s. Without a library form of the original nothing is left out."""
    natives = [a.estimate for a in better if a.program is None and a.impl != "tvm"]
    if not natives:
        return []
    bar = factor * min(natives)
    return [a for a in better if a.program is not None and a.estimate >= bar]


def kept_by_estimate(base: Alternative, others: List[Alternative], names, n_cand: int,
                     note: str) -> Decision:
    """The original kept: nothing on the shortlist."""
    best = format_seconds(others[0].estimate) if others else "none"
    why = (f"no candidate beats the original by the analytic cost "
           f"({format_seconds(base.estimate)} vs best {best}; {n_cand} candidates{note})")
    return decided(None, names, why, base.estimate, base.estimate, False, n_cand)


def choose_analytic(base: Alternative, better: List[Alternative], names, n_cand: int,
                    check: CheckStep) -> Decision:
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
    return decided(None, names, "no cheaper candidate held up: " + "; ".join(failures),
                   base.estimate, base.estimate, False, n_cand)


def choose_measured(base: Alternative, better: List[Alternative], names, n_cand: int,
                    check: CheckStep, measure: MeasureStep, max_measured: int,
                    mode: str, timing: Optional[TimingStep] = None) -> Decision:
    """The fastest of the original and the first ``max_measured`` shortlisted alternatives
    that hold up and build, timed together (``mode`` heads the reason).

    ``timing(alternatives, prefer, margin)`` times them under the protocol of
    :mod:`tvm_ollie.tune.compare` (interleaved rounds until separated); without it each sample
    is one ``measure(alt)`` (:func:`sampled`). :func:`decision_margin` is the separation
    threshold (:data:`MARGIN` against the original, :data:`NATIVE_MARGIN` for a derived program
    against the original on its native kernel) and :func:`preference` the tie-break: the
    original, then its native kernel, then the lower analytic cost, then the fewer stages.
    """
    # the original on its native kernels is what a program must beat: always timed, in addition
    # to the first ``max_measured`` programs (cheap phase programs had pushed it off the list)
    natives = [a for a in better if a.program is None]
    failures, alts = [], [base]
    for alt in natives + [a for a in better if a.program is not None][:max_measured]:
        ok, why = check(alt)
        if not ok:
            failures.append(f"{alt.label}: {why}")
            LOG.warning("ollie: candidate rejected: %s: %s", alt.label, why)
        elif all(a.label != alt.label for a in alts):
            alts.append(alt)
    res = (timing or sampled(measure))(alts, [a.label for a in preference(alts)],
                                       decision_margin(alts))
    t_base = res.seconds(base.label)
    if t_base is None:
        return decided(None, names, "the original operator failed to build or run",
                       base.estimate, base.estimate, False, n_cand)
    failures += [f"{a.label}: failed to build, tune or run" for a in alts[1:]
                 if a.label in res.timings and res.seconds(a.label) is None]
    tail = ("; rejected: " + "; ".join(failures)) if failures else ""
    ties = "" if res.separated else "; ties: the original, its native kernel, the lower " \
        "estimate, the fewer stages"
    summary = f"{mode}: {res.to_text(format_seconds)}{ties}{tail}"
    won = next((a for a in alts if a.label == res.winner), base)
    if won is base:
        return decided(None, names, summary, t_base, t_base, True, n_cand)
    return chosen(won, names, summary, t_base, res.seconds(won.label), True, n_cand)


def preference(alts: List[Alternative]) -> List[Alternative]:
    """The tie-break order of measured alternatives (``alts[0]`` the original): the original,
    the original on native kernels, then programs by analytic estimate, then fewer stages."""
    def rank(alt: Alternative):
        stages = len(alt.program.stages) if alt.program is not None else 0
        return (alt.program is not None, alt.estimate, stages, alt.label)

    return alts[:1] + sorted(alts[1:], key=rank)


def decision_margin(alts: List[Alternative]) -> Callable[[str, str], float]:
    """``margin(faster, other)``: how much faster (relative) ``faster`` must be to beat
    ``other``: :data:`NATIVE_MARGIN` for a derived program against the original on its native
    kernel, :data:`MARGIN` otherwise; never less than :data:`REPRODUCIBLE_MARGIN`."""
    natives = {a.label for a in alts if a.program is None and a.impl != "tvm"}
    programs = {a.label for a in alts if a.program is not None}

    def margin(faster: str, other: str) -> float:
        own = NATIVE_MARGIN if faster in programs and other in natives else MARGIN
        return max(own, REPRODUCIBLE_MARGIN)

    return margin


def sampled(measure: MeasureStep, **protocol) -> TimingStep:
    """A :data:`TimingStep` whose samples are calls of ``measure(alt)`` (a fake timer that
    returns fixed seconds decides as one measurement each would); ``protocol`` goes to
    :func:`~tvm_ollie.tune.compare.compare` (judged on :data:`DECISION_QUANTILE` unless it
    says otherwise)."""
    protocol.setdefault("quantile", DECISION_QUANTILE)

    def timing(alts: List[Alternative], prefer: List[str], margin) -> Comparison:
        return compare({a.label: (lambda a=a: measure(a)) for a in alts}, prefer, margin,
                       **protocol)

    return timing


def choose_forced(base: Alternative, alt: Alternative, names, n_cand: int,
                  check: CheckStep) -> Decision:
    """The chooser's alternative if it holds up (the original otherwise)."""
    if alt.is_baseline:
        return decided(None, names, "forced: original", base.estimate, base.estimate,
                       False, n_cand)
    ok, why = check(alt)
    if not ok:
        return decided(None, names, f"forced {alt.label} rejected: {why}", base.estimate,
                       base.estimate, False, n_cand)
    return chosen(alt, names, "forced by the chooser", base.estimate, alt.estimate, False,
                  n_cand)


def chosen(alt: Alternative, names, reason: str, before: float, after: float, measured: bool,
           n_cand: int) -> Decision:
    """The decision replacing a unit by ``alt`` (with its explanation)."""
    explain = _explain(alt.program) if alt.program is not None else \
        f"original operator on the native {alt.impl} kernel"
    return decided(alt.program, names, reason, before, after, measured, n_cand, explain,
                   alt.impl)


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
