"""Decisions remembered per machine: a warm compile takes each unit's decision as it was taken.

With the derivation, verification and per-machine caches (:mod:`tvm_ollie.derive.cache`,
:class:`~.checking.VerdictCache`, :class:`~tvm_ollie.tune.records.MachineStore`), a second
compile of a model searches, checks, times and calibrates nothing, yet it still reads every
search result back (an entry holds up to hundreds of programs: seconds per signature),
estimates every program, and rebuilds the shortlisted modules to key their verdicts. All of
that only recomputes, from cached inputs, the decision the first compile took. This store keeps
the decision itself (the chosen program, its implementation, the costs and the reason), keyed by
everything it was computed from:

* the machine key (:func:`~tvm_ollie.tune.machine.machine_key`): the CPU, the threads, the
  target, the TVM version, the native library and the package's code (the rules, the search,
  the checker, the emitter, the timing protocol...);
* the unit: its signature and TVM's structural hash of its isolated module (the operator, its
  attributes, shapes and dtypes, and the values of constant operands);
* the options that shape a decision (search depth, states, candidates kept, targets, search
  time, library, derivation, measured or not, how many measured, the trials) and the analytic
  calibration's numbers (the roof and every efficiency).

Why this is sound: the decision is a function of exactly these, through the caches whose keys
already make each step deterministic (the derivation cache's result for the expression, the
verdicts of the very same checks, the timed evidence of this machine); the chosen program was
checked against this very unit module when the decision was first taken, and nothing
unverified is stored (a kept original carries no program). What it does not follow, like the
derivation cache: a unit's share of the search time, which moves with the model's other units
(the model's ``search_time_s`` is part of the key, the share is not); clear the cache to decide
again, or set ``TVM_OLLIE_REMEASURE=1`` (decides again and replaces the stored decision).

Only the default decider remembers: a caller's timer, cost model, estimator, checker or chooser
decides by its own rules, and neither the tuned timing (its timings depend on the work dir's
tuning records) nor RPC (another machine's timings) is stored. Decisions that failed
(``internal error``) and multi-output programs (groups, which the stored form does not carry)
are not stored either: they are taken again.
"""

from __future__ import annotations

import hashlib
import json
import logging
from typing import Dict, Optional

import tvm_ffi

from ..compile_profile import stage
from ..derive.cache import dump_program, load_program
from ..tune.records import MachineStore
from .decision import Decision
from .units import unit_module

__all__ = ["RememberedDecisions"]

LOG = logging.getLogger("tvm_ollie.transform")

#: The decision fields stored besides the program (:class:`~.decision.Decision`).
_FIELDS = ("chosen", "reason", "explain", "before_s", "after_s", "measured", "candidates",
           "impl")


class RememberedDecisions:
    """The decisions of one compile's units, read back and stored (module docstring).

    Parameters
    ----------
    store : MachineStore
        Where (the per-user cache's per-machine entries).
    options : dict
        What else a decision depends on: the options that shape it and the calibration's
        numbers (JSON-able; part of every key).
    """

    def __init__(self, store: MachineStore, options: Dict[str, object]):
        self.store = store
        self.options = json.dumps(options, sort_keys=True, default=str)
        #: decisions read back / stored
        self.hits = self.stores = 0

    def key(self, unit, signature: str) -> Optional[str]:
        """The key of ``unit``'s decision (None: its module cannot be built or hashed)."""
        try:
            with stage("decision cache"):
                digest = str(tvm_ffi.structural_hash(unit_module(unit)))
        except Exception as err:  # pylint: disable=broad-except
            LOG.debug("ollie: no decision key (%s: %s)", type(err).__name__, err)
            return None
        return hashlib.sha256(f"{signature}\n{digest}\n{self.options}".encode()).hexdigest()

    def get(self, key: Optional[str]) -> Optional[Decision]:
        """The decision stored under ``key`` (None: none, or ``key`` is None)."""
        if key is None:
            return None
        with stage("decision cache"):
            found = self.store.get(key, _decode)
        self.hits += found is not None
        return found

    def put(self, key: Optional[str], decision: Decision) -> None:
        """Store ``decision`` (not a failed one, nor one whose program the form cannot carry)."""
        if key is None or decision.reason.startswith("internal error"):
            return
        value = {name: getattr(decision, name) for name in _FIELDS}
        value["names"] = list(decision.names)
        try:
            value["program"] = None if decision.program is None else \
                dump_program(decision.program)
        except (TypeError, ValueError) as err:
            LOG.debug("ollie: decision not stored (%s)", err)
            return
        with stage("decision cache"):
            before = self.store.stores
            self.store.put(key, value)
            self.stores += self.store.stores - before


def _decode(value) -> Decision:
    """The decision of a stored value (raises when malformed: the store drops it as corrupt)."""
    program = None if value["program"] is None else load_program(value["program"])
    fields = {name: value[name] for name in _FIELDS}
    for name in ("chosen", "reason", "explain", "impl"):
        if not isinstance(fields[name], str):
            raise ValueError(f"{name} is not text")
    original = fields["chosen"] in ("original", f"original [{fields['impl']}]")
    if (program is None) != original:
        raise ValueError("the chosen label and the program disagree")
    return Decision(program=program, names=[str(n) for n in value["names"]],
                    before_s=float(fields.pop("before_s")), after_s=float(fields.pop("after_s")),
                    measured=bool(fields.pop("measured")),
                    candidates=int(fields.pop("candidates")), **fields)
