"""The CUDA calibration: the roofline fit on fake timings, the JSON cache, and calibrate() on a
machine with and without a GPU (the device and the measurement replaced by fakes)."""

import importlib
import json
import math

import pytest

from tvm_ollie.transform.report import OptimizeReport
from tvm_ollie.tune import cuda_calibration as cc
from tvm_ollie.tune.cuda_calibration import KernelTiming, fit_efficiency

# (the package exports the function calibrate() under the module's name)
cal = importlib.import_module("tvm_ollie.tune.calibrate")
PEAK, BW = 50e12, 4e12


def _timing(kind, flops, moved, eff):
    """The time the cost model predicts for a kernel of efficiency ``eff``."""
    if kind == "eop":
        return KernelTiming(kind, flops, moved, max(flops / PEAK, moved / (BW * eff)))
    return KernelTiming(kind, flops, moved, max(flops / (PEAK * eff), moved / BW))


def test_fit_recovers_the_efficiencies_of_the_roofline():
    truth = {"matmul": 0.62, "conv2d": 0.07, "native_conv2d": 0.41, "eop": 0.55}
    # compute-bound kernels (many FLOPs per byte) and a memory-bound eOperator
    sizes = {k: (1e6, 1e9) if k == "eop" else (2e10, 1e7) for k in truth}
    timings = [_timing(k, sizes[k][0] * (i + 1), sizes[k][1] * (i + 1), e)
               for k, e in truth.items() for i in range(2)]
    fit = fit_efficiency(timings, PEAK, BW)
    assert fit.keys() == truth.keys()
    for kind, eff in truth.items():
        assert fit[kind] == pytest.approx(eff, rel=1e-9), kind


def test_fit_is_the_geometric_mean_and_drops_uninformative_samples():
    flops, moved = 1e12, 1e6
    timings = [KernelTiming("matmul", flops, moved, flops / (PEAK * 0.2)),
               KernelTiming("matmul", flops, moved, flops / (PEAK * 0.8)),
               # memory-bound: its time equals B / W, so it says nothing about the compute
               KernelTiming("batch_matmul", 1.0, 4e9, 4e9 / BW),
               KernelTiming("conv2d", flops, moved, 0.0),
               KernelTiming("conv2d", flops, moved, math.inf)]
    fit = fit_efficiency(timings, PEAK, BW)
    assert fit == {"matmul": pytest.approx(0.4)}


def test_fit_clips_to_the_valid_range():
    fast = KernelTiming("matmul", 1e12, 1.0, 1e12 / (PEAK * 3))  # faster than the roof
    slow = KernelTiming("conv2d", 1e6, 1.0, 1e6)
    fit = fit_efficiency([fast, slow], PEAK, BW)
    assert fit["matmul"] == 1.0 and fit["conv2d"] == cc.MIN_EFFICIENCY


def _fake_measure(calls, eff=0.3, peak=PEAK):
    """A measurement of compute-bound kernels at ``eff`` of ``peak`` (and an eOperator at
    ``eff`` of the bandwidth it reports, 3 TB/s)."""
    def measure(target, native_kinds):
        calls.append(tuple(native_kinds))
        kinds = ["matmul", "conv2d"] + list(native_kinds)
        timings = [KernelTiming(k, 1e11, 1e6, 1e11 / (peak * eff)) for k in kinds]
        timings.append(KernelTiming("eop", 1e3, 1e9, 1e9 / (3e12 * eff)))
        return timings, 3e12
    return measure


def test_calibration_is_cached_per_device_and_library_kernels(tmp_path, monkeypatch):
    monkeypatch.setenv("TVM_OLLIE_CACHE_DIR", str(tmp_path))
    calls = []
    first, path, cached = cc.calibrate_cuda("cuda", PEAK, "GPU X sm_90", "0.27",
                                            ["native_matmul"], _fake_measure(calls))
    assert not cached and path.parent == tmp_path and path.is_file()
    assert first.bandwidth == 3e12 and first.efficiency["native_matmul"] == pytest.approx(0.3)
    again, _, cached = cc.calibrate_cuda("cuda", PEAK, "GPU X sm_90", "0.27", ["native_matmul"],
                                         _fake_measure(calls))
    assert cached and again == first and len(calls) == 1
    # another set of library kernels (cuDNN installed since) is measured again
    _, _, cached = cc.calibrate_cuda("cuda", PEAK, "GPU X sm_90", "0.27",
                                     ["native_matmul", "native_conv2d"], _fake_measure(calls))
    assert not cached and len(calls) == 2
    # another device has its own file; a corrupt file is measured again
    other = cc.cache_path("GPU Y", "0.27")
    assert other != path
    other.write_text("{not json", encoding="utf-8")
    _, _, cached = cc.calibrate_cuda("cuda", PEAK, "GPU Y", "0.27", [], _fake_measure(calls))
    assert not cached and json.loads(other.read_text(encoding="utf-8"))["device"] == "GPU Y"


