"""What orchestration did, per partition of every dataflow block."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List

__all__ = ["KernelReport", "OrchestrationReport", "PartitionReport"]


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
class OrchestrationReport:
    """All partitions, plus the totals."""

    target: str = ""
    cost_model: str = ""
    partitions: List[PartitionReport] = field(default_factory=list)
    total_s: float = 0.0
    notes: List[str] = field(default_factory=list)

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
