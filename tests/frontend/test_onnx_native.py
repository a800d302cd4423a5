"""ONNX LSTM layers imported as one native kernel call (``tvm_ollie.LSTMLayer``), against ONNX
Runtime; the attributes the kernel does not reproduce keep the unrolled steps."""

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
    crnn_model_path,
    max_error,
    recurrent_case,
    run_ort,
    run_tvm,
    run_tvm_with_shapes,
)

from tvm_ollie import native  # noqa: E402
from tvm_ollie.frontend.loader import load_onnx  # noqa: E402
from tvm_ollie.frontend.onnx_decompose import decompose_onnx  # noqa: E402
from tvm_ollie.frontend.onnx_prep import prepare_onnx  # noqa: E402
from tvm_ollie.frontend.onnx_native import (  # noqa: E402
    DOMAIN,
    LSTM_KERNEL,
    LSTM_LAYER,
    unrolled_layers,
)


@pytest.fixture(autouse=True)
def _native():
    if not native.provides(LSTM_KERNEL):
        pytest.skip("native library without lstm")


def _without_y_c(model, keep=("y", "y_h")):
    """The model with only the outputs ``keep`` (``Y_c`` then unread, as exporters leave it)."""
    kept = [o for o in model.graph.output if o.name in keep]
    del model.graph.output[:]
    model.graph.output.extend(kept)
    return model


def _ops(model):
    return collections.Counter(n.op_type for n in model.graph.node)


@pytest.mark.parametrize("direction,initial,layout", [
    ("forward", True, 0), ("reverse", False, 0), ("bidirectional", True, 0),
    ("bidirectional", False, 1)])
def test_whole_layer_matches_ort(direction, initial, layout):
    """Y and Y_h, batch 3, through TVM's build against ONNX Runtime (layout 1 against the
    layout-0 model on transposed tensors: ONNX Runtime runs layout 0 only)."""
    model, feeds = recurrent_case("LSTM", direction=direction, initial=initial, seq=4, batch=3,
                                  size=5, hidden=6)  # fmt: skip
    model = _without_y_c(model)
    rewritten, info = decompose_onnx(model if not layout else _layout_1(model, direction,
                                                                        initial))
    assert _ops(rewritten)[LSTM_LAYER] == 1 and "LSTM" not in _ops(rewritten)
    assert info.replaced == {"LSTM": 1} and not info.unrolled_steps
    assert any(o.domain == DOMAIN for o in rewritten.opset_import)
    reference = run_ort(model, feeds)
    if not layout:
        assert max_error(run_tvm(model, feeds), reference) < 1e-5
        return
    swapped = {k: v.transpose(1, 0, 2) for k, v in feeds.items()}
    ours = run_tvm(_layout_1(model, direction, initial), swapped)
    back = [ours[0].transpose(1, 2, 0, 3), ours[1].transpose(1, 0, 2)]
    assert max_error(back, reference) < 1e-5


def _layout_1(model, direction, initial):
    """The same layer with ``layout = 1`` (batch first), the same weights."""
    batchwise, _ = recurrent_case("LSTM", direction=direction, initial=initial, seq=4, batch=3,
                                  size=5, hidden=6, layout=1)  # fmt: skip
    for source, target in zip(model.graph.initializer, batchwise.graph.initializer):
        target.CopyFrom(source)
    return _without_y_c(batchwise)


def test_imported_module_calls_the_kernel_once():
    model, _ = recurrent_case("LSTM", direction="bidirectional", seq=6, batch=1)
    text = load_onnx(_without_y_c(model, ("y",)), None, simplifier="none")["main"].script()
    assert text.count(LSTM_KERNEL) == 1 and "R.matmul" not in text


@pytest.mark.parametrize("why,extra", [
    ("Y_c", {}), ("clip", {"clip": 0.5}), ("peepholes", {"peepholes": True}),
    ("lens", {"lens": [4, 2, 1]}),
    ("activations", {"activations": ["Sigmoid", "Tanh", "Relu"]})])
def test_refused_attributes_keep_the_unrolled_steps(why, extra):
    model, _ = recurrent_case("LSTM", **extra)
    if why != "Y_c":
        model = _without_y_c(model)
    rewritten, info = decompose_onnx(model)
    assert LSTM_LAYER not in _ops(rewritten) and info.unrolled_steps == {"LSTM:y": 4}


def test_unrolled_layers_turns_the_kernel_off():
    model, feeds = recurrent_case("LSTM", direction="bidirectional")
    model = _without_y_c(model)
    with unrolled_layers():
        rewritten, info = decompose_onnx(model)
        ours = run_tvm(model, feeds)
    assert LSTM_LAYER not in _ops(rewritten) and info.unrolled_steps == {"LSTM:y": 8}
    assert max_error(ours, run_ort(model, feeds)) < 1e-5


@pytest.mark.parametrize("direction,weight_type,per_channel,extra", [
    ("bidirectional", "QInt8", True, {}),
    ("reverse", "QUInt8", False, {"initial": False}),
    ("forward", "QInt8", False, {"batch": 2})])
def test_dynamic_quantize_lstm_whole_layer_matches_ort(tmp_path, direction, weight_type,
                                                       per_channel, extra):
    """ONNX Runtime's own quantizer's DynamicQuantizeLSTM (``Y_c`` unread) as one kernel call:
    equal to ONNX Runtime's one-thread kernel (its arithmetic: one ``H`` quantization per step
    and direction), the integer sums exact."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    model, feeds = recurrent_case("LSTM", direction=direction, seq=5, size=6, hidden=8,
                                  **{"batch": 1, **extra})
    source, target = str(tmp_path / "lstm.onnx"), str(tmp_path / "q.onnx")
    onnx.save(_without_y_c(model), source)
    # 7-bit weights without VNNI (ONNX Runtime's advice there): its reference kernel adds
    # pairs of u8 x s8 products in saturating int16 otherwise.
    quantize_dynamic(source, target, weight_type=getattr(QuantType, weight_type),
                     per_channel=per_channel, op_types_to_quantize=["LSTM"],
                     reduce_range=not native.int8_exact_products())
    quantized = onnx.load(target)
    rewritten, info = decompose_onnx(quantized)
    assert _ops(rewritten)[LSTM_LAYER] == 1 and not info.unrolled_steps
    reference = run_ort(quantized, feeds, threads=1)
    assert max_error(run_tvm(quantized, feeds), reference) < 1e-5
    assert max_error(run_ort(model, feeds, threads=1), reference) > 1e-3  # it is quantized


@pytest.mark.slow
def test_crnn_export_layers_are_kernel_calls(tmp_path):
    """The 2-layer bidirectional LSTM of an exported CRNN (``Y_h``, ``Y_c`` unread): both layers
    one kernel call each, nothing unrolled, the result ONNX Runtime's."""
    pytest.importorskip("torch")
    path = crnn_model_path(str(tmp_path))
    feeds = {"x": np.random.default_rng(0).standard_normal((1, 1, 16, 32)).astype(np.float32)}
    prepared, info = prepare_onnx(onnx.load(path), {"x": [1, 1, 16, 32]})
    assert info.decomposed.replaced == {"LSTM": 2} and not info.decomposed.unrolled_steps
    assert _ops(prepared)[LSTM_LAYER] == 2
    ours = run_tvm_with_shapes(onnx.load(path), feeds, {"x": [1, 1, 16, 32]})
    assert max_error(ours, run_ort(onnx.load(path), feeds)) < 1e-5
