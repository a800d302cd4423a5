"""The CUDA analytic cost calibrated from a bundle's run on a device without TVM.

:mod:`tvm_ollie.tune.cuda_calibration` fits the efficiencies of TVM's CUDA kernels from timed
workloads when a GPU is here. A GPU machine without TVM can run the same workloads from a
bundle: :func:`calibration_entries` builds each of them (``calib.<kind>.<k>``, TVM's default
pipeline, inputs made by the runner), the runner times them and measures the copy bandwidth,
and :func:`fit_from_results` turns the rows into a :class:`~tvm_ollie.tune.cuda_calibration.
CudaCalibration`, with the seconds each kernel costs besides its roofline time fitted from the
candidate kernels' rows (:func:`fit_launch`). :func:`~tvm_ollie.tune.cuda_calibration.write_recorded` keeps it in the
package (``tune/recorded/``): the pass uses it for builds for that architecture where no GPU
is present, in place of the hand-set efficiencies.
"""

from __future__ import annotations

import os
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..codegen.builder import single_function_module, tensor_var
from ..tune import cuda_calibration as cc
from ..tune.measure import compile_module
from .candidates import ResultRow
from .manifest import ModelEntry, TensorEntry

__all__ = ["CALIBRATION_PREFIX", "calibration_entries", "fit_from_results", "fit_launch",
           "stage_count"]

#: Name prefix of the calibration entries of a bundle.
CALIBRATION_PREFIX = "calib."


def calibration_entries(out: str, target, export: Callable[[object, str], None],
                        log: Callable[[str], None] = print
                        ) -> Tuple[List[ModelEntry], Dict[str, Tuple[str, float, float]]]:
    """Build the calibration workloads (TVM kernels only: the device has no vendor library)
    into ``out/candidates``; returns the entries and ``{entry: (kind, flops, bytes)}``."""
    entries, workloads = [], {}
    os.makedirs(os.path.join(out, "candidates"), exist_ok=True)
    for k, (kind, shapes, body, flops, moved) in enumerate(cc.workloads(())):
        name = f"{CALIBRATION_PREFIX}{kind}.{k}"
        mod = single_function_module([tensor_var(f"x{j}", s) for j, s in enumerate(shapes)],
                                     body)
        rel = f"candidates/{name}.so"
        try:
            export(compile_module(mod, target), os.path.join(out, rel))
        except Exception as err:  # pylint: disable=broad-except
            log(f"{name}: build failed: {type(err).__name__}: {str(err)[:160]}")
            continue
        entry = ModelEntry(name, 1e-3, 1e-3, reference_first=True)
        entry.inputs = [TensorEntry("", "float32", tuple(s)) for s in shapes]
        entry.systems.append(("tvm", rel))
        entries.append(entry)
        workloads[name] = (kind, float(flops), float(moved))
    return entries, workloads


def stage_count(label: str) -> int:
    """Stages of a derived alternative from its timing label (``signature|s1 -> s2 -> ...``;
    0 for the original, whose kernel count TVM decides)."""
    alt = label.rpartition("|")[2]
    return 0 if alt == "original" else alt.count(" -> ") + 1


#: Fewest derived candidates, and distinct stage counts among them, that :func:`fit_launch`
#: fits a launch cost from (one model's three units gave 748 us a kernel: its slowest programs
#: had the most stages).
MIN_LAUNCH_ROWS = 20
MIN_LAUNCH_COUNTS = 3


def fit_launch(rows: Sequence[ResultRow], candidates: Dict[str, dict]) -> float:
    """Seconds one more stage costs on the device when its work is negligible: the
    least-squares slope of the fastest derived candidate per stage count over stage counts
    (the fastest: the one whose stages do the least work, so the launches dominate), clipped
    at 0; 0 with fewer than :data:`MIN_LAUNCH_ROWS` derived candidates or
    :data:`MIN_LAUNCH_COUNTS` stage counts. ``candidates``: the bundle's listing of candidate
    entries."""
    fastest: Dict[int, float] = {}
    derived = 0
    for row in rows:
        entry = candidates.get(row.model)
        if entry is None or not row.ok or not row.seconds or row.system not in entry["systems"]:
            continue
        n = stage_count(entry["systems"][row.system])
        if n > 0:
            derived += 1
            fastest[n] = min(fastest.get(n, row.seconds), row.seconds)
    if derived < MIN_LAUNCH_ROWS or len(fastest) < MIN_LAUNCH_COUNTS:
        return 0.0
    counts = np.array(sorted(fastest), dtype=float)
    seconds = np.array([fastest[int(n)] for n in counts])
    slope = np.polyfit(counts, seconds, 1)[0]
    return float(max(0.0, slope))


def fit_from_results(rows: Sequence[ResultRow], bandwidth: Optional[float],
                     workloads: Dict[str, Sequence], device: str, peak_flops: float,
                     candidates: Optional[Dict[str, dict]] = None
                     ) -> Optional[cc.CudaCalibration]:
    """The calibration of ``device`` from the timed calibration rows (``workloads``: the
    bundle's ``calibration`` listing) and the launch cost from the candidates' rows
    (:func:`fit_launch`); None when no row ran or the run printed no bandwidth."""
    timings = [cc.KernelTiming(workloads[r.model][0], float(workloads[r.model][1]),
                               float(workloads[r.model][2]), r.seconds)
               for r in rows if r.model in workloads and r.ok and r.seconds]
    if not timings or not bandwidth:
        return None
    return cc.CudaCalibration(device, float(peak_flops), float(bandwidth),
                              cc.fit_efficiency(timings, peak_flops, bandwidth), tuple(timings),
                              fit_launch(rows, candidates or {}))
