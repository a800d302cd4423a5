"""The derivation search: explorative rule application plus guided instantiation at every state.

:func:`derive` explores the states reachable from an expression by the rules of
:mod:`tvm_ollie.derive.rules`, breadth first, so every state is first reached by a shortest rule
path and each distinct state (by fingerprint of its canonical form) is expanded once:

* **explorative** steps (one rule at one focus scope) cost one unit of depth;
* **eager** steps (stage merging, boundary tightening) run to a fixed point after every
  explorative step, free;
* **guided** instantiation costs nothing: at every state the scopes that its parent state did not
  have are matched against the targets (:func:`tvm_ollie.derive.targets.match_scope`, cached per
  scope); each match becomes a candidate program (:func:`tvm_ollie.derive.program.instantiate`).
  A scope shared with the parent was instantiated there already: same operator, only the
  eOperators around it would differ;
* **guided rules** (:data:`tvm_ollie.derive.rules.GUIDED_RULES`, e.g. ``map_to_target``) are
  tried at the new compute scopes of every state, free: a rewrite is kept only when it makes a
  stage match a target, and then only as candidates (the rewritten state is instantiated, not
  explored), so the exploration itself is unchanged.

Repeats are pruned by fingerprint twice: first the raw rewritten expression (a repeat is dropped
before the expensive normalization: eager rules + :func:`tvm_ollie.derive.canon.canonicalize`),
then the canonical form. The time spent per phase is in ``SearchStats.phase_s``.

Every search has explicit limits (depth, time, states) and reports which one stopped it. It
also stops on its own once searching on cannot pay: when every state up to the asked depth is
expanded (``max_depth``; ``exhausted`` when no state remained at all), and, given a
:class:`CostBound`, once its best candidate costs within the bound's slack of the least any
program of the expression can cost (``near_bound``: no candidate still to be found could beat
it by more than a measurement can tell), ``stale`` (the bound's patience) or ``paid_back`` (the
seconds spent reach what is left to gain over the bound's number of runs). The time budget
covers verification too: a share of it (:data:`VERIFY_SHARE`) is reserved for verification,
so that a search that explores until its deadline still returns what it found.
Verification goes in order of value: first the cheapest candidate of every target kind (the
best matmul form, the best conv2d form...), then the cheapest others; the stats count the
candidates found, verified, rejected and those the budget left unverified. The exploration is
deterministic: no iteration over hash-ordered sets; ``seed`` only draws the verification
inputs. Candidates are deduplicated, sorted by the analytic cost of the target compiled for,
and each is checked against the original expression with the reference interpreter (on
sampled output points when the expression is too large to evaluate whole) before it is
returned; a candidate that fails is a bug: it is logged and dropped.
"""

from __future__ import annotations

import enum
import logging
import math
import time
import warnings
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..config import DEFAULTS
from ..ir.fingerprint import fingerprint
from ..ir.interp import evaluate, random_inputs
from ..ir.nodes import Scope
from ..verify.sampled import check_program_sampled, work
from ..verify.tolerance import expr_tolerance, tolerance
from . import program as program_mod
from .canon import canonicalize
from .casts import restore_program, widen_reads
from .collector import GC_ALLOCATIONS, collector_paused  # noqa: F401 (re-exported)
from .focus import apply_eager, apply_rules, compute_scopes, scope_ids, scopes_of
from .focus import is_compute, replace_node, rewrites
from .rule import Rule, RuleContext
from .rules import EAGER_RULES, GUIDED_RULES, SEARCH_RULES
from .targets import TARGET_NAMES, match_scope

__all__ = ["derive", "CostBound", "DeriveResult", "SearchStats", "StopReason", "DEFAULT_TARGETS",
           "VERIFY_SHARE", "best_of_each_kind_first", "collector_paused", "verify_candidate"]

LOG = logging.getLogger(__name__)

#: Every target operator (:data:`tvm_ollie.derive.targets.TARGET_OPS`), in matching order.
DEFAULT_TARGETS = TARGET_NAMES

#: Share of a time budget reserved for verification when ``derive`` verifies.
VERIFY_SHARE = 0.25


class StopReason(enum.Enum):
    """Why a search ended."""

    EXHAUSTED = "exhausted"  # every reachable state was expanded within the depth limit
    MAX_DEPTH = "max_depth"  # states remained beyond max_depth
    TIME_BUDGET = "time_budget"
    MAX_STATES = "max_states"
    FIRST_FOUND = "first_found"  # stop_on_first: every target has a candidate
    NEAR_BOUND = "near_bound"  # the best candidate is within the CostBound's slack of its floor
    STALE = "stale"  # the CostBound's patience: whole depth levels found nothing better
    PAID_BACK = "paid_back"  # the CostBound's payback: what is left to gain cannot repay more
    NEAR_MEASURED = "near_measured"  # the original, timed, is within the CostBound's slack


