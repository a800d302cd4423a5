"""ONNX Runtime's own per-node profile of an ONNX model, for the side-by-side table.

ONNX Runtime writes a Chrome-trace JSON when ``SessionOptions.enable_profiling`` is on: a
``Session`` event ``model_run`` per inference and a ``Node`` event ``<node>_kernel_time`` per
node it ran, whose ``args`` name the operator type (``op_name``: ``Conv``, ``FusedConv``,
``Relu``...) and the execution provider. Its graph optimizations have run by then, so the op
types are those of the optimized graph (a batch norm folded into the conv is gone; a
``FusedConv`` carries its activation). The warm-up run's events are dropped; the model's time
without the profiler is measured afterwards in a second session with profiling off and ONNX
Runtime's defaults (its workers spin after a run), as the benchmark times it: warm samples
(:func:`~tvm_ollie.bench.timing.warm_samples`: untimed warm-up calls, then at least 20 ms of
back-to-back calls per sample). Until 2026-12-03 it alternated single runs with the profiled
session, both not spinning: YOLOX quick read 1.62 ms there against 0.5 ms in a warm loop.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from typing import Dict, List, Optional, Sequence

import numpy as np

from ..bench.timing import warm_samples


@dataclasses.dataclass(frozen=True)
class OrtNode:
    """One node run: node name, operator type, provider, start (us) and duration (us) as ONNX
    Runtime's profiler wrote them, and the index of the run."""

    name: str
    op_type: str
    provider: str
    start_us: float
    dur_us: float
    run: int


@dataclasses.dataclass
class OrtProfile:
    """ONNX Runtime's profile of ``runs`` inferences.

    Attributes
    ----------
    nodes : list of OrtNode
        Every node event of the profiled runs (warm-up excluded).
    run_us : list of float
        Each profiled run's ``model_run`` duration (us).
    unprofiled_s : list of float
        Wall times (s) of the same number of runs in a session without profiling.
    threads : int
        ``intra_op_num_threads`` of both sessions.
    """

    nodes: List[OrtNode]
    run_us: List[float]
    unprofiled_s: List[float]
    threads: int

    @property
    def runs(self) -> int:
        """Number of profiled runs."""
        return len(self.run_us)


def _session(path: str, threads: int, profile_prefix: Optional[str] = None):
    # lazy: onnxruntime is an optional dependency
    import onnxruntime as ort  # pylint: disable=import-outside-toplevel

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    if profile_prefix:
        # the profiled session's workers sleep after a run: the unprofiled session runs after
        # it, and a spinning pool would take its cores
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.enable_profiling = True
        options.profile_file_prefix = profile_prefix
    return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])


def _feeds(session, inputs: Sequence[np.ndarray]) -> Dict[str, np.ndarray]:
    metas = session.get_inputs()
    if len(metas) != len(inputs):
        raise ValueError(f"the ONNX model takes {len(metas)} inputs, {len(inputs)} given")
    return {meta.name: np.ascontiguousarray(x) for meta, x in zip(metas, inputs)}


def profile_onnxruntime(path: str, inputs: Sequence[np.ndarray], runs: int = 10,
                        threads: Optional[int] = None) -> OrtProfile:  # fmt: skip
    """Profile ``runs`` inferences of the ONNX model at ``path`` on ``inputs`` (in the graph's
    input order) with ONNX Runtime's CPU provider, after one warm-up run; then ``runs`` warm
    samples of a session without profiling (module docstring)."""
    threads = int(threads or os.cpu_count() or 1)
    with tempfile.TemporaryDirectory(prefix="ollie_ort_profile_") as tmp:
        profiled = _session(path, threads, os.path.join(tmp, "ort"))
        feeds = _feeds(profiled, inputs)
        for _ in range(runs + 1):  # the first is the warm-up, dropped from the profile
            profiled.run(None, feeds)
        trace = profiled.end_profiling()
        with open(trace, encoding="utf-8") as f:
            events = json.load(f)
    nodes, run_us = parse_trace(events, skip_runs=1)
    plain = _session(path, threads)
    unprofiled = warm_samples(lambda: plain.run(None, feeds), runs).seconds
    return OrtProfile(nodes, run_us, unprofiled, threads)


def parse_trace(events: Sequence[dict], skip_runs: int = 0) -> tuple:
    """``(nodes, run_us)`` of an ONNX Runtime profile (its JSON list of events): the node
    events inside each ``model_run``, the first ``skip_runs`` runs dropped."""
    spans = sorted((e for e in events if e.get("cat") == "Session"
                    and e.get("name") == "model_run"), key=lambda e: e["ts"])  # fmt: skip
    kept = spans[skip_runs:]
    bounds = [(float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in kept]
    nodes: List[OrtNode] = []
    for event in events:
        if event.get("cat") != "Node" or not str(event.get("name", "")).endswith("_kernel_time"):
            continue
        start = float(event["ts"])
        run = next((i for i, (lo, hi) in enumerate(bounds) if lo <= start <= hi), None)
        if run is None:
            continue
        args = event.get("args", {})
        nodes.append(OrtNode(str(event["name"])[: -len("_kernel_time")],
                             str(args.get("op_name", "?")), str(args.get("provider", "")),
                             start, float(event["dur"]), run))  # fmt: skip
    return nodes, [float(e["dur"]) for e in kept]
