"""Candidate kernels timed on the device: what the pass weighs, measured where it runs.

On a CUDA target without a GPU here the pass decides each unit by its analytic estimate. A
bundle can carry, besides the whole models, every alternative the *measured* decision path would
time (the original on TVM, each shortlisted derived program: :class:`~tvm_ollie.transform.
decide.Decider` with a timer), each as its own small executable. The runner times them on the
device, with inputs it makes itself (nothing but the kernels is carried) and each checked
against the unit's original on the device (``reference first``). The timings come back as
records in the benchmark's work-dir layout, and a second build here decides with them
(:class:`DeviceTimer`): the measured decision path, without RPC, which the device cannot reach.

1. :func:`collect_candidates`: the ollie build of a case with a :class:`CollectingTimer`, which
   keeps each module the decisions ask to time, by its timing label (``signature|alternative``)
   and answers one equal time for all (so every decision keeps the original: this build is not
   used; only what it asked to time is).
2. :func:`candidate_entries`: per unit, one manifest entry ``<case>.u<k>`` whose systems
   ``a0, a1, ...`` are the alternatives (``a0`` the original), built with TVM's default pipeline
   for the target (what the untuned timing of the pass builds; on CPUs without the per-VM
   allocation cache, whose builtin is in the native library) and listed in
   ``candidates.json`` with their labels.
3. :func:`read_results` and :func:`write_records` (after the run): ``results.txt`` ->
   ``WORK_DIR/cuda/ollie/<case>/device_timings.json``: seconds per label (``null`` when the
   alternative failed or differed from the original on the device).
4. :class:`DeviceTimer`: the timer of the second build, reading those records; an alternative
   without a record is not chosen (None: failed).

Why labels and not module hashes: a label names the unit and the alternative as the decision
sees them, and the second build asks for the same labels when its derivations are the same
(the derivation cache of the first build makes them so: the bundle builds with it on).
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from .. import native_cuda
from ..codegen.cached_alloc import cached_alloc_scope
from ..compat import relax, tvm
from ..pipeline import build as ollie_build
from ..tune.calibrate import Calibration, calibrate
from ..tune.measure import compile_module
from .cases import Case
from .manifest import ModelEntry, TensorEntry

__all__ = ["CANDIDATES_FILE", "TIMINGS_FILE", "CandidateUnit", "CollectingTimer", "DeviceTimer",
           "ResultRow", "calibration_from_record", "calibration_record", "candidate_entries",
           "collect_candidates", "read_results", "records_dir", "write_records"]

#: The bundle's list of candidate entries: entry -> case, signature, label per system.
CANDIDATES_FILE = "candidates.json"
#: The records of one case's candidates, under :func:`records_dir`.
TIMINGS_FILE = "device_timings.json"
#: The time the collecting build answers for every module (any one value: all tie).
PLACEHOLDER_S = 1e-3


@dataclasses.dataclass
class CandidateUnit:
    """The alternatives of one unit that a measured decision times, the original first."""

    signature: str
    labels: List[str]
    modules: List["tvm.IRModule"]


class CollectingTimer:
    """A :data:`~tvm_ollie.transform.costing.Timer` that keeps every module it is asked to
    time (first module per label) and answers :data:`PLACEHOLDER_S` for all."""

    def __init__(self):
        self.modules: Dict[str, "tvm.IRModule"] = {}

    def __call__(self, module: "tvm.IRModule", label: str) -> float:
        self.modules.setdefault(label, module)
        return PLACEHOLDER_S

    def units(self) -> List[CandidateUnit]:
        """The modules grouped by unit signature (the label up to its last ``|``), in the
        order first asked, the original first in each."""
        units: Dict[str, CandidateUnit] = {}
        for label, mod in self.modules.items():
            sig = label.rpartition("|")[0]
            unit = units.setdefault(sig, CandidateUnit(sig, [], []))
            at = 0 if label.rpartition("|")[2] == "original" else len(unit.labels)
            unit.labels.insert(at, label)
            unit.modules.insert(at, mod)
        return list(units.values())


def collect_candidates(case: Case, target, ollie_options: Optional[dict] = None
                       ) -> Tuple[List[CandidateUnit], Calibration]:
    """The units of ``case`` that the measured decision path would time on ``target``, with
    their alternatives (module docstring, step 1), and the calibration that shortlisted them
    (the options', else :func:`~tvm_ollie.tune.calibrate.calibrate`'s): the measured build
    must shortlist with the same one to ask for the same labels."""
    options = dict(ollie_options or {})
    calib = options.pop("calibration", None) or calibrate(target)
    collector = CollectingTimer()
    ollie_build(case.mod, target=target, timer=collector, calibration=calib, **options)
    return collector.units(), calib


def calibration_record(calib: Calibration) -> dict:
    """``calib`` as JSON (:func:`calibration_from_record` reads it back)."""
    return {"kind": calib.kind, "peak_flops": calib.peak_flops, "bandwidth": calib.bandwidth,
            "efficiency": dict(calib.efficiency), "source": calib.source, "note": calib.note,
            "launch_s": calib.launch_s}


def calibration_from_record(data: dict) -> Calibration:
    """The :class:`~tvm_ollie.tune.calibrate.Calibration` of :func:`calibration_record`."""
    return Calibration(str(data["kind"]), float(data["peak_flops"]), float(data["bandwidth"]),
                       {str(k): float(v) for k, v in data["efficiency"].items()},
                       str(data.get("source", "given")), str(data.get("note", "")),
                       float(data.get("launch_s", 0.0)))


def _static_params(mod: "tvm.IRModule") -> Optional[List[Tuple[str, Tuple[int, ...]]]]:
    """``(dtype, shape)`` of ``main``'s parameters (None: a parameter is not a tensor of a
    static shape, which the runner cannot make)."""
    out = []
    for p in mod["main"].params:
        ty = p.ty
        if not isinstance(ty, relax.TensorType) or ty.shape is None:
            return None
        try:
            out.append((str(ty.dtype), tuple(int(d) for d in ty.shape)))
        except (TypeError, ValueError):
            return None
    return out


def candidate_entries(case: str, units: Sequence[CandidateUnit], out: str, target,
                      export: Callable[[object, str], None],
                      log: Callable[[str], None] = print,
                      calib: Optional[Calibration] = None) -> Tuple[List[ModelEntry], dict]:
    """Build and export the alternatives of ``units`` (module docstring, step 2) into
    ``out/candidates``; returns the manifest entries and their ``candidates.json`` part (with
    ``calib``, the calibration that shortlisted them, when given). A unit
    whose original fails to build, or whose inputs are not static tensors, is left out; an
    alternative that fails to build is left out of its unit."""
    entries, listing = [], {}
    os.makedirs(os.path.join(out, "candidates"), exist_ok=True)
    for k, unit in enumerate(units):
        params = _static_params(unit.modules[0])
        if params is None:
            log(f"{case}: unit {k} left out (inputs not static tensors)")
            continue
        name = f"{case}.u{k}"
        entry = ModelEntry(name, 1e-3, 1e-3, reference_first=True)
        entry.inputs = [TensorEntry("", dtype, shape) for dtype, shape in params]
        labels = {}
        for j, (label, mod) in enumerate(zip(unit.labels, unit.modules)):
            rel = f"candidates/{name}.a{j}.so"
            try:  # (no allocation cache: its builtin is in the native library, not carried)
                with cached_alloc_scope(False):
                    export(compile_module(mod, target), os.path.join(out, rel))
            except Exception as err:  # pylint: disable=broad-except
                log(f"{name} a{j}: build failed: {type(err).__name__}: {str(err)[:160]}")
                if j == 0:
                    break
                continue
            entry.systems.append((f"a{j}", rel))
            labels[f"a{j}"] = label
        if len(entry.systems) > 1 and entry.systems[0][0] == "a0":
            entries.append(entry)
            listing[name] = {"case": case, "signature": unit.signature, "systems": labels}
            if calib is not None:
                listing[name]["calibration"] = calibration_record(calib)
            if native_cuda.assumed():
                listing[name]["cuda_library"] = True
    return entries, listing


# -- after the run ---------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class ResultRow:
    """One row of the runner's table: seconds (None: failed) and whether it matched."""

    model: str
    system: str
    seconds: Optional[float]
    ok: bool