@dataclass(frozen=True)
class CostBound:
    """When a search has found all that a measurement could tell apart.

    ``seconds(program)`` is the caller's estimate of a candidate, ``lower_s`` a lower bound of
    it over every program of the expression (a roofline:
    :func:`tvm_ollie.tune.analytic.least_seconds`), ``margin`` the relative margin by which a
    measured program must beat another to be preferred (:func:`tvm_ollie.tune.compare.beats`:
    ``median(a) < (1 - margin) * median(b)``). The search stops once its best candidate
    ``b`` has::

        seconds(b) <= (1 + slack) * lower_s,   slack = margin / (1 - margin)

    since then every program ``p`` has ``seconds(p) >= lower_s >= seconds(b) / (1 + slack)
    = (1 - margin) * seconds(b)``: none can beat ``b`` by the margin.

    With ``patience`` (a number of depth levels) the search also stops (``stale``) once that
    many whole levels after the one that last improved the best candidate by more than the
    margin found nothing that did: it stops before expanding level ``d`` when

        d - 1 - last_improving_level >= patience.

    How many: on the quick zoo's convolutions and transposed convolutions
    (docs/compile-time.md) an improvement followed two barren levels (FSRCNN's transposed
    convolution under this machine's calibration: depth 0, then EinNet's matmul + offset-add
    form at depth 3, 19 % cheaper), never three; a level costs several times the one before.

    With ``known_s`` (the estimate of a program the caller already has: the original operator
    on its cheaper kernel) the best is the lower of it and the best candidate's: a candidate
    that cannot beat the original by the margin is not worth searching for either, so a unit
    whose original already runs near the bound stops after its first level (``near_bound``).

    With ``payback_runs`` (a number of runs of the model) the search also stops
    (``paid_back``) once the seconds it has run reach what is still to gain, over that many
    runs::

        elapsed_s >= payback_runs * (best - lower_s)

    (``best``: as for ``near_bound``). The remaining gain is the most any program still to
    be found could save per run; a search second is worth spending only if the model runs
    often enough to win it back, the rule that sizes the module's search time
    (:class:`tvm_ollie.tune.budget.SearchPayback`), applied to each search as it goes. It
    fires on the small operators, whose whole estimate is microseconds (InfoGAN's transposed
    convolutions, 10-20 us: at 100 000 runs their searches stop after 1-2 s instead of
    running to their share), and on a search that found a program near its bound; an
    operator whose estimate is a millisecond could repay 100 s, and runs to its share. It is
    checked from the second state on: the root's programs (the original as a target
    operator, level 0) are always found, as ``near_bound`` finds them.

    With ``gain_cap`` (``gain_cap() -> seconds or None``: the measured seconds of the best
    implementation the caller already has, the original on its library kernel timed on this
    machine; called each time the payback is checked, so the caller measures once, on the
    first call: a search that stops at its first state never pays for the timing) the gain is
    also at most that: a program still to be found cannot save more than the whole time of
    what it replaces, whatever the estimates say::

        elapsed_s >= payback_runs * min(best - lower_s, gain_cap())

    Why: on small operators the estimates are several times the measured times (DCGAN's
    transposed convolutions: best programs estimated at 52-130 us over bounds of 9-23 us,
    while the library's kernels measured 7-39 us), so the estimated gain (43-110 us a run)
    kept every search to its share though nothing found could save more than the library's
    few microseconds. The cap is a measured upper bound of the gain, in the same unit as the
    payback's seconds: it never stops a search whose estimated gain is below it, and it takes
    no part in ``near_bound`` (which compares estimates with estimates).

    With ``measured_s`` (``measured_s() -> seconds or None``: the original on its library
    kernel, timed on this machine at its real shape and put in the units of ``lower_s``: one
    thread's CPU seconds over the kernels' threads, as the calibration measures the roof and
    the efficiencies ``lower_s`` is made of, :mod:`tvm_ollie.tune.calibrate`) the search
    also stops (``near_measured``) where the estimates do not, once::

        measured_s() <= (1 + slack) * lower_s

    since then every program ``p`` runs at least ``lower_s >= (1 - margin) * measured_s()``:
    none can beat the original by the margin, as for ``near_bound`` with the measured
    original as ``b``. Why: the estimate of the original is its calibrated kind's efficiency
    on one calibration shape, and at other shapes it can be 1.5-2x its measured time (the
    demo's transposed convolution: estimated 336-440 us on its library kernel, timed 160-240
    us, while its derived forms' bound was 160-200 us: the search ran 5-22 s to find forms
    the decisions then timed at 1.5-2 ms, docs/compile-time.md). Checked only where the
    estimates do not stop the search, from its first state on; ``measured_s`` times once.
    Where it does not stop the search, the measured original is still a program at hand:
    the payback's ``best`` is the lower of it and the estimates', so what is left to gain is
    at most ``measured_s() - lower_s``, at most the slack's share of the bound.
    """

    seconds: Callable[[object], float]
    lower_s: float
    margin: float
    patience: Optional[int] = None
    known_s: Optional[float] = None
    payback_runs: Optional[float] = None
    gain_cap: Optional[Callable[[], Optional[float]]] = None
    measured_s: Optional[Callable[[], Optional[float]]] = None

    @property
    def slack(self) -> float:
        """How far above ``lower_s`` a candidate may be and still end the search."""
        return self.margin / (1.0 - self.margin)

    def reached(self, best_s: Optional[float]) -> bool:
        """Whether a best candidate of ``best_s`` seconds (None: none yet) ends the search."""
        best = self._best(best_s)
        return self.lower_s > 0 and best <= self.lower_s * (1.0 + self.slack)

    def reached_measured(self) -> bool:
        """Whether the original's measured seconds (``measured_s``) end the search."""
        if self.measured_s is None or self.lower_s <= 0:
            return False
        measured = self.measured_s()
        return measured is not None and measured <= self.lower_s * (1.0 + self.slack)

    def paid_back(self, best_s: Optional[float], elapsed_s: float) -> bool:
        """Whether a search that ran ``elapsed_s`` seconds with a best candidate of ``best_s``
        (None: none yet) has spent what its remaining gain could repay."""
        if self.payback_runs is None or self.lower_s <= 0:
            return False
        best = self._best(best_s)
        measured = self.measured_s() if self.measured_s is not None else None
        if measured is not None:  # (the original as timed is a program at hand, too)
            best = min(best, measured)
        return math.isfinite(best) and elapsed_s >= self.payback_runs * self.gain(best)

    def gain(self, best: float) -> float:
        """What a search with best known ``best`` seconds could still gain per run: ``best``
        less the lower bound, at most ``gain_cap()``."""
        left = best - self.lower_s
        cap = self.gain_cap() if self.gain_cap is not None else None
        return left if cap is None else min(left, cap)

    def _best(self, best_s: Optional[float]) -> float:
        """The best known seconds: the best candidate's or ``known_s``, the lower."""
        return min(s for s in (best_s, self.known_s, math.inf) if s is not None)


