"""The int8 rewrite with a zero point known at run time only (``DynamicQuantizeLinear`` before
``ConvInteger``/``MatMulInteger``, :mod:`tvm_ollie.transform.int8_kernels`): the weight split
into int8 parts, the bound over the zero point's range, and ONNX models through the pass and
through ``ollie.build`` against ONNX Runtime (the int32 results bit-exact), and the
DynamicQuantizeLSTM rule's products."""

import os
import sys

import numpy as np
import pytest
import tvm
from tvm import relax

import tvm_ollie as ollie
from tvm_ollie import native
from tvm_ollie.codegen import library as lib
from tvm_ollie.frontend.loader import load_onnx
from tvm_ollie.transform.int8_choice import INT8
from tvm_ollie.transform.int8_kernels import (MAX_PARTS, accumulator_bound, dynamic_bound,
                                              int8_kernels, int8_parts)

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "frontend"))
# pylint: disable=wrong-import-position
from test_onnx_decompose import dynamic_lstm_case  # noqa: E402

helper, numpy_helper, TensorProto = onnx.helper, onnx.numpy_helper, onnx.TensorProto


def _require_int8():
    if not native.available():
        pytest.skip(f"native library unavailable: {native.unavailable_reason()}")
    if not native.provides(lib.CONV2D_INT8):
        pytest.skip("the loaded native library predates the int8 kernels")


@pytest.mark.parametrize("low,high", [(-128, 127), (-64, 63)])
def test_int8_parts_sum_to_the_weight(low, high):
    w = np.random.default_rng(0).integers(-255, 256, (5, 3, 3, 3)).astype(np.int32)
    parts = int8_parts(w, low, high)
    assert parts is not None or high == 63  # [-255, 255] needs 3 parts of int8, 5 of [-64, 63]
    if parts is None:
        return
    assert len(parts) <= MAX_PARTS and all(p.dtype == np.int8 for p in parts)
    assert all(p.min() >= low and p.max() <= high for p in parts)
    assert np.array_equal(sum(p.astype(np.int64) for p in parts), w)


def test_int8_parts_of_a_fitting_weight_is_itself():
    w = np.array([[-128, 127], [0, 5]], np.int32)
    (part,) = int8_parts(w, -128, 127)
    assert np.array_equal(part, w)
    assert len(int8_parts(np.zeros((2, 2), np.int32), -128, 127)) == 1


def test_dynamic_bound_is_the_worst_zero_point():
    w = np.random.default_rng(1).integers(-128, 128, (4, 6)).astype(np.int32)
    brute = max(accumulator_bound(w, 1, 0, 255, z) for z in range(256))
    assert dynamic_bound(w, 1, 0, 255, 0, 255) == brute
    brute = max(accumulator_bound(w, 0, -128, 127, z) for z in range(-128, 128))
    assert dynamic_bound(w, 0, -128, 127, -128, 127) == brute


