"""The measured decisions: a unit's checked alternatives timed together, the evidence recorded.

A decision taken on one timing per alternative is as good as that timing, and on a shared
machine one timing can be off by 10-100x: the same model built twice then ran at different
speeds (YOLOX 26.8 / 3.9 / 16.0 ms). Here every alternative of a decision is built first
(:meth:`~.costing.ModuleTiming.sampler`), then all are timed together under the protocol of
:mod:`tvm_ollie.tune.compare` (interleaved rounds until the fastest is separated, ties to a
stated preference), and the evidence (every sample, the rounds, separated or tied, the
tie-break) is recorded in ``work_dir`` (:class:`DecisionRecords`). A later build with the same
work dir reads the evidence back and times nothing: it takes the same decisions (unless its
search no longer finds the recorded winner).
"""

from __future__ import annotations

import hashlib
import logging
from typing import Dict, List, Optional

from ..compile_profile import stage
from ..tune.compare import Comparison, Margin, compare
from ..tune.records import MachineStore
from ..tune.workdir import JsonRecords
from .alternatives import Alternative
from .choosing import DECISION_QUANTILE
from .costing import ModuleTiming, UnitCostModel

__all__ = ["CLEAR", "HOPELESS", "LONG_SAMPLE_S", "PROTOCOL", "TIME_CAP_S", "DecisionRecords",
           "DecisionTiming"]

LOG = logging.getLogger("tvm_ollie.transform")

#: An alternative whose fastest of two samples is more than this many times the leader's slowest
#: leaves the rounds (:func:`~tvm_ollie.tune.compare.compare`'s ``hopeless``; the whole-model
#: guard's value). Why: it cannot win (the margin a measured decision separates by is 15 %,
#: not 3x), and it was timed in every round: TVM's untuned kernel of the demo's transposed
#: convolution (49 ms a call, two calls a sample) against the library's (0.26 ms) took 8 rounds
#: and the whole 2 s of its decision; its samples still judge it (it is beaten, not dropped).
HOPELESS = 3.0

#: Seconds of a decision's timing after which ``min_rounds`` is waived once every alternative
#: has two samples (:func:`~tvm_ollie.tune.compare.compare`'s ``time_cap_s``): ten times the
#: protocol's 2 s, reached only by alternatives whose one call takes seconds.
TIME_CAP_S = 20.0

#: A hopeless alternative whose one sample took this many seconds leaves the rounds after it
#: (:func:`~tvm_ollie.tune.compare.compare`'s ``long_sample_s``): at paper size an untuned TVM
#: alternative of Longformer's attention took about 20 s a sample beside library
#: alternatives of milliseconds, and its second sample cost a heavy unit minutes more.
LONG_SAMPLE_S = 1.0

#: A decision stops before its last round only on a separation by this many times its margin
#: (:func:`~tvm_ollie.tune.compare.compare`'s ``clear``): gains within 1-2 margins (15-30%) are
#: timed to the last round and judged once there, where a separation after 5 rounds by a
#: burst had flipped decisions between fresh builds (docs/decisions.md, "Near ties confirmed").
CLEAR = 2.0

#: The protocol of one decision: at least 5 rounds, at most 15, no new round after 2 s, judged
#: on the first quartile (:data:`~.choosing.DECISION_QUANTILE`,
#: :func:`~tvm_ollie.tune.compare.quantile_interval`): a unit's samples
#: are only ever slowed by the machine, and a third of them slowed (a thread descheduled, a
#: pool's worker waiting for the scheduler's tick) widened the median's interval past the
#: alternative it beat: the same clear 3x gain was taken by some builds and not by others
#: (``tests/transform/test_stable_decisions.py``). Hopeless alternatives leave after two
#: rounds (:data:`HOPELESS`), after one when that sample took :data:`LONG_SAMPLE_S` or more.
#: Samples of seconds each (untuned TVM alternatives at paper size) end the rounds after two
#: once :data:`TIME_CAP_S` is spent. A close separation is confirmed to the last round
#: (:data:`CLEAR`).
PROTOCOL = dict(min_rounds=5, max_rounds=15, time_s=2.0, quantile=DECISION_QUANTILE,
                hopeless=HOPELESS, time_cap_s=TIME_CAP_S, long_sample_s=LONG_SAMPLE_S,
                clear=CLEAR)