@dataclass
class SearchStats:
    """Counters of one search (see :func:`derive`)."""

    states_visited: int = 0
    states_pruned: int = 0
    states_generated: int = 0
    #: pruned before normalization (the raw rewritten expression was seen before)
    states_pruned_raw: int = 0
    max_depth_reached: int = 0
    time_s: float = 0.0
    search_time_s: float = 0.0
    verify_time_s: float = 0.0
    first_found_s: Dict[str, float] = field(default_factory=dict)
    first_found_depth: Dict[str, int] = field(default_factory=dict)
    first_found_states: Dict[str, int] = field(default_factory=dict)
    #: ``(seconds, depth, repr)`` of every distinct candidate, in the order found.
    found_log: List[Tuple[float, int, str]] = field(default_factory=list)
    #: seconds spent per phase of the exploration (rule application and tree rebuilding,
    #: normalization = eager merging + canonical form, fingerprints, instantiation).
    phase_s: Dict[str, float] = field(default_factory=lambda: dict.fromkeys(
        ("rewrite", "normalize", "fingerprint", "instantiate", "guided"), 0.0))
    candidates_found: int = 0
    candidates_rejected: int = 0
    #: candidates checked and passed / left unchecked because the time budget ran out
    candidates_verified: int = 0
    candidates_unverified: int = 0
    #: guided rewrites taken (each led to an instantiated target)
    guided_steps: int = 0
    #: the best candidate's and the bound's seconds under a CostBound (None without one)
    best_s: Optional[float] = None
    bound_s: Optional[float] = None
    stop_reason: StopReason = StopReason.EXHAUSTED

    def summary(self) -> str:
        """One line for logs and the benchmark."""
        first = ", ".join(f"{k}@d{self.first_found_depth[k]} {v * 1e3:.1f}ms"
                          for k, v in sorted(self.first_found_s.items(), key=lambda kv: kv[1]))
        cut = f", {self.candidates_unverified} unverified (budget)" \
            if self.candidates_unverified else ""
        return (f"{self.states_visited} states ({self.states_pruned} pruned), "
                f"{self.candidates_found} candidates ({self.candidates_verified} verified"
                f"{cut}), {self.time_s:.2f}s, "
                f"stop={self.stop_reason.value}; first: {first or 'none'}")

    __str__ = summary  # print(stats) gives the line; repr keeps every field (and the log)


