"""What the pass decided for each operator, and why (the report of :class:`OllieOptimize`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List

from .decision import Decision, format_us

__all__ = ["Decision", "OpDecision", "OptimizeReport", "RegionDecision"]

#: The name of a call's :class:`~.decision.Decision` before calls, regions and groups shared one
#: record (same fields, same positional order: function, var_name, op_name, signature).
OpDecision = Decision


def RegionDecision(function: str, var_name: str, contents: str, expression: str,  # noqa: N802
                   **outcome: Any) -> Decision:
    """A region's :class:`~.decision.Decision` (the positional order of the former
    ``RegionDecision`` record; ``outcome``: ``chosen``, ``reason``, ``before_s``...)."""
    return Decision(function, var_name, kind="region", contents=contents,
                    expression=expression, **outcome)


@dataclass
class OptimizeReport:
    """Decisions of one run of the pass plus where its time went."""

    target: str = ""
    #: one per call decided alone (``kind == "call"``)
    decisions: List[Decision] = field(default_factory=list)
    #: one per region of several calls and per shared-input group (:mod:`.regions`,
    #: :mod:`.groups`; ``kind`` ``"region"`` or ``"group"``), groups first
    regions: List[Decision] = field(default_factory=list)
    search_s: float = 0.0
    #: why the module's search time was below ``search_time_s`` (empty when it was not:
    #: :class:`tvm_ollie.tune.budget.SearchPayback`)
    search_note: str = ""
    tuning_s: float = 0.0
    verify_s: float = 0.0
    total_s: float = 0.0
    tuning_calls: int = 0
    #: consumers (bias, residual, activation) folded into native kernels, per kernel kind
    epilogues: Dict[str, int] = field(default_factory=dict)
    #: inference folds applied before deciding, per rule (:mod:`.inference_fold`)
    inference_folds: Dict[str, int] = field(default_factory=dict)
    #: the module's trial budget and how it was spent (:class:`tvm_ollie.tune.budget.TrialBudget`;
    #: ``build`` adds its final task after the pass)
    budget: Any = None
    #: where the analytic cost's roof and efficiencies came from
    #: (:meth:`tvm_ollie.tune.calibrate.Calibration.describe`)
    calibration: str = ""
    #: the joint build's never-worse guard: whole plans timed here and the one kept
    #: (:class:`tvm_ollie.pipeline.guard.GuardReport`; None when it did not run)
    plans: Any = None
    #: the joint build's joint selection (whichever plan the guard kept)
    #: (:class:`tvm_ollie.orchestrate.report.OrchestrationReport`; None otherwise)
    orchestration: Any = None
    #: expressions whose derivations came from the cache (``cached``) or were searched
    #: (``searched``) (:mod:`tvm_ollie.derive.cache`); ``decided before``: signatures whose
    #: decision was read back whole (:mod:`tvm_ollie.transform.remembered`; only when some were)
    derivations: Dict[str, int] = field(default_factory=dict)
    #: wall seconds per compile stage (:class:`tvm_ollie.compile_profile.CompileProfile`)
    compile_profile: Any = None
    #: the sequential build's whole-model guard: the rewritten module and the original timed
    #: whole, the one kept (:class:`tvm_ollie.pipeline.guard.GuardReport`; None: not run)
    model_guard: Any = None
    #: chains of native convolutions kept in oneDNN's activation format
    #: (:class:`tvm_ollie.transform.blocked_layout.LayoutReport`; None: not run)
    layouts: Any = None
    #: native matmuls given their constant weights packed once
    #: (:class:`tvm_ollie.transform.matmul_pack.PackReport`; None: not run)
    matmul_packs: Any = None
    #: the int8 units' decisions (:class:`tvm_ollie.transform.int8_choice.Int8Report`: the
    #: exact forms timed and the one kept; None: no int8 unit)
    int8: Any = None

    @property
    def trials_spent(self) -> int:
        """MetaSchedule trials spent on the module (0 without tuning)."""
        return self.budget.spent if self.budget is not None else 0

    @property
    def trials_budget(self) -> int:
        """The module's trial budget (``trials``)."""
        return self.budget.total if self.budget is not None else 0

    @property
    def rewritten(self) -> List[Decision]:
        """The decisions that replaced their call."""
        return [d for d in self.decisions if d.rewritten]

    def derivations_text(self) -> str:
        """``N cached, M searched`` (and how many signatures were decided before: their
        decisions read back whole, :mod:`tvm_ollie.transform.remembered`)."""
        derived = self.derivations
        text = f"{derived.get('cached', 0)} cached, {derived.get('searched', 0)} searched"
        if derived.get("decided before"):
            text += f", {derived['decided before']} signatures decided before (per-machine " \
                    "cache: no search, check or timing)"
        return text

    def to_text(self, width: int = 60) -> str:
        """A table: one row per call, then the totals."""
        head = (f"{'function':<10} {'var':<10} {'operator':<44} {'before':>10} {'after':>10} "
                f"{'x':>6} {'m':>1}  chosen / reason")
        rows = [f"OllieOptimize on {self.target}", head, "-" * len(head)]
        for d in self.decisions:
            sig = d.signature if len(d.signature) <= 44 else d.signature[:41] + "..."
            chosen = d.chosen if d.rewritten else f"original ({d.reason})"
            if len(chosen) > width:
                chosen = chosen[:width - 3] + "..."
            rows.append(f"{d.function[:10]:<10} {d.var_name[:10]:<10} {sig:<44} "
                        f"{format_us(d.before_s):>10} {format_us(d.after_s):>10} "
                        f"{d.speedup:>6.2f} "
                        f"{'M' if d.measured else 'A'}  {chosen}")
        rows.append("-" * len(head))
        rows.append(f"{len(self.rewritten)}/{len(self.decisions)} calls rewritten; search "
                    f"{self.search_s:.2f}s, tuning {self.tuning_s:.2f}s ({self.tuning_calls} "
                    f"calls), verify {self.verify_s:.2f}s, total {self.total_s:.2f}s "
                    "(times: M measured, A analytic)")
        timed = [d for d in self.decisions if d.measured and d.reason]
        if timed:  # the evidence (tvm_ollie.transform.measuring), kept whole
            rows.append("timed decisions (median [interval of the median] per alternative):")
            rows.extend(f"  {d.var_name}: {d.reason}" for d in timed)
        if self.regions:
            done = sum(1 for r in self.regions if r.rewritten)
            rows.append(f"{done}/{len(self.regions)} regions rewritten:")
            rows.extend(r.to_text() for r in self.regions)
        if self.search_note:
            rows.append(self.search_note)
        if any(self.derivations.values()):
            rows.append(f"derivations: {self.derivations_text()}")
        if self.compile_profile is not None:
            rows.append(self.compile_profile.to_text())
        if self.calibration:
            rows.append(f"analytic cost: {self.calibration}")
        if self.budget is not None and (self.budget.total or self.budget.spent):
            rows.append(self.budget.to_text())
        if self.plans is not None:
            rows.append(self.plans.to_text())
        if self.model_guard is not None:
            rows.append(self.model_guard.to_text())
        if self.inference_folds:
            folded = ", ".join(f"{k} {v}" for k, v in sorted(self.inference_folds.items()))
            rows.append(f"inference folds before deciding: {folded}")
        if self.int8 is not None:
            rows.append(self.int8.to_text())
        if self.epilogues:
            folded = ", ".join(f"{k} {v}" for k, v in sorted(self.epilogues.items()))
            rows.append(f"epilogues folded into native kernels: {folded}")
        if self.layouts is not None:
            rows.append(self.layouts.to_text())
        if self.matmul_packs is not None:
            rows.append(self.matmul_packs.to_text())
        return "\n".join(rows)

    def __str__(self) -> str:
        return self.to_text()
