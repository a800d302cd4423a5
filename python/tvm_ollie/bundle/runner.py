"""The bundle's runner program and scripts: ``runner`` (C++, ``runner.cc`` beside this file),
``run.sh`` and ``README.md``.

The runner is compiled here with the C++ compiler against tvm-ffi's headers and linked to the
bundle's ``lib/libtvm_ffi.so`` and ``lib/libtvm_runtime.so`` with ``RPATH=$ORIGIN/lib``
(``DT_RPATH``, which also serves the dependencies of libraries loaded later), so it runs from
the bundle folder with ``LD_LIBRARY_PATH`` unset and nothing installed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from typing import List, Sequence, Tuple

import tvm_ffi.libinfo

from .sizes import MIB, BundleError, size_table

__all__ = ["RUNNER_SOURCE", "compile_runner", "write_readme", "write_run_script"]

#: The runner's C++ source (package data).
RUNNER_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "runner.cc")


def compile_runner(bundle: str, cxx: str = "") -> str:
    """Compile the runner into ``bundle/runner`` (C++17, ``-O2``, stripped) against
    ``bundle/lib``; the source goes beside it as ``runner.cc`` (rebuild line in the README).
    Returns its path."""
    cxx = cxx or os.environ.get("CXX", "") or shutil.which("g++") or shutil.which("c++") or ""
    if not cxx:
        raise BundleError("no C++ compiler (g++ or $CXX) to build the bundle's runner")
    out = os.path.join(bundle, "runner")
    shutil.copyfile(RUNNER_SOURCE, os.path.join(bundle, "runner.cc"))
    cmd = [cxx, "-std=c++17", "-O2", "-s", "-I", tvm_ffi.libinfo.find_include_path(),
           "-I", tvm_ffi.libinfo.find_dlpack_include_path(), RUNNER_SOURCE, "-o", out,
           "-L", os.path.join(bundle, "lib"), "-Wl,--no-as-needed", "-ltvm_ffi",
           "-ltvm_runtime", "-ldl", "-Wl,--disable-new-dtags,-rpath,$ORIGIN/lib"]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise BundleError(f"compiling the runner failed:\n{' '.join(cmd)}\n{proc.stderr[-2000:]}")
    return out


RUN_SH = """#!/bin/sh
# Runs every model of this bundle on {device} with the TVM runtime alone and prints the
# latency table (also written to results.txt). Arguments go to the runner:
#   --repeat N  --warmup N  --model NAME  --load-only
# Where python3 has PyTorch with CUDA, the same models on PyTorch follow in the table
# (torch_device.py; TORCH_COMPILE=1 adds torch.compile, TORCH=0 skips PyTorch). The runner
# finds what the bundle carries first (RPATH); cuBLAS/cuDNN, when a model calls them, come
# from the device: LD_LIBRARY_PATH, TVM_OLLIE_CUBLAS_LIB / TVM_OLLIE_CUDNN_LIB, else NVIDIA's
# Python wheels (python3's nvidia/*/lib, as PyTorch installs them).
cd "$(dirname "$0")" || exit 2
if grep -q libtvm_ollie_cuda manifest.txt && [ -z "$TVM_OLLIE_CUBLAS_LIB" ]; then
  # the CUDA library's kernels call cuBLAS/cuDNN: the device's own (NVIDIA's wheels, e.g.
  # PyTorch's) when the loader does not find them already
  vendor=$(python3 - 2>/dev/null <<'PY'
import os, nvidia
libs = [os.path.join(p, d, "lib") for p in nvidia.__path__ for d in sorted(os.listdir(p))]
print(":".join(lib for lib in libs if os.path.isdir(lib)))
PY
)
  [ -n "$vendor" ] && export LD_LIBRARY_PATH="$vendor${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}"
fi
./runner . "$@" > results.txt 2>&1
status=$?
if [ "${{TORCH:-1}}" != 0 ] && [ -f torch_device.py ] && [ -z "$*" ] && \\
    python3 -c "import torch, sys; sys.exit(not torch.cuda.is_available())" 2>/dev/null; then
  if [ "${{TORCH_COMPILE:-0}}" = 1 ]; then extra=--compile; else extra=; fi
  python3 torch_device.py $extra >> results.txt 2>&1 || status=1
fi
cat results.txt
exit $status
"""


def write_run_script(bundle: str, device: str) -> str:
    """``bundle/run.sh``: the one command to run on the device (exit status: the runner's,
    1 as well when PyTorch ran and a model failed there)."""
    path = os.path.join(bundle, "run.sh")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(RUN_SH.format(device=device))
    os.chmod(path, 0o755)
    return path


def write_readme(bundle: str, target: str, models: Sequence[Tuple[str, List[str]]],
                 sizes: Sequence[Tuple[str, int]], limit: int, notes: Sequence[str]) -> str:
    """``bundle/README.md``: what is inside, how to run it, the sizes."""
    lines = [
        f"# tvm-ollie device bundle ({target})",
        "",
        "Compiled models from TVM alone (`tvm`) and from the tvm-ollie pipeline (`ollie`), with",
        "their inputs and CPU reference outputs, and a runner that needs only the TVM runtime",
        "libraries carried in `lib/` (no Python, no TVM install, no compiler).",
        "",
        "## Run",
        "",
        "```sh",
        "sh run.sh                 # every model; table on stdout and in results.txt",
        "sh run.sh --repeat 50     # more timed calls (default: 3 warm-up, 20 timed)",
        "sh run.sh --model NAME    # one model",
        "sh run.sh --load-only     # load every library without using the device",
        "```",
        "",
        "Columns: median and fastest milliseconds of one call of `main` (synchronized), the",
        "largest absolute error against the reference, that error relative to the reference's",
        "largest magnitude, and `ok` when `|out - ref| <= atol * max|ref| + rtol * |ref|`",
        "everywhere. Exit status 0 when every executable loaded, ran and matched.",
        "",
        "Needs on the device: Linux x86-64 with glibc at least as new as the build machine's,",
        "and for CUDA the NVIDIA driver (`libcuda.so.1`) new enough for the carried CUDA",
        "runtime (`lib/libcudart.so.*`). CUDA kernels are compiled cubins for the target's",
        "architecture (no compilation at load time).",
        "",
        "Rebuild the runner (a C++17 compiler and tvm-ffi's headers):",
        "`g++ -std=c++17 -O2 -I TVM_FFI_INCLUDE runner.cc -o runner -L lib -Wl,--no-as-needed "
        "-ltvm_ffi -ltvm_runtime -ldl -Wl,--disable-new-dtags,-rpath,'$ORIGIN/lib'`",
        "",
        "## Models",
        "",
    ]
    lines += [f"* `{name}`: {', '.join(systems)}" for name, systems in models]
    if notes:
        lines += ["", "## Notes", ""] + [f"* {n}" for n in notes]
    lines += ["", f"## Files ({sum(s for _, s in sizes) / MIB:.1f} MiB)", "", "```",
              size_table(list(sizes), limit), "```", ""]
    path = os.path.join(bundle, "README.md")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write("\n".join(lines))
    return path
