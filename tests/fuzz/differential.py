"""Differential check of the pass: TVM's build against the ollie build, every alternative forced.

For one generated :class:`~op_strategies.Case` the module is built by plain ``tvm.compile(mod,
"llvm")`` (the reference) and by :func:`tvm_ollie.pipeline.build` once per alternative the
decision core derives for the operator or for a region around it (the operator with its bias
and activation), each forced through the public ``chooser`` option (derived programs on TVM
kernels and on native library kernels, and the original on its native kernel). Every
output must match the reference within a tolerance scaled by the reduction length.

Outcomes per forced alternative (:class:`Outcome`): ``applied`` (verified, built, matched),
``rejected`` (the decision core's numeric check refused it: the derivation produced a wrong
program, caught by the safety net), ``fallback`` (the rewritten module failed to build and
:func:`build` built the original), ``lost`` (the alternative was not derived again: the search
is not deterministic), ``shadowed`` (a rewritten region of several calls took the call whose
alternative was forced), ``unchanged`` (nothing to force: no alternative), and the failures:
``mismatch`` (a wrong output) and ``error`` (the ollie build raised).
"""

from __future__ import annotations

import os
import traceback
from collections import Counter
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import numpy as np
import tvm
from tvm import relax

from tvm_ollie.pipeline import build
from tvm_ollie.tune.calibrate import EFFICIENCY, Calibration

#: llvm roofline with the GPU efficiency table: fixed (no timing), derived programs look cheap
CALIB = Calibration("llvm", 1e11, 2e10, dict(EFFICIENCY["cuda"]), "given")
#: decision options: shallow, state-limited search (deterministic alternatives), no timing
OPTS = dict(trials=0, max_depth=2, search_time_s=30.0, calibration=CALIB, check_untuned=False)
#: float32 rounding per accumulated term, relative to the output's largest magnitude
EPS_PER_TERM = 2e-6


@dataclass
class Outcome:
    """What happened to one forced alternative."""

    label: str
    kind: str
    detail: str = ""


@dataclass
class CaseResult:
    """All forced alternatives of one case."""

    text: str
    alternatives: int = 0
    outcomes: List[Outcome] = field(default_factory=list)
    skipped: str = ""

    @property
    def failures(self) -> List[Outcome]:
        return [o for o in self.outcomes if o.kind in ("mismatch", "error")]

    def counts(self) -> Counter:
        return Counter(o.kind for o in self.outcomes)


def _run(ex, args) -> np.ndarray:
    vm = relax.VirtualMachine(ex, tvm.cpu())
    return vm["main"](*[tvm.runtime.tensor(a) for a in args]).numpy()


def _compare(got: np.ndarray, ref: np.ndarray, reduction: int) -> Optional[str]:
    if got.shape != ref.shape:
        return f"shape {got.shape} != {ref.shape}"
    if not ref.size:
        return None
    scale = max(float(np.max(np.abs(ref))), 1.0)
    err = float(np.max(np.abs(got.astype(np.float64) - ref)))
    tol = max(1e-5, EPS_PER_TERM * (reduction + 1)) * scale
    if not np.isfinite(err) or err > tol:
        return f"max abs err {err:.3g} > tol {tol:.3g} (scale {scale:.3g})"
    return None


class _Force:
    """A chooser that records the alternatives of every unit (call or region) and forces the
    one labelled ``label`` wherever it is offered (when ``label`` is None: the first of each
    unit, or a random one drawn by ``rng`` when given, so that one build per case still
    reaches every alternative over many cases)."""

    def __init__(self, label: Optional[str] = None, rng: Optional[np.random.Generator] = None):
        self.label, self.rng = label, rng
        self.seen: Dict[str, List[str]] = {}
        self.picked: List[str] = []

    def __call__(self, sig, alts):
        self.seen[sig] = [a.label for a in alts]
        if not alts:
            return None
        if self.label is None:
            alt = alts[int(self.rng.integers(len(alts)))] if self.rng is not None else alts[0]
            self.picked.append(alt.label)
            return alt
        return next((a for a in alts if a.label == self.label), None)

    def labels(self) -> List[str]:
        """Every alternative offered, each once (units in decision order, cheapest first)."""
        return list(dict.fromkeys(lab for labs in self.seen.values() for lab in labs))


def _one(case, args, ref, force: _Force, **opts) -> Outcome:
    try:
        ex, report = build(case.mod, "llvm", chooser=force, **{**OPTS, **opts})
    except Exception as err:  # pylint: disable=broad-except
        tb = traceback.format_exc(limit=-3)
        return Outcome(force.label or "?", "error", f"{type(err).__name__}: {err}\n{tb}")
    label = force.label or ("random: " + ", ".join(force.picked) if force.rng is not None
                            else "(cheapest of each unit)")
    decisions = list(report.regions) + list(report.decisions)
    reasons = " | ".join(d.reason for d in decisions)
    offered = force.labels()
    if not offered:
        kind = "unchanged"
    elif force.label is not None and force.label not in offered:
        kind = "lost"
    elif force.label is not None and f"forced {force.label} rejected" in reasons or \
            force.label is None and "rejected" in reasons:
        kind = "rejected"
    elif "failed to build" in reasons:
        kind = "fallback"
    elif force.label is None or any(d.chosen == force.label for d in decisions):
        kind = "applied"
    elif any(r.rewritten for r in report.regions):
        kind = "shadowed"  # a rewritten region took the call the label belongs to
    else:
        return Outcome(label, "error", f"not chosen: {reasons}")
    bad = _compare(_run(ex, args), ref, case.reduction)
    if bad:
        return Outcome(label, "mismatch", f"{bad}; decisions: "
                       + "; ".join(f"{d.chosen}: {d.reason}" for d in decisions))
    return Outcome(label, kind, reasons if kind != "applied" else "")


def check_case(case, max_alts: Optional[int] = None, pick_seed: Optional[int] = None,
               **opts) -> CaseResult:
    """Build ``case`` with TVM and with every alternative forced; compare the outputs.

    ``max_alts`` bounds the alternatives forced (spread evenly over the cheapest-first list).
    With ``pick_seed`` the first build forces a random alternative of each unit instead of the
    cheapest (with ``max_alts=1``, the cheap mode of the long run: one ollie build per case).
    """
    res = CaseResult(case.text)
    args = [np.random.default_rng(7).standard_normal([int(s) for s in p.ty.shape])
            .astype("float32") for p in case.mod["main"].params]
    try:
        ref = _run(tvm.compile(case.mod, "llvm"), args).astype(np.float64)
    except Exception as err:  # pylint: disable=broad-except
        res.skipped = f"TVM cannot build it: {type(err).__name__}: {str(err)[:200]}"
        return res
    first = _Force(rng=None if pick_seed is None else np.random.default_rng(pick_seed))
    res.outcomes.append(_one(case, args, ref, first, **opts))
    labels = first.labels()
    res.alternatives = len(labels)
    rest = labels[1:]
    if max_alts is not None and len(rest) > max_alts - 1:
        pick = np.linspace(0, len(rest) - 1, max(max_alts - 1, 0)).round().astype(int)
        rest = [rest[i] for i in sorted(set(pick.tolist()))]
    for label in rest:
        res.outcomes.append(_one(case, args, ref, _Force(label), **opts))
    return res


def fuzz_examples(default: int) -> int:
    """Examples of the long run (``OLLIE_FUZZ_EXAMPLES``; ``default`` when unset)."""
    return int(os.environ.get("OLLIE_FUZZ_EXAMPLES", default))
