"""Where a compile's wall time goes: a stage timer threaded through the build.

The build is a pipeline of stages (import, region finding, lift, derivation search, checking,
candidate builds and timings, orchestration, tuning, TVM's own build) spread over several
floors. Passing a timer through every signature would touch them all, so the active profile
travels in a context variable (like :func:`tvm_ollie.config.config_scope`)::

    with profile_scope() as prof:          # the outermost scope owns the profile
        with stage("import"):
            mod = load(...)
        ex, report = build(mod)            # opens profile_scope() too: joins the same profile
    print(prof.to_text())

:func:`stage` is a no-op when no profile is active (and in threads that did not open one), so
the instrumentation costs two clock reads per stage. Nested stages are attributed once: while
an inner stage runs, the outer one's clock stops (``search`` inside ``candidate builds`` counts
as search only), so the stages add up to at most the total, and ``other`` is the rest (the
pass's own bookkeeping, emitting, Python overhead).
"""

from __future__ import annotations

import contextlib
import contextvars
import time
from typing import Dict, Iterator, List, Optional

__all__ = ["CompileProfile", "current_profile", "profile_scope", "stage"]

#: Stage names in pipeline order (others are listed after these, in order of first use).
STAGE_ORDER = ("import", "calibration", "regions", "decision cache", "lift", "search",
               "derivation cache", "verify", "verification cache", "candidate builds", "timing",
               "orchestration", "tuning", "emit", "tvm build", "model guard")

_ACTIVE: contextvars.ContextVar = contextvars.ContextVar("tvm_ollie_profile", default=None)


class CompileProfile:
    """Wall seconds per named stage (exclusive: a nested stage's time is its own only).

    Attributes
    ----------
    seconds : dict
        ``{stage: seconds}`` accumulated over every entry of the stage.
    counts : dict
        ``{stage: times entered}``.
    total_s : float
        Wall seconds of the outermost :func:`profile_scope` (up to now while it is open).
    """

    def __init__(self):
        self.seconds: Dict[str, float] = {}
        self.counts: Dict[str, int] = {}
        self._stack: List[list] = []  # [name, since] of the open stages, innermost last
        self._start = time.perf_counter()
        self._end: Optional[float] = None

    @property
    def total_s(self) -> float:
        """Wall seconds from the scope's start to its end (or to now)."""
        end = self._end if self._end is not None else time.perf_counter()
        return end - self._start

    @property
    def other_s(self) -> float:
        """The total less every stage (time outside any stage)."""
        return max(0.0, self.total_s - sum(self.seconds.values()))

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Charge the block's wall time to ``name`` (minus its nested stages)."""
        now = time.perf_counter()
        if self._stack:
            outer = self._stack[-1]
            self._charge(outer[0], now - outer[1])
        entry = [name, now]
        self._stack.append(entry)
        try:
            yield
        finally:
            now = time.perf_counter()
            # (the entry is the innermost unless a generator left a stage open: pop it anyway)
            self._stack = [e for e in self._stack if e is not entry]
            self._charge(name, now - entry[1])
            self.counts[name] = self.counts.get(name, 0) + 1
            if self._stack:
                self._stack[-1][1] = now

    def _charge(self, name: str, seconds: float) -> None:
        self.seconds[name] = self.seconds.get(name, 0.0) + max(0.0, seconds)

    def add(self, name: str, seconds: float) -> None:
        """Record ``seconds`` under ``name`` measured elsewhere (not nested in a stage)."""
        self._charge(name, seconds)
        self.counts[name] = self.counts.get(name, 0) + 1

    def ordered(self) -> List[str]:
        """The stages seen, in pipeline order (:data:`STAGE_ORDER`), then the others."""
        known = [s for s in STAGE_ORDER if s in self.seconds]
        return known + [s for s in self.seconds if s not in STAGE_ORDER]

    def to_dict(self) -> Dict[str, float]:
        """``{stage: seconds}`` in pipeline order, plus ``other`` and ``total``."""
        out = {s: self.seconds[s] for s in self.ordered()}
        out["other"] = self.other_s
        out["total"] = self.total_s
        return out

    def to_text(self) -> str:
        """``compile profile: search 12.31 s (54%), ... , total 22.80 s``."""
        total = self.total_s
        parts = []
        for name in self.ordered() + ["other"]:
            secs = self.other_s if name == "other" else self.seconds[name]
            share = f" ({100.0 * secs / total:.0f}%)" if total > 0 else ""
            count = self.counts.get(name, 0)
            times = f" x{count}" if count > 1 else ""
            parts.append(f"{name} {secs:.2f} s{share}{times}")
        return f"compile profile: {', '.join(parts)}; total {total:.2f} s"

    def close(self) -> None:
        """Stop the total's clock."""
        if self._end is None:
            self._end = time.perf_counter()

    def __str__(self) -> str:
        return self.to_text()


def current_profile() -> Optional[CompileProfile]:
    """The profile of the innermost open :func:`profile_scope` (None when none is open)."""
    return _ACTIVE.get()


@contextlib.contextmanager
def profile_scope() -> Iterator[CompileProfile]:
    """Open a profile, or join the one already open (a build inside the CLI's scope adds to the
    CLI's profile, which also holds the import); the outermost scope closes it."""
    active = _ACTIVE.get()
    if active is not None:
        yield active
        return
    prof = CompileProfile()
    token = _ACTIVE.set(prof)
    try:
        yield prof
    finally:
        _ACTIVE.reset(token)
        prof.close()


@contextlib.contextmanager
def stage(name: str) -> Iterator[None]:
    """Charge the block to stage ``name`` of the active profile (nothing when none is open)."""
    prof = _ACTIVE.get()
    if prof is None:
        yield
        return
    with prof.stage(name):
        yield