def _conv_integer_model(w_zp: int, x_type=TensorProto.UINT8, **conv):
    """``ConvInteger(x, W, x_zero_point, w_zp)`` with the source zero point a graph input
    (a scalar: a run-time value) and the uint8 weight's centered range set by ``w_zp``."""
    channels = 4 * conv.get("group", 1)
    w = np.random.default_rng(2).integers(0, 256, (6 * conv.get("group", 1), 4, 3, 3))
    x_info = helper.make_tensor_value_info("x", x_type, [1, channels, 7, 7])
    zp_info = helper.make_tensor_value_info("zp", x_type, [])
    node = helper.make_node("ConvInteger", ["x", "w", "zp", "w_zp"], ["y"], **conv)
    graph = helper.make_graph(
        [node], "g", [x_info, zp_info], [helper.make_tensor_value_info("y", TensorProto.INT32,
                                                                       None)],
        [numpy_helper.from_array(w.astype(np.uint8), "w"),
         numpy_helper.from_array(np.array(w_zp, np.uint8), "w_zp")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def _matmul_integer_model(b_zp: int):
    b = np.random.default_rng(3).integers(0, 256, (24, 10)).astype(np.uint8)
    graph = helper.make_graph(
        [helper.make_node("MatMulInteger", ["a", "b", "zp", "b_zp"], ["y"])], "g",
        [helper.make_tensor_value_info("a", TensorProto.UINT8, [3, 24]),
         helper.make_tensor_value_info("zp", TensorProto.UINT8, [])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, None)],
        [numpy_helper.from_array(b, "b"), numpy_helper.from_array(np.array(b_zp, np.uint8),
                                                                  "b_zp")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def _load(model):
    return load_onnx(model, None, simplifier="none")


def _run(mod, feeds) -> np.ndarray:
    """The first output of ``main`` built by TVM."""
    vm = relax.VirtualMachine(relax.build(mod, target="llvm"), tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(v) for v in feeds.values()])
    return (out if hasattr(out, "numpy") else out[0]).numpy()


def _vm(mod):
    """``main`` of ``mod`` built by TVM."""
    return relax.VirtualMachine(relax.build(mod, target="llvm"), tvm.cpu())["main"]


def _ort(model, feeds) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0]


def _feeds(shape, dtype, zp: int) -> dict:
    info = np.iinfo(dtype)
    x = np.random.default_rng(4).integers(info.min, info.max + 1, shape).astype(dtype)
    return {"x" if len(shape) == 4 else "a": x, "zp": np.array(zp, dtype)}


def _expected_parts(weight: np.ndarray, zero_point: int) -> int:
    """How many int8 parts the rule splits ``weight - zero_point`` into on this CPU (parts in
    ``[-64, 63]`` without VNNI, where oneDNN sums pairs of products in int16); 0 when more than
    :data:`MAX_PARTS` would be needed and the int32 form stays."""
    low, high = (-128, 127) if native.int8_exact_products() else (-64, 63)
    parts = int8_parts(weight.astype(np.int32) - zero_point, low, high)
    return 0 if parts is None else len(parts)


def _initializer(model, name: str) -> np.ndarray:
    return next(numpy_helper.to_array(t) for t in model.graph.initializer if t.name == name)


# w_zp 128: the centered weight fits int8 (one part; three of [-64, 63] without VNNI); 60: two
# parts (more than MAX_PARTS without VNNI); 0: [0, 255], three parts (same)
CONV_CASES = {
    "one-part": (128, {"pads": [1, 1, 1, 1]}),
    "two-parts-stride-2": (60, {"pads": [1, 0, 1, 2], "strides": [2, 2]}),
    "three-parts-groups": (0, {"group": 2, "dilations": [2, 2]}),
}


@pytest.mark.parametrize("name", sorted(CONV_CASES))
def test_conv_integer_with_a_run_time_zero_point_equals_onnxruntime(name):
    """The rewritten module (one int8 call per weight part, the zero point an operand) gives
    ONNX Runtime's int32 result for zero points across the range, and it is the rule that
    rewrote it."""
    _require_int8()
    w_zp, conv = CONV_CASES[name]
    model = _conv_integer_model(w_zp, **conv)
    mod = _load(model)
    after, counts = int8_kernels(mod)
    parts = _expected_parts(_initializer(model, "w"), w_zp)
    assert parts == ({128: 1, 60: 2, 0: 3}[w_zp] if native.int8_exact_products() else
                     {128: 3, 60: 0, 0: 0}[w_zp])
    assert counts.get("int8_conv2d_dynamic_zp") == (1 if parts else None), counts
    assert after["main"].script().count("tvm_ollie.cpu.conv2d_int8") == parts
    ours, theirs = _vm(after), _vm(mod)
    for zp in (0, 37, 255):
        feeds = _feeds((1, 4 * conv.get("group", 1), 7, 7), np.uint8, zp)
        args = [tvm.runtime.tensor(v) for v in feeds.values()]
        expected = _ort(model, feeds)
        assert np.array_equal(ours(*args).numpy(), expected)
        assert np.array_equal(theirs(*args).numpy(), expected)


@pytest.mark.parametrize("x_type, rewritten", [(TensorProto.INT8, False),
                                               (TensorProto.UINT8, True)])
def test_int8_source_without_vnni_keeps_the_int32_conv(x_type, rewritten, monkeypatch):
    """Without VNNI oneDNN halves the weights of an int8-source convolution: the run-time
    zero point rule keeps TVM's ConvInteger for it and still rewrites a uint8 source (the
    CPU's answer replaced, so that both kinds of CPU run the guard)."""
    _require_int8()
    monkeypatch.setattr(native, "int8_exact_products", lambda: False)
    _, counts = int8_kernels(_load(_conv_integer_model(128, x_type, pads=[1, 1, 1, 1])))
    assert counts.get("int8_conv2d_dynamic_zp") == (1 if rewritten else None), counts


@pytest.mark.parametrize("b_zp", [128, 0])
def test_matmul_integer_with_a_run_time_zero_point_equals_onnxruntime(b_zp):
    _require_int8()
    model = _matmul_integer_model(b_zp)
    after, counts = int8_kernels(_load(model))
    parts = _expected_parts(_initializer(model, "b"), b_zp)
    assert counts.get("int8_matmul_dynamic_zp") == (1 if parts else None), counts
    assert after["main"].script().count("tvm_ollie.cpu.matmul_int8") == parts
    for zp in (0, 200):
        feeds = _feeds((3, 24), np.uint8, zp)
        assert np.array_equal(_run(after, feeds), _ort(model, feeds))


def test_past_the_bound_the_int32_form_stays():
    """A weight whose accumulators could pass 2^24 for some zero point stays TVM's int32
    conv (the guard looks at the zero point's whole range, not at one value)."""
    _require_int8()
    w = np.full((2, 300, 3, 3), 127, np.int32)  # 127 * 2700 * 255 > 2^24
    assert dynamic_bound(w, 0, 0, 255, 0, 255) > 2 ** 24
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 300, 4, 4), "uint8"))
    z = relax.Var("z", relax.TensorType((), "uint8"))
    with bb.function("main", [x, z]):
        with bb.dataflow():
            centered = bb.emit(relax.op.subtract(bb.emit(relax.op.astype(x, "int32")),
                                                 bb.emit(relax.op.astype(z, "int32"))))
            out = bb.emit_output(bb.emit(relax.op.nn.conv2d(centered, relax.const(w))))
        bb.emit_func_output(out)
    _, counts = int8_kernels(bb.get())
    assert counts == {}


