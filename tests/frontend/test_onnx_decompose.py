"""The decompositions of ONNX operators TVM's importer lacks, against ONNX Runtime.

Two levels: every attribute combination runs the decomposed model in ONNX Runtime against the
original one (milliseconds each: the rewrite itself is checked), and a representative of each
operator is imported by TVM, built for llvm and run in the Relax VM (the path users take); the
full matrix through TVM is marked slow.
"""

from __future__ import annotations

import collections
import os
import sys

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

sys.path.insert(0, os.path.dirname(__file__))
# pylint: disable=wrong-import-position
from onnx_op_cases import (  # noqa: E402
    conv_integer_case,
    cumprod_case,
    cumprod_reference,
    integer_reference,
    loss_case,
    matmul_integer_case,
    max_error,
    qlinear_binary_case,
    qlinear_conv_case,
    qlinear_matmul_case,
    recurrent_case,
    reverse_sequence_case,
    rotary_case,
    run_ort,
    run_tvm,
    run_tvm_with_shapes,
    unary_case,
    window_case,
)

from tvm_ollie.frontend.loader import ModelLoadError, load_onnx  # noqa: E402
from tvm_ollie.frontend.onnx_decompose import decompose_onnx  # noqa: E402
from tvm_ollie.frontend.onnx_native import unrolled_layers  # noqa: E402
from tvm_ollie.frontend.onnx_prep import prepare_onnx  # noqa: E402
from tvm_ollie.native import int8_exact_products  # noqa: E402

#: Recurrent attribute combinations (layout 0; layout 1 is compared with layout 0 below, since
#: ONNX Runtime runs only layout 0).
RECURRENT = {
    "lstm-forward": ("LSTM", {}),
    "lstm-reverse-no-bias-no-state": ("LSTM", {"direction": "reverse", "bias": False,
                                               "initial": False}),
    "lstm-bidi-peepholes-clip-input-forget": (
        "LSTM", {"direction": "bidirectional", "peepholes": True, "clip": 0.7,
                 "input_forget": 1}),
    "lstm-bidi-sequence-lens": ("LSTM", {"direction": "bidirectional", "lens": [4, 2, 1]}),
    "lstm-activations": ("LSTM", {"activations": ["HardSigmoid", "LeakyRelu", "ScaledTanh"],
                                  "activation_alpha": [0.3, 0.2, 0.8],
                                  "activation_beta": [0.4, 1.3]}),
    "lstm-bidi-activations": ("LSTM", {
        "direction": "bidirectional",
        "activations": ["Sigmoid", "Affine", "Softsign", "HardSigmoid", "Tanh", "Elu"],
        "activation_alpha": [0.5, 0.3, 1.1], "activation_beta": [0.2, 0.6]}),
    "gru-bidi": ("GRU", {"direction": "bidirectional"}),
    "gru-bidi-linear-before-reset": ("GRU", {"direction": "bidirectional",
                                             "linear_before_reset": 1}),
    "gru-reverse-sequence-lens": ("GRU", {"direction": "reverse", "lens": [1, 4, 3],
                                          "linear_before_reset": 1}),
    "gru-activations-clip": ("GRU", {"activations": ["Elu", "Affine"],
                                     "activation_alpha": [0.5, 2.0], "activation_beta": [0.1],
                                     "clip": 1.0, "initial": False}),
    "rnn-forward": ("RNN", {}),
    "rnn-bidi-activations": ("RNN", {"direction": "bidirectional",
                                     "activations": ["ThresholdedRelu", "Softsign"],
                                     "activation_alpha": [0.1]}),
    "rnn-softplus": ("RNN", {"activations": ["Softplus"], "bias": False}),
    "rnn-relu-sequence-lens": ("RNN", {"activations": ["Relu"], "lens": [2, 4, 3]}),
}

#: One two-step layer through TVM in the fast suite (a few seconds); the others (~10 s builds)
#: are slow.
RECURRENT_TVM = [
    "rnn-relu-sequence-lens",
    pytest.param("rnn-bidi-activations", marks=pytest.mark.slow),
    pytest.param("lstm-bidi-peepholes-clip-input-forget", marks=pytest.mark.slow),
    pytest.param("gru-reverse-sequence-lens", marks=pytest.mark.slow),
]


