"""The int8 rewrite as a measured decision: an int8 unit's exact alternatives timed together.

:mod:`.int8_kernels` finds integer convolutions and matmuls that oneDNN's int8 kernels compute
bit-exactly (its guards); which of the exact forms *runs faster* is then measured, the way the
float units are decided (:mod:`.decide`, :mod:`.measuring`). The alternatives of a unit are
only forms that give the same integers (exactness is the rule's guard, never a trade-off):

* ``tvm-int32``: the importer's int32 arithmetic built by TVM (the original; a requantized
  unit with TVM's requantization);
* ``onednn-int8``: the oneDNN int8 call with its int32 result (for a requantized unit, followed
  by TVM's requantization, when the accumulators pass the plain rule's exactness bound);
* ``onednn-int8-requant``: the oneDNN call with the requantization inside (8-bit result).

Each alternative is an isolated module of the unit (its 8-bit source a parameter, its
constants inline: :func:`unit_module`), all built once together where the timing allows it
(:class:`~.batched.UnitBuild`), and timed under the decision protocol of
:mod:`.measuring` (:data:`~.measuring.PROTOCOL`: interleaved rounds until separated, judged
on the first quartile: :data:`INT8_PROTOCOL`) with the margin every measured decision has
(:data:`~.choosing.REPRODUCIBLE_MARGIN`) and the original preferred in a tie. The evidence is
kept in the decider's records (:class:`~.measuring.DecisionRecords`: the work dir and the
per-machine cache), so a later build times nothing.

Units are decided once per *timing signature* (shapes, dtypes, attributes, which parts are
present; not the constants' values, which do not change a kernel's time): ResNet-18's 20
convolutions are 11 decisions. When a requantized unit keeps TVM's requantization the verdict
between its convolution's two forms is the plain unit's verdict too (the same comparison with
the same requantization after both), so the plain rule does not time it again.

Without a timing (the decider does not measure: ``trials=0`` with ``check_untuned=False``, or
a given calibration) nothing is timed and every unit takes the oneDNN form its guards allow
(docs/quantized.md: TVM's generic int32 loops were 18-36x slower on the quantized zoo
models); the report says so.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from ..compat import relax, tvm
from ..compile_profile import stage
from ..tune.compare import Comparison, compare
from .batched import UnitBuild
from .choosing import REPRODUCIBLE_MARGIN, format_seconds
from .costing import ModuleTiming, TunedTiming, UntunedTiming
from .measuring import PROTOCOL, DecisionRecords
from .units import build_isolated_module

__all__ = ["INT32", "INT8", "INT8_REQUANT", "Int8Choice", "Int8Report", "Int8Verdict",
           "unit_module"]

LOG = logging.getLogger("tvm_ollie.transform")

#: The alternatives' labels (module docstring), in the tie-break order: the original first.
INT32, INT8_REQUANT, INT8 = "tvm-int32", "onednn-int8-requant", "onednn-int8"
PREFERENCE = (INT32, INT8_REQUANT, INT8)
#: The protocol of an int8 decision: the float decisions' (:data:`~.measuring.PROTOCOL`), with
#: no alternative retired early (``hopeless`` infinite). (Measured before :func:`tvm_ollie.native.
#: _default_omp_wait_policy` made GNU OpenMP's passive policy effective: with two threads on the
#: loaded 2-core machine a 12 us oneDNN call timed in turns with TVM's int32 kernel took the
#: scheduler's tick or several, 4-48 ms, in most samples, and every such decision kept TVM's
#: loops.)
INT8_PROTOCOL = dict(PROTOCOL, hopeless=math.inf)


@dataclass
class Int8Verdict:
    """One timing signature's decision: the alternatives, the one kept and the evidence."""

    signature: str
    kept: str
    alternatives: List[str]
    evidence: str = ""
    units: int = 0

    def to_text(self) -> str:
        """One line: the signature, the kept form, how many units, the timings."""
        return f"  {self.signature}: kept {self.kept} ({self.units} unit(s)); {self.evidence}"


@dataclass
class Int8Report:
    """The int8 decisions of one run (:class:`~.report.OptimizeReport`'s ``int8``)."""

    timed: bool = False
    verdicts: List[Int8Verdict] = field(default_factory=list)

    def kept(self) -> Dict[str, int]:
        """Units per kept form."""
        out: Dict[str, int] = {}
        for v in self.verdicts:
            out[v.kept] = out.get(v.kept, 0) + v.units
        return out

    def to_text(self) -> str:
        """The decisions, one line each (or why nothing was timed)."""
        if not self.timed:
            return ("int8 units: not timed (the decider does not measure): the oneDNN form "
                    "taken wherever its exactness guards hold")
        if not self.verdicts:
            return "int8 units: none"
        rows = ["int8 units (timed: median [interval of the first quartile] per form):"]
        rows += [v.to_text() for v in self.verdicts if v.units]
        return "\n".join(rows)


def unit_module(source, expr, values: Dict[object, object],
                extra: Sequence[object] = ()) -> "tvm.IRModule":
    """``main(x, ...) = expr`` with the 8-bit ``source`` as the parameter ``x`` and each of
    ``extra`` (a run-time zero point) as one more parameter: every variable ``expr`` reads is
    inlined from ``values`` (variable -> its bound value) down to those; constants stay
    inline. Raises ``KeyError`` on a free variable."""
    inputs = [("x", source)] + [(f"x{i + 1}", e) for i, e in enumerate(extra)]

    def original(bb, params):
        read = [(e, params[name]) for name, e in inputs]
        return _emit(bb, expr, read, values)

    module = build_isolated_module(inputs, original, None)
    return relax.transform.Normalize()(module)


