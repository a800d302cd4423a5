"""An llvm bundle of a tiny model runs in a fresh process with nothing installed (issue 13.3).

The bundle is built once per module (TVM alone and the ollie pipeline, cheap options); the
runner then runs under ``env -i`` with only ``PATH``, from the bundle folder: no Python path,
no ``LD_LIBRARY_PATH``, so it can only use what the bundle carries.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import numpy as np
import pytest

from tvm_ollie.bundle import Case, build_bundle, read_manifest
from tvm_ollie.compat import relax
from tvm_ollie.codegen.builder import single_function_module, tensor_var
from tvm_ollie.tune.calibrate import EFFICIENCY, Calibration

#: Given roofline (no calibration measurements), short derivation: a cheap ollie build.
OLLIE = dict(calibration=Calibration("llvm", 1e11, 2e10, dict(EFFICIENCY["llvm"]), "given"),
             max_depth=2, search_time_s=2.0, library=False)


def tiny_case() -> Case:
    """``relu(conv2d(x: 1x8x6x6, w: 8x8x3x3, padding 1))``: reference from TVM's llvm build."""
    shapes = [(1, 8, 6, 6), (8, 8, 3, 3)]
    rng = np.random.default_rng(0)
    mod = single_function_module(
        [tensor_var(f"x{k}", s) for k, s in enumerate(shapes)],
        lambda bb, x, w: relax.op.nn.relu(relax.op.nn.conv2d(x, w, padding=1)))
    return Case("tiny", mod, [rng.standard_normal(s).astype("float32") for s in shapes])


def run_clean(bundle: str, *args: str) -> subprocess.CompletedProcess:
    """``run.sh`` in an empty environment (PATH only), from the bundle folder."""
    return subprocess.run(["/bin/sh", "run.sh", *args], cwd=bundle, capture_output=True,
                          text=True, env={"PATH": "/usr/bin:/bin"}, timeout=120, check=False)


@pytest.fixture(name="bundle", scope="module")
def _bundle(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("bundle") / "llvm")
    res = build_bundle(out, "llvm", cases=[tiny_case()], ollie_options=OLLIE)
    assert not res.failures
    return out


def test_llvm_bundle_runs_without_tvm(bundle):
    proc = run_clean(bundle, "--repeat", "3", "--warmup", "1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [line.split() for line in proc.stdout.splitlines() if line.startswith("tiny ")]
    assert [(r[1], r[-1]) for r in rows] == [("tvm", "ok"), ("ollie", "ok")]
    assert all(float(r[2]) > 0 for r in rows)
    assert "bundle run: all ok" in proc.stdout
    with open(os.path.join(bundle, "results.txt"), encoding="utf-8") as fh:
        assert fh.read() == proc.stdout


def test_bundle_contents(bundle):
    manifest = read_manifest(os.path.join(bundle, "manifest.txt"))
    assert manifest.device == "cpu" and manifest.preload == []
    (model,) = manifest.models
    assert [s for s, _ in model.systems] == ["tvm", "ollie"]
    assert [t.shape for t in model.inputs] == [(1, 8, 6, 6), (8, 8, 3, 3)]
    libs = set(os.listdir(os.path.join(bundle, "lib")))
    assert {"libtvm_ffi.so", "libtvm_runtime.so"} <= libs
    assert not any(name.startswith(("libc.so", "libm.so", "libtvm_compiler")) for name in libs)
    for name in ("runner", "runner.cc", "run.sh", "README.md"):
        assert os.path.isfile(os.path.join(bundle, name))


def test_wrong_reference_fails_the_run(bundle, tmp_path):
    copy = str(tmp_path / "copy")
    shutil.copytree(bundle, copy, symlinks=True)
    ref = os.path.join(copy, "data", "tiny", "out0.bin")
    values = np.fromfile(ref, dtype="float32")
    (values + 1.0).astype("float32").tofile(ref)
    proc = run_clean(copy, "--repeat", "1", "--warmup", "0")
    assert proc.returncode == 1
    assert proc.stdout.count("MISMATCH") == 2 and "bundle run: FAILED" in proc.stdout


def test_load_only_and_missing_library(bundle, tmp_path):
    proc = run_clean(bundle, "--load-only")
    assert proc.returncode == 0 and "bundle load: all ok" in proc.stdout
    copy = str(tmp_path / "copy")
    shutil.copytree(bundle, copy, symlinks=True)
    os.remove(os.path.join(copy, "models", "tiny.ollie.so"))
    proc = run_clean(copy, "--repeat", "1")
    assert proc.returncode == 1
    assert "tiny                   tvm" in proc.stdout and "FAILED" in proc.stdout