def _decomposed(model):
    rewritten, info = decompose_onnx(model)
    left = [n.op_type for n in rewritten.graph.node if n.op_type == model.graph.node[0].op_type]
    assert not left, f"{left} not decomposed: {info.refused}"
    return rewritten, info


def _small(op, attrs, **extra):
    return recurrent_case(op, **{"seq": 2, "batch": 2, "hidden": 3, "size": 2, **attrs,
                                 **extra})


@pytest.mark.parametrize("name", sorted(RECURRENT))
def test_recurrent_rewrite_matches_ort(name):
    op, attrs = RECURRENT[name]
    model, feeds = recurrent_case(op, **attrs)
    rewritten, _ = _decomposed(model)
    assert max_error(run_ort(rewritten, feeds), run_ort(model, feeds)) < 1e-5


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
def test_recurrent_layout_1_matches_layout_0(op, direction):
    model, feeds = recurrent_case(op, direction=direction)
    batchwise, _ = recurrent_case(op, direction=direction, layout=1)
    for source, target in zip(model.graph.initializer, batchwise.graph.initializer):
        target.CopyFrom(source)
    swapped = {"x": feeds["x"].transpose(1, 0, 2)}
    swapped.update({k: v.transpose(1, 0, 2) for k, v in feeds.items() if k != "x"})
    rewritten, _ = _decomposed(batchwise)
    ours = run_ort(rewritten, swapped)
    reference = run_ort(model, feeds)
    back = [ours[0].transpose(1, 2, 0, 3)] + [y.transpose(1, 0, 2) for y in ours[1:]]
    assert max_error(back, reference) < 1e-5


@pytest.mark.parametrize("name", RECURRENT_TVM)
def test_recurrent_through_tvm_matches_ort(name):
    op, attrs = RECURRENT[name]
    model, feeds = _small(op, attrs, **({"lens": [2, 1]} if "lens" in attrs else {}))
    assert max_error(run_tvm(model, feeds), run_ort(model, feeds)) < 1e-5


@pytest.mark.slow
def test_crnn_export_with_dynamic_width_imports(tmp_path):
    """A conv backbone then a 2-layer bidirectional LSTM, exported with dynamic axes: the width
    fixed by the shapes, both layers unrolled (the native whole-layer kernel off), the result
    ONNX Runtime's."""
    pytest.importorskip("torch")
    from onnx_op_cases import crnn_model_path  # pylint: disable=import-outside-toplevel

    path = crnn_model_path(str(tmp_path))
    feeds = {"x": np.random.default_rng(0).standard_normal((1, 1, 16, 32)).astype(np.float32)}
    with unrolled_layers():
        _, info = prepare_onnx(onnx.load(path), {"x": [1, 1, 16, 32]})
        ours = run_tvm_with_shapes(onnx.load(path), feeds, {"x": [1, 1, 16, 32]})
    assert info.decomposed.replaced == {"LSTM": 2}
    assert sum(info.decomposed.unrolled_steps.values()) == 2 * 2 * 16
    assert max_error(ours, run_ort(onnx.load(path), feeds)) < 1e-5


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(RECURRENT))
def test_recurrent_matrix_through_tvm(name):
    op, attrs = RECURRENT[name]
    model, feeds = recurrent_case(op, **attrs)
    assert max_error(run_tvm(model, feeds), run_ort(model, feeds)) < 1e-5


