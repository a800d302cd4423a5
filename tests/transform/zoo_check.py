"""Build a zoo model (quick size) with the ollie pipeline, every rewrite forced, and compare
its output with PyTorch eager."""

from __future__ import annotations

import time
from typing import Tuple

import numpy as np
import tvm
from tvm import relax

from tvm_ollie.models import get_model, to_relax
from tvm_ollie.pipeline import build
from tvm_ollie.tune.calibrate import EFFICIENCY, Calibration

#: fixed llvm roofline (no timing): decisions do not depend on the machine's load
CALIB = Calibration("llvm", 1e11, 2e10, dict(EFFICIENCY["cuda"]), "given")
#: relative tolerance against PyTorch (float32 through a whole network)
RTOL = 2e-3


def cheapest(sig, alts):
    """Chooser: the cheapest alternative to the original, whatever its margin (the decision
    core still verifies it): the pass rewrites every call it can."""
    return alts[0] if alts else None


def check_model(name: str, budget_s: float = 10.0) -> Tuple[int, int, float, dict]:
    """``(rewritten, decisions, relative error, report summary)`` (regions of several calls
    counted with the calls); raises on a mismatch or when the build fell back to the original
    module."""
    import torch  # pylint: disable=import-outside-toplevel

    spec = get_model(name, quick=True)
    with torch.no_grad():
        ref = spec.module(*spec.example_inputs).numpy().astype(np.float64)
    mod, params = to_relax(spec)
    t0 = time.perf_counter()
    ex, report = build(mod, "llvm", trials=0, max_depth=2, search_time_s=budget_s,
                       calibration=CALIB, check_untuned=False, chooser=cheapest)
    build_s = time.perf_counter() - t0
    units = list(report.regions) + list(report.decisions)
    fell_back = [d for d in units if "failed to build" in d.reason]
    assert not fell_back, f"{name}: the rewritten module failed to build: {fell_back[0].reason}"
    vm = relax.VirtualMachine(ex, tvm.cpu())
    args = [tvm.runtime.tensor(x.numpy()) for x in spec.example_inputs] + list(params)
    got = vm["main"](*args).numpy().astype(np.float64)
    assert got.shape == ref.shape, f"{name}: shape {got.shape} vs {ref.shape}"
    scale = max(float(np.max(np.abs(ref))), 1e-6)
    err = float(np.max(np.abs(got - ref))) / scale
    assert err <= RTOL, f"{name}: relative error {err:.3g} > {RTOL} ({report.to_text()})"
    rejected = [d.reason for d in units if "rejected" in d.reason]
    rewritten = len(report.rewritten) + sum(1 for r in report.regions if r.rewritten)
    return rewritten, len(units), err, {
        "build_s": round(build_s, 1), "rejected": rejected[:3]}
