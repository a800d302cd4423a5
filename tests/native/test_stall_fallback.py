"""The stall fallback (``tvm_ollie/stall.cc``): a parallel call far slower than its call
site's fastest run waited for a descheduled worker; parallel calls then run on the calling
thread for a window (native kernels and TVM's parallel loops alike), with the same numbers."""

import os
import subprocess
import sys

import numpy as np
import pytest
import tvm_ffi

from native_util import call_direct, require_native, two_threads_stall_on
from parallel_modules import N, Scaled
from tvm_ollie import native
from tvm_ollie.compat import relax, tvm

CONV = "pad=1,1,1,1;bias=1;act=relu"
NO_BEST = 2**63 - 1


@pytest.fixture(autouse=True)
def _stall_api():
    require_native()
    if not native.provides(native.STALL_STATS):
        pytest.skip("the loaded native library has no stall fallback (built before it)")
    with two_threads_stall_on():  # every call parallel unless the fallback says otherwise
        yield


def _is_stall(elapsed_us: int, best_us: int) -> bool:
    best_ns = best_us if best_us == NO_BEST else best_us * 1000
    return bool(tvm_ffi.get_global_func(native.IS_STALL)(elapsed_us * 1000, best_ns))


def test_stall_rule():
    assert not _is_stall(10**6, NO_BEST)  # no fastest run known yet
    assert not _is_stall(10**6, 0)
    assert not _is_stall(300, 10)  # 30x, but 0.29 ms above: an interrupt, a page fault
    assert _is_stall(600, 10)
    assert not _is_stall(3900, 1000)  # 3.9x of a 1 ms call
    assert _is_stall(4100, 1000)


def test_stall_rule_for_work():
    """A call of known work slower than 0.5 GFLOP/s (plus 0.5 ms) is a stall even when its
    site's fastest run is no faster (every run of the site stalled so far), or none is known."""
    if not native.provides(native.IS_STALL_FOR_WORK):
        pytest.skip("the loaded native library predates is_stall_for_work")
    rule = tvm_ffi.get_global_func(native.IS_STALL_FOR_WORK)
    mflop = 1e6  # 2 ms at 0.5 GFLOP/s
    assert rule(8_000_000, NO_BEST, mflop)  # 8 ms for 1 MFLOP, no fastest run yet
    assert rule(8_000_000, 7_000_000, mflop)  # the fastest run was a stall too
    assert not rule(2_400_000, NO_BEST, mflop)  # within 2 ms + 0.5 ms
    assert not rule(8_000_000, NO_BEST, 0.0)  # work unknown: is_stall alone
    assert rule(4_100_000, 1_000_000, 0.0)  # is_stall's rule still holds
    assert not rule(10**9, NO_BEST, 1e9)  # 1 s for 1 GFLOP: not a stall


def _conv_case():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 16, 9, 9)).astype("float32")
    w = rng.standard_normal((16, 16, 3, 3)).astype("float32")
    b = rng.standard_normal(16).astype("float32")
    return [x, w, b], (1, 16, 9, 9)


def _cache_size() -> int:
    text = str(tvm_ffi.get_global_func(native.CACHE_STATS)())
    return int(dict(kv.split("=") for kv in text.split(";"))["size"])


def test_window_runs_native_calls_serially_with_equal_numbers():
    arrays, out_shape = _conv_case()
    parallel = call_direct(native.CONV2D, CONV, arrays, out_shape)
    cached, before = _cache_size(), native.stall_stats()["serial_calls"]
    native.hold_serial(10_000_000)  # 10 s
    assert native.stall_stats()["left_us"] > 0
    serial = call_direct(native.CONV2D, CONV, arrays, out_shape)
    assert native.stall_stats()["serial_calls"] == before + 1
    assert _cache_size() == cached + 1  # prepared for one thread
    np.testing.assert_allclose(serial, parallel, rtol=1e-5, atol=1e-5)
    native.set_stall_fallback(False)  # off: the window no longer applies
    call_direct(native.CONV2D, CONV, arrays, out_shape)
    native.set_stall_fallback(True)
    native.hold_serial(0)
    call_direct(native.CONV2D, CONV, arrays, out_shape)
    assert native.stall_stats()["serial_calls"] == before + 1
    with pytest.raises(ValueError):
        native.hold_serial(-1)




def test_window_runs_tvm_parallel_loops_on_the_calling_thread():
    if not native.provides(native.SET_PARALLEL_RUNTIME):
        pytest.skip("the loaded native library has no parallel runtime")
    x, y = (np.random.default_rng(1).standard_normal((N, 33)).astype("float32")
            for _ in range(2))
    with native.parallel_runtime("openmp"):
        vm = relax.VirtualMachine(tvm.compile(Scaled, target="llvm"), tvm.cpu())
        args = [tvm.runtime.tensor(a) for a in (x, y)]
        before = native.stall_stats()["serial_calls"]
        native.hold_serial(10_000_000)
        got = vm["main"](*args).numpy()
        assert native.stall_stats()["serial_calls"] == before + 1
    np.testing.assert_allclose(got, x * 2 + y, rtol=1e-6)


STALLS = r"""
import os, sys, numpy as np, tvm_ffi, ctypes
for path in sys.argv[1:]:
    ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
f = tvm_ffi.get_global_func("tvm_ollie.cpu.conv2d")
tvm_ffi.get_global_func("tvm_ollie.cpu.set_num_threads")(2)
tvm_ffi.get_global_func("tvm_ollie.cpu.set_serial_flops")(0)
x = np.random.rand(1, 32, 16, 16).astype("float32")
w = np.random.rand(32, 32, 3, 3).astype("float32")
y = np.zeros_like(x); a = [tvm_ffi.from_dlpack(t) for t in (x, w, y)]
for _ in range(200):
    f("pad=1,1,1,1", *a)  # the fastest parallel run, on both cores
tasks = os.listdir("/proc/self/task")
for tid in tasks:  # every thread on one core: the worker waits for the spinning caller's slice
    os.sched_setaffinity(int(tid), {min(os.sched_getaffinity(0))})
for _ in range(30):
    f("pad=1,1,1,1", *a)
print(tvm_ffi.get_global_func("tvm_ollie.cpu.stall_stats")())
"""


@pytest.mark.slow  # fresh interpreters (tvm_ffi imports torch); two cores needed
@pytest.mark.parametrize("enabled", ["1", "0"])
def test_workers_that_cannot_run_are_detected(enabled):
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two cores")
    env = dict(os.environ, TVM_OLLIE_STALL_FALLBACK=enabled)
    env.pop("OMP_WAIT_POLICY", None)  # GNU OpenMP's own: the caller spins at the barrier
    res = subprocess.run([sys.executable, "-c", STALLS, *native.library_files()], env=env,
                         capture_output=True, text=True, check=True, timeout=300)  # fmt: skip
    stats = dict(kv.split("=") for kv in res.stdout.split()[-1].split(";"))
    assert int(stats["stalls"]) >= 1
    if enabled == "1":
        assert int(stats["serial_calls"]) >= 1  # the calls after the stall
    else:
        assert int(stats["serial_calls"]) == 0 and stats["enabled"] == "0"
