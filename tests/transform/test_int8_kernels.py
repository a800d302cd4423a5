"""The int8 rewrite (:mod:`tvm_ollie.transform.int8_kernels`): Before/Expected modules, its
guards, QLinearConv/QLinearMatMul/ConvInteger models through the pass against ONNX Runtime
(bit-exact: the requantization inside the kernel, or the int32 accumulator), the requantization
guards, and the int32 form kept without the native library."""

import os
import subprocess
import sys

import numpy as np
import pytest
import tvm
from tvm import relax

from tvm_ollie import native
from tvm_ollie.codegen import library as lib
from tvm_ollie.transform.int8_kernels import (MATMUL_INT8_PACK_WEIGHT, accumulator_bound,
                                              int8_kernels, requantize_reference,
                                              saturates_past_limit)

FRONTEND_TESTS = os.path.join(os.path.dirname(__file__), "..", "frontend")


def _require_int8():
    if not native.available():
        pytest.skip(f"native library unavailable: {native.unavailable_reason()}")
    if not native.provides(lib.CONV2D_INT8):
        pytest.skip("the loaded native library predates the int8 kernels")


@pytest.fixture
def unpacked(monkeypatch):
    """The structural tests compare the plain weight operand: no packing."""
    provides = native.provides
    packers = (native.CONV2D_INT8_PACK_WEIGHT, MATMUL_INT8_PACK_WEIGHT)
    monkeypatch.setattr(native, "provides", lambda name: name not in packers and provides(name))


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


#: Why an int8-source convolution keeps TVM's form on a CPU without VNNI: oneDNN's s8-source
#: convolutions there halve the weights (its s8s8 compensation), so odd weights are not exact.
NO_VNNI_S8_CONV = "s8-source convolutions without VNNI halve the weights (oneDNN's s8s8 path)"


def _require_s8_conv_exact(x_dtype):
    if np.dtype(x_dtype) == np.int8 and not native.int8_exact_products():
        pytest.skip(NO_VNNI_S8_CONV)


@pytest.mark.parametrize("x_dtype, zp", [("uint8", 128), ("int8", None)])
def test_centered_conv_becomes_the_int8_kernel(x_dtype, zp, unpacked):
    """Without a zero point (ConvInteger's default) the kernel gets 0."""
    _require_int8()
    _require_s8_conv_exact(x_dtype)
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


@pytest.mark.parametrize("x_dtype, zp", [("int8", None), ("uint8", 128)])
def test_int8_source_conv_without_vnni_keeps_the_int32_form(x_dtype, zp, monkeypatch, unpacked):
    """Without VNNI oneDNN halves the weights of an int8-source convolution: the rule keeps
    TVM's convolution there, and still rewrites a uint8 source (the CPU's answer replaced, so
    that both kinds of CPU run the guard)."""
    _require_int8()
    monkeypatch.setattr(native, "int8_exact_products", lambda: False)
    before = _centered_conv(x_dtype, zp, _weight())
    after, counts = int8_kernels(before)
    if x_dtype == "uint8":
        assert counts == {"int8_conv2d": 1}
        return
    assert counts == {}
    tvm.ir.assert_structural_equal(after, before)


def test_centered_matmul_becomes_the_int8_kernel(unpacked):
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


def _onnx_cases():
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    sys.path.insert(0, FRONTEND_TESTS)
    import onnx_op_cases  # pylint: disable=import-outside-toplevel

    return onnx_op_cases


#: ONNX cases through ``ollie.build``: (case, the int8 rewrite expected).
THROUGH_THE_PASS = {
    "qlinear-conv-u8-per-channel-bias-strides": (
        lambda c: c.qlinear_conv_case(pads=[1, 1, 1, 1], strides=[2, 2]), "int8_conv2d_requant"),
    "qlinear-conv-s8-saturating": (
        lambda c: c.qlinear_conv_case(np.int8, np.int8, False, y_scale=0.005, pads=[1, 1, 1, 1]),
        "int8_conv2d_requant"),
    "qlinear-matmul-u8-per-column": (
        lambda c: c.qlinear_matmul_case(per_column=True), "int8_matmul_requant"),
}