@dataclass
class DeriveResult:
    """Candidates (programs sorted by cost, each verified) and the search statistics.

    Which candidates are kept when there are more than ``max_candidates`` or than the budget
    can verify: the cheapest of every operator kind first, then the cheapest others."""

    candidates: list
    stats: SearchStats
    original: Scope = None

    @property
    def best(self):
        """The cheapest candidate, or None."""
        return self.candidates[0] if self.candidates else None

    def by_kind(self, kind: str) -> list:
        """Candidates whose stages include an operator of ``kind``."""
        return [p for p in self.candidates if any(s.kind == kind for s in p.stages)]


class _Limits(Exception):
    def __init__(self, reason: StopReason):
        super().__init__(reason.value)
        self.reason = reason


def _state_key(expr: Scope):
    return fingerprint(expr)


class _Search:
    def __init__(self, expr: Scope, targets, max_depth, search_time_s, max_states,
                 rules, ctx, stop_on_first, guided, instantiate_all_scopes,
                 bound: Optional[CostBound] = None):

        self.program_mod = program_mod
        self.expr = expr
        self.targets = tuple(targets)
        self.max_depth = max_depth
        self.t0 = time.perf_counter()
        self.deadline = None if search_time_s is None else self.t0 + search_time_s
        self.max_states = max_states
        self.rules = tuple(rules)
        self.ctx = ctx
        self.stop_on_first = stop_on_first
        self.guided = guided
        self.instantiate_all_scopes = instantiate_all_scopes
        self.stats = SearchStats()
        self.match_cache: Dict[int, list] = {}
        self.seen_guided: set = set()  # fingerprints of the states guided rules produced
        self.candidates: Dict[str, object] = {}
        self.key_fn = _state_key
        self.phase = self.stats.phase_s
        self.bound = bound
        self.gc_check = lambda: None
        #: the last depth level whose candidates improved the best by more than the margin
        self.improved_depth: Optional[int] = None
        if bound is not None:
            self.stats.bound_s = bound.lower_s

    # -- guided instantiation -----------------------------------------------------------------
    def _matches(self, scope: Scope) -> list:
        hit = self.match_cache.get(id(scope))
        if hit is None:
            hit = match_scope(scope, self.targets)
            # the scope is kept alive by the entry, so its id cannot be reused meanwhile
            self.match_cache[id(scope)] = hit = (scope, hit)
        return hit[1]

    def _instantiate(self, state: Scope, path: Tuple, depth: int, parent: Optional[Scope]) -> None:
        """Instantiate every match of the scopes of ``state`` that its parent did not have.

        A scope already present in the parent state was instantiated there (same operator, in
        the parent's context); only the new scopes can add an operator, so only they are
        matched (``instantiate_all_scopes`` restores matching every scope of every state).
        """
        t = time.perf_counter()
        old = scope_ids(parent) if parent is not None and not self.instantiate_all_scopes else ()
        matched = []
        for scope in scopes_of(state):
            if id(scope) in old:
                continue
            found = self._matches(scope)
            if found:
                matched.append((scope, found))
            for m in found:
                self._add(path, depth, m.kind, lambda m=m, scope=scope:
                          self.program_mod.instantiate(state, scope, m, path))
        for kind, group in sibling_matches(matched):
            self._add(path, depth, kind, lambda group=group:
                      self.program_mod.instantiate_all(state, group, path))
        self.phase["instantiate"] += time.perf_counter() - t
        self._check_first()
        self._check_bound()

    def _add(self, path: Tuple, depth: int, kind: str, build) -> None:
        """Record the program ``build()`` makes (a candidate of operator ``kind``), once."""
        try:
            prog = build()
        except (ValueError, NotImplementedError) as err:
            LOG.debug("instantiate failed for %s: %s", kind, err)
            return
        key = repr(prog) + "|" + _program_key(prog)
        if key in self.candidates:
            return
        self.candidates[key] = prog
        if self.bound is not None:
            cost = _bound_seconds(self.bound, prog)
            best = self.stats.best_s
            if best is None or cost < best * (1.0 - self.bound.margin):
                self.improved_depth = depth
            if best is None or cost < best:
                self.stats.best_s = cost
        now = time.perf_counter() - self.t0
        self.stats.candidates_found += 1
        self.stats.found_log.append((now, depth, repr(prog)))
        if kind not in self.stats.first_found_s:
            self.stats.first_found_s[kind] = now
            self.stats.first_found_depth[kind] = depth
            self.stats.first_found_states[kind] = self.stats.states_visited

    def _check_first(self) -> None:
        if self.stop_on_first and all(t in self.stats.first_found_s for t in self._reachable()):
            raise _Limits(StopReason.FIRST_FOUND)

    def _check_bound(self) -> None:
        if self.bound is not None and self.bound.reached(self.stats.best_s):
            raise _Limits(StopReason.NEAR_BOUND)
        if self.bound is not None and self.bound.reached_measured():
            raise _Limits(StopReason.NEAR_MEASURED)

    def _check_stale(self, depth: int) -> None:
        """Stop before level ``depth`` once the bound's patience of whole levels found nothing
        better (:class:`CostBound`)."""
        patience = None if self.bound is None else self.bound.patience
        if patience is not None and self.improved_depth is not None and \
                depth - 1 - self.improved_depth >= patience:
            raise _Limits(StopReason.STALE)

    def _guided(self, state: Scope, path: Tuple, depth: int, parent: Optional[Scope]) -> None:
        """Guided rules at the compute scopes of ``state`` that its parent did not have.

        A rewrite is offered only when it leads a stage to a target (the rule's own guard), so
        each one is normalized in its state and instantiated; the rewritten state is not
        explored further (a guided step is free and adds candidates, never states).
        """
        t = time.perf_counter()
        old = scope_ids(parent) if parent is not None else ()
        steps = []
        for scope in scopes_of(state):
            if id(scope) in old or not is_compute(scope):
                continue
            for rule in GUIDED_RULES:
                for rw in rewrites(rule, scope, self.ctx):
                    steps.append((rule, rw, scope))
        self.phase["guided"] += time.perf_counter() - t
        for rule, rw, scope in steps:
            t = time.perf_counter()
            if self.deadline is not None and t > self.deadline:
                raise _Limits(StopReason.TIME_BUDGET)
            new = self._normal(replace_node(state, scope, rw.scope))
            key = self.key_fn(new)
            self.phase["guided"] += time.perf_counter() - t
            if key in self.seen_guided:  # e.g. the same two mappings in the other order
                continue
            self.seen_guided.add(key)
            self.stats.guided_steps += 1
            self._instantiate(new, path + ((rule.name, rw.note, new),), depth, state)

    def _reachable(self):
        return self.stop_on_first if isinstance(self.stop_on_first, tuple) else self.targets[:1]

    # -- exploration ----------------------------------------------------------------------------
    def _check_limits(self) -> None:
        now = time.perf_counter()
        if self.deadline is not None and now > self.deadline:
            raise _Limits(StopReason.TIME_BUDGET)
        # (not before the root's programs: the first level is what every search returns)
        if self.stats.states_visited and self.bound is not None and \
                self.bound.paid_back(self.stats.best_s, now - self.t0):
            raise _Limits(StopReason.PAID_BACK)
        if self.max_states is not None and self.stats.states_visited >= self.max_states:
            raise _Limits(StopReason.MAX_STATES)

    def _normal(self, expr: Scope) -> Scope:
        return canonicalize(apply_eager(expr, EAGER_RULES, self.ctx))

    def _allowed(self, path: Tuple) -> Tuple[Rule, ...]:
        """The rules still allowed after ``path`` (rules with a per-path bound drop out)."""
        if not path:
            return self.rules
        used: Dict[str, int] = {}
        for name, _, _ in path:
            used[name] = used.get(name, 0) + 1
        return tuple(r for r in self.rules
                     if r.max_per_path is None or used.get(r.name, 0) < r.max_per_path)

    def _children(self, state: Scope, path: Tuple, seen: set, seen_raw: set, out: list) -> None:
        """Append the new (unseen) one-step successors of ``state`` to ``out``.

        Two fingerprints guard the expensive normalization (eager merging + canonical form): the
        raw rewritten expression's (equal raw states normalize alike, so a repeat is dropped
        before it is normalized) and the canonical one's.
        """
        clock = time.perf_counter
        deadline = self.deadline
        phase = self.phase
        t = clock()
        for step in apply_rules(state, self._allowed(path), self.ctx, compute_scopes(state)):
            t1 = clock()
            phase["rewrite"] += t1 - t
            if deadline is not None and t1 > deadline:
                raise _Limits(StopReason.TIME_BUDGET)
            self.stats.states_generated += 1
            raw = self.key_fn(step.expr)
            t2 = clock()
            phase["fingerprint"] += t2 - t1
            if raw in seen_raw:
                self.stats.states_pruned += 1
                self.stats.states_pruned_raw += 1
                t = t2
                continue
            seen_raw.add(raw)
            new = self._normal(step.expr)
            t3 = clock()
            phase["normalize"] += t3 - t2
            key = self.key_fn(new)
            t = clock()
            phase["fingerprint"] += t - t3
            if key in seen:
                self.stats.states_pruned += 1
                continue
            seen.add(key)
            out.append((new, path + ((step.rule.name, step.note, new),), state))
        phase["rewrite"] += clock() - t

    def run(self) -> None:
        """Explore (within :func:`collector_paused`: ``gc_check`` is its check)."""
        root = self._normal(self.expr)
        seen = {self.key_fn(root)}
        seen_raw = {self.key_fn(self.expr)}
        frontier: List[Tuple[Scope, Tuple, Optional[Scope]]] = [(root, (), None)]
        depth = 0
        stop = StopReason.EXHAUSTED
        try:
            while frontier:
                self._check_stale(depth)
                nxt: List[Tuple[Scope, Tuple, Optional[Scope]]] = []
                self.stats.max_depth_reached = depth
                for state, path, parent in frontier:
                    self._check_limits()
                    self.gc_check()
                    self.stats.states_visited += 1
                    if self.guided:
                        self._instantiate(state, path, depth, parent)
                        if GUIDED_RULES:
                            self._guided(state, path, depth, parent)
                    if depth >= self.max_depth:
                        stop = StopReason.MAX_DEPTH
                        continue
                    self._children(state, path, seen, seen_raw, nxt)
                frontier = nxt
                depth += 1
        except _Limits as lim:
            stop = lim.reason
        self.stats.stop_reason = stop
        self.stats.search_time_s = time.perf_counter() - self.t0


