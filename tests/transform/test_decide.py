"""The decision core with injected timers and checkers: what is measured, what is chosen."""

import logging

import numpy as np
import pytest
import tvm
from tvm import relax

import small_models as sm
from tvm_ollie import native
from tvm_ollie.transform import optimize_module
from tvm_ollie.transform.decide import MARGIN
from tvm_ollie.tune.calibrate import Calibration

#: the tests' fixed calibration, with the native kernels at a high (GEMM-like) efficiency
CALIB = Calibration("llvm", sm.LLVM_CALIB.peak_flops, sm.LLVM_CALIB.bandwidth,
                    dict(sm.LLVM_CALIB.efficiency, native_conv2d=0.7, native_matmul=0.7), "given")
OPTS = dict(max_depth=2, search_time_s=4.0, calibration=CALIB)
needs_native = pytest.mark.skipif(not native.load(), reason="native library not loaded")

logging.getLogger("tvm_ollie.derive").setLevel(logging.CRITICAL)


class FakeTimer:
    """Seconds by alternative: ``times[label]`` if given, else ``default``; records calls."""

    def __init__(self, times=None, default=5e-3, original=10e-3):
        self.times = dict(times or {})
        self.default = default
        self.original = original
        self.labels = []

    def __call__(self, mod, label):
        alt = label.split("|")[-1]
        self.labels.append(alt)
        if alt == "original":
            return self.original
        return self.times.get(alt, self.default)


def _run(mod, args):
    return sm.run(tvm.compile(mod, target="llvm"), args)


def test_fastest_measured_alternative_wins():
    timer = FakeTimer()
    _, report = optimize_module(sm.conv3x3(), "llvm", library=False, timer=timer,
                                max_measured=3, **OPTS)
    # one label per sample: the alternatives are timed together in rounds
    measured = list(dict.fromkeys(lab for lab in timer.labels if lab != "original"))
    assert "original" in timer.labels and len(measured) == 3
    # make the last measured alternative the fastest: it must be chosen
    timer2 = FakeTimer({measured[-1]: 1e-3})
    _, report = optimize_module(sm.conv3x3(), "llvm", library=False, timer=timer2,
                                max_measured=3, **OPTS)
    (d,) = report.decisions
    assert d.chosen == measured[-1] and d.measured
    assert d.before_s == 10e-3 and d.after_s == 1e-3


def test_nothing_faster_than_margin_keeps_original():
    timer = FakeTimer(default=10e-3 * (1 - MARGIN / 2))
    new, report = optimize_module(sm.conv3x3(), "llvm", library=False, timer=timer, **OPTS)
    (d,) = report.decisions
    assert not d.rewritten and d.reason.startswith("untuned, measured: original 10.00ms")
    tvm.ir.assert_structural_equal(new, sm.conv3x3())


def test_timer_failures_keep_original():
    new, report = optimize_module(sm.conv3x3(), "llvm", timer=lambda mod, label: None, **OPTS)
    (d,) = report.decisions
    assert not d.rewritten and "failed to build or run" in d.reason
    tvm.ir.assert_structural_equal(new, sm.conv3x3())


def test_library_false_and_derive_false():
    timer = FakeTimer()
    optimize_module(sm.conv_stack(), "llvm", library=False, timer=timer, **OPTS)
    assert timer.labels and not any("[native]" in lab for lab in timer.labels)
    timer = FakeTimer()
    _, report = optimize_module(sm.conv_stack(), "llvm", library=False, derive=False,
                                timer=timer, **OPTS)
    assert not any(d.rewritten for d in report.decisions)
    assert all(d.candidates == 0 for d in report.decisions)


@needs_native
def test_native_original_chosen_and_numerics():
    timer = FakeTimer({"original [native]": 1e-3}, default=8e-3)
    mod = sm.conv_stack()
    new, report = optimize_module(mod, "llvm", derive=False, timer=timer, **OPTS)
    assert all(d.chosen == "original [native]" for d in report.decisions), report.to_text()
    assert set(timer.labels) == {"original", "original [native]"}
    ops = sm.ops_in(new)
    assert "relax.nn.conv2d" not in ops
    args = sm.random_inputs(mod, seed=2)
    sm.assert_close(_run(new, args), _run(mod, args))
    # the relu after the first convolution is folded into its kernel
    assert report.epilogues == {"conv2d": 1}
    assert "relax.nn.relu" not in sm.ops_in(new)


@needs_native
def test_derived_program_on_native_kernels():
    timer = FakeTimer(default=8e-3)
    optimize_module(sm.conv3x3(), "llvm", timer=timer, max_measured=8, **OPTS)
    native_progs = [lab for lab in timer.labels
                    if lab.endswith("[native]") and not lab.startswith("original")]
    assert native_progs, timer.labels
    timer = FakeTimer({native_progs[0]: 1e-3}, default=8e-3)
    mod = sm.conv3x3()
    new, report = optimize_module(mod, "llvm", timer=timer, max_measured=8, **OPTS)
    (d,) = report.decisions
    assert d.chosen == native_progs[0]
    assert "relax.call_dps_packed" in sm.ops_in(new), sm.ops_in(new)
    args = sm.random_inputs(mod, seed=4)
    sm.assert_close(_run(new, args), _run(mod, args))


@needs_native
def test_matmul_bias_relu_mlp_numerics():
    mod = sm.mlp()
    timer = FakeTimer({"original [native]": 1e-3}, default=8e-3)
    new, report = optimize_module(mod, "llvm", derive=False, timer=timer, **OPTS)
    assert all(d.chosen == "original [native]" for d in report.decisions)
    assert report.epilogues.get("matmul", 0) >= 2  # bias and relu of the first layer
    args = sm.random_inputs(mod, seed=5)
    sm.assert_close(_run(new, args), _run(mod, args))
    assert np.isfinite(_run(new, args)).all()


def test_unsupported_dtype_has_no_native_form():
    from tvm_ollie.codegen import library as lib

    x = relax.Var("x", relax.TensorType((4, 8), "float16"))
    w = relax.Var("w", relax.TensorType((8, 3), "float16"))
    assert lib.call_form(relax.BlockBuilder().normalize(relax.op.matmul(x, w))) is None
    x32 = relax.Var("x", relax.TensorType((8,), "float32"))
    w32 = relax.Var("w", relax.TensorType((8, 3), "float32"))
    assert lib.call_form(relax.BlockBuilder().normalize(relax.op.matmul(x32, w32))) is None