def test_dynamic_quantize_chain_through_the_build():
    """``DynamicQuantizeLinear -> ConvInteger -> Cast -> Mul`` (a dynamically quantized
    layer) through ``ollie.build`` with a timer that prefers the kernel: the decision isolates
    the unit with the zero point as a second input, the int8 form is kept, and the result
    equals TVM's build of the import bit for bit and ONNX Runtime's within its float
    rounding."""
    _require_int8()
    w = np.random.default_rng(5).integers(0, 256, (6, 3, 3, 3)).astype(np.uint8)
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["q", "s", "z"]),
             helper.make_node("ConvInteger", ["q", "w", "z", "w_zp"], ["acc"], pads=[1] * 4),
             helper.make_node("Cast", ["acc"], ["wide"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["wide", "s"], ["y"])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.array(100, np.uint8),
                                                                  "w_zp")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    mod = _load(model)
    ex, report = ollie.build(mod, target="llvm", trials=0, derive=False,
                             timer=lambda _m, label: 1e-6 if label.endswith(INT8) else 1e-3)
    assert report.inference_folds.get("int8_conv2d_dynamic_zp") == 1, report.inference_folds
    feeds = {"x": np.random.default_rng(6).standard_normal((1, 3, 8, 8)).astype(np.float32)}
    ours = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(feeds["x"])).numpy()
    assert np.array_equal(ours, _run(mod, feeds))
    np.testing.assert_allclose(ours, _ort(model, feeds), rtol=1e-5, atol=1e-5)


def test_dynamic_quantize_lstm_products_become_int8_kernels(tmp_path):
    """The DynamicQuantizeLSTM rule writes every step's quantized ``X`` and ``H`` as ``int32(q)
    - int32(z)`` of uint8 tensors: each product is an int8 matmul with a run-time zero point,
    and the rewritten module equals TVM's build of the import bit for bit and ONNX Runtime's
    kernel within its float rounding."""
    _require_int8()
    _, quantized, feeds = dynamic_lstm_case(tmp_path, "reverse-u8-no-initial-states")
    mod = _load(quantized)
    after, counts = int8_kernels(mod)
    # 5 steps: 5 input products and 4 recurrent ones (the zero initial state has none)
    assert counts.get("int8_matmul_dynamic_zp") == 9, counts
    ours = _run(after, feeds)
    assert np.array_equal(ours, _run(mod, feeds))
    session = ort.InferenceSession(quantized.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(ours, session.run(None, feeds)[0], atol=1e-5)
