"""Every timing path runs an executable on its target's device (issue 13, item 1).

A recording ``relax.VirtualMachine`` notes the device each VM is created on; on a non-CPU
device it raises instead of running (an llvm executable must not run there, and this machine
may have no GPU), so a CUDA target shows up as a recorded ``cuda`` device and a failure.
"""

from __future__ import annotations

import numpy as np
import pytest

from tvm_ollie.compat import relax, tvm
from tvm_ollie.codegen.builder import single_function_module, tensor_var
from tvm_ollie.pipeline.guard import GuardError, guard_plans
from tvm_ollie.transform.costing import UntunedTiming
from tvm_ollie.tune.calibrate import _tvm_seconds  # pylint: disable=protected-access
from tvm_ollie.tune.measure import random_args, time_main
from tvm_ollie.target import target_device

CPU = tvm.cpu(0).dlpack_device_type()
CUDA = tvm.cuda(0).dlpack_device_type()


class NotOnThisDevice(RuntimeError):
    """Raised by the recording VM for a device other than the CPU."""


@pytest.fixture(name="devices")
def _recording_vm(monkeypatch):
    seen = []
    real = relax.VirtualMachine

    def recording(ex, device, *args, **kwargs):
        seen.append(device.dlpack_device_type())
        if device.dlpack_device_type() != CPU:
            raise NotOnThisDevice(f"would run on device type {device.dlpack_device_type()}")
        return real(ex, device, *args, **kwargs)

    monkeypatch.setattr(relax, "VirtualMachine", recording)
    return seen


def _module():
    return single_function_module([tensor_var("x", (8, 8)), tensor_var("y", (8, 8))],
                                  lambda bb, x, y: relax.op.add(x, y))


@pytest.fixture(name="llvm_ex", scope="module")
def _llvm_ex():
    return tvm.compile(_module(), target="llvm")


def test_target_device_follows_the_target_kind():
    assert target_device().dlpack_device_type() == CPU
    assert target_device("llvm").dlpack_device_type() == CPU
    assert target_device("cuda").dlpack_device_type() == CUDA
    assert target_device({"kind": "cuda", "arch": "sm_90"}).dlpack_device_type() == CUDA


def test_time_main_runs_on_the_targets_device(devices, llvm_ex):
    args = random_args(_module()["main"])
    assert time_main(llvm_ex, args, number=1, repeat=1, target="llvm") > 0
    with pytest.raises(NotOnThisDevice):
        time_main(llvm_ex, args, number=1, repeat=1, target="cuda")
    assert devices == [CPU, CUDA]


def test_untuned_timing_measures_on_the_targets_device(devices, llvm_ex):
    class Prebuilt(UntunedTiming):
        def compile(self, module, label):
            return llvm_ex

    assert Prebuilt("llvm").measure(_module(), "add") > 0
    assert Prebuilt("cuda").measure(_module(), "add") is None  # timing failed: not cached
    assert devices == [CPU, CUDA]


def test_plan_guard_runs_plans_on_the_targets_device(devices, llvm_ex):
    args = random_args(_module()["main"])
    ex, winner, _ = guard_plans([("a", lambda: llvm_ex)], args, target="llvm")
    assert winner == "a" and ex is llvm_ex
    with pytest.raises(GuardError, match="would run on device type"):
        guard_plans([("a", lambda: llvm_ex)], args, target="cuda")
    assert devices == [CPU, CUDA]


def test_calibration_times_tvm_kernels_on_the_targets_device(devices):
    seconds = _tvm_seconds(lambda bb, a, b: relax.op.add(a, b), [(4, 4), (4, 4)], "llvm", 1)
    assert np.isfinite(seconds) and seconds > 0 and devices == [CPU]
