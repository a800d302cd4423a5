"""QDQ groups fused into integer operators (:mod:`tvm_ollie.frontend.onnx_qdq`): on a model
``quantize_static`` writes in the QDQ format, the fused graph equals ONNX Runtime's own fusion
bit-exactly (both in ONNX Runtime and through TVM); the guards keep groups ONNX Runtime would
compute differently."""

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from onnx_op_cases import max_error, run_ort, run_tvm  # noqa: E402
from tvm_ollie.frontend.onnx_qdq import fuse_qdq  # noqa: E402
from tvm_ollie.native import int8_exact_products  # noqa: E402

SHAPE = (1, 4, 8, 8)


def _float_model(path: str) -> None:
    """Conv (bias) -> MaxPool -> Add (of two convs) -> MatMul -> Gemm: a group of each rule."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.standard_normal((8, 4, 3, 3)) * 0.2).astype(
        np.float32), "w1"),
             numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "b1"),
             numpy_helper.from_array((rng.standard_normal((8, 8, 1, 1)) * 0.3).astype(
                 np.float32), "w2"),
             numpy_helper.from_array((rng.standard_normal((4, 5)) * 0.5).astype(np.float32), "m"),
             numpy_helper.from_array((rng.standard_normal((10, 160)) * 0.1).astype(np.float32),
                                     "g"),
             numpy_helper.from_array(rng.standard_normal(10).astype(np.float32), "gb")]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("MaxPool", ["c1"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Conv", ["p", "w2"], ["c2"]),
             helper.make_node("Add", ["p", "c2"], ["s"]),
             helper.make_node("MatMul", ["s", "m"], ["mm"]),
             helper.make_node("Flatten", ["mm"], ["f"]),
             helper.make_node("Gemm", ["f", "g", "gb"], ["y"], transB=1)]
    graph = helper.make_graph(nodes, "qdq", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, SHAPE)], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, [1, 10])], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)


@pytest.fixture(scope="module")
def qdq_model(tmp_path_factory):
    from onnxruntime import quantization as q  # pylint: disable=import-outside-toplevel

    directory = tmp_path_factory.mktemp("qdq")
    source, target = str(directory / "float.onnx"), str(directory / "qdq.onnx")
    _float_model(source)
    rng = np.random.default_rng(1)
    batches = iter([{"x": rng.standard_normal(SHAPE).astype(np.float32)} for _ in range(4)])

    class Reader(q.CalibrationDataReader):
        def get_next(self):
            return next(batches, None)

    q.quantize_static(source, target, Reader(), quant_format=q.QuantFormat.QDQ, per_channel=True,
                      activation_type=q.QuantType.QUInt8, weight_type=q.QuantType.QInt8,
                      # 7-bit weights without VNNI: ONNX Runtime's u8 x s8 kernels add pairs of
                      # products in saturating int16 there (2.3 off TVM's exact int32 sums)
                      reduce_range=not int8_exact_products())
    return onnx.load(target)


def _feeds():
    return {"x": np.random.default_rng(3).standard_normal(SHAPE).astype(np.float32) * 2}


def _fused(model):
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    return copy, fuse_qdq(copy)


def test_every_group_fuses_and_equals_onnxruntime_fusion(qdq_model):
    fused, counts = _fused(qdq_model)
    assert counts == {"Conv": 2, "MaxPool": 1, "Add": 1, "MatMul": 1, "Gemm": 1}
    ops = [n.op_type for n in fused.graph.node]
    assert "Conv" not in ops and ops.count("QLinearConv") == 2 and "QLinearAdd" in ops
    assert "QGemm" in ops and "Gemm" not in ops
    onnx.checker.check_model(fused)
    feeds = _feeds()
    assert max_error(run_ort(fused, feeds), run_ort(qdq_model, feeds)) == 0


def test_qdq_model_through_tvm_equals_onnxruntime(qdq_model):
    feeds = _feeds()
    assert max_error(run_tvm(qdq_model, feeds), run_ort(qdq_model, feeds)) == 0


def _set_initializer(model, name, value):
    for i, tensor in enumerate(model.graph.initializer):
        if tensor.name == name:
            model.graph.initializer[i].CopyFrom(numpy_helper.from_array(value, name))
            return
    raise KeyError(name)


def test_bias_with_another_scale_keeps_the_float_conv(qdq_model):
    """QLinearConv reads the int32 bias at scale ``xs * ws``: a bias DQ at another scale is not
    that operator."""
    model = onnx.ModelProto()
    model.CopyFrom(qdq_model)
    conv = next(n for n in model.graph.node if n.op_type == "Conv" and len(n.input) == 3)
    bias_dq = next(n for n in model.graph.node if n.output[0] == conv.input[2])
    scale = numpy_helper.to_array(next(t for t in model.graph.initializer
                                       if t.name == bias_dq.input[1]))
    _set_initializer(model, bias_dq.input[1], (scale * 1.5).astype(np.float32))
    assert fuse_qdq(model).get("Conv") == 1  # the other conv (no bias) still fuses


def test_maxpool_between_different_parameters_stays(qdq_model):
    model = onnx.ModelProto()
    model.CopyFrom(qdq_model)
    pool = next(n for n in model.graph.node if n.op_type == "MaxPool")
    q = next(n for n in model.graph.node if pool.output[0] in n.input)
    scale = numpy_helper.to_array(next(t for t in model.graph.initializer
                                       if t.name == q.input[1]))
    model.graph.initializer.append(numpy_helper.from_array((scale * 2).astype(np.float32),
                                                           "other_scale"))
    q.input[1] = "other_scale"
    assert "MaxPool" not in fuse_qdq(model)


def test_float_result_read_twice_stays(qdq_model):
    model = onnx.ModelProto()
    model.CopyFrom(qdq_model)
    matmul = next(n for n in model.graph.node if n.op_type == "MatMul")
    model.graph.node.append(helper.make_node("Relu", [matmul.output[0]], ["extra"]))
    model.graph.output.append(helper.make_tensor_value_info("extra", TensorProto.FLOAT, None))
    assert "MatMul" not in fuse_qdq(model)
