"""The whole-model guard without TVM's build of the original where it cannot win.

The whole-model guard (:func:`tvm_ollie.pipeline.build.build`) builds TVM's build of the
original module beside the rewritten module (and the library plan) and times them whole. On
every quick model the original lost by 2.2-40x (the quiet benchmark of docs/benchmarks.md),
and its build is a whole TVM build of the model (0.5-10 s of a cold build, plus the LLVM JIT
of its kernels when it first runs). The guard's timing already retires a plan that is
:data:`~tvm_ollie.transform.measuring.HOPELESS` times slower than the leader after two
samples; this rule applies the same test before the build, with the decisions' own timings
as the original's lower bound::

    L = sum over the calls decided by timing of their original's measured seconds (TVM's build)
    skip(original)  iff  L >= HOPELESS * t_leader

``t_leader``: the fastest of a few calls of each plan built before it (the rewritten module
and the library plan, already built and run by the guard), the fastest plan's. Why ``L`` bounds the original from below: the original module runs each of
those calls on TVM's kernels (each call counted once, a call appears in one decision), plus
everything else; each call's seconds are the median its decision measured for TVM's build of
the call alone (the same pipeline builds it; in the whole model it is fused with at most its
elementwise epilogue, which adds work). So when the rule holds, the original is at least
``HOPELESS`` times slower than the leading plan, which the guard's timing would retire
after two samples and never keep (the guard keeps it only if separated faster). Calls decided
by the estimate (``measured`` false: small units skipped, the estimate's decisions) and
regions (their calls may also be decided alone) add nothing to ``L``. Where the original is
skipped the guard compares the plans' outputs with the library plan's (TVM with the library's
kernels, each call checked against TVM's build of it), else there is nothing to compare: each
rewritten call was checked against the original's when it was decided.

What could make it wrong: a decision timed in a loaded phase of the machine inflates ``L``
(and the guard's own timing would then be as unreliable); a plan timed in such a phase
only keeps the original's build (the rule does not hold).
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
    """``L``: the measured seconds of the original of every call decided by timing (each call
    once: :attr:`OptimizeReport.decisions` holds one entry per call)."""
    seen, total = set(), 0.0
    for dec in report.decisions:
        key = (getattr(dec, "function", ""), dec.var_name)
        if key in seen or not dec.measured or not dec.before_s > 0:
            continue
        seen.add(key)
        total += float(dec.before_s)
    return total


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
    return (f"hopeless: its calls decided by timing alone measured {lower * 1e3:.3f}ms on "
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
