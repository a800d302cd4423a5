"""One OpenMP runtime per process: the native kernels bind to the GNU OpenMP that PyTorch uses
when PyTorch is installed, to the system's when it is not, and a second runtime (a renamed copy)
is reported. Each case runs in a fresh interpreter, since a loaded OpenMP runtime cannot be
unloaded from the test process."""

import json
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")

#: ``argv[1]``: "default" (import tvm_ollie), "no-torch" (tvm_ollie with PyTorch hidden, then
#: PyTorch imported and run after it) or the path of an OpenMP copy to load before tvm_ollie.
_CHILD = r"""
import ctypes, json, logging, os, sys
mode = sys.argv[1]
warnings = []
class Keep(logging.Handler):
    def emit(self, record):
        warnings.append(record.getMessage())
logging.getLogger("tvm_ollie.native_openmp").addHandler(Keep())
if mode == "no-torch":
    sys.modules["torch"] = None  # import torch raises ImportError: a process without PyTorch
elif mode != "default":  # a second file after PyTorch's (a copy by path is not deduplicated)
    import torch
    ctypes.CDLL(mode, mode=os.RTLD_LOCAL)
import tvm_ollie.native as native
from tvm_ollie import native_openmp
assert native.load(), native.unavailable_reason()
report = {"before": native_openmp.openmp_libraries(),
          "native": native_openmp.symbol_file("GOMP_parallel", native.library_path()),
          "warnings": warnings}
if mode == "no-torch":
    del sys.modules["torch"]
import torch
torch.set_num_threads(2)
torch.ones(256, 256) @ torch.ones(256, 256)  # a parallel region of PyTorch's
torch_cpu = os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so")
report.update(after=native_openmp.openmp_libraries(), torch_dir=os.path.dirname(torch.__file__),
              torch=native_openmp.symbol_file("GOMP_parallel", torch_cpu))
print(json.dumps(report))
"""


def _child(mode: str, **env) -> dict:
    environ = {k: v for k, v in os.environ.items() if k != "TVM_OLLIE_OPENMP_CHECK"}
    environ.update(env)
    out = subprocess.run([sys.executable, "-c", _CHILD, mode], cwd=ROOT, env=environ,
                         capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(autouse=True)
def _needs_torch_and_native():
    pytest.importorskip("torch")
    from tvm_ollie import native  # pylint: disable=import-outside-toplevel

    if not native.available():
        pytest.skip(native.unavailable_reason())


@pytest.mark.slow  # a fresh interpreter importing TVM and PyTorch: ~10 s on the shared machine
def test_one_runtime_shared_with_torch():
    """``import tvm`` imports PyTorch (tvm-ffi does): the native kernels, oneDNN and PyTorch run
    on the one libgomp loaded first, so their regions share one worker team."""
    report = _child("default")
    assert len(report["before"]) == 1 and report["after"] == report["before"]
    assert report["native"] == report["torch"] == report["before"][0]
    assert report["warnings"] == []


@pytest.mark.slow
def test_process_without_torch_then_torch():
    """Without PyTorch the native kernels bind to the system's libgomp; PyTorch imported after
    them binds to that same file (one soname, one file), so still one runtime."""
    report = _child("no-torch")
    assert len(report["before"]) == 1
    assert not report["before"][0].startswith(os.path.realpath(report["torch_dir"]))
    assert report["native"] == report["before"][0]
    assert report["after"] == report["before"] and report["torch"] == report["native"]


@pytest.mark.slow
def test_second_runtime_is_reported(tmp_path):
    """A second copy loaded before the native library (as a wheel with its own libgomp-<hash>
    would bring) makes two runtimes: reported once, when the native library loads, with the
    one its kernels use; the switch silences it."""
    from tvm_ollie import native_openmp  # pylint: disable=import-outside-toplevel

    source = next(p for p in native_openmp.openmp_libraries() if "gomp" in p)
    copy = str(tmp_path / "libgomp-0123abcd.so.1")
    shutil.copy(source, copy)
    report = _child(copy)
    assert os.path.realpath(copy) in report["before"] and len(report["before"]) == 2
    assert report["native"] != os.path.realpath(copy)
    assert len(report["warnings"]) == 1 and "2 OpenMP runtimes" in report["warnings"][0]
    assert _child(copy, TVM_OLLIE_OPENMP_CHECK="0")["warnings"] == []


def test_openmp_libraries_in_this_process():
    """The test process imported tvm_ollie: its native kernels' GOMP_parallel comes from one
    of the mapped OpenMP files."""
    from tvm_ollie import native, native_openmp  # pylint: disable=import-outside-toplevel

    found = native_openmp.openmp_libraries()
    assert found and all(os.path.isabs(p) for p in found)
    assert native_openmp.symbol_file("GOMP_parallel", native.library_path()) in found
    assert native_openmp.symbol_file("no_such_symbol_anywhere", native.library_path()) is None
