"""The bundle's parts without building a model: size accounting, manifest, the CUDA blob
rewrite, the carried libraries."""

from __future__ import annotations

import os
import struct

import pytest

from tvm_ollie.bundle.build import _failure_line
from tvm_ollie.bundle.cuda_pack import CUDA_FORMAT, patch_blob, split_blob
from tvm_ollie.bundle.libraries import (NativeLibrary, dependency_closure,
                                        referenced_libraries, runtime_libraries)
from tvm_ollie.bundle.manifest import (Manifest, ModelEntry, TensorEntry, read_manifest,
                                       write_manifest)
from tvm_ollie.bundle.sizes import (MIB, BundleError, BundleSizeError, check_size, file_sizes,
                                    size_table)


def _write(path, nbytes):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as fh:
        fh.write(b"\0" * nbytes)


def test_sizes_are_listed_largest_first_and_the_limit_is_enforced(tmp_path):
    _write(str(tmp_path / "lib" / "big.so"), 3 * MIB)
    _write(str(tmp_path / "data" / "m" / "in0.bin"), MIB // 2)
    _write(str(tmp_path / "manifest.txt"), 10)
    sizes = file_sizes(str(tmp_path))
    assert sizes == [("lib/big.so", 3 * MIB), ("data/m/in0.bin", MIB // 2),
                     ("manifest.txt", 10)]
    assert check_size(str(tmp_path), 4 * MIB) == sizes
    with pytest.raises(BundleSizeError) as err:
        check_size(str(tmp_path), 3 * MIB)
    text = str(err.value)
    assert "over the 3.0 MiB limit" in text and "lib/big.so" in text
    assert "data/m/in0.bin" in text and "3.500 MiB  total (3 files" in text
    assert size_table(sizes).splitlines()[0].strip() == "3.000 MiB  lib/big.so"


def test_manifest_round_trip(tmp_path):
    model = ModelEntry("m", 1e-3, 2e-4, [TensorEntry("data/m/in0.bin", "float32", (1, 3)),
                                         TensorEntry("data/m/in1.bin", "int64", ())],
                       [TensorEntry("data/m/out0.bin", "float32", (3,))],
                       [("tvm", "models/m.tvm.so"), ("ollie", "models/m.ollie.so")])
    manifest = Manifest("cuda", 0, ["lib/libtvm_runtime_cuda.so"], [model])
    path = str(tmp_path / "manifest.txt")
    write_manifest(path, manifest)
    assert read_manifest(path) == manifest
    with open(path, encoding="utf-8") as fh:
        assert "input data/m/in1.bin int64 -\n" in fh.read()
    with pytest.raises(ValueError, match="white space"):
        write_manifest(path, Manifest("cpu", 0, ["lib/a b.so"]))


def _s(data: bytes) -> bytes:
    return struct.pack("<Q", len(data)) + data


def _cuda_payload(fmt: bytes, source: bytes) -> bytes:
    """A CUDA module's bytes: fmt, one FunctionInfo (2 args, 2 launch tags), data."""
    info = (_s(b"k0") + struct.pack("<Q", 2) + b"\x02\x20\x01\x00" * 2 + struct.pack("<Q", 2)
            + _s(b"blockIdx.x") + _s(b"threadIdx.x") + struct.pack("<Q", 2) + b"\0" * 8)
    return _s(fmt) + struct.pack("<Q", 1) + _s(b"k0") + info + _s(source)


def _blob(cuda_payload: bytes) -> bytes:
    tree = struct.pack("<Q", 3) + struct.pack("<3Q", 0, 1, 2) + struct.pack("<Q", 1) + \
        struct.pack("<Q", 1)
    body = tree + _s(b"relax.VMExecutable") + _s(b"exec") + _s(b"_lib") + _s(b"cuda") + \
        _s(cuda_payload)
    return struct.pack("<Q", len(body)) + body


def test_cuda_source_modules_are_replaced_by_compiled_binaries():
    blob = _blob(_cuda_payload(b"cuda", b"__global__ void k0() {}"))
    seen = []

    def compile_source(code):
        seen.append(code)
        return b"CUBIN"

    patched, count = patch_blob(blob, compile_source)
    assert count == 1 and seen == ["__global__ void k0() {}"]
    _, modules = split_blob(patched)
    assert [k for k, _ in modules] == [b"relax.VMExecutable", b"_lib", b"cuda"]
    assert modules[0][1] == b"exec" and modules[1][1] is None
    assert modules[2][1] == _cuda_payload(CUDA_FORMAT.encode(), b"CUBIN")
    assert patch_blob(patched, compile_source) == (patched, 0)  # already compiled: unchanged


def test_unknown_cuda_layouts_are_refused():
    with pytest.raises(BundleError, match="bytes after the data"):
        patch_blob(_blob(_cuda_payload(b"cuda", b"src") + b"??"), lambda code: b"")
    blob = _blob(_cuda_payload(b"cuda", b"src"))
    with pytest.raises(BundleError, match="size field"):
        patch_blob(blob + b"\0", lambda code: b"")


def test_carried_libraries_leave_the_c_library_and_driver_to_the_device():
    files = runtime_libraries("cpu")
    libs, missing = dependency_closure(files)
    assert {"libtvm_ffi.so", "libtvm_runtime.so"} <= set(libs) and missing == []
    assert not [n for n in libs if n.startswith(("libc.so", "libm.so", "ld-linux", "libcuda"))]


class _FakeExecutable:
    def __init__(self, text):
        self.text = text

    def stats(self):
        return self.text

    def as_text(self):
        return ""


def test_native_libraries_are_carried_only_when_called():
    cpu = NativeLibrary("tvm_ollie.cpu.", ("/x/libtvm_ollie_native.so",))
    cuda = NativeLibrary("tvm_ollie.cuda.", ("/x/libtvm_ollie_cuda.so",))
    ex = _FakeExecutable("Globals: vm.builtin.alloc_storage, tvm_ollie.cpu.conv2d")
    assert referenced_libraries(ex, [cpu, cuda]) == [cpu]
    assert referenced_libraries(_FakeExecutable("fused_conv2d"), [cpu, cuda]) == []


def test_a_failed_build_is_told_by_its_error_line():
    nvcc = RuntimeError("nvcc failed\nk.cu(3): error: too many resources requested\n"
                        "ptxas info    : Compile time = 68.8 ms")
    assert _failure_line(nvcc) == "RuntimeError: k.cu(3): error: too many resources requested"
    assert _failure_line(ValueError("first\nlast")) == "ValueError: last"
    assert _failure_line(KeyError()) == "KeyError"