def test_unrolled_steps_and_gemms():
    """Per step and direction the specification's two MatMuls: the input projection (reading
    the step's slice of X and the direction's one W^T) and the recurrent one. Batching the input
    projections is the optimizer's shared-weight groups' job, not the importer's."""
    model, _ = recurrent_case("LSTM", direction="bidirectional", seq=4, batch=3, size=3)
    rewritten, info = _decomposed(model)
    assert info.unrolled_steps == {"LSTM:y": 8}
    assert "8 recurrent step(s) unrolled" in info.summary()
    counts = collections.Counter(n.op_type for n in rewritten.graph.node)
    assert counts["MatMul"] == 8 + 8
    shapes = {t.name: tuple(t.dims) for t in rewritten.graph.initializer}
    weights = collections.Counter(n.input[1] for n in rewritten.graph.node
                                  if n.op_type == "MatMul" and n.input[1] in shapes and
                                  shapes[n.input[1]] == (3, 4 * 4))  # fmt: skip
    assert sorted(weights.values()) == [4, 4]  # one W^T per direction, read by its 4 steps


def test_full_sequence_lens_is_the_plain_case():
    model, _ = recurrent_case("GRU", lens=[4, 4, 4])
    lens = model.graph.input.pop(1)
    model.graph.initializer.append(onnx.numpy_helper.from_array(np.full(3, 4, np.int32),
                                                                lens.name))  # fmt: skip
    rewritten, _ = _decomposed(model)
    assert not [n for n in rewritten.graph.node if n.op_type in ("Where", "Less")]


def test_refused_layer_keeps_the_one_line_error():
    model, _ = recurrent_case("RNN", activations=["Gelu"])
    rewritten, info = decompose_onnx(model)
    assert rewritten.graph.node[0].op_type == "RNN"
    assert "Gelu" in info.refused["RNN"]
    with pytest.raises(ModelLoadError, match="operator RNN .* not decomposed: activation Gelu"):
        load_onnx(model, simplifier="none")


def test_prepare_onnx_reports_the_decomposition():
    model, _ = recurrent_case("RNN", seq=2)
    _, info = prepare_onnx(model, simplifier="none")
    assert info.decomposed.replaced == {"RNN": 1}
    assert any("RNN x1" in note for note in info.notes)


# ---------------------------------------------------------------------------------------------
# Integer operators: through TVM, against ONNX Runtime and the specification's arithmetic
# ---------------------------------------------------------------------------------------------

#: name -> (case, whether ONNX Runtime runs it: it lacks per-channel ConvInteger zero points
#: and per-row MatMulInteger zero points).
INTEGER = {
    "conv-integer-u8s8-per-channel": (lambda: conv_integer_case(), False),
    "conv-integer-s8s8-group-pads-strides": (
        lambda: conv_integer_case(np.int8, np.int8, False, group=2, pads=[1, 1, 1, 1],
                                  strides=[2, 2]), True),
    "matmul-integer-per-axis": (lambda: matmul_integer_case(), False),
    "matmul-integer-per-tensor": (lambda: matmul_integer_case(np.int8, np.uint8, False), True),
    "qlinear-conv-u8s8-per-channel-bias": (lambda: qlinear_conv_case(), True),
    "qlinear-conv-s8s8-saturating": (
        lambda: qlinear_conv_case(np.int8, np.int8, False, y_scale=0.005, pads=[1, 1, 1, 1]),
        True),
    "qlinear-conv-u8u8-no-bias": (
        lambda: qlinear_conv_case(np.uint8, np.uint8, True, bias=False, y_scale=1.0), True),
    "qlinear-matmul-u8s8": (lambda: qlinear_matmul_case(), True),
    "qlinear-matmul-s8s8-per-column-saturating": (
        lambda: qlinear_matmul_case(np.int8, np.int8, True, y_scale=0.002), True),
    "qlinear-matmul-u8s8-full-range": (lambda: qlinear_matmul_case(full_range=True), False),
}


#: Integer cases through TVM in the fast suite (a 3-7 s build each; the rest are slow).
FAST_INTEGER = ("conv-integer-u8s8-per-channel", "matmul-integer-per-tensor")


@pytest.mark.parametrize("name", [
    n if n in FAST_INTEGER else pytest.param(n, marks=pytest.mark.slow) for n in sorted(INTEGER)
])
def test_integer_through_tvm_is_exact(name):
    make, ort_runs = INTEGER[name]
    model, feeds = make()
    ours = run_tvm(model, feeds)
    assert max_error(ours, integer_reference(model, feeds)) == 0
    if ort_runs:
        assert max_error(ours, run_ort(model, feeds)) == 0
    assert ours[0].dtype == integer_reference(model, feeds)[0].dtype


