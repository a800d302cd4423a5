"""The single-thread threshold of the native kernels (``TVM_OLLIE_SERIAL_FLOPS``): a call below
it runs on the calling thread (its primitive is prepared, and cached, for one thread), one above
it with the library's thread count; the numbers are the same either way."""

import os
import subprocess
import sys

import numpy as np
import pytest

from native_util import call_direct, require_native
from tvm_ollie import native


@pytest.fixture(autouse=True)
def _serial_api():
    require_native()
    if not native.provides(native.SET_SERIAL_FLOPS):
        pytest.skip("the loaded native library has no serial threshold (built before it)")
    before, threads = native.get_serial_flops(), native.get_num_threads()
    yield
    native.set_serial_flops(before)
    native.set_num_threads(threads)


def _cache_size() -> int:
    import tvm_ffi

    stats = dict(kv.split("=") for kv in str(tvm_ffi.get_global_func(native.CACHE_STATS)())
                 .split(";"))  # fmt: skip
    return int(stats["size"])


CONV = "pad=1,1,1,1;bias=1;act=relu"
GEMM = ""


def _conv(rng, c):
    x = rng.standard_normal((1, c, 9, 9)).astype("float32")
    w = rng.standard_normal((c, c, 3, 3)).astype("float32")
    b = rng.standard_normal(c).astype("float32")
    return [x, w, b], (1, c, 9, 9)


def _deconv(rng, c):
    x = rng.standard_normal((1, c, 5, 5)).astype("float32")
    w = rng.standard_normal((c, c, 3, 3)).astype("float32")  # IOHW
    return [x, w], (1, c, 7, 7)


def _gemm(rng, n):
    return [rng.standard_normal((n, n)).astype("float32") for _ in range(2)], (n, n)


@pytest.mark.parametrize("kernel, attrs, case, size", [
    (native.CONV2D, CONV, _conv, 13),   # 2 * 13*81 * 13*9 = 0.25 MFLOP
    (native.MATMUL, GEMM, _gemm, 37),   # 2 * 37^3 = 0.1 MFLOP
    # 2 * 8*25 * 8*9 = 0.03 MFLOP; oneDNN (the default, fmt=gemm, makes no primitive)
    (native.CONV2D_TRANSPOSE, "fmt=plain", _deconv, 8),
])
def test_under_the_threshold_runs_single_threaded_with_equal_numbers(kernel, attrs, case, size):
    rng = np.random.default_rng(0)
    arrays, out_shape = case(rng, size)
    native.set_num_threads(2)
    native.set_serial_flops(0)  # never serial: prepared for 2 threads
    parallel = call_direct(kernel, attrs, arrays, out_shape)
    cached = _cache_size()
    call_direct(kernel, attrs, arrays, out_shape)
    assert _cache_size() == cached  # same thread count: the same cached primitive
    native.set_serial_flops(10**9)  # everything serial: prepared again, for one thread
    serial = call_direct(kernel, attrs, arrays, out_shape)
    assert _cache_size() == cached + 1
    np.testing.assert_allclose(serial, parallel, rtol=1e-5, atol=1e-5)
    native.set_serial_flops(1)  # above the threshold again: back to the 2-thread primitive
    call_direct(kernel, attrs, arrays, out_shape)
    assert _cache_size() == cached + 1


def test_setting_roundtrip_info_and_errors():
    native.set_serial_flops(12345)
    assert native.get_serial_flops() == 12345
    assert "single-threaded below 12345 flops" in native.info()
    with pytest.raises(ValueError):
        native.set_serial_flops(-1)


def _serial_flops_in_fresh_process(env_value):
    """What a fresh process that loads only tvm-ffi and the library reads (no TVM)."""
    code = ("import ctypes, sys, tvm_ffi\n"
            "for path in sys.argv[1:]: ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)\n"
            f"print(tvm_ffi.get_global_func({native.GET_SERIAL_FLOPS!r})())")
    env = dict(os.environ)
    env.pop("TVM_OLLIE_SERIAL_FLOPS", None)
    if env_value is not None:
        env["TVM_OLLIE_SERIAL_FLOPS"] = env_value
    res = subprocess.run([sys.executable, "-c", code, *native.library_files()], env=env,
                         capture_output=True, text=True, check=True)  # fmt: skip
    return int(res.stdout.split()[-1])


@pytest.mark.slow  # two fresh interpreters; tvm_ffi imports torch (several seconds each)
def test_default_and_environment_variable():
    assert _serial_flops_in_fresh_process(None) == native.DEFAULT_SERIAL_FLOPS
    assert _serial_flops_in_fresh_process("777") == 777
