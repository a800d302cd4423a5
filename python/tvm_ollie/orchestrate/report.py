"""What orchestration did, per partition of every dataflow block."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Tuple

import numpy as np

__all__ = ["KernelReport", "OrchestrationReport", "PartitionReport", "ProfileReport"]


@dataclass
class KernelReport:
    """One emitted kernel: its primitives (names, in order), kinds and estimated cost."""

    primitives: List[str]
    kinds: List[str]
    cost_s: float
    outputs: int


@dataclass
class PartitionReport:
    """One independent selection problem and its outcome."""

    function: str
    block: int
    index: int
    primitives: int
    candidates: int
    enumeration: str  # why candidate enumeration stopped
    variables: int = 0
    constraints: int = 0
    solve_s: float = 0.0
    gap: float = 0.0
    status: str = "not run"
    objective_s: float = 0.0
    singleton_cost_s: float = 0.0
    rounds: int = 0
    fallbacks: List[str] = field(default_factory=list)
    kernels: List[KernelReport] = field(default_factory=list)
    joint: str = ""  # predicted totals of the joint, sequential and original plans
    choices: List[str] = field(default_factory=list)  # the alternative chosen per group


@dataclass
class ProfileReport:
    """What the profiled kernel costs did (:mod:`.profiled`): candidates costed, those the
    rule sent to profiling, how many were measured now, found in the cache, failed (banned) or
    left to the scaled estimate, the seconds spent measuring, and the measured/analytic ratio
    of every measured candidate."""

    candidates: int = 0
    eligible: int = 0
    profiled: int = 0
    cached: int = 0
    failed: int = 0
    scaled: int = 0
    samples: int = 0  # single elementwise/layout primitives timed to scale their class
    library: int = 0  # library candidates measured (now or from the cache)
    profile_s: float = 0.0
    overhead_s: float = 0.0
    budget_s: float = 0.0
    max_kernels: int = 0
    rpc: bool = False
    stopped: str = ""  # "budget" when the budget left candidates unmeasured
    ratios: List[float] = field(default_factory=list)
    failures: List[str] = field(default_factory=list)

    def quartiles(self) -> Optional[tuple]:
        """``(min, q1, median, q3, max)`` of the measured/analytic ratios (None if none)."""
        if not self.ratios:
            return None
        return tuple(float(q) for q in np.quantile(self.ratios, [0, 0.25, 0.5, 0.75, 1]))

    def to_text(self) -> str:
        """One line, plus a line per recorded failure."""
        q = self.quartiles()
        err = ("measured/analytic min {:.2f} q1 {:.2f} median {:.2f} q3 {:.2f} max {:.2f}"
               .format(*q)) if q else "no measured/analytic ratio"
        where = " through rpc" if self.rpc else ""
        stop = f"; budget ({self.budget_s:g} s, {self.max_kernels} kernels) reached" \
            if self.stopped == "budget" else ""
        lines = [f"profiled costs{where}: {self.candidates} candidates, {self.eligible} to "
                 f"profile ({self.samples} simple samples, {self.library} library calls "
                 f"measured): {self.profiled} profiled in "
                 f"{self.profile_s:.2f} s, {self.cached} from cache, {self.failed} failed "
                 f"(fused ones banned), {self.scaled} scaled estimates{stop}; {err}"]
        lines += [f"  profiling failed: {f}" for f in self.failures]
        return "\n".join(lines)


@dataclass
class OrchestrationReport:
    """All partitions, plus the totals."""

    target: str = ""
    cost_model: str = ""
    partitions: List[PartitionReport] = field(default_factory=list)
    total_s: float = 0.0
    notes: List[str] = field(default_factory=list)
    profile: Optional[ProfileReport] = None  # with profiled kernel costs
    #: with library candidates: (calls offered one, calls that chose it)
    library: Optional[Tuple[int, int]] = None

    @property
    def kernels(self) -> int:
        """Kernels emitted (single primitives included)."""
        return sum(len(p.kernels) for p in self.partitions)

    @property
    def primitives(self) -> int:
        """Primitives (graph nodes) seen."""
        return sum(p.primitives for p in self.partitions)

    def to_text(self, kernels: bool = True) -> str:
        """A human-readable summary (one line per partition, then its fused kernels)."""
        lines = [f"orchestration ({self.cost_model} cost, {self.target}): "
                 f"{self.primitives} primitives -> {self.kernels} kernels in "
                 f"{len(self.partitions)} partitions, {self.total_s:.2f} s"]
        lines += [f"  note: {n}" for n in self.notes]
        if self.profile is not None:
            lines += ["  " + line for line in self.profile.to_text().splitlines()]
        for p in self.partitions:
            lines.append(
                f"  [{p.function} block {p.block} part {p.index}] prims={p.primitives} "
                f"cands={p.candidates} ({p.enumeration}) vars={p.variables} "
                f"cons={p.constraints} solve={p.solve_s * 1e3:.1f}ms gap={p.gap:.3g} "
                f"status={p.status} cost={p.objective_s * 1e6:.1f}us "
                f"(singletons {p.singleton_cost_s * 1e6:.1f}us) rounds={p.rounds}")
            lines += [f"    fallback: {r}" for r in p.fallbacks]
            lines += [f"    joint {p.joint}"] if p.joint else []
            lines += [f"    chose {c}" for c in p.choices]
            if kernels:
                for k in p.kernels:
                    if len(k.primitives) > 1:
                        lines.append(f"    kernel {'+'.join(k.primitives)} "
                                     f"[{','.join(k.kinds)}] {k.cost_s * 1e6:.1f}us "
                                     f"outputs={k.outputs}")
        return "\n".join(lines)
