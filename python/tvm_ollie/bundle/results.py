"""A device run's results brought back: the table, the candidates' records, the calibration.

``tvm-ollie bundle-results BUNDLE --work-dir D`` (or :func:`import_results`) reads the
``results.txt`` that ``run.sh`` wrote in a bundle folder (copied back from the device) with
the bundle's ``candidates.json``, writes each case's device timings under ``D`` (the
benchmark's layout, :func:`~.candidates.records_dir`) for a ``measured`` build, and fits the
CUDA calibration from the calibration rows (:mod:`.calibration`), written beside the records
(``D/cuda/calibration_<arch>.json``) or, asked to record it, as the package's calibration of
that architecture (``tune/recorded/``, used by every later build without a GPU).
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Dict, List, Optional

from ..derive.cost import TARGET_DEFAULTS
from ..tune import cuda_calibration as cc
from .calibration import fit_from_results
from .candidates import CANDIDATES_FILE, ResultRow, read_results, write_records

__all__ = ["ImportedResults", "import_results"]


@dataclasses.dataclass
class ImportedResults:
    """What :func:`import_results` read and wrote."""

    rows: List[ResultRow]
    records: Dict[str, int]
    calibration: Optional[cc.CudaCalibration]
    calibration_path: Optional[Path]
    mismatches: List[str]


def import_results(bundle: str, work_dir: str, device: str = "NVIDIA H200", arch: str = "sm_90",
                   calibration_path: Optional[str] = None, write_calibration: bool = True,
                   record: bool = False) -> ImportedResults:
    """Read ``bundle/results.txt`` and ``bundle/candidates.json`` (module docstring); the
    calibration goes to ``calibration_path``, else the package's recording of ``arch`` with
    ``record``, else the work dir."""
    with open(os.path.join(bundle, "results.txt"), encoding="utf-8") as fh:
        rows, bandwidth = read_results(fh.read())
    listing_path = os.path.join(bundle, CANDIDATES_FILE)
    listing = {"candidates": {}, "calibration": {}}
    if os.path.isfile(listing_path):
        with open(listing_path, encoding="utf-8") as fh:
            listing = json.load(fh)
    records = write_records(listing["candidates"], rows, work_dir, device)
    calib = fit_from_results(rows, bandwidth, listing["calibration"], device,
                             TARGET_DEFAULTS["cuda"][0], listing["candidates"])
    path = None
    if calib is not None and write_calibration:
        where = Path(calibration_path) if calibration_path else None
        if where is None and not record:
            where = Path(work_dir) / "cuda" / f"calibration_{arch}.json"
        path = cc.write_recorded(calib, arch, where)
    mismatches = [f"{r.model} {r.system}" for r in rows if not r.ok]
    return ImportedResults(rows, records, calib, path, mismatches)
