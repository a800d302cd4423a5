"""The native-library loader (tvm_ollie.native): loading, threads, info, failure reporting."""

import os
import subprocess
import sys

import pytest

from tvm_ollie import native


def _require():
    if not native.available():
        pytest.skip(f"native library unavailable: {native.unavailable_reason()}")


def test_load_is_idempotent_and_registers_globals():
    _require()
    import tvm_ffi

    assert native.load() is True
    assert native.load() is True
    assert native.unavailable_reason() == ""
    assert os.path.isfile(native.library_path())
    for name in (native.MATMUL, native.CONV2D, native.INFO, native.SET_NUM_THREADS,
                 native.GET_NUM_THREADS, native.CACHE_STATS, native.CONV2D_PACKED_SIZE,
                 native.CONV2D_PACK_WEIGHT):
        assert tvm_ffi.get_global_func(name, allow_missing=True) is not None, name


def test_threads_roundtrip():
    _require()
    before = native.get_num_threads()
    assert before >= 1
    try:
        native.set_num_threads(1)
        assert native.get_num_threads() == 1
        assert "threads: 1" in native.info()
    finally:
        native.set_num_threads(before)
    with pytest.raises(ValueError):
        native.set_num_threads(0)


def test_a_count_set_before_the_first_kernel_call_is_kept():
    """set_num_threads before any kernel has run is not replaced by the default (one
    TVM_NUM_THREADS or the affinity's) when the first call settles it."""
    _require()
    code = ("import tvm_ollie.native as n; n.set_num_threads(1); "
            "print('THREADS', n.get_num_threads())")
    res = _run(code, TVM_NUM_THREADS="2")
    assert res.returncode == 0, res.stderr
    assert "THREADS 1" in res.stdout


def test_conv2d_packed_size():
    _require()
    size = native.conv2d_packed_size("pad=1,1,1,1", (1, 16, 7, 7), (32, 16, 3, 3))
    assert size >= 16 + 32 * 16 * 3 * 3  # header + weights (blocked formats may pad)
    with pytest.raises(Exception, match="does not fit data"):
        native.conv2d_packed_size("", (1, 16, 7, 7), (32, 8, 3, 3))


def test_info_names_libraries_and_choices():
    _require()
    text = native.info()
    assert "onednn: 3.2" in text
    assert "OpenBLAS" in text
    assert "matmul default:" in text and "conv2d default:" in text


def _run(code, **env):
    full_env = dict(os.environ, **env)
    return subprocess.run([sys.executable, "-c", code], env=full_env, capture_output=True,
                          text=True, timeout=300, check=False)


def test_unavailable_library_is_reported_not_raised(tmp_path):
    """A broken library: `import tvm_ollie` still works, one warning, available() is False."""
    bogus = tmp_path / "libtvm_ollie_native.so"
    bogus.write_bytes(b"not an ELF file")
    code = ("import tvm_ollie, tvm_ollie.native as n; "
            "print('AVAILABLE', n.available()); print('REASON', n.unavailable_reason())")
    res = _run(code, TVM_OLLIE_NATIVE_LIB=str(bogus))
    assert res.returncode == 0, res.stderr
    assert "AVAILABLE False" in res.stdout
    assert str(bogus) in res.stdout
    assert res.stderr.count("tvm-ollie native library unavailable") == 1


def test_disabled_by_environment():
    # native.py and the loader alone (the package's __init__ not run, TVM not importable)
    code = ("import sys, types, importlib; "
            "sys.modules.update(tvm=None, tvm_ffi=None); "
            "p = types.ModuleType('p'); p.__path__ = [%r]; sys.modules['p'] = p; "
            "n = importlib.import_module('p.native'); "
            "print(n.available(), n.unavailable_reason())" % os.path.dirname(native.__file__))
    res = _run(code, TVM_OLLIE_DISABLE_NATIVE="1")
    assert res.returncode == 0, res.stderr
    assert "False disabled by TVM_OLLIE_DISABLE_NATIVE" in res.stdout
    assert "unavailable" not in res.stderr


def test_kernels_leave_the_callers_openmp_thread_count_alone():
    """The kernels run with the library's thread count and restore the calling thread's OpenMP
    count: PyTorch reads that count as its own (torch.compile asserts it unchanged while the
    backend builds and times kernels)."""
    _require()
    torch = pytest.importorskip("torch")
    import numpy as np
    import tvm_ffi

    before_torch, before_native = torch.get_num_threads(), native.get_num_threads()
    a = np.ones((64, 64), "float32")
    out = np.zeros((64, 64), "float32")
    try:
        torch.set_num_threads(2)
        native.set_num_threads(1)
        matmul = tvm_ffi.get_global_func(native.MATMUL)
        matmul("ta=0;tb=0", *[tvm_ffi.from_dlpack(x) for x in (a, a, out)])
        assert torch.get_num_threads() == 2
        assert out[0, 0] == 64.0
    finally:
        native.set_num_threads(before_native)
        torch.set_num_threads(before_torch)
