"""How much CPU a runtime's idle workers burn after its call returns.

A pool whose workers spin after a call holds cores that the next call, another runtime's or
another process's, needs. The time it holds them is measured as CPU time, not wall time: the
process's other threads' CPU time (``/proc/self/task/*/schedstat``, nanoseconds) over a window
in which the calling thread sleeps right after the call. CPU time counts only the moments the
spinner ran, so the number holds on a loaded machine too (a spinner that is descheduled burns
less, never more). :mod:`.crowded` reports it per runtime and thread setting.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from typing import Callable, Dict

__all__ = ["threads_cpu_ns", "spin_after", "spin_table"]

#: The window after a call, seconds: longer than GNU OpenMP's default spin (300,000 polls, about
#: 9 ms of CPU on the development machine) and ONNX Runtime's (about 40 ms), measured.
DEFAULT_WINDOW_S = 0.1


def threads_cpu_ns(skip: int) -> int:
    """CPU nanoseconds run so far by this process's threads other than native thread id
    ``skip`` (0 where ``/proc`` is unavailable); a thread that ended is no longer counted."""
    total = 0
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return 0
    for tid in tids:
        if tid == str(skip):
            continue
        try:
            with open(f"/proc/self/task/{tid}/schedstat", encoding="ascii") as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # the thread ended between the listing and the read
    return total


def spin_after(call: Callable[[], object], window_s: float = DEFAULT_WINDOW_S,
               repeats: int = 9) -> float:  # fmt: skip
    """Median milliseconds of CPU the process's other threads spend in the ``window_s`` after
    ``call`` returns, the caller asleep; ``call`` runs twice before each window so that its
    workers are awake, as in a stream of calls."""
    me = threading.get_native_id()
    burnt = []
    for _ in range(repeats):
        call()
        call()
        start = threads_cpu_ns(me)
        time.sleep(window_s)
        burnt.append((threads_cpu_ns(me) - start) / 1e6)
    return statistics.median(burnt)


def spin_table(rows: Dict[str, dict]) -> str:
    """Markdown: a row per runtime, a column per setting: CPU ms burnt after its call (each
    row's ``spin_ms``)."""
    names = list(rows)
    runtimes = []
    for row in rows.values():
        runtimes += [r for r in row.get("spin_ms", {}) if r not in runtimes]
    lines = ["| CPU ms after the call | " + " | ".join(names) + " |",
             "|" + "---|" * (len(names) + 1)]  # fmt: skip
    for runtime in runtimes:
        cells = []
        for name in names:
            value = rows[name].get("spin_ms", {}).get(runtime)
            cells.append("-" if value is None else f"{value:.2f}")
        lines.append(f"| {runtime} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
