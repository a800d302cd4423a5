"""The int8 rewrite as a measured decision (:mod:`tvm_ollie.transform.int8_choice`): with a fake
timer, each exact form of a unit kept when it is the fastest (Before/Expected), the int32 form
kept when timing refuses the kernels, the int8 kernel with TVM's requantization, one decision
per timing signature, the evidence read back, and the outputs bit-exact against the int32 form
and ONNX Runtime."""

import os
import sys

import numpy as np
import pytest
import tvm
from tvm import relax

from tvm_ollie.codegen import library as lib
from tvm_ollie.transform.costing import CallableTiming
from tvm_ollie.transform.int8_choice import (INT8, INT8_REQUANT, INT32, Int8Choice,
                                             unit_module)
from tvm_ollie.transform.int8_kernels import int8_kernels
from tvm_ollie.transform.measuring import DecisionRecords

sys.path.insert(0, os.path.dirname(__file__))
from test_int8_kernels import (_centered_conv, _expected_conv, _require_int8,  # noqa: E402
                               _requantized_conv, _weight, unpacked)  # noqa: F401

BIAS = np.arange(-2, 2, dtype=np.int32).reshape(1, 4, 1, 1)
SCALE = np.array([0.01, 0.02, 0.03, 0.04], np.float32).reshape(1, 4, 1, 1)


class FakeTimer:
    """Seconds per alternative label (the part after the last ``|``); records the labels."""

    def __init__(self, seconds):
        self.seconds = seconds
        self.labels = []

    def __call__(self, _module, label):
        self.labels.append(label)
        return self.seconds[label.rsplit("|", 1)[1]]


def _run(mod, x):
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    return vm["main"](tvm.runtime.tensor(x)).numpy()


def _x(shape=(1, 3, 6, 6)):
    return np.random.default_rng(1).integers(0, 256, shape).astype(np.uint8)


def _canonical(mod):
    return relax.transform.CanonicalizeBindings()(mod)


def test_requant_kernel_kept_when_fastest(unpacked):
    """Expected: the one requantizing kernel call (as without timing)."""
    _require_int8()
    timer = FakeTimer({INT32: 1e-3, INT8_REQUANT: 1e-5, INT8: 2e-5})
    choice = Int8Choice(CallableTiming(timer))
    before = _requantized_conv(_weight(), BIAS, SCALE, 7)
    after, counts = int8_kernels(before, choice=choice)
    assert counts == {"int8_conv2d_requant": 1}
    untimed, _ = int8_kernels(before)
    tvm.ir.assert_structural_equal(_canonical(after), _canonical(untimed))
    (verdict,) = choice.report().verdicts
    assert verdict.kept == INT8_REQUANT and verdict.units == 1
    assert verdict.alternatives == [INT32, INT8_REQUANT, INT8]
    assert {label.rsplit("|", 1)[1] for label in timer.labels} == {INT32, INT8_REQUANT, INT8}
    assert "kept onednn-int8-requant" in choice.report().to_text()


def test_int32_form_kept_when_timing_refuses_the_kernels():
    """Expected: the module unchanged (TVM's int32 conv and requantization)."""
    _require_int8()
    choice = Int8Choice(CallableTiming(FakeTimer({INT32: 1e-5, INT8_REQUANT: 1e-3,
                                                  INT8: 1e-3})))
    before = _requantized_conv(_weight(), BIAS, SCALE, 7)
    after, counts = int8_kernels(before, choice=choice)
    assert counts == {}
    tvm.ir.assert_structural_equal(after, before)
    kept = {v.signature.split(";")[0]: v.kept for v in choice.report().verdicts}
    # the plain conv's verdict follows from the same comparison, not timed again
    assert kept == {"int8_conv2d_requant": INT32, "int8_conv2d": INT32}


