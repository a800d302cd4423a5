"""One MetaSchedule trial budget for a whole module, spent by expected gain.

``trials`` used to mean "per measured implementation" in the pass and "per remaining kernel" in
``build``, so the trials a compile ran grew with the model. A :class:`TrialBudget` is the one
budget of a compile: its *tasks* are the decisions of the pass (one per operator signature,
whose original and candidate implementations are tuned to be measured) and, in ``build``, the
*final* task (the rewritten module's kernels). Like MetaSchedule's task scheduler weighs tasks
by their share of the latency, a task is allotted

    allot(t) = floor(pool * w(t) / (sum of w over the tasks not yet run + w_final))

where ``pool`` is what is left of the budget, ``w(t)`` the task's expected gain (the estimated
seconds of its calls in the module: the time at stake in its choice) and ``w_final`` is
``final_share / (1 - final_share)`` times the decisions' total weight (half the budget for the
final build by default). A task's allotment is split evenly among its *parts* (the original and
up to ``max_measured`` candidates, so that they are compared at equal tuning effort; below one
trial each, the first parts get one: the original first, which only biases towards keeping it).
What a task does not spend (nothing to tune, records already in the work dir, fewer candidates
than parts) goes back to the pool for the next ones; the final task gets everything left. Each
decision task is allotted once; the final task also tops up the kernels first tuned by this
compile's decisions (a kernel that the rewritten module shares with a decision's measurement,
e.g. a kept original, would otherwise leave the rest of the budget unspent), never those
recorded by an earlier compile (a second compile of the same model tunes nothing).

The ledger (:meth:`TrialBudget.to_text`, in the pass's report and ``tvm-ollie explain``) says
how the budget was spent: trials spent / budget, and per task.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional

from .metaschedule import workload_hash

__all__ = ["MIN_SHARE", "PAYBACK_RUNS", "SearchPayback", "SmallUnitGuard", "TaskSpend",
           "TrialBudget"]

#: The share of a module's estimated time below which a unit is not worth deciding
#: (:class:`SmallUnitGuard`).
MIN_SHARE = 0.01

#: Runs of the model in which the module's derivation search must be able to pay for itself
#: (:class:`SearchPayback`, ``OllieConfig.search_payback_runs``). Why 100 000: at 10 000,
#: FSRCNN's searches (estimated to gain at most 87 us per run under the given analytic
#: calibration) got 2 s, and its transposed convolution lost EinNet's matmul + offset-add form
#: (163 us instead of 175 us, found after 1-4 s: docs/compile-time.md).
PAYBACK_RUNS = 100_000

#: Name of the final task of ``build`` (the rewritten module's kernels).
FINAL_TASK = "build"


@dataclass
class TaskSpend:
    """One task of the ledger: its weight, what it was allotted and what it spent."""

    name: str
    weight: float
    parts: int = 1
    allotted: Optional[int] = None  # None until the task first asks for trials
    spent: int = 0
    tunings: int = 0
    parts_left: int = 1
    left: int = 0

    @property
    def opened(self) -> bool:
        """Whether the task asked for trials."""
        return self.allotted is not None


class TrialBudget:
    """The trial budget of one compile (see the module docstring).

    Parameters
    ----------
    total : int
        Trials for the whole module.
    final_share : float
        Share of the weights that the final task (``build``'s kernels) stands for; 0 when the
        pass runs alone (the decisions share everything).
    """

    def __init__(self, total: int, final_share: float = 0.0):
        if total < 0:
            raise ValueError(f"TrialBudget: total must be >= 0, not {total}")
        if not 0.0 <= final_share < 1.0:
            raise ValueError(f"TrialBudget: final_share must be in [0, 1), not {final_share}")
        self.total = int(total)
        self.final_share = float(final_share)
        self.tasks: Dict[str, TaskSpend] = {}
        self.notes: List[str] = []
        self._current: Optional[TaskSpend] = None
        self._done: set = set()
        #: structural hashes of the workloads tuned during this compile (the final task may
        #: tune them again: records from earlier compiles are never tuned twice)
        self.fresh: set = set()

    # -- planning ---------------------------------------------------------------------------

    def add_task(self, name: str, weight: float, parts: int = 1) -> None:
        """Declare a task and its expected gain before any task runs (repeats add weight)."""
        task = self.tasks.get(name)
        if task is None:
            self.tasks[name] = TaskSpend(name, max(float(weight), 0.0), max(int(parts), 1))
        else:
            task.weight += max(float(weight), 0.0)

    @property
    def spent(self) -> int:
        """Trials spent so far by every task."""
        return sum(t.spent for t in self.tasks.values())

    @property
    def pool(self) -> int:
        """Trials not yet spent."""
        return max(self.total - self.spent, 0)

    # -- spending ---------------------------------------------------------------------------

    @contextlib.contextmanager
    def task(self, name: str, ends: bool = True) -> Iterator[Optional[TaskSpend]]:
        """Run ``name``: the :meth:`grant` calls inside draw on its allotment; what it does
        not spend goes back to the pool when the block ends. ``ends=False``: a first part of
        the task (a decision prepared before it is timed, :meth:`~tvm_ollie.transform.decide.
        Decider.prepare`), whose allotment stays the task's for the block that ends it."""
        previous, self._current = self._current, self.tasks.get(name)
        try:
            yield self._current
        finally:
            if self._current is not None and ends:
                self._done.add(name)
            self._current = previous

    def grant(self, label: str = "") -> int:
        """Trials for the next tuning of the current task (one part of its allotment); outside
        a declared task, an even share of the pool among the undeclared work (``label`` then
        names a task of its own, weighted like the average declared task)."""
        task = self._current
        if task is None:
            name = label or f"task{len(self.tasks)}"
            if name not in self.tasks:
                weights = [t.weight for t in self.tasks.values()]
                self.add_task(name, sum(weights) / len(weights) if weights else 1.0)
            task = self.tasks[name]
        if not task.opened:
            task.allotted = self._allot(task)
            task.left = task.allotted
            task.parts_left = task.parts
            if task.allotted >= task.parts:
                task.left = task.allotted - task.allotted % task.parts
        share = task.left // max(task.parts_left, 1)
        if share == 0 and task.left > 0:
            share = 1
        share = min(share, self.pool)
        task.left -= share
        task.parts_left = max(task.parts_left - 1, 0)
        return share

    def spend(self, trials: int, label: str = "") -> None:
        """Record ``trials`` spent by the current task (or by the task ``label``)."""
        task = self._current or self.tasks.get(label)
        if task is None:
            self.add_task(label or "other", 0.0)
            task = self.tasks[label or "other"]
        task.spent += max(int(trials), 0)
        task.tunings += 1

    def final(self) -> int:
        """Open the final task and grant it everything left (``build``'s kernels)."""
        if FINAL_TASK not in self.tasks:
            self.add_task(FINAL_TASK, 0.0)
        task = self.tasks[FINAL_TASK]
        task.allotted = task.left = self.pool
        task.parts_left = 0
        self._current = task
        return task.allotted

    def in_final(self) -> bool:
        """Whether the final task is running."""
        return self._current is not None and self._current.name == FINAL_TASK

    def metered(self, tuner):
        """``tuner`` whose ``tune`` records the trials it ran against the current task."""
        return None if tuner is None else _MeteredTuner(tuner, self)

    # -- report -----------------------------------------------------------------------------

    def to_text(self) -> str:
        """``trials: S spent / N budget`` and one line per task that was allotted trials."""
        lines = [f"trials: {self.spent} spent / {self.total} budget"]
        for task in self.tasks.values():
            if not task.opened and not task.spent:
                continue
            name = task.name if len(task.name) <= 60 else task.name[:57] + "..."
            lines.append(f"  {name}: {task.spent} spent of {task.allotted} allotted "
                         f"(weight {task.weight:.3g}, {task.tunings} tuning runs)")
        lines.extend(f"  note: {n}" for n in self.notes)
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.to_text()

    # -- internals --------------------------------------------------------------------------

    def _allot(self, task: TaskSpend) -> int:
        if task.name == FINAL_TASK:
            return self.pool
        decisions = [t for t in self.tasks.values() if t.name != FINAL_TASK]
        total_w = sum(t.weight for t in decisions)
        final_w = total_w * self.final_share / (1.0 - self.final_share)
        pending = [t for t in decisions if not t.opened and t.name not in self._done]
        pending_w = sum(t.weight for t in pending) + final_w
        if pending_w <= 0:  # no estimates (nothing liftable): an even share
            return self.pool // max(len(pending), 1)
        return int(self.pool * task.weight / pending_w)


class _MeteredTuner:
    """A tuner whose ``tune(fused, trials)`` is recorded in a :class:`TrialBudget`."""

    def __init__(self, tuner, budget: TrialBudget):
        self._tuner, self._budget = tuner, budget

    def tune(self, fused_mod, trials: int) -> int:
        budget, final = self._budget, self._budget.in_final()
        if final and hasattr(self._tuner, "retune"):
            self._tuner.retune = set(budget.fresh)
        ran = self._tuner.tune(fused_mod, trials)
        budget.spend(ran if isinstance(ran, int) else trials)
        if ran and not final:
            budget.fresh.update(workload_hash(m) for m in getattr(self._tuner, "last_tuned", []))
        return ran

    def __getattr__(self, name):
        return getattr(self._tuner, name)


class SmallUnitGuard:
    """Skips the units too small to matter: not searched, checked, built or timed.

    A unit signature whose calls' estimated time ``w`` (the same weights that share the
    search time and the trials: the calibrated analytic cost of the original) is below
    ``min_share`` of the module's estimated time ``W`` keeps its original:

        skip(sig)  iff  w(sig) < min_share * W

    Why: the most a decision can save is the unit's whole time, ``w``, and a rewrite that
    made it free would change the module by less than ``min_share`` (1 %), less than the
    whole-model measurements can tell apart (their margin, :mod:`tvm_ollie.tune.compare`, is
    3 %); yet its search, checks, builds and timings cost as much as a heavy unit's. ``W`` is
    the sum over the module's derivable calls (each once; a region's weight is its calls'),
    each on the cheaper of its TVM and native library kernels, so the share of a unit is
    over-estimated (the other operators are left out, and the module is taken at its
    fastest known kernels): the guard errs towards deciding. A signature without a weight (a shared-input group) is never
    skipped, nor is anything when the module has no estimate.
    """

    def __init__(self, weights: Dict[str, float], total_s: float,
                 min_share: float = MIN_SHARE):
        self.weights = dict(weights)
        self.total_s = float(total_s)
        self.min_share = float(min_share)

    def skip(self, sig: str) -> Optional[str]:
        """Why ``sig`` is skipped (the decision's reason), or None: decide it."""
        weight = self.weights.get(sig)
        if weight is None or self.total_s <= 0 or weight >= self.min_share * self.total_s:
            return None
        return (f"skipped: too small to matter (estimated {weight * 1e6:.1f}us of the "
                f"module's {self.total_s * 1e6:.1f}us, {weight / self.total_s:.2%} < "
                f"{self.min_share:.0%})")

    def kept(self, sigs) -> List[str]:
        """The signatures of ``sigs`` that are decided (not skipped), in order."""
        return [s for s in sigs if self.skip(s) is None]


class SearchPayback:
    """The module's derivation time, bounded by what the searches could gain.

    The most a unit's search can gain, by the estimates that rank its programs, is its best
    known program (the original on its cheaper kernel) less the roofline lower bound of any
    program of its expression (:func:`tvm_ollie.tune.analytic.least_seconds`); a search
    second pays only if the model runs often enough to win it back. So the searches of a
    module whose gains ``g(sig)`` sum to ``G`` get::

        total = min(search_time_s, least_s + runs * G)

    (``runs``: :data:`PAYBACK_RUNS` by default, 100 000 runs: a model whose searches could gain
    0.02 ms per run gets 2 s more than its floors, not 20 s). ``least_s`` is what any module
    gets: the pass gives ``config.MIN_SEARCH_S`` per signature it decides, the floor below which
    the forms the rule tests expect go unfound, and the paid-back seconds come on top, shared
    by weight, so the heavy signatures still get more than the floor (with the floors alone,
    FSRCNN's transposed convolution lost EinNet's form at load 9). The estimates the gain comes
    from are rough (InfoGAN's 1x56x2x2 transposed convolution: the library kernel estimated 65
    us and EinNet's form 68 us, measured 27 and 15 us), hence a generous ``runs``. The pass
    counts a region that does not lift at its whole weight, the most it could gain.
    ``runs=math.inf`` gives ``search_time_s`` whatever the gains.
    """

    def __init__(self, gains: Dict[str, float], runs: float = PAYBACK_RUNS,
                 least_s: float = 2.0):
        self.gains = {sig: max(float(g), 0.0) for sig, g in gains.items()}
        self.runs = float(runs)
        self.least_s = float(least_s)

    @property
    def gain_s(self) -> float:
        """What the searches could gain per run of the model, in seconds."""
        return sum(self.gains.values())

    def total(self, search_time_s: float) -> float:
        """The module's search seconds."""
        return min(float(search_time_s), self.least_s + self.runs * self.gain_s)

    def note(self, search_time_s: float) -> Optional[str]:
        """Why the search budget is below ``search_time_s`` (None when it is not): the seconds the
        searches may take, not the seconds they took."""
        total = self.total(search_time_s)
        if total >= search_time_s:
            return None
        return (f"search budget {total:.2f}s of {search_time_s:g}s: the searches could gain at "
                f"most {self.gain_s * 1e6:.1f}us per run (best known less the roofline bound),"
                f" paid back over {self.runs:g} runs")
