"""Timing every call the Relax VM makes, with the VM's own instrument hook.

TVM 0.27 has no profiling VM any more (``VirtualMachine(..., profile=True)`` and
``vm.profile`` are gone, and so is ``tvm.runtime.profiling``). What remains is
``vm.set_instrument(f)``: the VM calls ``f(func, name, before, ret, *args)`` before and after
every ``call`` instruction (``RunInstrCall`` in ``src/runtime/vm/vm.cc``): TVM kernels, the
native library's kernels reached through ``call_dps_packed``, and VM builtins alike, each under
the name the executable calls it by. The time between the two callbacks is the call's time
plus the hook's own cost (two crossings into Python, a few microseconds), which
:func:`hook_floor_s` measures so that the report can say how much of the sum it is.

On a GPU the "after" callback synchronizes the device first, so each call's time is its
kernel's time rather than its launch's.
"""

from __future__ import annotations

import dataclasses
import re
import time
from typing import Callable, Dict, List, Optional, Sequence

_CALL_LINE = re.compile(r"^\s*call\s+(\S+)\s+in:")
_FUNC_HEADER = re.compile(r"^@(\S+):\s*$")


@dataclasses.dataclass(frozen=True)
class CallEvent:
    """One call instruction as it ran: its function's name, start (ns, process clock),
    duration (ns), self time (ns: the duration less the calls it made, when it is a Relax
    subfunction whose instructions the VM runs and instruments too), nesting depth, and the
    index of the run it belongs to."""

    name: str
    start_ns: int
    dur_ns: int
    self_ns: int
    depth: int
    run: int


class CallRecorder:
    """The instrument: records a :class:`CallEvent` per call while :attr:`run` is not None.

    Parameters
    ----------
    sync : callable, optional
        Called after each call, before its end time is taken (``dev.sync`` on a GPU).
    """

    def __init__(self, sync: Optional[Callable[[], None]] = None):
        self.events: List[CallEvent] = []
        self.run: Optional[int] = None
        self._sync = sync
        self._open: List[tuple] = []

    def __call__(self, _func, name, before, _ret, *_args) -> int:
        now = time.perf_counter_ns()
        if self.run is None:
            return 0
        if before:
            self._open.append([str(name), now, 0])
            return 0
        if self._sync is not None:
            self._sync()
            now = time.perf_counter_ns()
        # nested calls (a Relax subfunction's instructions) close in last-in, first-out order
        called, start, children = self._open.pop()
        dur = now - start
        if self._open:
            self._open[-1][2] += dur
        self.events.append(CallEvent(called, start, dur, dur - children, len(self._open),
                                     self.run))
        return 0


def vm_calls(executable, func: str = "main") -> List[str]:
    """The names called by the ``call`` instructions of ``func`` in the executable's code, in
    order (``Executable.as_text()``); a straight-line ``main`` runs exactly these."""
    calls: List[str] = []
    current = None
    for line in executable.as_text().splitlines():
        header = _FUNC_HEADER.match(line)
        if header:
            current = header.group(1)
            continue
        match = _CALL_LINE.match(line)
        if match and current == func:
            calls.append(match.group(1))
    return calls


def record_runs(plain_vm, traced_vm, func: str, args: Sequence, runs: int,
                sync: Optional[Callable[[], None]] = None) -> tuple:
    """Run ``func`` ``runs`` times on each VM, alternating (after one warm-up run each), the
    second VM under the instrument, so that both see the same load on a shared machine.

    Two VMs because an instrument, once set, cannot be removed, only made cheap. Returns
    ``(events, plain_s, traced_s)``: every call of every instrumented run, and each run's wall
    time without and with the instrument.
    """
    recorder = CallRecorder(sync)
    traced_vm.set_instrument(recorder)
    plain, traced = plain_vm[func], traced_vm[func]
    plain(*args)  # warm-up: first-call allocations, the library's primitive caches
    traced(*args)
    plain_s, traced_s = [], []
    for index in range(runs):
        plain_s.append(_timed(plain, args, sync))
        recorder.run = index
        traced_s.append(_timed(traced, args, sync))
        recorder.run = None
    return recorder.events, plain_s, traced_s


def _timed(main, args: Sequence, sync: Optional[Callable[[], None]]) -> float:
    start = time.perf_counter()
    main(*args)
    if sync is not None:
        sync()
    return time.perf_counter() - start


def hook_floor_s(events: Sequence[CallEvent], probe: str = "vm.builtin.null_value"
                 ) -> Optional[float]:  # fmt: skip
    """The instrument's own cost per call: the median recorded time of ``probe``, a builtin
    that does nothing (None when the run never called it)."""
    times = sorted(e.dur_ns for e in events if e.name == probe)
    if not times:
        return None
    return times[len(times) // 2] / 1e9


def per_run(events: Sequence[CallEvent]) -> Dict[int, List[CallEvent]]:
    """The events grouped by run index."""
    runs: Dict[int, List[CallEvent]] = {}
    for event in events:
        runs.setdefault(event.run, []).append(event)
    return runs
