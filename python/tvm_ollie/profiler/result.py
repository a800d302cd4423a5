"""A model's profile: per system, every VM call timed; tables by kind and by name; the trace.

Every figure is per inference, of a *typical run*: when every profiled run made the same
sequence of calls (a model without control flow), each call's time is its median over the runs
(or, with ``stat="min"``, its fastest: the undisturbed cost on a machine shared with other
work), so that one run preempted on a shared machine does not move the tables; otherwise it is
the mean. The model's times use the same statistic. The column sums compare with one run's time. Beside the sum of the calls
stand the model's time measured without the profiler (median of as many runs) and the
instrument's own cost per call (:func:`~.vm_trace.hook_floor_s`): the gap between the model's
time and the kernels' sum is the per-call overhead (VM dispatch, allocations, checks), which the
``VM ...`` rows show call by call.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from .kinds import KIND_ORDER, is_kernel, kind_of
from .ort import OrtProfile
from .vm_trace import CallEvent, hook_floor_s, per_run


@dataclasses.dataclass(frozen=True)
class Row:
    """One line of a table: ``count`` calls per run taking ``total_s`` per run in all."""

    key: str
    count: float
    total_s: float
    kind: str = ""

    @property
    def mean_s(self) -> float:
        """Time per call."""
        return self.total_s / self.count if self.count else 0.0


@dataclasses.dataclass
class SystemProfile:
    """Every VM call of one build of the model (``ollie``, or ``tvm`` for TVM alone).

    Attributes
    ----------
    system : str
        ``"ollie"`` or ``"tvm"``.
    events : list of CallEvent
        Every call of every profiled run.
    runs : int
        Number of profiled runs.
    unprofiled_s : list of float
        Wall time of each run without the instrument.
    profiled_s : list of float
        Wall time of each run with it.
    code_calls : int
        Number of ``call`` instructions in ``main``'s code.
    build_s : float
        Time to build the executable.
    stat : str
        ``"median"`` or ``"min"``: how a typical run is taken from the runs (:data:`STATS`).
    """

    system: str
    events: List[CallEvent]
    runs: int
    unprofiled_s: List[float]
    profiled_s: List[float]
    code_calls: int
    build_s: float = 0.0
    stat: str = "median"

    def typical(self) -> List[Tuple[str, float, float]]:
        """``(name, seconds, weight)`` per call of a typical run: per position, the median self
        time over the runs (weight 1) when all runs made the same calls, else every call of
        every run with weight ``1 / runs`` (means)."""
        return _typical([[(e.name, e.self_ns / 1e9) for e in run]
                         for run in per_run(self.events).values()], self.stat)  # fmt: skip

    def calls_per_run(self) -> float:
        """Calls recorded per profiled run."""
        return len(self.events) / self.runs if self.runs else 0.0

    def calls_sum_s(self, kernels_only: bool = False) -> float:
        """Sum of the calls' self times in a typical run (all calls, or only the kernels)."""
        return sum(t * w for n, t, w in self.typical()
                   if not kernels_only or is_kernel(kind_of(n)))  # fmt: skip

    def kernel_calls(self) -> float:
        """Kernel calls per run."""
        return sum(w for n, _, w in self.typical() if is_kernel(kind_of(n)))

    def unprofiled_median_s(self) -> float:
        """The model's time without the profiler (median, or min with ``stat="min"``)."""
        return STATS[self.stat](self.unprofiled_s) if self.unprofiled_s else 0.0

    def hook_floor_s(self) -> Optional[float]:
        """The instrument's cost per call (None if no empty builtin ran)."""
        return hook_floor_s(self.events)

    def by_kind(self) -> List[Row]:
        """Rows per kind, in :data:`~.kinds.KIND_ORDER`."""
        rows = _group(self.typical(), kind_of)
        order = {k: i for i, k in enumerate(KIND_ORDER)}
        return sorted(rows, key=lambda r: order.get(r.key, len(order)))

    def by_name(self) -> List[Row]:
        """Rows per called name, the costliest first."""
        rows = _group(self.typical(), lambda n: n)
        rows = [dataclasses.replace(r, kind=kind_of(r.key)) for r in rows]
        return sorted(rows, key=lambda r: -r.total_s)

    def trace_run(self) -> List[CallEvent]:
        """The events of the run whose wall time is the median (the trace shows one run)."""
        runs = per_run(self.events)
        if not runs:
            return []
        ranked = sorted(runs, key=lambda i: sum(e.self_ns for e in runs[i]))
        return runs[ranked[len(ranked) // 2]]


#: How a typical run's call times are taken from the runs.
STATS: Dict[str, Callable] = {"median": statistics.median, "min": min}


def _typical(runs: List[List[Tuple[str, float]]], stat: str = "median"
             ) -> List[Tuple[str, float, float]]:  # fmt: skip
    if not runs:
        return []
    names = [n for n, _ in runs[0]]
    if all([n for n, _ in run] == names for run in runs):
        return [(name, STATS[stat]([run[i][1] for run in runs]), 1.0)
                for i, name in enumerate(names)]  # fmt: skip
    return [(n, t, 1.0 / len(runs)) for run in runs for n, t in run]


def _group(calls: Iterable[Tuple[str, float, float]], key: Callable[[str], str]) -> List[Row]:
    counts: Dict[str, float] = {}
    totals: Dict[str, float] = {}
    for name, seconds, weight in calls:
        k = key(name)
        counts[k] = counts.get(k, 0.0) + weight
        totals[k] = totals.get(k, 0.0) + seconds * weight
    return [Row(k, counts[k], totals[k]) for k in counts]


def ort_typical(ort: OrtProfile, stat: str = "median") -> List[Tuple[str, float, float]]:
    """``(op type, seconds, weight)`` per node of a typical ONNX Runtime run."""
    runs: Dict[int, List[Tuple[str, float]]] = {}
    for node in sorted(ort.nodes, key=lambda n: n.start_us):
        runs.setdefault(node.run, []).append((node.op_type, node.dur_us / 1e6))
    return _typical(list(runs.values()), stat)


def _ort_rows(ort: OrtProfile, stat: str) -> List[Row]:
    rows = _group(ort_typical(ort, stat), lambda n: n)
    return sorted(rows, key=lambda r: -r.total_s)


def fmt_time(seconds: float) -> str:
    """``1.23 ms`` / ``45.6 us``: a time in the unit that reads best (negative differences
    too)."""
    size = abs(seconds)
    if size >= 1.0:
        return f"{seconds:.2f} s"
    if size >= 1e-3:
        return f"{seconds * 1e3:.3f} ms"
    return f"{seconds * 1e6:.1f} us"


#: Widest kernel name a table shows: fused kernels of long chains are named after every
#: operator in them; the cut keeps the head and the tail (the trace has the full names).
NAME_WIDTH = 60


def _short(name: str) -> str:
    if len(name) <= NAME_WIDTH:
        return name
    half = (NAME_WIDTH - 3) // 2
    return f"{name[:half]}...{name[-(NAME_WIDTH - 3 - half):]}"


def _count(value: float) -> str:
    return f"{value:g}" if value == int(value) else f"{value:.1f}"


def table(rows: Sequence[Row], total_s: float, title: str, limit: Optional[int] = None,
          with_kind: bool = False) -> str:  # fmt: skip
    """A fixed-width table: key, count, total, mean, share of ``total_s``."""
    shown = list(rows if limit is None else rows[:limit])
    width = max([len(title)] + [len(_short(r.key)) for r in shown])
    head = f"{title:<{width}}  {'calls':>6}  {'total':>10}  {'mean':>10}  {'share':>6}"
    if with_kind:
        head += "  kind"
    lines = [head, "-" * len(head)]
    for r in shown:
        share = 100.0 * r.total_s / total_s if total_s > 0 else 0.0
        line = (f"{_short(r.key):<{width}}  {_count(r.count):>6}  {fmt_time(r.total_s):>10}  "
                f"{fmt_time(r.mean_s):>10}  {share:5.1f}%")  # fmt: skip
        lines.append(line + (f"  {r.kind}" if with_kind else ""))
    if limit is not None and len(rows) > limit:
        rest = rows[limit:]
        lines.append(f"... {len(rest)} more names, {fmt_time(sum(r.total_s for r in rest))}")
    return "\n".join(lines)


@dataclasses.dataclass
class ProfileResult:
    """The profile of one model: each build's calls, and ONNX Runtime's nodes when profiled.

    Attributes
    ----------
    model : str
        What was profiled (a path, or ``"<IRModule>"``).
    target : str
        The target's kind.
    threads : int
        TVM's thread count (``TVM_NUM_THREADS``) during the runs; ONNX Runtime used as many.
    systems : list of SystemProfile
        ``ollie`` first, then ``tvm`` with ``baseline``.
    ort : OrtProfile or None
        ONNX Runtime's profile (ONNX models).
    stat : str
        ``"median"`` or ``"min"`` for ONNX Runtime's typical run and model time (the systems
        carry their own).
    """

    model: str
    target: str
    threads: int
    systems: List[SystemProfile]
    ort: Optional[OrtProfile] = None
    stat: str = "median"

    def system(self, name: str) -> SystemProfile:
        """The profile of the build named ``name``."""
        for sys_profile in self.systems:
            if sys_profile.system == name:
                return sys_profile
        raise KeyError(name)

    def summary_lines(self) -> List[str]:
        """One line per system: the model's time without the profiler, the calls' sum, and the
        per-call overhead (model time less the kernels' time net of the instrument's cost)."""
        lines = []
        for s in self.systems:
            floor = s.hook_floor_s() or 0.0
            model = s.unprofiled_median_s()
            net = s.calls_sum_s(kernels_only=True) - floor * s.kernel_calls()
            lines.append(
                f"{s.system}: model {fmt_time(model)} without the profiler "
                f"({fmt_time(STATS[s.stat](s.profiled_s))} with it); "
                f"{_count(s.calls_per_run())} calls ({s.code_calls} in main's code) summing "
                f"{fmt_time(s.calls_sum_s())}; {_count(s.kernel_calls())} kernels "
                f"{fmt_time(net)} net of the instrument (~{fmt_time(floor)}/call); "
                f"overhead (model - kernels) {fmt_time(model - net)} = "
                f"{100.0 * (model - net) / model if model > 0 else 0.0:.0f}%")
        if self.ort is not None:
            ort_model = STATS[self.stat](self.ort.unprofiled_s) if self.ort.unprofiled_s else 0
            typical = ort_typical(self.ort, self.stat)
            nodes = sum(t * w for _, t, w in typical)
            run = STATS[self.stat](self.ort.run_us) / 1e6 if self.ort.run_us else 0.0
            lines.append(
                f"onnxruntime: model {fmt_time(ort_model)} without the profiler "
                f"({fmt_time(run)} with it); {_count(sum(w for _, _, w in typical))} nodes "
                f"summing {fmt_time(nodes)}; overhead (model - nodes) "
                f"{fmt_time(ort_model - nodes)} = "
                f"{100.0 * (ort_model - nodes) / ort_model if ort_model > 0 else 0.0:.0f}%")
        return lines

    def to_text(self, names: Optional[int] = 25) -> str:
        """The report: summary, then per system its table by kind and by name (the ``names``
        costliest; None: all), then ONNX Runtime's by op type."""
        out = [f"profile of {self.model} on {self.target}, {self.threads} threads, "
               f"{self.systems[0].runs if self.systems else 0} runs (a typical run: "
               f"per-call {'medians' if self.stat == 'median' else 'minima'})", ""]
        out += self.summary_lines()
        for s in self.systems:
            total = s.calls_sum_s()
            out += ["", table(s.by_kind(), total, f"{s.system}: by kind"), ""]
            out.append(table(s.by_name(), total, f"{s.system}: by name", limit=names,
                             with_kind=True))
        if self.ort is not None:
            rows = _ort_rows(self.ort, self.stat)
            total = sum(r.total_s for r in rows)
            out += ["", table(rows, total, "onnxruntime: by op type")]
        return "\n".join(out) + "\n"

    def to_chrome_trace(self) -> dict:
        """A Chrome trace (``chrome://tracing``, Perfetto): one complete event per call of one
        run of each system (process ``pid`` per system, times from that run's start), and one
        per node of one ONNX Runtime run."""
        events: List[dict] = []
        for pid, s in enumerate(self.systems, start=1):
            events.append(_process_name(pid, f"{s.system} (TVM VM)"))
            run = s.trace_run()
            origin = min((e.start_ns for e in run), default=0)
            for e in run:
                events.append({"name": e.name, "cat": kind_of(e.name), "ph": "X",
                               "ts": (e.start_ns - origin) / 1e3, "dur": e.dur_ns / 1e3,
                               "pid": pid, "tid": e.depth,
                               "args": {"self_us": e.self_ns / 1e3}})  # fmt: skip
        if self.ort is not None and self.ort.nodes:
            pid = len(self.systems) + 1
            events.append(_process_name(pid, "onnxruntime"))
            last = max(n.run for n in self.ort.nodes)
            run = [n for n in self.ort.nodes if n.run == last]
            origin = min(n.start_us for n in run)
            for n in run:
                events.append({"name": n.name, "cat": n.op_type, "ph": "X",
                               "ts": n.start_us - origin, "dur": n.dur_us, "pid": pid,
                               "tid": 0, "args": {"op_type": n.op_type,
                                                  "provider": n.provider}})  # fmt: skip
        return {"traceEvents": events, "displayTimeUnit": "ms"}

    def write_chrome_trace(self, path: str) -> None:
        """Write :meth:`to_chrome_trace` as JSON to ``path``."""
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.to_chrome_trace(), f)


def _process_name(pid: int, name: str) -> dict:
    return {"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": name}}