def sibling_matches(matched: Sequence[Tuple[Scope, list]]) -> List[Tuple[str, Dict]]:
    """Per operator kind, its first match in each of several sibling scopes: ``(kind, {scope:
    match})`` for every kind that at least two scopes, none inside another, match.

    A state whose body combines several compute scopes (the phases of :mod:`.rules.phase`) is
    only free of wasted work when every one of them runs as an operator; instantiating one
    match at a time leaves the others in the enclosing eOperator.
    """
    if len(matched) < 2:
        return []
    inner = set()
    for scope, _ in matched:
        inner.update(id(s) for s in scopes_of(scope) if s is not scope)
    free = [(scope, found) for scope, found in matched if id(scope) not in inner]
    out = []
    for kind in dict.fromkeys(m.kind for _, found in free for m in found):
        group = {}
        for scope, found in free:
            first = next((m for m in found if m.kind == kind), None)
            if first is not None:
                group[scope] = first
        if len(group) >= 2:
            out.append((kind, group))
    return out


def _bound_seconds(bound: CostBound, prog) -> float:
    try:
        return float(bound.seconds(prog))
    except Exception:  # pylint: disable=broad-except
        return float("inf")


def _program_key(prog) -> str:
    try:
        return ";".join(str(s.expr) for s in prog.stages)
    except AttributeError:  # pragma: no cover
        return repr(prog)


