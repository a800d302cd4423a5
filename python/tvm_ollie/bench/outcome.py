"""One system's outcome on one model: prepared (or why not), run once, checked against eager.

Shared by both benchmark modes: the interleaved mode calls these in its own process, the
isolated mode prepares and runs in a worker (:mod:`.isolated`) and checks the outputs it ships
back in the coordinator.
"""

from __future__ import annotations

import time
import traceback
from typing import Callable, List, Optional, Tuple

import numpy as np

from .check import as_numpy_list, compare_outputs
from .systems import SystemUnavailable, get_system

#: ``(result dict, run or None, outputs or None)``: what :func:`prepare_outcome` gives.
Outcome = Tuple[dict, Optional[Callable[[], object]], Optional[List[np.ndarray]]]


def prepare_outcome(name: str, spec, ctx, log: Callable[[str], None] = print) -> Outcome:
    """Prepare system ``name`` on ``spec`` and run it once.

    The result dict has ``status`` ``"skipped"`` (a package or device is missing), ``"error"``
    (preparing or the first run failed; ``reason`` says how) or ``"built"`` with the build
    times and the system's info. ``run`` and the first run's ``outputs`` (numpy) come only
    with ``"built"`` and a device to run on.
    """
    start = time.perf_counter()
    try:
        prepared = get_system(name).prepare(spec, ctx)
    except SystemUnavailable as err:
        return {"status": "skipped", "reason": str(err)}, None, None
    except Exception as err:  # pylint: disable=broad-except
        log(f"  {spec.name}/{name}: error\n{traceback.format_exc(limit=6)}")
        return {"status": "error", "reason": f"{type(err).__name__}: {err}"[:500]}, None, None
    result = {"status": "built", "prepare_s": time.perf_counter() - start,
              "compile_s": prepared.compile_s, **prepared.info}  # fmt: skip
    if prepared.tune_s is not None:
        result["tune_s"] = prepared.tune_s
    if prepared.run is None:
        return result, None, None
    try:
        outputs = as_numpy_list(prepared.run())
    except Exception as err:  # pylint: disable=broad-except
        result.update(status="error", reason=f"run failed: {type(err).__name__}: {err}"[:500])
        return result, None, None
    return result, prepared.run, outputs


def check_outcome(result: dict, outputs: List[np.ndarray], reference: List[np.ndarray]) -> bool:
    """Compare a built system's ``outputs`` with the ``reference`` and record the verdict in
    ``result`` (errors, ``status`` ``"ok"`` or ``"mismatch"``); True when they agree."""
    agreement = compare_outputs(outputs, reference)
    result["max_abs_err"], result["rel_err"] = agreement.max_abs_err, agreement.rel_err
    if not agreement.ok:
        result.update(status="mismatch", reason=agreement.reason)
        return False
    result["status"] = "ok"
    return True