@pytest.mark.slow
def test_saturation_reaches_the_type_limits():
    model, feeds = qlinear_conv_case(np.int8, np.int8, False, y_scale=0.005)
    (out,) = run_tvm(model, feeds)
    assert out.min() == -128 and out.max() == 127


# ---------------------------------------------------------------------------------------------
# Small operators and schema functions
# ---------------------------------------------------------------------------------------------

SMALL = {
    "lp-normalization-p2": lambda: unary_case("LpNormalization", axis=1),
    "lp-normalization-p1": lambda: unary_case("LpNormalization", p=1),
    "reverse-sequence-time0": lambda: reverse_sequence_case(),
    "reverse-sequence-batch0-constant": lambda: reverse_sequence_case(1, 0, constant_lens=True),
    "celu-opset17-context-function": lambda: unary_case("Celu", alpha=0.7),
    "swish-opset24-function": lambda: unary_case("Swish", opset=24, alpha=1.3),
    "hann-window-function": lambda: window_case(),
    "hamming-window-function-symmetric": lambda: window_case("HammingWindow", 7, 0),
    "blackman-window-function": lambda: window_case("BlackmanWindow"),
    "softmax-cross-entropy-context-function": lambda: loss_case(),
    "nll-loss-sum-context-function": lambda: loss_case("NegativeLogLikelihoodLoss", "sum"),
    "rotary-embedding-context-function": lambda: rotary_case(),
    "rotary-embedding-interleaved": lambda: rotary_case(1),
    "qlinear-add-u8": lambda: qlinear_binary_case(),
    "qlinear-mul-s8": lambda: qlinear_binary_case("QLinearMul", np.int8),
}


@pytest.mark.parametrize("name", sorted(SMALL))
def test_small_ops_rewrite_matches_ort(name):
    model, feeds = SMALL[name]()
    rewritten, info = _decomposed(model)
    assert info.replaced or info.inlined
    assert max_error(run_ort(rewritten, feeds), run_ort(model, feeds)) < 1e-6


@pytest.mark.parametrize("name", [
    "celu-opset17-context-function",
    pytest.param("lp-normalization-p2", marks=pytest.mark.slow),
    pytest.param("reverse-sequence-time0", marks=pytest.mark.slow),
    pytest.param("rotary-embedding-context-function", marks=pytest.mark.slow),
    pytest.param("softmax-cross-entropy-context-function", marks=pytest.mark.slow),
    pytest.param("qlinear-add-u8", marks=pytest.mark.slow),
])
def test_small_ops_through_tvm(name):
    model, feeds = SMALL[name]()
    assert max_error(run_tvm(model, feeds), run_ort(model, feeds)) < 1e-6


def test_lp_normalization_of_zeros_is_zero():
    model, _ = unary_case("LpNormalization", shape=(2, 3))
    rewritten, _ = _decomposed(model)
    (out,) = run_ort(rewritten, {"x": np.zeros((2, 3), np.float32)})
    assert not np.any(out)


@pytest.mark.parametrize("axis,exclusive,reverse", [(1, 0, 0), (1, 1, 0), (2, 0, 1), (0, 1, 1)])
def test_cumprod(axis, exclusive, reverse):
    model, feeds = cumprod_case(axis, exclusive, reverse)
    rewritten, _ = _decomposed(model)
    expected = cumprod_reference(feeds["x"], axis, exclusive, reverse)
    assert max_error(run_ort(rewritten, feeds), [expected]) < 1e-6


@pytest.mark.slow
def test_cumprod_through_tvm():
    model, feeds = cumprod_case(1, 1, 1)
    assert max_error(run_tvm(model, feeds), [cumprod_reference(feeds["x"], 1, 1, 1)]) < 1e-6


# ---------------------------------------------------------------------------------------------
# A quantized export (onnxruntime.quantization) of a small conv + relu + linear model
# ---------------------------------------------------------------------------------------------


