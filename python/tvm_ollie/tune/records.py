"""Measurements kept across processes: the per-user cache's ``machine`` entries.

A work dir keeps a build's measurements (the timed decisions' evidence, the untuned timings,
the whole-model guard's verdict) for a later build *with the same work dir*; a fresh work dir
measured everything again, and so did every process for the analytic roofline. This store keeps
them in the per-user cache (``$TVM_OLLIE_CACHE_DIR/machine``, beside the derivation and
verification caches, on the same storage: :class:`~tvm_ollie.derive.cache.EntryStore`, atomic
writes, a corrupt entry ignored with one warning, an unwritable directory skipped with one
warning, size-bounded), keyed by :func:`~.machine.machine_key`: the CPU, the threads, the
target, the TVM version, the native library and the package's code. Another machine, thread
count, target or code version never reads a stored measurement; it measures and stores its own.

``TVM_OLLIE_REMEASURE=1`` (:func:`~.machine.remeasure`) skips every read: everything is measured
again and the stored values are replaced; a comma-separated list of store names (``what``:
``decisions,model guard``) skips the reads of those stores only. ``TVM_OLLIE_CACHE_DIR=``
(empty) turns the store off, like the other per-user caches; so does
``OllieConfig(derivation_cache=False)`` (the callers do not open a store then).
"""

from __future__ import annotations

import hashlib
import json
from typing import Callable, Optional

from ..derive.cache import EntryStore, user_cache_dir
from .machine import machine_key, remeasure

__all__ = ["MachineStore"]

#: Layout of an entry; bump when the stored fields change.
RECORD_FORMAT = 1
SUBDIR = "machine"


class MachineStore:
    """JSON values by ``(machine key, what, key)`` in the per-user cache (module docstring).

    Parameters
    ----------
    target : Target or str
        The target the values were measured for (part of the machine key).
    what : str
        The kind of value (``"calibration"``, ``"decisions"``...): also part of every key.
    dirs : sequence of str, optional
        Where (default: the per-user cache's ``machine`` directory).
    machine : str, optional
        The machine key (default :func:`~.machine.machine_key` of ``target``); tests give one.
    """

    def __init__(self, target, what: str, dirs=None, machine: Optional[str] = None):
        if dirs is None:
            user = user_cache_dir(SUBDIR)
            dirs = [user] if user else []
        self.store = EntryStore(dirs, what=f"per-machine cache ({what})")
        self.what = what
        self.machine = machine if machine is not None else machine_key(target)
        #: values read back / stored
        self.hits = self.stores = 0

    @classmethod
    def for_run(cls, target, what: str, enabled: bool = True,
                machine: Optional[str] = None) -> Optional["MachineStore"]:
        """The store of a compile, or None when it is off (``enabled`` False, or no per-user
        cache directory); ``machine`` as in the constructor."""
        if not enabled or not user_cache_dir(SUBDIR):
            return None
        return cls(target, what, machine=machine)

    def _keyed(self, key: str):
        material = json.dumps({"format": RECORD_FORMAT, "machine": self.machine,
                               "what": self.what, "key": key}, sort_keys=True)
        return hashlib.sha256(material.encode()).hexdigest(), material

    def get(self, key: str, decode: Callable[[object], object] = lambda value: value):
        """``decode(value)`` of the value stored under ``key`` (None: none, or
        ``TVM_OLLIE_REMEASURE`` asks for this store's ``what``). A ``decode`` that raises marks
        the entry corrupt: ignored with one warning and removed."""
        if remeasure(self.what) or not self.store.dirs:
            return None
        found = self.store.load(*self._keyed(key), decode=lambda entry: decode(entry["value"]))
        self.hits += found is not None
        return found

    def put(self, key: str, value) -> None:
        """Store ``value`` (JSON-able) under ``key``."""
        if not self.store.dirs:
            return
        digest, material = self._keyed(key)
        self.stores += self.store.store(digest, {"key": material, "value": value})