def test_nothing_timed_is_an_error_and_not_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("TVM_OLLIE_CACHE_DIR", str(tmp_path))
    with pytest.raises(RuntimeError, match="no calibration kernel"):
        cc.calibrate_cuda("cuda", PEAK, "GPU Z", "0.27", [], lambda t, k: ([], 1e12))
    assert not list(tmp_path.iterdir())


def test_measurement_keeps_the_kernels_that_ran():
    """A workload that fails to build or run is left out; every other is timed once."""
    seen = []

    def seconds(target, shapes, body, repeat):
        seen.append(shapes)
        if len(seen) == 2:
            raise RuntimeError("nvcc failed")
        return 1e-3

    native = ["native_matmul", "native_conv2d"]
    kinds = [kind for kind, *_ in cc.workloads(native)]
    timings, bandwidth = cc.measure_cuda("cuda", native, seconds_fn=seconds,
                                         bandwidth_fn=lambda target: 2e12)
    assert len(seen) == len(kinds) and len(timings) == len(kinds) - 1 and bandwidth == 2e12
    assert [t.kind for t in timings] == kinds[:1] + kinds[2:]
    assert {"matmul", "batch_matmul", "conv2d", "conv_transpose", "eop", "native_matmul",
            "native_conv2d"} == set(kinds)


def test_without_gpu_the_hand_set_table_is_uncalibrated(monkeypatch, tmp_path):
    monkeypatch.setattr(cal, "gpu_available", lambda t: False)
    monkeypatch.setattr(cc, "RECORDED_DIR", tmp_path)  # (no recorded device run)
    calib = cal.calibrate("cuda")
    assert calib.source == "default" and calib.efficiency == cal.EFFICIENCY["cuda"]
    assert "uncalibrated" in calib.describe() and "no CUDA device" in calib.describe()
    text = OptimizeReport(target="cuda", calibration=calib.describe()).to_text()
    assert "analytic cost: cuda uncalibrated" in text


def test_with_gpu_the_fit_replaces_the_table(tmp_path, monkeypatch):
    monkeypatch.setenv("TVM_OLLIE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(cal, "gpu_available", lambda t: True)
    monkeypatch.setattr(cal, "_device_label", lambda t: "Fake GPU sm_90")
    monkeypatch.setattr(cc, "native_kinds_here", lambda: ["native_matmul"])
    peak = cal.TARGET_DEFAULTS["cuda"][0]  # the roof the fit divides by
    monkeypatch.setattr(cc, "measure_cuda", _fake_measure([], eff=0.25, peak=peak))
    monkeypatch.setattr(cal, "_CUDA", {})
    calib = cal.calibrate("cuda")
    assert calib.source == "calibrated" and "Fake GPU sm_90" in calib.describe()
    assert calib.eff("conv2d") == pytest.approx(0.25)  # fitted, not the table's 0.05
    assert calib.eff("native_matmul") == pytest.approx(0.25)
    assert calib.eff("eop") == pytest.approx(0.25)
    assert calib.eff("native_conv2d") == cal.CUDA_LIBRARY_EFFICIENCY["native_conv2d"]
    assert calib.eff("conv_transpose") == cal.EFFICIENCY["cuda"]["conv_transpose"]
    assert calib.bandwidth == 3e12
    monkeypatch.setenv("TVM_OLLIE_CUDA_CALIBRATE", "0")
    assert cal.calibrate("cuda").source == "default"


def test_failed_calibration_falls_back_with_the_reason(tmp_path, monkeypatch):
    monkeypatch.setenv("TVM_OLLIE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(cal, "gpu_available", lambda t: True)
    monkeypatch.setattr(cal, "_device_label", lambda t: "Broken GPU")
    monkeypatch.setattr(cc, "native_kinds_here", lambda: [])
    monkeypatch.setattr(cc, "measure_cuda", lambda t, k: ([], 1e12))
    monkeypatch.setattr(cal, "_CUDA", {})
    calib = cal.calibrate("cuda")
    assert calib.source == "default" and "calibration failed" in calib.describe()