def _quantized(tmp_path, kind):
    # pylint: disable=import-outside-toplevel
    pytest.importorskip("torch")
    from onnxruntime import quantization as q

    from onnx_op_cases import calibration_inputs, quantizable_model_path

    source = quantizable_model_path(str(tmp_path))
    target = str(tmp_path / f"{kind}.onnx")
    if kind.startswith("dynamic"):
        q.quantize_dynamic(source, target, weight_type=q.QuantType.QInt8 if kind == "dynamic"
                           else q.QuantType.QUInt8, per_channel=kind != "dynamic")  # fmt: skip
    else:

        class _Reader(q.CalibrationDataReader):
            def __init__(self):
                self.inputs = iter(calibration_inputs())

            def get_next(self):
                return next(self.inputs, None)

        fmt = q.QuantFormat.QOperator if kind == "static-qoperator" else q.QuantFormat.QDQ
        q.quantize_static(source, target, _Reader(), quant_format=fmt,
                          per_channel=kind == "static-qdq")  # fmt: skip
    return onnx.load(target)


@pytest.mark.slow  # torch export, quantization, simplification and a build: ~20 s each
@pytest.mark.parametrize("kind", [
    "dynamic-per-channel",
    "dynamic",
    "static-qoperator",
    "static-qdq",
])
def test_quantized_export_imports_and_matches_ort(tmp_path, kind):
    """Integer paths (DynamicQuantizeLinear + ConvInteger/MatMulInteger; QLinearConv + QGemm +
    QLinearAdd) match ONNX Runtime to float rounding; QDQ matches the graph as written (ONNX
    Runtime unoptimized) within one output step and its fused integer kernels within the int8
    tolerance (they saturate u8s8 pairs in int16, see onnx_op_cases._weight_range)."""
    model = _quantized(tmp_path, kind)
    feeds = {"x": np.random.default_rng(3).standard_normal((1, 3, 6, 6)).astype(np.float32)}
    ours = run_tvm(model, feeds, simplifier="auto")
    as_written, fused = run_ort(model, feeds, optimize=False), run_ort(model, feeds)
    largest = float(np.abs(as_written[0]).max())
    if kind == "static-qdq":
        assert max_error(ours, as_written) <= 0.01 * largest
        assert max_error(ours, fused) <= 0.05 * largest
    else:
        assert max_error(ours, as_written) <= 1e-5 * largest
        assert max_error(ours, fused) <= 1e-5 * largest


def test_unknown_operator_is_left_for_the_loader():
    model, _ = unary_case("Relu")
    model.graph.node[0].op_type = "NoSuchOp"
    rewritten, info = decompose_onnx(model)
    assert rewritten.graph.node[0].op_type == "NoSuchOp" and not info.summary()


def test_dynamic_inputs_without_shapes_say_how_to_decompose():
    model, _ = recurrent_case("RNN", seq=2)
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "seq"
    with pytest.raises(ModelLoadError, match="operator RNN .* not decomposed: .* --shape"):
        load_onnx(model)


#: DynamicQuantizeLSTM cases: ``quantize_dynamic`` of an LSTM (ONNX Runtime's own quantizer),
#: (direction, weight type, per channel, LSTM case options).
DYNAMIC_LSTM = {
    "forward-s8": ("forward", "QInt8", False, {}),
    "bidirectional-s8-per-channel": ("bidirectional", "QInt8", True, {}),
    "reverse-u8-no-initial-states": ("reverse", "QUInt8", False, {"initial": False}),
    "bidirectional-batch-2-peepholes": ("bidirectional", "QInt8", False,
                                        {"batch": 2, "peepholes": True}),
}


