"""Candidate kernels timed by the bundle's runner and read back (issue 26, item 2).

An llvm bundle of a tiny transposed convolution carries the alternatives the pass weighs for
it; the runner times them with inputs it makes and checks each against the original;
``import_results`` turns the table into records; a ``measured`` build decides by them. The
parts are tested alone too: the results parser, the records, the device timer, the grouping of
the collected modules, the calibration fit and the recorded calibration's use, and the
PyTorch script's manifest reader and check.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import shutil

import numpy as np
import pytest

from test_bundle_llvm import OLLIE, run_clean
from tvm_ollie.bundle import Case, build_bundle, read_manifest
from tvm_ollie.bundle import build as bundle_build
from tvm_ollie.bundle.calibration import (MIN_LAUNCH_ROWS, fit_from_results, fit_launch,
                                          stage_count)
from tvm_ollie.bundle.candidates import (CANDIDATES_FILE, TIMINGS_FILE, CollectingTimer,
                                         DeviceTimer, ResultRow, read_results, records_dir,
                                         write_records)
from tvm_ollie.bundle.manifest import (Manifest, ModelEntry, TensorEntry, read_manifest as
                                       read_manifest_file, write_manifest)
from tvm_ollie.bundle.results import import_results
from tvm_ollie.codegen.builder import single_function_module, tensor_var
from tvm_ollie.compat import relax
from tvm_ollie.tune import cuda_calibration as cc

calibrate_module = importlib.import_module("tvm_ollie.tune.calibrate")


def tiny_transpose_case() -> Case:
    """``relu(conv2d_transpose(x: 2x16x4x4, k: 16x8x4x4, stride 2, padding 1))``: its
    derivations remove the zero-stuffed work, so the pass times some of them."""
    shapes = [(2, 16, 4, 4), (16, 8, 4, 4)]
    rng = np.random.default_rng(0)
    mod = single_function_module(
        [tensor_var(f"x{k}", s) for k, s in enumerate(shapes)],
        lambda bb, x, k: relax.op.nn.relu(relax.op.nn.conv2d_transpose(x, k, strides=2,
                                                                       padding=1)))
    return Case("tinyt", mod, [rng.standard_normal(s).astype("float32") for s in shapes])


@pytest.fixture(name="bundle", scope="module")
def _bundle(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("cand") / "llvm")
    res = build_bundle(out, "llvm", cases=[tiny_transpose_case()], systems=("tvm",),
                       ollie_options=OLLIE, candidates=True)
    assert not res.failures
    return out


def _rows(stdout: str, model: str):
    return [line.split() for line in stdout.splitlines() if line.startswith(model + " ")]


def test_candidates_run_checked_against_the_original(bundle, tmp_path):
    manifest = read_manifest(os.path.join(bundle, "manifest.txt"))
    unit = next(m for m in manifest.models if m.name == "tinyt.u0")
    assert unit.reference_first and all(not t.file for t in unit.inputs)
    assert [t.shape for t in unit.inputs] == [(2, 16, 4, 4), (16, 8, 4, 4)]
    systems = [s for s, _ in unit.systems]
    assert systems[0] == "a0" and len(systems) >= 2
    with open(os.path.join(bundle, CANDIDATES_FILE), encoding="utf-8") as fh:
        listing = json.load(fh)
    labels = listing["candidates"]["tinyt.u0"]["systems"]
    assert labels["a0"].endswith("|original") and set(labels) == set(systems)
    # (the calibration that shortlisted them, for the measured build to shortlist alike)
    assert listing["candidates"]["tinyt.u0"]["calibration"]["peak_flops"] == \
        OLLIE["calibration"].peak_flops
    assert listing["calibration"] == {}  # (only CUDA bundles carry the calibration kernels)
    assert not os.path.exists(os.path.join(bundle, "data", "tinyt.u0"))  # nothing carried

    proc = run_clean(bundle, "--repeat", "3", "--warmup", "1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = _rows(proc.stdout, "tinyt.u0")
    assert [r[1] for r in rows] == systems and all(r[-1] == "ok" for r in rows)
    assert float(rows[0][4]) == 0.0  # (the original is its own reference)

    work = str(tmp_path / "work")
    res = import_results(bundle, work, device="cpu", write_calibration=False)
    assert res.records == {"tinyt": len(systems)} and res.calibration is None
    timer = DeviceTimer.load(work, "tinyt")
    assert set(timer.timings) == set(labels.values())
    assert all(s is not None and s > 0 for s in timer.timings.values())
    assert timer.calibration == OLLIE["calibration"] and not timer.cuda_library

    out = str(tmp_path / "measured")
    options = {k: v for k, v in OLLIE.items() if k != "calibration"}  # (from the records)
    built = build_bundle(out, "llvm", cases=[tiny_transpose_case()], systems=("measured",),
                         work_dir=work, ollie_options=options)
    assert not built.failures
    with open(out + ".reports/tinyt.measured.txt", encoding="utf-8") as fh:
        report = fh.read()
    assert "timed decisions" in report  # (decided by the device timings)
    proc = run_clean(out, "--repeat", "1", "--warmup", "0")
    assert proc.returncode == 0, proc.stdout
    assert [(r[1], r[-1]) for r in _rows(proc.stdout, "tinyt")] == [("measured", "ok")]


def test_a_candidate_that_differs_is_a_mismatch_and_recorded_failed(bundle, tmp_path):
    copy = str(tmp_path / "copy")
    shutil.copytree(bundle, copy, symlinks=True)
    path = os.path.join(copy, "manifest.txt")
    manifest = read_manifest_file(path)
    unit = next(m for m in manifest.models if m.name == "tinyt.u0")
    # the whole model (relu of the unit) in place of the unit's a1: other outputs
    unit.systems[1] = ("a1", "models/tinyt.tvm.so")
    write_manifest(path, manifest)
    proc = run_clean(copy, "--repeat", "1", "--warmup", "0")
    assert proc.returncode == 1
    row = next(r for r in _rows(proc.stdout, "tinyt.u0") if r[1] == "a1")
    assert row[6] == "MISMATCH:"
    res = import_results(copy, str(tmp_path / "w"), device="cpu", write_calibration=False)
    timer = DeviceTimer.load(str(tmp_path / "w"), "tinyt")
    with open(os.path.join(copy, CANDIDATES_FILE), encoding="utf-8") as fh:
        label = json.load(fh)["candidates"]["tinyt.u0"]["systems"]["a1"]
    assert timer.timings[label] is None and "tinyt.u0 a1" in res.mismatches


def test_measured_without_records_is_not_built(tmp_path):
    res = build_bundle(str(tmp_path / "b"), "llvm", cases=[tiny_transpose_case()],
                       systems=("measured",), work_dir=str(tmp_path / "empty"),
                       ollie_options=OLLIE)
    assert [(c, s) for c, s, _ in res.failures] == [("tinyt", "measured")]
    assert "no device timings" in res.failures[0][2]


def test_read_results_rows_and_bandwidth():
    text = "\n".join([
        "model                  system    median_ms     min_ms    max_abs    rel_err  status",
        "m.u0                   a0           0.5000     0.4000          0          0  ok",
        "m.u0                   a1                -          -          -          -  FAILED: x",
        "m.u0                   a2           0.2500     0.2000        1.0        0.5  MISMATCH: "
        "output 0 differs",
        "m                      torch.compile   1.0000  0.9000  0  0  ok (first call 3.0 s)",
        "bandwidth 4321.5 GB/s",
        "bundle run: FAILED"])
    rows, bandwidth = read_results(text)
    assert rows == [ResultRow("m.u0", "a0", 0.5e-3, True), ResultRow("m.u0", "a1", None, False),
                    ResultRow("m.u0", "a2", 0.25e-3, False),
                    ResultRow("m", "torch.compile", 1e-3, True)]
    assert bandwidth == pytest.approx(4321.5e9)


def test_records_and_device_timer(tmp_path):
    listing = {"m.u0": {"case": "m", "signature": "s",
                        "systems": {"a0": "s|original", "a1": "s|alt", "a2": "s|bad"}}}
    rows = [ResultRow("m.u0", "a0", 2e-3, True), ResultRow("m.u0", "a1", 1e-3, True),
            ResultRow("m.u0", "a2", 5e-4, False), ResultRow("other", "a0", 1.0, True)]
    assert write_records(listing, rows, str(tmp_path), "dev") == {"m": 3}
    with open(os.path.join(records_dir(str(tmp_path), "m"), TIMINGS_FILE),
              encoding="utf-8") as fh:
        data = json.load(fh)
    assert data == {"device": "dev", "calibration": None, "cuda_library": False,
                    "timings": {"s|original": 2e-3, "s|alt": 1e-3, "s|bad": None}}
    timer = DeviceTimer.load(str(tmp_path), "m")
    assert timer.device == "dev"
    assert timer(None, "s|alt") == 1e-3 and timer(None, "s|bad") is None
    assert timer(None, "s|unknown") is None
    assert timer.asked == ["s|alt", "s|bad", "s|unknown"] and timer.missing == ["s|unknown"]
    assert DeviceTimer.load(str(tmp_path), "absent") is None


def test_collecting_timer_groups_units_original_first():
    timer = CollectingTimer()
    mods = {label: object() for label in ("u|x -> y", "u|original", "v|original", "u|x")}
    for label, mod in mods.items():
        assert timer(mod, label) == timer(mods["u|original"], label)
    assert timer(object(), "u|x") > 0  # (a second ask keeps the first module)
    units = timer.units()
    assert [(u.signature, u.labels) for u in units] == [
        ("u", ["u|original", "u|x -> y", "u|x"]), ("v", ["v|original"])]
    assert units[0].modules == [mods["u|original"], mods["u|x -> y"], mods["u|x"]]


def test_manifest_round_trip_with_made_inputs(tmp_path):
    unit = ModelEntry("m.u0", 1e-3, 1e-3, [TensorEntry("", "float32", (2, 3))], [],
                      [("a0", "candidates/m.u0.a0.so")], reference_first=True)
    manifest = Manifest("cuda", 0, [], [unit])
    path = str(tmp_path / "manifest.txt")
    write_manifest(path, manifest)
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    assert "random float32 2,3\nreference first\n" in text
    assert read_manifest_file(path) == manifest


def test_calibration_fit_from_rows():
    peak, bw = 60e12, 4e12
    workloads = {"calib.matmul.0": ("matmul", 2e9, 12e6), "calib.eop.1": ("eop", 1e6, 48e6)}
    rows = [ResultRow("calib.matmul.0", "tvm", 1e-4, True),
            ResultRow("calib.eop.1", "tvm", 24e-6, True),
            ResultRow("m.u0", "a0", 1.0, True)]
    calib = fit_from_results(rows, bw, workloads, "GPU", peak)
    assert calib.efficiency == pytest.approx({"matmul": 2e9 / (peak * 1e-4),
                                              "eop": 48e6 / (bw * 24e-6)})
    assert [t.kind for t in calib.timings] == ["matmul", "eop"]
    assert fit_from_results(rows, None, workloads, "GPU", peak) is None


def test_launch_cost_is_the_slope_of_the_fastest_per_stage_count():
    stages = ["a", "a -> b", "a -> b -> c"]
    listing = {f"m.u{k}": {"case": "m", "systems": {"a0": f"s{k}|original",
                                                    "a1": f"s{k}|{stages[k % 3]}"}}
               for k in range(MIN_LAUNCH_ROWS)}
    assert [stage_count(listing[f"m.u{k}"]["systems"]["a1"]) for k in range(4)] == [1, 2, 3, 1]
    # the fastest per stage count: 10, 15, 20 us at 1, 2, 3 stages; the others slower
    rows = [ResultRow(f"m.u{k}", "a1", (5 + 5 * (k % 3 + 1) + k) * 1e-6 if k >= 3 else
                      (5 + 5 * (k % 3 + 1)) * 1e-6, True) for k in range(MIN_LAUNCH_ROWS)]
    rows += [ResultRow("m.u0", "a0", 1.0, True), ResultRow("m.u1", "a1", 1e-6, False)]
    assert fit_launch(rows, listing) == pytest.approx(5e-6)
    assert fit_launch(rows[:MIN_LAUNCH_ROWS - 1], listing) == 0.0  # (too few to fit)
    two_counts = {k: v for k, v in listing.items() if stage_count(v["systems"]["a1"]) < 3}
    assert fit_launch(rows, two_counts) == 0.0
    falling = [ResultRow(r.model, r.system, 40e-6 - r.seconds, r.ok) for r in rows[:-2]]
    assert fit_launch(falling, listing) == 0.0  # (clipped at 0)


def test_recorded_calibration_is_used_without_a_gpu(tmp_path, monkeypatch):
    monkeypatch.setattr(cc, "RECORDED_DIR", tmp_path)
    monkeypatch.setattr(calibrate_module, "gpu_available", lambda target: False)
    cuda = {"kind": "cuda", "arch": "sm_90"}
    assert calibrate_module.calibrate(cuda).source == "default"
    recorded = cc.CudaCalibration("NVIDIA H200", 60e12, 4.2e12, {"conv2d": 0.2, "eop": 0.7})
    path = cc.write_recorded(recorded, "sm_90")
    assert path == tmp_path / "cuda_sm_90.json" and cc.read_recorded("sm_90") == recorded
    calib = calibrate_module.calibrate(cuda)
    assert calib.source == "recorded" and calib.bandwidth == 4.2e12
    assert calib.efficiency["conv2d"] == 0.2 and calib.efficiency["eop"] == 0.7
    assert calib.efficiency["matmul"] == calibrate_module.EFFICIENCY["cuda"]["matmul"]
    assert "NVIDIA H200" in calib.describe()
    assert calibrate_module.calibrate({"kind": "cuda", "arch": "sm_80"}).source == "default"


def _torch_script():
    path = os.path.join(os.path.dirname(bundle_build.__file__), "torch_device.py")
    spec = importlib.util.spec_from_file_location("torch_device", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_torch_script_reads_the_manifest_and_checks(bundle):
    script = _torch_script()
    models = script.read_manifest(os.path.join(bundle, "manifest.txt"))
    assert [m[0] for m in models][:2] == ["tinyt", "tinyt.u0"]
    name, rtol, atol, inputs, outputs = models[0]
    assert (rtol, atol) == (1e-3, 1e-3) and len(inputs) == 2 and len(outputs) == 1
    assert models[1][4] == []  # (a candidate entry: no reference, skipped by the script)
    script.HERE = bundle
    ref = script.load(outputs[0])
    torch = pytest.importorskip("torch")
    assert script.check([torch.from_numpy(ref)], outputs, rtol, atol)[:2] == (True, 0.0)
    ok, max_abs, _ = script.check([torch.from_numpy(ref + 1.0)], outputs, rtol, atol)
    assert not ok and max_abs == pytest.approx(1.0)
    assert not os.path.exists(os.path.join(bundle, "torch_device.py"))  # (no zoo model)