def _emit(bb, expr, read, values):
    """``expr`` emitted into ``bb`` with each ``(source, param)`` of ``read`` read as its
    parameter (calls bound one by one, as the VM's code generation needs them)."""
    for source, param in read:
        if expr.same_as(source):
            return param
    if isinstance(expr, relax.Var):
        return _emit(bb, values[expr], read, values)
    if isinstance(expr, relax.Tuple):
        return relax.Tuple([_emit(bb, f, read, values) for f in expr.fields])
    if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op):
        args = [_emit(bb, a, read, values) for a in expr.args]
        return bb.emit(relax.Call(expr.op, args, expr.attrs, expr.ty_args))
    return expr  # constants, strings, extern functions, shapes


class Int8Choice:
    """Decides int8 units by timing (module docstring).

    Parameters
    ----------
    model : ModuleTiming
        The decider's deciding cost (a caller's timer, or the untuned timing here; a tuned one
        is timed untuned: tuning TVM's int32 loops for a comparison with a library call is not
        worth its trials).
    records : DecisionRecords, optional
        Where the evidence is kept and read back.
    protocol : dict, optional
        Options of :func:`~tvm_ollie.tune.compare.compare` (default :data:`INT8_PROTOCOL`).
    """

    def __init__(self, model: ModuleTiming, records: Optional[DecisionRecords] = None,
                 protocol: Optional[dict] = None):
        if isinstance(model, TunedTiming):
            model = UntunedTiming(model.target, None, model.rpc)
        self.model = model
        self.records = records
        self.protocol = dict(INT8_PROTOCOL if protocol is None else protocol)
        self.verdicts: Dict[str, Int8Verdict] = {}
        self._units: Dict[str, list] = {}

    def report(self) -> Int8Report:
        """The decisions so far."""
        return Int8Report(True, list(self.verdicts.values()))

    def known(self, signature: str) -> Optional[str]:
        """The kept form of ``signature`` if it is decided."""
        verdict = self.verdicts.get(signature)
        return None if verdict is None else verdict.kept

    def count(self, signature: str, unit) -> None:
        """The unit ``unit`` (its root expression) of ``signature`` took its verdict (TVM's
        ``rewrite_call`` may offer one expression twice: counted once)."""
        seen = self._units.setdefault(signature, [])
        if not any(u.same_as(unit) for u in seen):
            seen.append(unit)
            self.verdicts[signature].units = len(seen)

    def settle(self, signature: str, kept: str, alternatives: Sequence[str], why: str) -> None:
        """Record ``signature``'s verdict taken elsewhere (``why``), without a unit yet."""
        self.verdicts.setdefault(signature, Int8Verdict(signature, kept, list(alternatives),
                                                        why, 0))

    def decide(self, signature: str, source, alternatives: Dict[str, object],
               values: Dict[object, object],
               finish: Optional[Callable[["tvm.IRModule"], "tvm.IRModule"]] = None,
               extra: Sequence[object] = ()) -> Tuple[str, Optional[Comparison]]:
        """The kept label among ``alternatives`` (label -> expression computing the unit from
        ``source``; :data:`INT32` the original, whose expression is the unit) and the
        comparison (None: decided before). ``finish`` completes each kernel alternative's
        module as the build will run it (the weights packed once at compile time: an unpacked
        call re-packs its weight in every call, up to 100x the convolution). An alternative
        that cannot be isolated or fails to build or run is not a candidate; when nothing but
        the original can be timed the original is kept. ``extra``: the unit's other run-time
        inputs (:func:`unit_module`)."""
        known = self.known(signature)
        if known is not None:
            self.count(signature, alternatives[INT32])
            return known, None
        modules = {}
        for label, expr in alternatives.items():
            try:
                modules[label] = unit_module(source, expr, values, extra)
                if finish is not None and label != INT32:
                    modules[label] = finish(modules[label])
            except (KeyError, tvm.TVMError) as err:
                LOG.warning("ollie: int8 %s %s not isolated: %s", signature, label, err)
        res = self._compare(signature, modules)
        kept = res.winner if res.winner else INT32
        self.verdicts[signature] = Int8Verdict(signature, kept, list(alternatives),
                                               res.to_text(format_seconds), 0)
        self.count(signature, alternatives[INT32])
        LOG.info("ollie: int8 %s: kept %s (%s)", signature, kept, res.to_text(format_seconds))
        return kept, res

    def _compare(self, signature: str, modules: Dict[str, "tvm.IRModule"]) -> Comparison:
        prefer = [p for p in PREFERENCE if p in modules]
        key = DecisionRecords.key(self.model.record_key, f"int8|{signature}")
        res = self.records.get(key, prefer) if self.records is not None else None
        if res is not None:
            return res
        with stage("int8 timing"):
            res = compare(self._samplers(signature, modules), prefer, REPRODUCIBLE_MARGIN,
                          **self.protocol)
        if self.records is not None and res.winner:
            self.records.put(key, f"int8|{signature}", res)
        return res

    def _samplers(self, signature: str, modules: Dict[str, "tvm.IRModule"]) -> dict:
        """One sampler per alternative, from one merged build where the model times builds."""
        build = UnitBuild(modules, self.model.target) if self.model.shares_builds and \
            len(modules) > 1 else None
        samplers = {}
        for label, module in modules.items():
            samplers[label] = _failed
            try:
                built = build.function(label) if build is not None else None
                samplers[label] = self.model.sample_built(built[0], built[1], module) \
                    if built is not None else self.model.sample(module, f"{signature}|{label}")
            except Exception as err:  # pylint: disable=broad-except
                LOG.warning("ollie: int8 %s %s failed to build: %s", signature, label, err)
        return samplers


def _failed() -> None:
    """The sampler of an alternative that failed to build."""
    return None