def dynamic_lstm_case(tmp_path, name):
    """The ``DYNAMIC_LSTM`` case ``name``: the float LSTM, its quantized model, the feeds."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    direction, weight_type, per_channel, extra = DYNAMIC_LSTM[name]
    model, feeds = recurrent_case("LSTM", direction=direction, seq=5, size=6, hidden=8,
                                  **{"batch": 1, **extra})
    source, target = str(tmp_path / "lstm.onnx"), str(tmp_path / "q.onnx")
    onnx.save(model, source)
    # Without VNNI ONNX Runtime's u8 x s8 kernels add pairs of products in saturating int16:
    # its quantizer's reduce_range (7-bit weights) is what it recommends there, and keeps both
    # of its kernels (DynamicQuantizeLSTM and the decomposition's MatMulInteger) exact.
    quantize_dynamic(source, target, weight_type=getattr(QuantType, weight_type),
                     per_channel=per_channel, op_types_to_quantize=["LSTM"],
                     reduce_range=not int8_exact_products())
    quantized = onnx.load(target)
    assert [n.op_type for n in quantized.graph.node] == ["DynamicQuantizeLSTM"]
    return model, quantized, feeds


@pytest.mark.parametrize("name", sorted(DYNAMIC_LSTM))
def test_dynamic_quantize_lstm_rewrite_matches_ort(tmp_path, name):
    """The decomposition (X and every step's H quantized as ONNX Runtime does) run by ONNX
    Runtime equals ONNX Runtime's DynamicQuantizeLSTM kernel; the float LSTM does not (the
    quantization is what is reproduced). ONNX Runtime with one intra-op thread: with more,
    its kernel splits a batch of 2+ rows between threads and quantizes each part's ``H``
    apart, so its own output depends on its thread count (2.5e-3 here); the decomposition is
    its one-thread arithmetic, one ``H`` quantization per step and direction."""
    model, quantized, feeds = dynamic_lstm_case(tmp_path, name)
    rewritten, info = decompose_onnx(quantized)
    assert "DynamicQuantizeLSTM" not in [n.op_type for n in rewritten.graph.node], info
    reference = run_ort(quantized, feeds, threads=1)
    assert max_error(run_ort(rewritten, feeds, threads=1), reference) < 1e-6
    assert max_error(run_ort(model, feeds, threads=1), reference) > 1e-3


@pytest.mark.parametrize("name", ["bidirectional-s8-per-channel",
                                  "reverse-u8-no-initial-states"])
def test_dynamic_quantize_lstm_through_tvm_matches_ort(tmp_path, name):
    _, quantized, feeds = dynamic_lstm_case(tmp_path, name)
    assert max_error(run_tvm(quantized, feeds), run_ort(quantized, feeds, threads=1)) < 1e-5


def test_dynamic_quantize_lstm_guard_refuses_mixed_zero_points(tmp_path):
    """ONNX Runtime reads one weight zero point per direction: others are refused."""
    _, quantized, _ = dynamic_lstm_case(tmp_path, "bidirectional-s8-per-channel")
    for init in quantized.graph.initializer:
        if init.name.startswith("W") and init.name.endswith("zero_point"):
            zps = onnx.numpy_helper.to_array(init).copy()
            zps.reshape(-1)[-1] = 3
            init.CopyFrom(onnx.numpy_helper.from_array(zps, init.name))
    _, info = decompose_onnx(quantized)
    assert any("zero points differ" in why for why in info.refused.values()), info.refused


def _qlinear_lookup_case(op, dtype, x_scale, x_zp, y_scale, y_zp, alpha):
    """One QLinearLeakyRelu/QLinearSigmoid (com.microsoft) over every value of ``dtype`` (a
    16x16 input)."""
    from onnx import TensorProto, helper

    elem = TensorProto.UINT8 if dtype == np.uint8 else TensorProto.INT8
    inits = [onnx.numpy_helper.from_array(np.array(v, t), n) for n, v, t in (
        ("xs", x_scale, np.float32), ("xz", x_zp, dtype), ("ys", y_scale, np.float32),
        ("yz", y_zp, dtype))]
    extra = {"alpha": alpha} if op == "QLinearLeakyRelu" else {}
    node = helper.make_node(op, ["x", "xs", "xz", "ys", "yz"], ["y"], domain="com.microsoft",
                            **extra)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", elem, [16, 16])],
                              [helper.make_tensor_value_info("y", elem, [16, 16])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = min(model.ir_version, 10)
    info = np.iinfo(dtype)
    x = np.arange(info.min, info.max + 1).astype(dtype).reshape(16, 16)
    return model, {"x": x}


@pytest.mark.parametrize("op", ["QLinearLeakyRelu", "QLinearSigmoid"])
@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_qlinear_lookup_table_equals_ort_on_every_value(op, dtype):
    """The table is ONNX Runtime's, bit for bit, for every 8-bit input and 12 random scale and
    zero-point sets (saturating ones among them); through TVM for the first. (QLinearSigmoid:
    ONNX Runtime's own logistic, its FMA kernel, reproduced in numpy.)"""
    rng = np.random.default_rng(7)
    info = np.iinfo(dtype)
    for k in range(12):
        params = (float(rng.uniform(0.002, 0.1)), int(rng.integers(info.min, info.max + 1)),
                  float(rng.uniform(0.001, 0.1)), int(rng.integers(info.min, info.max + 1)),
                  float(rng.uniform(0.0, 0.5)))
        if op == "QLinearSigmoid":  # outputs in [0, 1]: scales that use the 8-bit range
            params = params[:2] + (float(rng.uniform(0.5, 1.5)) / 255, params[3], 0.0)
        model, feeds = _qlinear_lookup_case(op, dtype, *params)
        rewritten, info_ = decompose_onnx(model)
        assert [n.op_type for n in rewritten.graph.node if n.op_type == op] == [], info_
        reference = run_ort(model, feeds)[0]
        assert np.array_equal(run_ort(rewritten, feeds)[0], reference), params
        if k == 0:
            ours = run_tvm(model, feeds)[0]
            assert ours.dtype == reference.dtype and np.array_equal(ours, reference)


def _qlinear_gap_case(dtype, shape, x_scale, x_zp, y_scale, y_zp, seed):
    from onnx import TensorProto, helper

    elem = TensorProto.UINT8 if dtype == np.uint8 else TensorProto.INT8
    inits = [onnx.numpy_helper.from_array(np.array(v, t), n) for n, v, t in (
        ("xs", x_scale, np.float32), ("xz", x_zp, dtype), ("ys", y_scale, np.float32),
        ("yz", y_zp, dtype))]
    node = helper.make_node("QLinearGlobalAveragePool", ["x", "xs", "xz", "ys", "yz"], ["y"],
                            domain="com.microsoft", channels_last=0)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", elem, shape)],
                              [helper.make_tensor_value_info("y", elem, shape[:2] + [1, 1])],
                              inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = min(model.ir_version, 10)
    info = np.iinfo(dtype)
    x = np.random.default_rng(seed).integers(info.min, info.max + 1, shape).astype(dtype)
    return model, {"x": x}


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_qlinear_global_average_pool_equals_ort(dtype):
    """MLAS's sum, multiplier and rounding, bit for bit against ONNX Runtime: 10 random
    scale/zero-point sets and shapes (odd image sizes, saturating outputs); through TVM for the
    first."""
    rng = np.random.default_rng(11)
    info = np.iinfo(dtype)
    for k in range(10):
        shape = [int(rng.integers(1, 3)), int(rng.integers(1, 20)), int(rng.integers(1, 9)),
                 int(rng.integers(1, 9))]
        params = (float(rng.uniform(0.005, 0.1)), int(rng.integers(info.min, info.max + 1)),
                  float(rng.uniform(0.005, 0.1)), int(rng.integers(info.min, info.max + 1)))
        model, feeds = _qlinear_gap_case(dtype, shape, *params, seed=k)
        rewritten, info_ = decompose_onnx(model)
        assert "QLinearGlobalAveragePool" not in [n.op_type for n in rewritten.graph.node], info_
        reference = run_ort(model, feeds)[0]
        assert np.array_equal(run_ort(rewritten, feeds)[0], reference), (shape, params)
        if k == 0:
            ours = run_tvm(model, feeds)[0]
            assert ours.dtype == reference.dtype and np.array_equal(ours, reference)