class DecisionRecords(JsonRecords):
    """The evidence of every timed decision, kept in ``work_dir`` (``FILE``), keyed by the
    cost model (target, device, mode) and the unit's signature, and in the per-user cache
    (``shared``, a :class:`~tvm_ollie.tune.records.MachineStore`: keyed by this machine, its
    threads, the target, TVM, the native library and the code besides), so that a build in a
    fresh work dir on the same machine reads the evidence back too.

    The derivation search runs under a time budget, so a later build may find another set of
    alternatives for the same unit: the recorded decision is reused when its winner is among
    the alternatives checked now (then nothing is timed and the decision is the same), and
    taken again otherwise. ``TVM_OLLIE_REMEASURE=1`` skips the per-user cache's evidence (the
    work dir's is the work dir's: delete it to time again)."""

    FILE = "ollie_decisions.json"

    def __init__(self, work_dir: Optional[str], shared: Optional[MachineStore] = None):
        super().__init__(work_dir)
        self.shared = shared

    @staticmethod
    def key(model: str, signature: str) -> str:
        """One key per (cost model, signature)."""
        return hashlib.sha1(f"{model}\n{signature}".encode()).hexdigest()

    def entry(self, key: str) -> Optional[dict]:
        """The raw record of ``key``: this work dir's, else the per-machine cache's."""
        entry = self.data.get(key)
        if entry is None and self.shared is not None:
            entry = self.shared.get(key)
        return entry if isinstance(entry, dict) else None

    def get(self, key: str, labels: List[str]) -> Optional[Comparison]:
        """The recorded comparison if its winner is one of ``labels`` (the alternatives of
        the decision now); None: not decided in this work dir, or the winner is not offered."""
        entry = self.entry(key)
        try:
            res = Comparison.from_dict(entry["comparison"]) if entry else None
        except (KeyError, TypeError, ValueError):  # a record of another version: time again
            return None
        return res if res is not None and res.winner in labels else None

    def put(self, key: str, signature: str, comparison: Comparison,
            evidence: Optional[dict] = None) -> None:
        """Record and save (``evidence``: the conditions it was timed in,
        :func:`tvm_ollie.tune.evidence.evidence`, when the caller keeps them)."""
        self.data[key] = {"signature": signature, "comparison": comparison.to_dict()}
        if evidence is not None:
            self.data[key]["evidence"] = evidence
        self.save()
        if self.shared is not None:
            self.shared.put(key, self.data[key])


class DecisionTiming:
    """Times the alternatives of one decision together (a
    :data:`~.choosing.TimingStep` once bound to a unit by :meth:`step`), reusing recorded
    evidence.

    Parameters
    ----------
    model : UnitCostModel
        The deciding cost; a :class:`~.costing.ModuleTiming` builds each alternative once and
        samples it (:meth:`~.costing.ModuleTiming.sampler`), any other is sampled by its
        ``seconds``.
    records : DecisionRecords
        Where the evidence is kept.
    protocol : dict, optional
        Options of :func:`~tvm_ollie.tune.compare.compare` (default :data:`PROTOCOL`).
    """

    def __init__(self, model: UnitCostModel, records: DecisionRecords,
                 protocol: Optional[dict] = None):
        self.model = model
        self.records = records
        self.protocol = dict(PROTOCOL if protocol is None else protocol)
        #: ``{(signature, label): median seconds}`` of every decision timed or read back
        self.seconds: Dict[tuple, float] = {}

    def step(self, unit, signature: str):
        """The timing step of ``unit``'s decision."""
        return lambda alts, prefer, margin: self(unit, signature, alts, prefer, margin)

    def __call__(self, unit, signature: str, alts: List[Alternative], prefer: List[str],
                 margin: Margin) -> Comparison:
        labels = [a.label for a in alts]
        key = DecisionRecords.key(getattr(self.model, "record_key", self.model.name),
                                  signature)
        res = self.records.get(key, labels)
        if res is None:
            with stage("candidate builds"):
                samplers = self._samplers(unit, alts)
            with stage("timing"):
                res = compare(samplers, prefer, margin, **self.protocol)
            self.records.put(key, signature, res)
        else:
            LOG.info("ollie: %s decided from the recorded evidence", signature)
        self.seconds.update({(signature, n): s for n, s in res.medians().items()})
        return res

    def _samplers(self, unit, alts: List[Alternative]) -> dict:
        samplers = {}
        for alt in alts:
            if isinstance(self.model, ModuleTiming):
                sampler = self.model.sampler(unit, alt)
            else:
                sampler = (lambda a=alt: self.model.seconds(unit, a))
            samplers[alt.label] = sampler if sampler is not None else _failed
        return samplers


def _failed() -> None:
    """The sampler of an alternative that failed to build."""
    return None
