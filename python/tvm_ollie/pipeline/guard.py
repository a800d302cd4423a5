"""Never worse, measured: the joint plan timed whole against the plans it competes with.

The joint selection (:mod:`.joint`) picks derivation alternatives and kernel boundaries by a
cost model, and its in-program guard compares plans by that same model, so a modelling error
(a kernel priced far from what it runs in) can make the joint plan slower than the sequential
build it should beat. When the build can time on this machine (a local CPU, or a GPU present
here: the plans run on the target's device), the joint build also builds, from the decisions it
already made (no second derivation search), the plans it competes with
(:func:`~.joint_plans.joint_build`):

* ``joint``: the joint selection;
* ``refined``: the alternatives the joint selection picked, substituted into the module, then
  fission and orchestration again (:func:`~.joint.apply_picked`): an alternative's result can
  then fuse into its readers, which it cannot inside the joint program; skipped when the
  joint selection picked what the Decider chose (then it is the ``sequential`` plan);
* ``sequential``: every heavy call on the Decider's choice, then fission and orchestration
  (what ``orchestrate=True`` builds, the ``ollie-orch`` system);
* ``derivation``: the same module with TVM's greedy fusion (the ``ollie`` system, its layout
  step included);
* ``library``: every heavy call on its library kernel where it has one, epilogues folded,
  chains of convolutions in oneDNN's format (:func:`~.joint.library_plan`, the sequential
  build's library plan), TVM's greedy fusion; skipped when it is the derivation plan;
* ``orchestration``: the module as given (no derivation, no library kernel), fission and
  orchestration (orchestration alone);
* ``original``: the module as given, built by TVM's own pipeline (greedy fusion): TVM alone,
  so that the joint build is never slower than TVM alone either;

and :func:`guard_plans` keeps the fastest. Each plan is built and run once on the same sample
inputs; a plan that fails to build or to run, or whose outputs differ from the reference plan's
by more than :func:`plan_tolerance`, is dropped with the reason. The others are timed under the
protocol of :mod:`tvm_ollie.tune.compare` (:func:`alternating`): alternating rounds (round
``r`` runs every plan once, in an order rotated by ``r``, so that load drifting over time falls
on all of them), until the fastest plan's median is separated from every other's (disjoint
order-statistic intervals of the medians and :data:`GUARD_MARGIN` apart) or the budget is
spent. A plan whose fastest of two samples is more than 3x the leader's slowest cannot win and
leaves the rounds (two samples, not one: on a loaded machine one sample can be 10-100x off).
When the leaders do not separate, the tie goes to the first of them in the order of
preference (``prefer``: the joint build prefers the simplest plans, TVM alone first, then the
derivation-only plan, then the library plan), never to the luckier sample::

    winner = fastest if separated, else the first tied plan in ``prefer`` order

The :class:`GuardReport` (``OptimizeReport.plans``) lists the medians, the winner, the
guard's own timing of it (:attr:`GuardReport.kept_s`, for comparison with a fresh timing of the
finished executable), the rounds, separated or tied, and why any plan was dropped.

The sequential build (:func:`~.build.build` without ``joint``) uses the same protocol as its
whole-model guard: the rewritten module against the original built alike (``report.model_guard``,
:mod:`.build`).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from ..compat import relax, tvm
from ..target import target_device
from ..transform.measuring import LONG_SAMPLE_S
from ..tune.compare import (WARM_SAMPLE_S, WARM_WARMUP, Comparison, calls_per_sample, clocked,
                             compare, from_seconds, judge)
from ..verify.tolerance import narrowest_float, tolerance

__all__ = ["GUARD_MARGIN", "MAX_SAMPLE_CALLS", "GuardError", "GuardReport", "PlanOutcome",
           "PlanSkipped", "PlanTimer", "SIZING_CALLS", "WARM_TIMING", "alternating",
           "alternating_medians", "guard_plans", "plan_tolerance", "warm_call_s"]

#: ``timer(runs) -> {plan: seconds}`` or a :class:`~tvm_ollie.tune.compare.Comparison`: the
#: time of one call of each plan (``runs[plan]()`` runs it once); the default is
#: :func:`alternating`. Seconds are judged as one sample each.
PlanTimer = Callable[[Dict[str, Callable[[], object]]], Union[Dict[str, float], Comparison]]

#: A plan beats another when its median is this much lower (relative) and the medians'
#: intervals are disjoint; closer plans are tied (two builds of one plan timed by these rounds
#: agreed within 0.4-2% here, docs/benchmarks-history.md).
GUARD_MARGIN = 0.03

#: Warm samples for the whole-model guards (``**WARM_TIMING`` to :func:`alternating`): the
#: benchmark's own protocol (:data:`tvm_ollie.bench.timing.WARM`): each sample at least
#: :data:`~tvm_ollie.tune.compare.WARM_SAMPLE_S` (20 ms) of back-to-back calls of one plan after
#: half as many untimed calls, its calls counted from warm calls (:func:`warm_call_s`). Samples
#: of about 1 ms right after another plan timed cold calls (YOLOX's kept plan 1.52 ms in the
#: build against 0.74 ms for the finished executable, docs/measuring.md, "The guard's
#: samples"); samples of 5 ms counted from the plan's second call (1.2-4x a warm call, so often
#: 1-2 ms) read the kept plan at 0.57-0.75 of the benchmark's timing of the finished executable
#: (docs/measuring.md, "The guard's timing against the benchmark's").
WARM_TIMING = {"sample_s": WARM_SAMPLE_S, "warmup": WARM_WARMUP}

#: Calls timed one by one after a plan's first call to size the samples (:func:`warm_call_s`).
SIZING_CALLS = 3

#: Most calls in one guard sample (the benchmark's :func:`~tvm_ollie.bench.timing.calls_for`
#: allows as many): a 20 ms sample of a 0.05 ms model is 400 calls.
MAX_SAMPLE_CALLS = 1000


class GuardError(RuntimeError):
    """No plan built and ran (the message lists why each failed)."""


class PlanSkipped(Exception):
    """Raised by a plan's build when the plan is not worth building (the message says why:
    e.g. it would be the same module as another plan)."""


@dataclass
class PlanOutcome:
    """One plan: its median time, or why it was dropped."""

    name: str
    seconds: Optional[float] = None
    dropped: str = ""


@dataclass
class GuardReport:
    """The plans timed whole and the one kept."""

    plans: List[PlanOutcome] = field(default_factory=list)
    winner: str = ""
    reference: str = ""  # the plan the others' outputs were compared with ("": none)
    notes: List[str] = field(default_factory=list)
    #: the timing evidence (None: fewer than two plans were timed)
    comparison: Optional[Comparison] = None
    #: what the first line of :meth:`to_text` calls the guard
    title: str = "never-worse guard"

    def times(self) -> Dict[str, float]:
        """Median seconds of each timed plan."""
        return {p.name: p.seconds for p in self.plans if p.seconds is not None}

    @property
    def kept_s(self) -> Optional[float]:
        """The guard's median of the kept plan (what a fresh timing of the finished executable
        should agree with; None: not timed)."""
        return self.times().get(self.winner)

    def to_text(self) -> str:
        """One line: each plan's median (or why it was dropped) and the winner; the evidence
        (rounds, separated or tied) after it."""
        parts = [f"{p.name} {p.seconds * 1e3:.3f}ms" if p.seconds is not None
                 else f"{p.name} dropped ({p.dropped})" if p.dropped
                 else f"{p.name} (not timed: nothing else ran)" for p in self.plans]
        text = f"{self.title} (whole modules timed here): {', '.join(parts)}; " \
               f"kept {self.winner or 'none'}"
        if self.comparison is not None:
            text += f" ({self.comparison.rounds} rounds, stop: {self.comparison.stop}; " \
                    f"{self.comparison.verdict()})"
        return "\n".join([text] + [f"  note: {n}" for n in self.notes])


def plan_tolerance(dtypes: Sequence[str]) -> float:
    """Relative error (of the reference's largest magnitude) within which two plans agree:
    ten times the per-operator check's tolerance of the narrowest float type involved, since
    a whole model regroups many reductions; a wrong plan errs by the values' own size."""

    return 10.0 * tolerance(narrowest_float(dtypes))


def alternating(runs: Dict[str, Callable[[], object]], time_s: float = 2.0,
                min_rounds: int = 7, max_rounds: int = 51,
                clock: Callable[[], float] = time.perf_counter, hopeless: float = 3.0,
                prefer: Optional[Sequence[str]] = None,
                margin: float = GUARD_MARGIN, quantile: float = 0.5,
                sample_s: float = 1e-3, warmup: float = 0.0,
                long_sample_s: Optional[float] = LONG_SAMPLE_S) -> Comparison:
    """Every plan timed in alternating rounds under :func:`~tvm_ollie.tune.compare.compare`
    (module docstring): until the fastest is separated, at least ``min_rounds`` and at most
    ``max_rounds`` rounds, none started after ``time_s``.

    The first call of every plan is its first sample; the calls per sample come from warm calls
    (:func:`warm_call_s`): a plan faster than ``sample_s`` is called several times per sample
    (the same count for every plan: that of the fastest, at most :data:`MAX_SAMPLE_CALLS`), so
    that a sample lasts ``sample_s`` and is not the timer's noise. With ``warmup > 0`` each
    sample comes after untimed calls of the same plan, ``warmup`` times as many as the sample's
    (at least one), so that a plan is timed in its steady state and not right after another
    plan's threads and data had the cores and caches (:data:`WARM_TIMING`). A plan ``hopeless``
    times slower than the leader in two samples after its first call (in one, when it lasted
    ``long_sample_s``) leaves the rounds (``hopeless=inf`` times every plan in every round): at
    large sizes the plan without derivation runs for seconds where the others take milliseconds,
    while a first call pays one-time costs that a fast plan's second sample, taken in a loaded
    moment, can seem to confirm. ``quantile``: the statistic judged (the median by default;
    :func:`~tvm_ollie.tune.compare.compare`).
    """
    first = {}
    for name, run in runs.items():
        first[name] = max(clocked(run, 1, clock)(), 1e-9)
    one = min(warm_call_s(run, first[name], sample_s, clock) for name, run in runs.items())
    number = calls_per_sample(one, floor_s=sample_s, cap=MAX_SAMPLE_CALLS)
    warm = max(1, math.ceil(number * warmup)) if warmup > 0 else 0
    samplers = {name: clocked(run, number, clock, warmup=warm) for name, run in runs.items()}
    return compare(samplers, prefer, margin, min_rounds=min_rounds, max_rounds=max_rounds,
                   time_s=time_s, clock=clock, hopeless=hopeless, initial=first,
                   quantile=quantile, long_sample_s=long_sample_s)


def warm_call_s(run: Callable[[], object], first_s: float, sample_s: float,
                clock: Callable[[], float] = time.perf_counter,
                calls: int = SIZING_CALLS) -> float:
    """Seconds of one warm call of ``run``, to count the calls of a sample: the median of
    ``calls`` calls timed one by one after the first (``first_s``), when the first took less
    than ``sample_s`` (else ``first_s``: a slow plan is not called again for this).

    The first calls of a fresh executable pay one-time costs (a quick ResNet-18's second call
    took 1.2-4x, sometimes 20x, a warm call), and a count taken from them makes every sample a
    fraction of ``sample_s``: over calls whose times have a long tail, short samples read
    faster than the benchmark's long ones (:data:`WARM_TIMING`)."""
    if first_s >= sample_s or calls <= 0:
        return first_s
    took = sorted(max(clocked(run, 1, clock)(), 1e-9) for _ in range(calls))
    return took[len(took) // 2]


def alternating_medians(runs: Dict[str, Callable[[], object]], time_s: float = 2.0,
                        min_rounds: int = 7, max_rounds: int = 51,
                        clock: Callable[[], float] = time.perf_counter,
                        hopeless: float = 3.0) -> Dict[str, float]:
    """Median seconds of one call of every plan, from :func:`alternating` rounds."""
    return alternating(runs, time_s, min_rounds, max_rounds, clock, hopeless).medians()


def _flatten(value) -> List[np.ndarray]:
    """The arrays of a VM result (a tensor or nested tuples of them)."""
    if hasattr(value, "numpy"):
        return [value.numpy()]
    if isinstance(value, (list, tuple)) or hasattr(value, "__len__"):
        return [a for v in value for a in _flatten(v)]
    return [np.asarray(value)]


def _differs(ref: List[np.ndarray], got: List[np.ndarray]) -> str:
    """Why ``got`` is not ``ref`` within :func:`plan_tolerance` (``""``: it is)."""
    if len(ref) != len(got):
        return f"{len(got)} results, not {len(ref)}"
    rtol = plan_tolerance([str(a.dtype) for a in ref])
    for k, (a, b) in enumerate(zip(ref, got)):
        if a.shape != b.shape:
            return f"result {k}: shape {b.shape}, not {a.shape}"
        if not np.issubdtype(a.dtype, np.floating):
            if not np.array_equal(a, b):
                return f"result {k}: values differ"
            continue
        if not np.all(np.isfinite(a)):
            continue  # a reference that overflows on sample inputs cannot judge
        scale = float(np.max(np.abs(a))) if a.size else 0.0
        err = float(np.max(np.abs(a.astype("float64") - b.astype("float64")))) if a.size \
            else 0.0
        if not err <= rtol * max(scale, 1e-30):
            return f"result {k}: max error {err:.3g} > {rtol:g} x {scale:.3g}"
    return ""


def _one_line(err: Exception) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[-1][:160]}" if text else type(err).__name__


def guard_plans(plans: Sequence[Tuple[str, Callable[[], object]]], args: Sequence[np.ndarray],
                reference: Union[str, Sequence[str], None] = None,
                timer: Optional[PlanTimer] = None,
                device=None, target=None, prefer: Optional[Sequence[str]] = None,
                margin: float = GUARD_MARGIN, timing: Optional[Dict[str, float]] = None
                ) -> Tuple[object, str, GuardReport]:
    """Build every plan, keep the fastest that computes what the reference plan computes.

    Parameters
    ----------
    plans : sequence of (name, build)
        ``build()`` returns the plan's Relax executable.
    args : sequence of ndarray
        Inputs of ``main`` (one set, shared by every plan).
    reference : str or sequence of str, optional
        The plan whose outputs the others must match (when it runs; several: the first of
        them that runs; else the first plan that runs is the reference). None: the first plan
        that runs.
    timer : PlanTimer, optional
        Times the plans that ran (default :func:`alternating`).
    device : Device, optional
        Where the plans run (default: device 0 of ``target``'s kind).
    target : str | dict | Target, optional
        The target the plans are built for (:func:`~tvm_ollie.tune.measure.target_device`;
        the CPU without one). On a GPU every timed call ends with a device synchronization,
        so a sample is the kernels' time and not their asynchronous launch.
    prefer : sequence of str, optional
        Who wins a tie (plans not separated by the timing), first first; default: the order
        of ``plans``.
    margin : float
        Relative margin of separation (:data:`GUARD_MARGIN`).
    timing : dict, optional
        Keywords of the default timer :func:`alternating` (``min_rounds``, ``time_s``,
        ``quantile``...): the joint build times seven plans and asks for more rounds and the
        first quartile (:data:`~.joint_plans.GUARD_TIMING`).

    Returns
    -------
    (executable, name, GuardReport)
        The winner. Raises :class:`GuardError` when no plan built and ran.
    """

    dev = device if device is not None else target_device(target)
    sync = dev.dlpack_device_type() != tvm.cpu(0).dlpack_device_type()
    report = GuardReport()
    built: Dict[str, object] = {}
    runs: Dict[str, Callable[[], object]] = {}
    outputs: Dict[str, List[np.ndarray]] = {}
    order = [name for name, _ in plans]
    for name, build in plans:
        outcome = PlanOutcome(name)
        report.plans.append(outcome)
        try:
            ex = build()
            main = relax.VirtualMachine(ex, dev)["main"]
            inputs = [tvm.runtime.tensor(a, dev) for a in args]
            outputs[name] = _flatten(main(*inputs))
        except PlanSkipped as why:
            outcome.dropped = f"skipped: {why}"
            continue
        except Exception as err:  # pylint: disable=broad-except
            outcome.dropped = f"failed: {_one_line(err)}"
            continue
        built[name] = ex
        runs[name] = (lambda m=main, i=inputs: (m(*i), dev.sync()) if sync else m(*i))
    ran = [n for n in order if n in runs]
    if not ran:
        raise GuardError("no plan built and ran: " + "; ".join(
            f"{p.name} {p.dropped}" for p in report.plans))
    wanted = [reference] if isinstance(reference, str) else list(reference or [])
    ref = next((n for n in wanted if n in runs), ran[0])
    report.reference = ref
    if wanted and ref != wanted[0]:
        report.notes.append(f"outputs compared with {ref} ({wanted[0]} did not run)")
    for name in ran:
        why = _differs(outputs[ref], outputs[name]) if name != ref else ""
        if why:
            next(p for p in report.plans if p.name == name).dropped = \
                f"outputs differ from {ref}'s: {why}"
            del runs[name]
    prefer = [n for n in (prefer or []) if n in order] + [n for n in order if n not in
                                                          (prefer or [])]
    winner = next(n for n in order if n in runs)
    if len(runs) > 1:
        timed = timer(runs) if timer is not None else \
            alternating(runs, prefer=prefer, margin=margin, **(timing or {}))
        if not isinstance(timed, Comparison):
            timed = from_seconds(timed, prefer, margin)
        (timed.winner, timed.fastest, timed.separated, timed.tied,
         timed.tie_break) = judge(timed.timings, prefer, margin)
        for p in report.plans:
            if p.name in runs:
                p.seconds = timed.seconds(p.name)
        report.comparison = timed
        winner = timed.winner if timed.winner in runs else winner
    report.winner = winner
    return built[winner], winner, report