def derive(
    expr: Scope,
    targets: Sequence[str] = DEFAULT_TARGETS,
    max_depth: int = DEFAULTS.max_depth,
    search_time_s: Optional[float] = None,
    max_states: Optional[int] = None,
    seed: int = 0,
    rules: Optional[Sequence[Rule]] = None,
    ctx: Optional[RuleContext] = None,
    verify: bool = True,
    max_candidates: Optional[int] = 16,
    stop_on_first=False,
    guided: bool = True,
    cost_target: Optional[str] = None,
    instantiate_all_scopes: bool = False,
    bound: Optional[CostBound] = None,
    *,
    time_budget_s: Optional[float] = None,
) -> DeriveResult:
    """Derive programs equivalent to ``expr`` built from target operators and eOperators.

    Parameters
    ----------
    expr : Scope
        The expression to derive from (e.g. from :func:`tvm_ollie.lift`).
    targets : sequence of str
        Operator kinds to instantiate (``matmul``, ``batch_matmul``, ``conv2d``, ``g2bmm``,
        ``gbmm``).
    max_depth : int
        Most explorative rule steps on a path (eager stage merging and guided instantiation are
        free).
    search_time_s, max_states : optional
        Wall-clock and visited-state limits of the exploration (``time_budget_s``: the former
        name of ``search_time_s``, deprecated).
    seed : int
        Seed of the verification inputs. The exploration itself is deterministic.
    rules : sequence of Rule, optional
        Explorative rules (default :data:`tvm_ollie.derive.rules.SEARCH_RULES`).
    ctx : RuleContext, optional
        Rule options (split factors, relax limit).
    verify : bool
        Check each returned candidate against ``expr`` with the interpreter (never turn this off
        outside of benchmarks of the search alone).
    max_candidates : int or None
        Return at most this many: the cheapest of every target kind first, then the cheapest
        others (verification stops once enough passed).
    stop_on_first : bool or tuple of str
        Stop as soon as the first target (or each of the given targets) has a candidate.
    guided : bool
        Match targets at every state (turning it off measures pure exploration).
    cost_target : str, optional
        Roofline defaults used to sort candidates (``"cuda"`` or ``"llvm"``); by default the
        kind of ``tvm.target.Target.current()`` (``"llvm"`` when there is none).
    instantiate_all_scopes : bool
        Match every scope of every state, not only the scopes a state does not share with its
        parent (more candidates that differ only in their eOperators; slower).
    bound : CostBound, optional
        Stop (``near_bound``) once the best candidate is as cheap as a measurement could tell
        any program to be (:class:`CostBound`).

    Notes
    -----
    ``search_time_s`` bounds the whole call, verification included: with ``verify`` the
    exploration stops at ``(1 - VERIFY_SHARE)`` of it, and verification gets the rest. The
    first candidate is always verified (nothing unverified is returned), further ones only
    while time remains; when the budget cuts verification short, ``stats.stop_reason`` is
    ``TIME_BUDGET`` and ``stats.candidates_unverified`` counts what was left.

    Returns
    -------
    DeriveResult
    """
    if not isinstance(expr, Scope):
        raise TypeError(f"derive needs a Scope, got {type(expr).__name__}")
    if time_budget_s is not None:
        warnings.warn("derive(time_budget_s=) is deprecated; use search_time_s=",
                      DeprecationWarning, stacklevel=2)
        search_time_s = time_budget_s if search_time_s is None else search_time_s
    widened, retyped = widen_reads(expr)
    if retyped:  # inputs read under widening casts: derive over their widened copies
        res = derive(widened, targets, max_depth, search_time_s, max_states, seed, rules, ctx,
                     verify, max_candidates, stop_on_first, guided, cost_target,
                     instantiate_all_scopes, bound)
        progs = [restore_program(p, expr, retyped) for p in res.candidates]
        return DeriveResult(progs, res.stats, expr)
    ctx = ctx or RuleContext(targets=tuple(targets))
    explore_s = search_time_s
    if verify and search_time_s is not None:
        explore_s = search_time_s * (1 - VERIFY_SHARE)
    with collector_paused() as check:
        search = _Search(expr, targets, max_depth, explore_s, max_states,
                         rules if rules is not None else SEARCH_RULES, ctx, stop_on_first,
                         guided, instantiate_all_scopes, bound)
        search.gc_check = check
        search.run()
        found, stats, t0 = list(search.candidates.values()), search.stats, search.t0
        del search  # its states go now, before the collector walks what is left
    deadline = None if search_time_s is None else t0 + search_time_s
    cost_target = cost_target or _current_target_kind()
    costs = {id(p): (_cost(p, cost_target), repr(p)) for p in found}
    progs = sorted(found, key=lambda p: costs[id(p)])
    progs = best_of_each_kind_first(progs)
    t_verify = time.perf_counter()
    if verify and progs:
        out = _verified(expr, progs, seed, max_candidates, deadline, stats)
    else:
        out = progs if max_candidates is None else progs[:max_candidates]
    out.sort(key=lambda p: costs[id(p)])  # returned by cost, whichever were kept
    stats.verify_time_s = time.perf_counter() - t_verify
    stats.time_s = stats.search_time_s + stats.verify_time_s
    return DeriveResult(out, stats, expr)