def _int8_then_tvm_requant(weight):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 3, 6, 6), "uint8"))
    call = lib.conv2d_int8_call((1, 1), (1, 1, 1, 1), (1, 1), 1, xzp=True)
    with bb.function("main", [x]):
        with bb.dataflow():
            acc = bb.emit(lib.emit_call(call, [x, relax.const(weight.astype(np.int8)),
                                               relax.const(np.array([128], np.int32))],
                                        (1, 4, 6, 6), "int32"))
            acc = bb.emit(relax.op.add(acc, relax.const(BIAS)))
            scaled = bb.emit(relax.op.multiply(bb.emit(relax.op.astype(acc, "float32")),
                                               relax.const(SCALE)))
            out = bb.emit_output(bb.emit(relax.op.quantize(
                scaled, relax.const(np.float32(1.0)), relax.const(np.array(7, "uint8")),
                axis=1, out_dtype="uint8")))
        bb.emit_func_output(out)
    return bb.get()


def test_int8_kernel_with_tvm_requantization_kept_when_fastest(unpacked):
    """Expected: the int32-result kernel, then TVM's requantization; bit-exact."""
    _require_int8()
    weight = _weight()
    choice = Int8Choice(CallableTiming(FakeTimer({INT32: 1e-3, INT8_REQUANT: 3e-5,
                                                  INT8: 1e-5})))
    before = _requantized_conv(weight, BIAS, SCALE, 7)
    after, counts = int8_kernels(before, choice=choice)
    assert counts == {"int8_conv2d": 1}
    tvm.ir.assert_structural_equal(_canonical(after), _canonical(_int8_then_tvm_requant(weight)))
    x = _x()
    assert np.array_equal(_run(after, x), _run(before, x))


def test_plain_unit_refused_by_timing_and_kept():
    _require_int8()
    weight = _weight()
    before = _centered_conv("uint8", 128, weight)
    after, counts = int8_kernels(before, choice=Int8Choice(CallableTiming(
        FakeTimer({INT32: 1e-5, INT8: 1e-3}))))
    assert counts == {}
    tvm.ir.assert_structural_equal(after, before)


def test_plain_unit_kept_when_fastest(unpacked):
    _require_int8()
    weight = _weight()
    after, counts = int8_kernels(_centered_conv("uint8", 128, weight), choice=Int8Choice(
        CallableTiming(FakeTimer({INT32: 1e-3, INT8: 1e-5}))))
    assert counts == {"int8_conv2d": 1}
    tvm.ir.assert_structural_equal(_canonical(after), _canonical(_expected_conv("uint8", 128,
                                                                                weight)))


def test_tie_keeps_the_original():
    """Within the margin the int32 form (the original) is preferred, as for float units."""
    _require_int8()
    before = _centered_conv("uint8", 128, _weight())
    after, counts = int8_kernels(before, choice=Int8Choice(CallableTiming(
        FakeTimer({INT32: 1.05e-5, INT8: 1e-5}))))
    assert counts == {}


