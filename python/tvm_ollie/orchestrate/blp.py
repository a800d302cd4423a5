"""Kernel selection as a binary linear program (Korch's formulation, solved by HiGHS).

One binary ``x_i`` per candidate kernel ``i``; ``P(v)`` is the set of candidates that output
value ``v``::

    minimize    sum_i cost_i * x_i
    subject to  sum_{j in P(v)} x_j >= 1      for every required output v not available
                sum_{j in P(v)} x_j - x_i >= 0 for every candidate i and input v of i that is
                                               not available (a graph input)
    sum_{j contains p} x_j >= 1     for every primitive p on a path to a required value
                                    (implied by the above; it tightens the relaxation)

A primitive may lie in several chosen kernels (recomputation is allowed: nothing says "each
primitive once"). ``scipy.optimize.milp`` solves it with a time limit; on time-out the best
incumbent is used, and with none (or an infeasible program) the caller falls back to
singletons. ``extra_cuts`` are "not all of these together" rows (used to break a dependency
cycle between chosen kernels).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Dict, FrozenSet, List, Optional, Sequence, Set

import numpy as np

__all__ = ["BLPProblem", "BLPResult", "solve_blp", "brute_force"]


@dataclass
class BLPProblem:
    """An abstract selection problem over hashable value names.

    Attributes
    ----------
    costs : list of float
        Cost per candidate.
    produces : list of frozenset
        Values each candidate outputs.
    needs : list of frozenset
        Values each candidate reads.
    required : set
        Values that must be produced (graph outputs).
    available : set
        Values available without any candidate (graph inputs).
    extra_cuts : list of frozenset
        Groups of candidates that must not all be chosen.
    covers : list of frozenset
        Groups of candidates of which at least one must be chosen. The selection passes one
        per live primitive (the candidates containing it): implied by the constraints above
        (a primitive on a path to a required value lies in some chosen kernel), they make the
        relaxation much tighter, which the solver needs on graphs of hundreds of candidates.
    """

    costs: List[float]
    produces: List[FrozenSet]
    needs: List[FrozenSet]
    required: Set
    available: Set
    extra_cuts: List[FrozenSet[int]] = field(default_factory=list)
    covers: List[FrozenSet[int]] = field(default_factory=list)

    def feasible(self, chosen: Sequence[int]) -> bool:
        """Whether a selection satisfies every constraint."""
        chosen = set(chosen)
        made = set(self.available)
        for i in chosen:
            made |= self.produces[i]
        if not self.required <= made:
            return False
        if any(cut <= chosen for cut in self.extra_cuts):
            return False
        if any(not cover & chosen for cover in self.covers):
            return False
        return all(self.needs[i] <= made for i in chosen)


@dataclass
class BLPResult:
    """What the solver returned."""

    chosen: List[int]
    objective: float
    status: str  # optimal, time_limit (best incumbent), time_limit_no_incumbent, infeasible,
    #              error
    gap: float
    solve_s: float
    n_vars: int
    n_constraints: int
    message: str = ""

    @property
    def ok(self) -> bool:
        """A usable selection was found."""
        return self.status in ("optimal", "time_limit") and bool(self.chosen or self.n_vars == 0)


def _rows(problem: BLPProblem):
    """Sparse constraint rows ``(cols, coefs, lower bound, upper bound)``."""
    producers: Dict[object, List[int]] = {}
    for i, made in enumerate(problem.produces):
        for v in made:
            producers.setdefault(v, []).append(i)
    rows = []
    for v in problem.required:
        if v not in problem.available:
            cols = producers.get(v, [])
            rows.append((cols, [1.0] * len(cols), 1.0, np.inf))
    for i, need in enumerate(problem.needs):
        for v in need:
            if v in problem.available:
                continue
            cols = [j for j in producers.get(v, []) if j != i]
            rows.append((cols + [i], [1.0] * len(cols) + [-1.0], 0.0, np.inf))
    for cut in problem.extra_cuts:
        cols = sorted(cut)
        rows.append((cols, [1.0] * len(cols), -np.inf, float(len(cols) - 1)))
    for cover in problem.covers:
        cols = sorted(cover)
        rows.append((cols, [1.0] * len(cols), 1.0, np.inf))
    return rows


def solve_blp(problem: BLPProblem, time_limit_s: float = 10.0) -> BLPResult:
    """Solve ``problem`` with HiGHS (``scipy.optimize.milp``)."""
    # lazy: scipy.optimize/sparse load in a few tenths of a second; only the solve needs them
    from scipy.optimize import Bounds, LinearConstraint, milp  # pylint: disable=C0415
    from scipy.sparse import csr_array  # pylint: disable=C0415

    n = len(problem.costs)
    rows = _rows(problem)
    start = time.perf_counter()
    if n == 0:
        status = "optimal" if problem.required <= problem.available else "infeasible"
        return BLPResult([], 0.0, status, 0.0, 0.0, 0, len(rows))
    if any(not cols and lo > 0 for cols, _, lo, _ in rows):
        return BLPResult([], float("nan"), "infeasible", float("nan"), 0.0, n, len(rows),
                         "a required value has no producer")
    constraints = []
    if rows:
        data, ri, ci = [], [], []
        for r, (cols, coefs, _, _) in enumerate(rows):
            data.extend(coefs)
            ri.extend([r] * len(cols))
            ci.extend(cols)
        mat = csr_array((data, (ri, ci)), shape=(len(rows), n))
        constraints = [LinearConstraint(mat, [r[2] for r in rows], [r[3] for r in rows])]
    # Kernel costs are seconds (1e-6..1e-2): scale them so that the largest is 1e3, otherwise
    # HiGHS's absolute gap tolerance (1e-6) would accept a clearly suboptimal selection.
    costs = np.asarray(problem.costs, dtype=float)
    scale = 1e3 / max(float(np.max(np.abs(costs))), 1e-30)
    res = milp(costs * scale, integrality=np.ones(n), bounds=Bounds(0, 1),
               constraints=constraints,
               options={"time_limit": float(time_limit_s), "disp": False,
                        "mip_rel_gap": 1e-6})
    solve_s = time.perf_counter() - start
    gap = float(getattr(res, "mip_gap", 0.0) or 0.0)
    if res.x is None:
        status = {1: "time_limit_no_incumbent", 2: "infeasible"}.get(res.status, "error")
        return BLPResult([], float("nan"), status, float("nan"), solve_s, n, len(rows),
                         f"no solution ({res.message})")
    chosen = [i for i in range(n) if res.x[i] > 0.5]
    status = "optimal" if res.status == 0 else "time_limit"
    return BLPResult(chosen, float(res.fun) / scale, status, gap, solve_s, n, len(rows),
                     str(res.message))


def brute_force(problem: BLPProblem) -> Optional[float]:
    """Least cost over all feasible subsets (exponential: tests only); None if infeasible."""
    n = len(problem.costs)
    best: Optional[float] = None
    for bits in range(1 << n):
        chosen = [i for i in range(n) if bits >> i & 1]
        if problem.feasible(chosen):
            cost = sum(problem.costs[i] for i in chosen)
            best = cost if best is None or cost < best else best
    return best
