"""The one decision record: what was decided for a unit (a call, a region or a shared-input
group), why, and what replaces it.

The choosing stage (:mod:`.choosing`) makes a :class:`Decision` per unit signature (no unit
yet: equal units are decided once); :func:`~.optimize.optimize_module` binds a copy of it to
each unit it decides (:meth:`Decision.for_unit`), emits the rewritten ones from those copies and
puts the same objects in the :class:`~.report.OptimizeReport` (``decisions``: calls;
``regions``: regions and groups). A caller that changes its mind after the pass (the module
failed to build, the joint build's guard kept another plan) sets ``chosen`` back to
``"original"`` on the report's record.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import List, Optional

from ..derive.program import Program

__all__ = ["KINDS", "Decision", "format_us"]

#: What a decision is about: one call, a region of several calls lifted as one expression, or
#: a group of independent calls reading one operand (:mod:`.units`).
KINDS = ("call", "region", "group")


@dataclass
class Decision:
    """The decision for one unit (or, before :meth:`for_unit`, for one unit signature).

    Attributes
    ----------
    function, var_name : str
        The Relax function and the variable bound to the unit's result (a group: its results'
        variables, comma-separated).
    op_name : str
        The Relax operator of a call (``relax.nn.conv2d``...); empty for a region or group.
    signature : str
        The unit's signature (:func:`~.units.unit_signature`): units with equal signatures
        share one decision.
    chosen : str
        ``"original"``; ``"original [native]"`` (the operator on its native library kernel);
        or ``repr(program)`` of the derived program that replaced the unit, followed by
        ``[native]`` when its matched operators run on library kernels.
    reason : str
        Why (the costs compared, or what failed).
    explain : str
        The rule path of the chosen program (``""`` when the original was kept).
    before_s, after_s : float
        Cost of the original and of the chosen implementation (equal when kept), measured
        seconds when ``measured`` else the calibrated analytic estimate.
    measured : bool
        Whether the alternatives were timed (tuned with ``trials > 0``, or untuned).
    candidates : int
        Derived programs considered.
    kind : str
        One of :data:`KINDS`.
    contents, expression : str
        A region's or group's calls in order (``var=op, ...``) and its lifted expression
        (empty for a call).
    program : Program, optional
        The derived program that replaces the unit (None: the original operator, on TVM or on
        its native kernel).
    names : list of str
        The program's names of the unit's operands, in the order of the unit's inputs.
    impl : str
        How the replacement is emitted (``"tvm"``, ``"native"``; :func:`~.emit.emit_program`).
    """

    function: str = ""
    var_name: str = ""
    op_name: str = ""
    signature: str = ""
    chosen: str = "original"
    reason: str = ""
    explain: str = ""
    before_s: float = 0.0
    after_s: float = 0.0
    measured: bool = False
    candidates: int = 0
    kind: str = "call"
    contents: str = ""
    expression: str = ""
    program: Optional[Program] = field(default=None, repr=False)
    names: List[str] = field(default_factory=list, repr=False)
    impl: str = "tvm"

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"Decision.kind must be one of {', '.join(KINDS)}, not "
                             f"{self.kind!r}")

    @property
    def rewritten(self) -> bool:
        """Whether the unit was replaced (by a program, or by its native kernel)."""
        return self.chosen != "original"

    @property
    def label(self) -> str:
        """What runs in place of the unit (the alternative's label; ``chosen``)."""
        return self.chosen

    @property
    def speedup(self) -> float:
        """``before_s / after_s`` (1.0 when kept or unknown)."""
        if self.after_s <= 0 or not self.rewritten:
            return 1.0
        return self.before_s / self.after_s

    def calls(self) -> List[str]:
        """The variables bound to the calls this unit covers, in order: a call's own
        (``var_name``), a region's or group's from ``contents`` (``var=op, ...``, a group's
        ending `` share x``); the units of one report name their calls in one module, so two
        units cover a call in common exactly when these lists share a name."""
        if self.kind == "call" or not self.contents:
            return [self.var_name] if self.var_name else []
        listed = self.contents.rsplit(" share ", 1)[0] if self.kind == "group" else \
            self.contents
        return [part.split("=", 1)[0].strip() for part in listed.split(", ") if "=" in part]

    def for_unit(self, **identity) -> "Decision":
        """A copy of this signature's decision naming one unit (``kind``, ``function``,
        ``var_name``, ``op_name``, ``signature``, ``contents``, ``expression``)."""
        return dataclasses.replace(self, **identity)

    def kept(self, why: str) -> "Decision":
        """A copy that keeps the original, with ``why`` before the reason (the costs stay the
        ones the choice compared)."""
        return dataclasses.replace(self, chosen="original", reason=why + self.reason,
                                   program=None, impl="tvm")

    def to_text(self) -> str:
        """A region or group: what it contained and what it became (two or three lines); a
        call: one line."""
        became = self.chosen if self.rewritten else f"original ({self.reason})"
        how = "measured" if self.measured else "analytic"
        times = f"({format_us(self.before_s)} -> {format_us(self.after_s)}, {how})"
        if self.kind == "call":
            return f"{self.function}.{self.var_name} {self.signature} -> {became}  {times}"
        return (f"region {self.function}.{self.var_name} [{self.contents}]\n"
                f"    lifted: {self.expression}\n"
                f"    -> {became}  {times}")


def format_us(seconds: float) -> str:
    """Seconds as the report writes them (``-`` when unknown)."""
    if seconds <= 0:
        return "-"
    if seconds < 1e-6:
        return f"{seconds * 1e9:.0f}ns"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f}us"
    return f"{seconds * 1e3:.2f}ms"