def _verified(expr: Scope, progs: list, seed: int, max_candidates: Optional[int],
              deadline: Optional[float], stats: SearchStats) -> list:
    """The programs of ``progs`` (in order) that verify against ``expr``, at most
    ``max_candidates``; past ``deadline`` (once one is kept) the rest stay unverified and the
    search's stop reason becomes the time budget. A program that fails is logged as an error:
    a rule produced a wrong rewrite."""
    out = []
    checker = _Verifier(expr, seed)
    for k, prog in enumerate(progs):
        if max_candidates is not None and len(out) >= max_candidates:
            break
        if out and deadline is not None and time.perf_counter() > deadline:
            stats.stop_reason = StopReason.TIME_BUDGET
            stats.candidates_unverified = len(progs) - k
            break
        ok, why = checker.check(prog)
        if ok:
            out.append(prog)
            stats.candidates_verified += 1
        else:
            stats.candidates_rejected += 1
            LOG.error("derived candidate failed verification (%s): %r\n%s", why, prog,
                      _explain(prog))
    return out


def best_of_each_kind_first(progs: Sequence) -> list:
    """``progs`` (sorted by cost) reordered: the first program using each operator kind (in
    the order the kinds first appear), then the others in their order."""
    firsts, rest, kinds = [], [], set()
    for prog in progs:
        new = {s.kind for s in prog.stages if s.is_operator} - kinds
        if new:
            kinds |= new
            firsts.append(prog)
        else:
            rest.append(prog)
    return firsts + rest