def read_results(text: str) -> Tuple[List[ResultRow], Optional[float]]:
    """The rows of a runner's ``results.txt`` and its copy bandwidth (bytes/s; None when the
    run printed none)."""
    rows, bandwidth = [], None
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[0] == "bandwidth":
            bandwidth = float(parts[1]) * 1e9
            continue
        if len(parts) < 7 or parts[0] == "model":
            continue
        try:
            median_ms = float(parts[2])
        except ValueError:
            median_ms = None
        ok = parts[6] == "ok"
        rows.append(ResultRow(parts[0], parts[1], median_ms * 1e-3 if median_ms is not None
                              else None, ok))
    return rows, bandwidth


def records_dir(work_dir: str, case: str) -> str:
    """Where the device records of ``case`` go: the benchmark's layout,
    ``WORK_DIR/cuda/ollie/<case>``."""
    return os.path.join(work_dir, "cuda", "ollie", case)


def write_records(listing: dict, rows: Iterable[ResultRow], work_dir: str,
                  device: str) -> Dict[str, int]:
    """Write each case's :data:`TIMINGS_FILE` from the rows of its candidate entries
    (``listing``: ``candidates.json``); a derived alternative that failed or differed from the
    original on the device is recorded as ``null``. Returns the records written per case."""
    by_case: Dict[str, Dict[str, Optional[float]]] = {}
    calibrations: Dict[str, Optional[dict]] = {}
    libraries: Dict[str, bool] = {}
    for row in rows:
        entry = listing.get(row.model)
        if entry is None or row.system not in entry["systems"]:
            continue
        label = entry["systems"][row.system]
        by_case.setdefault(entry["case"], {})[label] = row.seconds if row.ok else None
        calibrations[entry["case"]] = entry.get("calibration")
        libraries[entry["case"]] = bool(entry.get("cuda_library", False))
    for case, timings in by_case.items():
        folder = records_dir(work_dir, case)
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, TIMINGS_FILE), "w", encoding="utf-8") as fh:
            json.dump({"device": device, "calibration": calibrations[case],
                       "cuda_library": libraries[case], "timings": timings},
                      fh, indent=1, sort_keys=True)
    return {case: len(t) for case, t in by_case.items()}


