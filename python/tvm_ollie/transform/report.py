"""What the pass decided for each operator, and why (the report of :class:`OllieOptimize`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List

__all__ = ["OpDecision", "OptimizeReport", "RegionDecision"]


class _Outcome:
    """``rewritten`` and ``speedup`` of a decision (fields ``chosen``, ``before_s``,
    ``after_s``)."""

    @property
    def rewritten(self) -> bool:
        """Whether the call or region was replaced."""
        return self.chosen != "original"

    @property
    def speedup(self) -> float:
        """``before_s / after_s`` (1.0 when kept or unknown)."""
        if self.after_s <= 0 or not self.rewritten:
            return 1.0
        return self.before_s / self.after_s


@dataclass
class OpDecision(_Outcome):
    """The decision for one call of a derivable operator.

    Attributes
    ----------
    function, var_name : str
        The Relax function and the variable bound to the call.
    op_name : str
        The Relax operator (``relax.nn.conv2d``...).
    signature : str
        Operator, operand shapes/dtypes and attributes: calls with equal signatures share one
        derivation and one tuning.
    chosen : str
        ``"original"``; ``"original [native]"`` (the operator on its native library kernel);
        or ``repr(program)`` of the derived program that replaced the call, followed by
        ``[native]`` when its matched operators run on library kernels.
    reason : str
        Why (the costs compared, or what failed).
    explain : str
        The rule path of the chosen program (``""`` when the original was kept).
    before_s, after_s : float
        Cost of the original and of the chosen implementation (equal when kept), measured
        seconds when ``measured`` else the calibrated analytic estimate.
    measured : bool
        Whether MetaSchedule-tuned kernels were timed (``trials > 0`` on a runnable target).
    candidates : int
        Derived programs considered.
    """

    function: str
    var_name: str
    op_name: str
    signature: str
    chosen: str = "original"
    reason: str = ""
    explain: str = ""
    before_s: float = 0.0
    after_s: float = 0.0
    measured: bool = False
    candidates: int = 0


@dataclass
class RegionDecision(_Outcome):
    """The decision for one region (several calls lifted, derived and replaced as a whole).

    Attributes
    ----------
    function, var_name : str
        The Relax function and the variable of the region's result.
    contents : str
        The region's calls in order (``var=op, ...``).
    expression : str
        The region lifted as one expression.
    chosen, reason, explain, before_s, after_s, measured, candidates
        As in :class:`OpDecision`. When a region is kept, its heavy call is decided alone
        (and has its own :class:`OpDecision`).
    """

    function: str
    var_name: str
    contents: str
    expression: str
    chosen: str = "original"
    reason: str = ""
    explain: str = ""
    before_s: float = 0.0
    after_s: float = 0.0
    measured: bool = False
    candidates: int = 0

    def to_text(self) -> str:
        """Two or three lines: what the region contained and what it became."""
        became = self.chosen if self.rewritten else f"original ({self.reason})"
        return (f"region {self.function}.{self.var_name} [{self.contents}]\n"
                f"    lifted: {self.expression}\n"
                f"    -> {became}  ({_us(self.before_s)} -> {_us(self.after_s)}, "
                f"{'measured' if self.measured else 'analytic'})")


@dataclass
class OptimizeReport:
    """Decisions of one run of the pass plus where its time went."""

    target: str = ""
    decisions: List[OpDecision] = field(default_factory=list)
    #: one per region of several calls (:mod:`.regions`)
    regions: List[RegionDecision] = field(default_factory=list)
    search_s: float = 0.0
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
    #: (``searched``) (:mod:`tvm_ollie.derive.cache`)
    derivations: Dict[str, int] = field(default_factory=dict)
    #: wall seconds per compile stage (:class:`tvm_ollie.compile_profile.CompileProfile`)
    compile_profile: Any = None
    #: the sequential build's whole-model guard: the rewritten module and the original timed
    #: whole, the one kept (:class:`tvm_ollie.pipeline.guard.GuardReport`; None: not run)
    model_guard: Any = None

    @property
    def trials_spent(self) -> int:
        """MetaSchedule trials spent on the module (0 without tuning)."""
        return self.budget.spent if self.budget is not None else 0

    @property
    def trials_budget(self) -> int:
        """The module's trial budget (``trials``)."""
        return self.budget.total if self.budget is not None else 0

    @property
    def rewritten(self) -> List[OpDecision]:
        """The decisions that replaced their call."""
        return [d for d in self.decisions if d.rewritten]

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
                        f"{_us(d.before_s):>10} {_us(d.after_s):>10} {d.speedup:>6.2f} "
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
        if self.derivations.get("cached") or self.derivations.get("searched"):
            rows.append(f"derivations: {self.derivations.get('cached', 0)} cached, "
                        f"{self.derivations.get('searched', 0)} searched")
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
        if self.epilogues:
            folded = ", ".join(f"{k} {v}" for k, v in sorted(self.epilogues.items()))
            rows.append(f"epilogues folded into native kernels: {folded}")
        return "\n".join(rows)

    def __str__(self) -> str:
        return self.to_text()


def _us(seconds: float) -> str:
    if seconds <= 0:
        return "-"
    if seconds < 1e-6:
        return f"{seconds * 1e9:.0f}ns"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f}us"
    return f"{seconds * 1e3:.2f}ms"
