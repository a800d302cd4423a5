"""The whole-model guard without TVM's build of the original where it cannot win.

The whole-model guard (:func:`tvm_ollie.pipeline.build.build`) builds TVM's build of the
original module beside the rewritten module (and the library plan) and times them whole. On
every quick model the original lost by 2.2-40x (the quiet benchmark of docs/benchmarks.md),
and its build is a whole TVM build of the model (0.5-10 s of a cold build, plus the LLVM JIT
of its kernels when it first runs). The guard's timing already retires a plan that is
:data:`~tvm_ollie.transform.measuring.HOPELESS` times slower than the leader after two
samples; this rule applies the same test before the build, with the decisions' own timings
as the original's lower bound::

    L = sum over disjoint units decided by timing of their original's measured seconds
        (TVM's build of the unit alone: a call, a region of calls, a shared-input group)
    skip(original)  iff  L >= HOPELESS * t_leader

``t_leader``: the fastest of a few calls of each plan built before it (the rewritten module
and the library plan, already built and run by the guard), the fastest plan's. Why ``L`` bounds
the original from below: the original module runs each of those units' calls on TVM's kernels,
plus everything else; each unit's seconds are the median its decision measured for TVM's build
of the unit alone (the same pipeline builds it; in the whole model it is fused with at most its
neighbours' elementwise work, which adds work). Each call is counted at most once
(:meth:`~tvm_ollie.transform.decision.Decision.calls`: a region's heavy call may also be a unit
of its own, and a group shares calls with nothing else only by chance), the larger units
first. So when the rule holds, the original is at least ``HOPELESS`` times slower than the
leading plan, which the guard's timing would retire after two samples and never keep (the
guard keeps it only if separated faster). Units decided by the estimate (``measured`` false:
small units skipped, the estimate's decisions) add nothing to ``L``, and neither do the
native softmax and instance norms the pass puts in by rule (nothing timed TVM's kernels for
them: an estimate is no bound). Before regions and groups counted, BERT quick (six regions,
no call decided alone) had ``L = 0`` and built and timed its original in every guard (30-35
ms against 0.5-1.2 ms for the plans, 4-5 s of a 12 s cold build, docs/compile-time.md).
Where the original is skipped the guard compares the plans' outputs with the library plan's
(TVM with the library's kernels, each call checked against TVM's build of it), else there is
nothing to compare: each rewritten unit was checked against the original's when it was
decided.

What could make it wrong: a decision timed in a loaded phase of the machine inflates ``L``
(and the guard's own timing would then be as unreliable); a plan timed in such a phase
only keeps the original's build (the rule does not hold). A region built alone also copies
what its layout calls (reshape, permute) produce, copies that the whole model may fuse into a
neighbour: small beside the matmul or convolution each region is built around, and the factor
of 3 is what such slack has to overcome.
"""

from __future__ import annotations

import time
from typing import Callable, Optional

from ..transform.measuring import HOPELESS

__all__ = ["ORIGINAL_HOPELESS", "REWRITTEN_CALLS", "hopeless_original", "original_lower_bound",
           "fastest_call"]

#: How much slower than the rewritten module the original's lower bound must be to skip its
#: build: the guard's own retiring factor.
ORIGINAL_HOPELESS = HOPELESS

#: Calls of each plan timed (after one untimed) for ``t_leader``.
REWRITTEN_CALLS = 5


def original_lower_bound(report) -> float:
    """``L``: the measured seconds of the originals of the units decided by timing
    (:attr:`OptimizeReport.decisions` and ``regions``: calls, regions and groups), no call
    counted twice: the units by decreasing seconds, each counted when none of its calls was
    (module docstring)."""
    units = [u for u in list(report.decisions) + list(getattr(report, "regions", ()))
             if u.measured and u.before_s > 0]
    seen, total = set(), 0.0
    for unit in sorted(units, key=lambda u: -float(u.before_s)):
        function = getattr(unit, "function", "")
        calls = {(function, name) for name in _calls(unit)}
        if not calls or calls & seen:
            continue
        seen |= calls
        total += float(unit.before_s)
    return total


def _calls(unit) -> list:
    """The calls a unit covers (:meth:`~tvm_ollie.transform.decision.Decision.calls`; a unit
    without that method, a test's stand-in: its ``var_name``)."""
    calls = getattr(unit, "calls", None)
    return calls() if callable(calls) else [unit.var_name]


def hopeless_original(report, leader_s: Optional[float], leader: str = "rewritten",
                      factor: float = ORIGINAL_HOPELESS) -> Optional[str]:
    """Why TVM's build of the original need not be built (module docstring), or None: build
    it (no timing of a plan, or the bound does not hold). ``leader_s``: the fastest plan
    built before it (``leader``: its name), as the guard's timing retires a plan
    ``HOPELESS`` times slower than its leader."""
    if leader_s is None or not leader_s > 0:
        return None
    lower = original_lower_bound(report)
    if lower < factor * leader_s:
        return None
    return (f"hopeless: its units decided by timing alone measured {lower * 1e3:.3f}ms on "
            f"TVM's kernels, >= {factor:g} x the {leader} plan's {leader_s * 1e3:.3f}ms")


def fastest_call(run: Callable[[], object], calls: int = REWRITTEN_CALLS,
                 clock: Callable[[], float] = time.perf_counter) -> float:
    """The fastest of ``calls`` timed calls of ``run`` after one untimed call."""
    run()
    best = float("inf")
    for _ in range(calls):
        start = clock()
        run()
        best = min(best, clock() - start)
    return best