@pytest.mark.parametrize("name", sorted(THROUGH_THE_PASS))
def test_through_the_pass_equals_onnxruntime(name):
    """The requantizing kernels (8-bit results) through ``ollie.build``, bit-exact against ONNX
    Runtime."""
    _require_int8()
    cases = _onnx_cases()
    if "-s8-" in name:
        _require_s8_conv_exact(np.int8)
    make, rule = THROUGH_THE_PASS[name]
    model, feeds = make(cases)
    import tvm_ollie as ollie  # pylint: disable=import-outside-toplevel
    from tvm_ollie.frontend.loader import load_onnx  # pylint: disable=import-outside-toplevel

    mod = load_onnx(model, None, simplifier="none")
    # the decision is timed (tests/transform/test_int8_choice.py): here the kernel is the
    # fastest by a fake timer, so that the fused kernel is what runs
    ex, report = ollie.build(mod, target="llvm", trials=0, derive=False,
                             timer=lambda _m, label: 1e-6 if label.endswith("-requant") else 1e-3)
    assert report.inference_folds.get(rule) == 1, report.inference_folds
    vm = relax.VirtualMachine(ex, tvm.cpu())
    ours = vm["main"](*[tvm.runtime.tensor(v) for v in feeds.values()]).numpy()
    theirs = cases.run_ort(model, feeds)[0]
    assert ours.dtype == theirs.dtype
    assert np.array_equal(ours, theirs)  # bit-exact


