"""Heavier bundle checks (``pytest -m slow``): the whole zoo on llvm, and a CUDA bundle that
loads through TVM's CUDA runtime here, without a GPU, against a stub driver."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from tvm_ollie.bundle import build_bundle, case_names, read_manifest

from test_bundle_llvm import run_clean, tiny_case

pytestmark = pytest.mark.slow


def test_zoo_llvm_bundle_runs_without_tvm(tmp_path):
    """Every case (zoo quick sizes, W1, the transposed convolution), TVM alone and ollie on
    TVM kernels (the CPU native library and oneDNN would be over the size limit), checked
    against PyTorch on the CPU by the runner in an empty environment."""
    out = str(tmp_path / "zoo")
    res = build_bundle(out, "llvm", ollie_options={"library": False})
    assert not res.failures
    proc = run_clean(out, "--repeat", "3", "--warmup", "1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [line.split() for line in proc.stdout.splitlines()[1:-1]]
    assert len(rows) == 2 * len(case_names()) and all(r[-1] == "ok" for r in rows)


def _stub_driver(folder: str) -> str:
    """A ``libcuda.so.1`` defining every driver function ``libtvm_runtime_cuda.so`` imports,
    each failing: enough to load the CUDA runtime and deserialize CUDA modules."""
    from tvm_ollie.bundle.libraries import runtime_libraries

    cuda_rt = runtime_libraries("cuda")[-1]
    syms = subprocess.run(["nm", "-D", "--undefined-only", cuda_rt], capture_output=True,
                          text=True, check=True).stdout.split()
    names = sorted({s.split("@")[0] for s in syms if s.startswith("cu") and s[2:3].isupper()})
    src = os.path.join(folder, "stub.c")
    with open(src, "w", encoding="utf-8") as fh:
        fh.write("".join(f"int {n}(void) {{ return 999; }}\n" for n in names))
    lib = os.path.join(folder, "libcuda.so.1")
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", lib, "-Wl,-soname,libcuda.so.1", src],
                   check=True)
    return lib


@pytest.mark.skipif(not (shutil.which("nvcc") and shutil.which("gcc") and shutil.which("nm")),
                    reason="needs nvcc, gcc and nm")
def test_cuda_bundle_loads_without_a_compiler(tmp_path):
    """The CUDA executables hold cubins: TVM's CUDA runtime loads them with no
    ``tvm_callback_cuda_compile`` (which exists only in TVM's Python package)."""
    out = str(tmp_path / "cuda")
    res = build_bundle(out, "cuda", cases=[tiny_case()], systems=("tvm",))
    assert not res.failures
    manifest = read_manifest(os.path.join(out, "manifest.txt"))
    assert manifest.device == "cuda" and manifest.preload == ["lib/libtvm_runtime_cuda.so"]
    assert any(name.startswith("libcudart.so") for name in os.listdir(os.path.join(out, "lib")))
    stub = _stub_driver(str(tmp_path))
    proc = subprocess.run(["/bin/sh", "run.sh", "--load-only"], cwd=out, capture_output=True,
                          text=True, env={"PATH": "/usr/bin:/bin", "LD_PRELOAD": stub},
                          timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "tiny                   tvm      loaded" in proc.stdout
