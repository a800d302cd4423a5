"""The int8 rewrite (:mod:`tvm_ollie.transform.int8_kernels`): Before/Expected modules, its
guards, a QLinearConv model through the pass against ONNX Runtime (bit-exact: the kernel gives
the int32 accumulator, the requantization stays TVM's), and the int32 form kept without the
native library."""

import os
import subprocess
import sys

import numpy as np
import pytest
import tvm
from tvm import relax

from tvm_ollie import native
from tvm_ollie.codegen import library as lib
from tvm_ollie.transform.int8_kernels import accumulator_bound, int8_kernels

FRONTEND_TESTS = os.path.join(os.path.dirname(__file__), "..", "frontend")


def _require_int8():
    if not native.available():
        pytest.skip(f"native library unavailable: {native.unavailable_reason()}")
    if not native.provides(lib.CONV2D_INT8):
        pytest.skip("the loaded native library predates the int8 kernels")


def _centered_conv(x_dtype: str, zp: int, weight: np.ndarray, padding=(1, 1, 1, 1)):
    """``conv2d(int32(x) - zp, W)``, what the ONNX importer writes for QLinearConv."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, weight.shape[1], 6, 6), x_dtype))
    with bb.function("main", [x]):
        with bb.dataflow():
            wide = bb.emit(relax.op.astype(x, "int32"))
            centered = wide if zp is None else bb.emit(
                relax.op.subtract(wide, relax.const(zp, "int32")))
            y = bb.emit(relax.op.nn.conv2d(centered, relax.const(weight), padding=padding))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


def _expected_conv(x_dtype: str, zp: int, weight: np.ndarray):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, weight.shape[1], 6, 6), x_dtype))
    call = lib.conv2d_int8_call((1, 1), (1, 1, 1, 1), (1, 1), 1, xzp=True)
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(lib.emit_call(call, [x, relax.const(weight.astype(np.int8)),
                                             relax.const(np.array([zp], np.int32))],
                                      (1, weight.shape[0], 6, 6), "int32"))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


def _weight(low=-60, high=60, shape=(4, 3, 3, 3)):
    return np.random.default_rng(0).integers(low, high, shape).astype(np.int32)


@pytest.mark.parametrize("x_dtype, zp", [("uint8", 128), ("int8", None)])
def test_centered_conv_becomes_the_int8_kernel(x_dtype, zp):
    """Without a zero point (ConvInteger's default) the kernel gets 0."""
    _require_int8()
    weight = _weight()
    after, counts = int8_kernels(_centered_conv(x_dtype, zp, weight))
    assert counts == {"int8_conv2d": 1}
    canonical = relax.transform.CanonicalizeBindings()
    tvm.ir.assert_structural_equal(canonical(after),
                                   canonical(_expected_conv(x_dtype, zp or 0, weight)))


@pytest.mark.parametrize("why, weight, zp", [
    ("weight outside int8", _weight(-200, 200), 0),
    ("accumulator above 2^24", np.full((2, 512, 3, 3), 60, np.int32), 0),
])
def test_guards_keep_the_int32_form(why, weight, zp):
    _require_int8()
    before = _centered_conv("uint8", zp, weight)
    after, counts = int8_kernels(before)
    assert counts == {}, why
    tvm.ir.assert_structural_equal(after, before)


def test_centered_matmul_becomes_the_int8_kernel():
    _require_int8()
    weight = _weight(shape=(16, 5))
    bb = relax.BlockBuilder()
    a = relax.Var("a", relax.TensorType((4, 16), "int8"))
    with bb.function("main", [a]):
        with bb.dataflow():
            wide = bb.emit(relax.op.astype(a, "int32"))
            centered = bb.emit(relax.op.subtract(wide, relax.const(-3, "int32")))
            out = bb.emit_output(bb.emit(relax.op.matmul(centered, relax.const(weight))))
        bb.emit_func_output(out)
    after, counts = int8_kernels(bb.get())
    assert counts == {"int8_matmul": 1}
    bb = relax.BlockBuilder()
    with bb.function("main", [a]):
        with bb.dataflow():
            call = lib.emit_call(lib.matmul_int8_call(xzp=True),
                                 [a, relax.const(weight.astype(np.int8)),
                                  relax.const(np.array([-3], np.int32))], (4, 5), "int32")
            out = bb.emit_output(bb.emit(call))
        bb.emit_func_output(out)
    canonical = relax.transform.CanonicalizeBindings()
    tvm.ir.assert_structural_equal(canonical(after), canonical(bb.get()))


def test_accumulator_bound():
    w = np.array([[1, -2], [3, 0]], np.int32)  # [K=2, N=2], output axis 1
    assert accumulator_bound(w, 1, 0, 255, 100) == 4 * 155


def _onnx_case():
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    sys.path.insert(0, FRONTEND_TESTS)
    from onnx_op_cases import qlinear_conv_case  # pylint: disable=import-outside-toplevel

    return qlinear_conv_case(pads=[1, 1, 1, 1], strides=[2, 2])


def test_qlinear_conv_through_the_pass_equals_onnxruntime():
    _require_int8()
    model, feeds = _onnx_case()
    from onnx_op_cases import run_ort  # pylint: disable=import-outside-toplevel

    import tvm_ollie as ollie  # pylint: disable=import-outside-toplevel
    from tvm_ollie.frontend.loader import load_onnx  # pylint: disable=import-outside-toplevel

    mod = load_onnx(model, None, simplifier="none")
    ex, report = ollie.build(mod, target="llvm", trials=0, derive=False)
    assert report.inference_folds.get("int8_conv2d") == 1
    vm = relax.VirtualMachine(ex, tvm.cpu())
    ours = vm["main"](tvm.runtime.tensor(feeds["x"])).numpy()
    theirs = run_ort(model, feeds)[0]
    assert ours.dtype == theirs.dtype
    assert np.array_equal(ours, theirs)  # bit-exact


def test_int32_form_stays_when_the_library_lacks_the_kernels(monkeypatch):
    monkeypatch.setattr(native, "provides", lambda name: False)
    before = _centered_conv("uint8", 128, _weight())
    after, counts = int8_kernels(before)
    assert counts == {} and after.same_as(before)


@pytest.mark.slow  # a fresh interpreter importing TVM: ~15 s on the shared 2-core machine
def test_without_the_native_library_the_int32_form_stays():
    pytest.importorskip("onnx")
    script = (
        "import sys; sys.path.insert(0, sys.argv[1])\n"
        "from onnx_op_cases import qlinear_conv_case\n"
        "from tvm_ollie import native\n"
        "from tvm_ollie.frontend.loader import load_onnx\n"
        "from tvm_ollie.transform.int8_kernels import int8_kernels\n"
        "model, _ = qlinear_conv_case()\n"
        "mod, counts = int8_kernels(load_onnx(model, None, simplifier='none'))\n"
        "assert not native.available() and counts == {}, counts\n"
        "assert 'call_dps_packed' not in mod.script()\n"
        "print('ok')\n")
    env = dict(os.environ, TVM_OLLIE_DISABLE_NATIVE="1")
    out = subprocess.run([sys.executable, "-c", script, FRONTEND_TESTS], env=env,
                         capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr[-2000:]