class DeviceTimer:
    """The timer of a build that decides by device records (module docstring, step 4):
    ``(module, label) -> seconds`` from :data:`TIMINGS_FILE`; None for a label not timed there
    or recorded as failed. ``asked`` and ``missing`` say which labels were asked for;
    ``calibration`` is the one the candidates were shortlisted with (None: not recorded) and
    ``cuda_library`` whether the CUDA library's kernels were among them (assumed to run:
    :func:`tvm_ollie.native_cuda.assumed`)."""

    def __init__(self, timings: Dict[str, Optional[float]], device: str = "",
                 calibration: Optional[Calibration] = None, cuda_library: bool = False):
        self.timings = dict(timings)
        self.device = device
        self.calibration = calibration
        self.cuda_library = cuda_library
        self.asked: List[str] = []
        self.missing: List[str] = []

    @classmethod
    def load(cls, work_dir: str, case: str) -> Optional["DeviceTimer"]:
        """The records of ``case`` under ``work_dir`` (None: none there)."""
        path = os.path.join(records_dir(work_dir, case), TIMINGS_FILE)
        if not os.path.isfile(path):
            return None
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
        calib = data.get("calibration")
        return cls(data.get("timings", {}), str(data.get("device", "")),
                   calibration_from_record(calib) if calib else None,
                   bool(data.get("cuda_library", False)))

    def __call__(self, module: "tvm.IRModule", label: str) -> Optional[float]:  # noqa: ARG002
        self.asked.append(label)
        if label not in self.timings:
            self.missing.append(label)
            return None
        return self.timings[label]