def _requantized_conv(weight, bias, scale, yzp, one=1.0, out_dtype="uint8"):
    """What the importer writes for QLinearConv: ``quantize(float32(conv + B) * M, one, yzp)``."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, weight.shape[1], 6, 6), "uint8"))
    with bb.function("main", [x]):
        with bb.dataflow():
            wide = bb.emit(relax.op.astype(x, "int32"))
            centered = bb.emit(relax.op.subtract(wide, relax.const(128, "int32")))
            acc = bb.emit(relax.op.nn.conv2d(centered, relax.const(weight), padding=(1, 1)))
            if bias is not None:
                acc = bb.emit(relax.op.add(acc, relax.const(bias)))
            scaled = bb.emit(relax.op.multiply(bb.emit(relax.op.astype(acc, "float32")),
                                               relax.const(scale)))
            out = bb.emit_output(bb.emit(relax.op.quantize(
                scaled, relax.const(np.float32(one)), relax.const(np.array(yzp, out_dtype)),
                axis=1, out_dtype=out_dtype)))
        bb.emit_func_output(out)
    return bb.get()


def test_requantized_conv_becomes_one_kernel_call(unpacked):
    _require_int8()
    weight = _weight()
    bias = np.arange(-2, 2, dtype=np.int32).reshape(1, 4, 1, 1)
    scale = np.array([0.01, 0.02, 0.03, 0.04], np.float32).reshape(1, 4, 1, 1)
    after, counts = int8_kernels(_requantized_conv(weight, bias, scale, 7))
    assert counts == {"int8_conv2d_requant": 1}
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 3, 6, 6), "uint8"))
    call = lib.conv2d_int8_call((1, 1), (1, 1, 1, 1), (1, 1), 1, xzp=True, requant="channel")
    operands = [x, relax.const(weight.astype(np.int8)), relax.const(np.array([128], np.int32)),
                relax.const(scale.reshape(4)), relax.const(bias.reshape(4).astype(np.float32)),
                relax.const(np.array([7], np.int32))]
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(lib.emit_call(call, operands, (1, 4, 6, 6), "uint8")))
        bb.emit_func_output(out)
    canonical = relax.transform.CanonicalizeBindings()
    tvm.ir.assert_structural_equal(canonical(after), canonical(bb.get()))


def test_packed_weight_call_equals_the_plain_one():
    """With the packing functions the conv calls read the weight packed once (``wpacked=1``):
    same outputs as the plain call, and a packed weight from another problem is refused."""
    _require_int8()
    if not native.provides(native.CONV2D_INT8_PACK_WEIGHT):
        pytest.skip("the loaded native library predates the int8 weight packing")
    weight = _weight(shape=(8, 3, 3, 3))
    scale = np.float32(0.03)
    before = _requantized_conv(weight, None, scale, 7)
    after, counts = int8_kernels(before)
    assert counts == {"int8_conv2d_requant": 1}
    assert "wpacked=1;kernel=3,3" in after.script()
    x = np.random.default_rng(1).integers(0, 256, (1, 3, 6, 6)).astype(np.uint8)
    outs = []
    for mod in (before, after):
        vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
        outs.append(vm["main"](tvm.runtime.tensor(x)).numpy())
    assert outs[0].dtype == np.uint8 and np.array_equal(outs[0], outs[1])
    conv = tvm.get_global_func(lib.CONV2D_INT8)
    with pytest.raises(ValueError, match="another problem"):
        conv("pad=1,1,1,1;xzp=1;wpacked=1;kernel=3,3", tvm.runtime.tensor(x),
             tvm.runtime.tensor(np.zeros(100, np.int8)),
             tvm.runtime.tensor(np.array([0], np.int32)),
             tvm.runtime.tensor(np.zeros((1, 8, 6, 6), np.int32)))


@pytest.mark.parametrize("why, bias, one", [
    ("a bias past 2^24 is not exact in float32", np.full((1, 4, 1, 1), 2 ** 24 + 1, np.int32),
     1.0),
    ("the quantize divides by a scale other than 1", None, 0.5),
])
def test_requant_guards_keep_the_int32_kernel(why, bias, one):
    """A requantization the kernel would not reproduce exactly stays TVM's; the accumulation
    still goes to the plain int32 kernel."""
    _require_int8()
    before = _requantized_conv(_weight(), bias, np.float32(0.01), 7, one=one)
    _, counts = int8_kernels(before)
    assert counts == {"int8_conv2d": 1}, why


def test_saturates_past_limit():
    assert saturates_past_limit(0, 1e-4, 128, "uint8")  # 2^24 * 1e-4 = 1678 > 129
    assert not saturates_past_limit(0, 1e-6, 128, "uint8")  # 16.8: inside the range
    assert not saturates_past_limit(2 ** 24 - 10, 0.01, 0, "int8")  # the bias eats the margin
    assert not saturates_past_limit(0, -1.0, 0, "int8")


@pytest.mark.parametrize("scale, fused", [(0.01, True), (1e-7, False)])
def test_accumulators_past_2_24_fuse_only_where_they_saturate(scale, fused):
    """512 input channels of weight 60: accumulators up to 255 * 60 * 4608 > 2^24. With a
    multiplier that saturates every such value the kernel is exact (checked on an input that
    reaches them); with a tiny one the chain stays TVM's (and the plain kernel's bound refuses
    it too)."""
    _require_int8()
    weight = np.full((2, 512, 3, 3), 60, np.int32)
    before = _requantized_conv(weight, None, np.float32(scale), 7)
    after, counts = int8_kernels(before)
    assert counts == ({"int8_conv2d_requant": 1} if fused else {})
    if fused:
        x = np.full((1, 512, 6, 6), 255, np.uint8)
        x[0, :, :3] = 0
        outs = [relax.VirtualMachine(tvm.compile(m, target="llvm"), tvm.cpu())["main"](
            tvm.runtime.tensor(x)).numpy() for m in (before, after)]
        assert np.array_equal(outs[0], outs[1]) and {0, 255} <= set(outs[0].ravel().tolist())


def test_requantize_reference_rounds_half_to_even_then_adds_the_zero_point():
    acc = np.array([1, 3, 5, -1, 600, -600])
    got = requantize_reference(acc, np.zeros(6), np.full(6, 0.5, np.float32), 101, "uint8")
    assert got.tolist() == [101, 103, 103, 101, 255, 0]


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


def test_matmul_weight_is_packed_once():
    """With the library's matmul packing the pass hands the kernel ``B`` packed
    (``wpacked=1``): same integers as TVM's build of the int32 form."""
    _require_int8()
    if not native.provides(MATMUL_INT8_PACK_WEIGHT):
        pytest.skip("the loaded native library predates the int8 matmul packing")
    weight = _weight(shape=(16, 5))
    bb = relax.BlockBuilder()
    a = relax.Var("a", relax.TensorType((4, 16), "uint8"))
    with bb.function("main", [a]):
        with bb.dataflow():
            wide = bb.emit(relax.op.astype(a, "int32"))
            centered = bb.emit(relax.op.subtract(wide, relax.const(120, "int32")))
            out = bb.emit_output(bb.emit(relax.op.matmul(centered, relax.const(weight))))
        bb.emit_func_output(out)
    before = bb.get()
    after, counts = int8_kernels(before)
    assert counts == {"int8_matmul": 1} and "xzp=1;wpacked=1" in after.script()
    x = np.random.default_rng(2).integers(0, 256, (4, 16)).astype(np.uint8)
    outs = [relax.VirtualMachine(tvm.compile(m, target="llvm"), tvm.cpu())["main"](
        tvm.runtime.tensor(x)).numpy() for m in (before, after)]
    assert np.array_equal(outs[0], outs[1])