def _current_target_kind() -> str:
    """The cost tables of the current TVM target (:func:`tvm_ollie.target.target_kind`:
    ``"cuda"`` on an NVIDIA GPU target, else ``"llvm"``)."""
    try:
        # lazy: derive/ imports without TVM (the search is pure Python); target.py needs it
        # pylint: disable=import-outside-toplevel
        from ..compat import tvm
        from ..target import target_kind

        current = tvm.target.Target.current(allow_none=True)
    except Exception:  # pylint: disable=broad-except
        return "llvm"
    return target_kind(current) if current is not None else "llvm"


def verify_candidate(original: Scope, program, seed: int = 0) -> Tuple[bool, str]:
    """``(ok, reason)``: ``program`` against ``original`` on random inputs (sampled output points
    when ``original`` is too large to evaluate whole), as :func:`derive` checks candidates."""
    return _Verifier(original, seed).check(program)


def _cost(prog, target: str) -> float:
    try:
        cost = prog.cost(target=target)
    except Exception:  # pylint: disable=broad-except
        return float("inf")
    for attr in ("time_s", "seconds", "total_s", "time"):
        value = getattr(cost, attr, None)
        if isinstance(value, (int, float)):
            return float(value)
    return float(cost) if isinstance(cost, (int, float)) else float("inf")


def _explain(prog) -> str:
    try:
        return prog.explain()
    except Exception:  # pylint: disable=broad-except
        return ""


class _Verifier:
    """Checks programs against the original: whole outputs when small, sampled points otherwise."""

    #: Above this many multiply-adds (product of all iterator extents) sampling is used.
    FULL_WORK_LIMIT = 2e7

    def __init__(self, expr: Scope, seed: int):
        self.expr = expr
        self.seed = seed
        self.inputs = random_inputs(expr, seed=seed)
        self.full = work(expr) <= self.FULL_WORK_LIMIT
        # float32 keeps the historical checks (1e-4 whole, 1e-6 at float64-evaluated samples);
        # a narrower type rounds at its casts and stages, which a regrouped float64 sum can
        # flip by one unit of that type: its tolerance applies to the samples too.
        self.rtol = expr_tolerance(expr)
        self.sampled_tol = {} if self.rtol <= tolerance("float32") else \
            {"rtol": self.rtol, "atol": self.rtol / 100}
        self.reference = None

    def check(self, prog) -> Tuple[bool, str]:
        """``(ok, reason)`` for one program."""

        try:
            if self.full:
                if self.reference is None:
                    self.reference = evaluate(self.expr, self.inputs, dtype=np.float64)
                got = prog.evaluate(self.inputs)
                ok = got.shape == self.reference.shape and np.allclose(
                    got, self.reference, rtol=self.rtol, atol=self.rtol / 10)
                return ok, "" if ok else "values differ"
            res = check_program_sampled(self.expr, prog, self.inputs, seed=self.seed,
                                        **self.sampled_tol)
            return res.ok, res.reason
        except Exception as err:  # pylint: disable=broad-except
            return False, f"{type(err).__name__}: {err}"