def _two_convs(w1, w2):
    """Two requantized convolutions of one timing signature (different weights)."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 4, 6, 6), "uint8"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = x
            for w in (w1, w2):
                wide = bb.emit(relax.op.subtract(bb.emit(relax.op.astype(y, "int32")),
                                                 relax.const(128, "int32")))
                acc = bb.emit(relax.op.nn.conv2d(wide, relax.const(w), padding=(1, 1)))
                scaled = bb.emit(relax.op.multiply(bb.emit(relax.op.astype(acc, "float32")),
                                                   relax.const(np.float32(0.01))))
                y = bb.emit(relax.op.quantize(scaled, relax.const(np.float32(1.0)),
                                              relax.const(np.array(128, "uint8")), axis=1,
                                              out_dtype="uint8"))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


def test_one_decision_per_signature_and_the_evidence_read_back(tmp_path):
    _require_int8()
    w1, w2 = _weight(shape=(4, 4, 3, 3)), _weight(-30, 30, shape=(4, 4, 3, 3))
    before = _two_convs(w1, w2)
    timer = FakeTimer({INT32: 1e-3, INT8_REQUANT: 1e-5, INT8: 2e-5})
    choice = Int8Choice(CallableTiming(timer), DecisionRecords(str(tmp_path)))
    after, counts = int8_kernels(before, layout=False, choice=choice)
    assert counts == {"int8_conv2d_requant": 2}
    (verdict,) = choice.report().verdicts
    assert verdict.units == 2
    first = len(timer.labels)
    assert len({label.rsplit("|", 1)[0] for label in timer.labels}) == 1  # one decision
    x = _x((1, 4, 6, 6))
    assert np.array_equal(_run(after, x), _run(before, x))
    # a later build with the same work dir reads the evidence back: nothing timed
    again = Int8Choice(CallableTiming(timer), DecisionRecords(str(tmp_path)))
    _, counts = int8_kernels(before, layout=False, choice=again)
    assert counts == {"int8_conv2d_requant": 2} and len(timer.labels) == first
    assert "recorded" in again.report().verdicts[0].evidence


def test_unit_module_isolates_the_unit():
    """The original alternative's module computes the unit alone from its 8-bit source."""
    before = _requantized_conv(_weight(), BIAS, SCALE, 7)
    func = before["main"]
    values = {b.var: b.value for blk in func.body.blocks for b in blk.bindings}
    root = func.body.blocks[0].bindings[-1].value
    iso = unit_module(func.params[0], root, values)
    x = _x()
    assert np.array_equal(_run(iso, x), _run(before, x))


def test_through_the_build_with_a_timer_equals_onnxruntime():
    """``ollie.build`` with a timer decides the int8 unit by it and says so in the report;
    the outputs equal ONNX Runtime's bit for bit whichever form is kept."""
    _require_int8()
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "frontend"))
    import onnx_op_cases as cases  # pylint: disable=import-outside-toplevel

    import tvm_ollie as ollie  # pylint: disable=import-outside-toplevel
    from tvm_ollie.frontend.loader import load_onnx  # pylint: disable=import-outside-toplevel

    model, feeds = cases.qlinear_conv_case(pads=[1, 1, 1, 1], strides=[2, 2])
    theirs = cases.run_ort(model, feeds)[0]
    for fast, rule in ((INT32, None), (INT8, "int8_conv2d"),
                       (INT8_REQUANT, "int8_conv2d_requant")):
        seconds = {INT32: 1e-3, INT8: 1e-3, INT8_REQUANT: 1e-3, fast: 1e-5}

        def timer(_mod, label, seconds=seconds):
            return seconds.get(label.rsplit("|", 1)[1], 1e-3)

        mod = load_onnx(model, None, simplifier="none")
        ex, report = ollie.build(mod, target="llvm", trials=0, derive=False, timer=timer)
        assert {k: v for k, v in report.inference_folds.items()
                if k.startswith("int8_") and "nhwc" not in k} == ({rule: 1} if rule else {})
        assert f"kept {fast}" in report.int8.to_text()
        vm = relax.VirtualMachine(ex, tvm.cpu())
        ours = vm["main"](*[tvm.runtime.tensor(v) for v in feeds.values()]).numpy()
        assert ours.dtype == theirs.dtype and np.array_equal(ours, theirs)


def test_without_timing_the_kernels_are_taken_and_the_report_says_so():
    """A decider that does not measure (``check_untuned=False``, ``trials=0``): the oneDNN form
    wherever exact, as before the decision was timed."""
    _require_int8()
    from tvm_ollie.transform.optimize import optimize_module  # pylint: disable=C0415

    before = _requantized_conv(_weight(), BIAS, SCALE, 7)
    _, report = optimize_module(before, target="llvm", trials=0, derive=False,
                                check_untuned=False)
    assert report.inference_folds.get("int8_conv2d_requant") == 1
    assert report.int8 is not None and not report.int8.timed
    assert "not timed" in report.int8.to_text()
