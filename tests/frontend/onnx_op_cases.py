"""Tiny one-operator ONNX models for the operators TVM's importer lacks, with their inputs.

Each case builder returns ``(model, feeds)``: a model built with ``onnx.helper`` (weights as
initializers, random values from a fixed seed) and the inputs to run it on. Used by
``test_onnx_decompose.py`` and by ``onnx_operator_table.py`` (the table in
``docs/onnx-operators.md``).
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

Case = Tuple[object, Dict[str, np.ndarray]]


def _model(nodes, inputs, outputs, initializers=(), opset: int = 17, domains=()):
    from onnx import helper  # pylint: disable=import-outside-toplevel

    graph = helper.make_graph(list(nodes), "case", list(inputs), list(outputs),
                              initializer=list(initializers))  # fmt: skip
    opsets = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, 1) for d in domains]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = min(model.ir_version, 10)  # what onnxruntime reads
    return model


def _value(name, elem, shape):
    from onnx import helper  # pylint: disable=import-outside-toplevel

    return helper.make_tensor_value_info(name, elem, shape)


def _init(name, array):
    from onnx import numpy_helper  # pylint: disable=import-outside-toplevel

    return numpy_helper.from_array(np.asarray(array), name)


# ---------------------------------------------------------------------------------------------
# Recurrent layers
# ---------------------------------------------------------------------------------------------

_GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}


def recurrent_case(op: str, direction: str = "forward", layout: int = 0, bias: bool = True,
                   initial: bool = True, peepholes: bool = False,
                   lens: Optional[Sequence[int]] = None, seq: int = 4, batch: int = 3,
                   size: int = 3, hidden: int = 4, seed: int = 0, **attrs) -> Case:  # fmt: skip
    """One LSTM/GRU/RNN node; ``lens`` gives ``sequence_lens`` (a graph input)."""
    from onnx import TensorProto  # pylint: disable=import-outside-toplevel

    rng = np.random.default_rng(seed)
    dirs = 2 if direction == "bidirectional" else 1
    gates = _GATES[op]

    def rand(*shape):
        return (rng.standard_normal(shape) * 0.5).astype(np.float32)

    inits = [_init("W", rand(dirs, gates * hidden, size)),
             _init("R", rand(dirs, gates * hidden, hidden))]  # fmt: skip
    names = ["x", "W", "R", "B" if bias else "", "lens" if lens is not None else ""]
    if bias:
        inits.append(_init("B", rand(dirs, 2 * gates * hidden)))
    x_shape = [batch, seq, size] if layout else [seq, batch, size]
    state_shape = [batch, dirs, hidden] if layout else [dirs, batch, hidden]
    inputs = [_value("x", TensorProto.FLOAT, x_shape)]
    feeds = {"x": rand(*x_shape)}
    if lens is not None:
        inputs.append(_value("lens", TensorProto.INT32, [batch]))
        feeds["lens"] = np.array(lens, np.int32)
    states = ["h0", "c0"] if op == "LSTM" else ["h0"]
    for state in states:
        names.append(state if initial else "")
        if initial:
            inputs.append(_value(state, TensorProto.FLOAT, state_shape))
            feeds[state] = rand(*state_shape)
    if peepholes:
        names.append("P")
        inits.append(_init("P", rand(dirs, 3 * hidden)))
    while names and not names[-1]:
        names.pop()
    outputs = ["y", "y_h", "y_c"] if op == "LSTM" else ["y", "y_h"]
    from onnx import helper  # pylint: disable=import-outside-toplevel

    node = helper.make_node(op, names, outputs, hidden_size=hidden, direction=direction,
                            **({"layout": layout} if layout else {}), **attrs)  # fmt: skip
    model = _model([node], inputs, [_value(o, TensorProto.FLOAT, None) for o in outputs], inits,
                   opset=14 if layout else 17)  # fmt: skip
    return model, feeds


# ---------------------------------------------------------------------------------------------
# Integer operators
# ---------------------------------------------------------------------------------------------


def _ints(rng, dtype, shape, low=None, high=None):
    """Random integers of ``dtype`` in ``[low, high]`` (the type's range by default)."""
    info = np.iinfo(dtype)
    low = info.min if low is None else low
    high = info.max if high is None else high
    return rng.integers(low, high + 1, size=shape).astype(dtype)


def _weight_range(x_type, w_type, full_range: bool) -> Tuple[Optional[int], Optional[int]]:
    """int8 weights against uint8 activations in ``[-61, 60]`` unless ``full_range``.

    ONNX Runtime's u8s8 kernels on x86 without VNNI add pairs of products in saturating int16
    (``pmaddubsw``): ``255 * 127 * 2`` overflows, ``255 * 64 * 2`` does not. Its quantizers
    reduce the weight range for that reason; the comparison with it does the same, and the full
    range is compared with the specification's arithmetic in numpy instead. The cases' weight
    zero points lie in ``[-3, 3]``: ``[-61, 60]`` keeps the centered weight ``w - w_zp`` in
    ``[-64, 63]`` too, the range our oneDNN kernels are exact in without VNNI, so that the int8
    rewrite applies on both kinds of CPU.
    """
    if full_range or not (np.dtype(x_type) == np.uint8 and np.dtype(w_type) == np.int8):
        return None, None
    return -61, 60


def conv_integer_case(x_type=np.uint8, w_type=np.int8, per_channel: bool = True,
                      group: int = 1, seed: int = 0, **attrs) -> Case:  # fmt: skip
    """``ConvInteger`` with zero points (per output channel for ``w`` when ``per_channel``)."""
    from onnx import TensorProto, helper  # pylint: disable=import-outside-toplevel

    rng = np.random.default_rng(seed)
    out_channels, in_channels = 4, 4
    x = _ints(rng, x_type, (1, in_channels, 6, 6))
    w = _ints(rng, w_type, (out_channels, in_channels // group, 3, 3))
    x_zp = _ints(rng, x_type, ())
    w_zp = _ints(rng, w_type, (out_channels,) if per_channel else ())
    node = helper.make_node("ConvInteger", ["x", "w", "x_zp", "w_zp"], ["y"], group=group,
                            **attrs)  # fmt: skip
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(x_type))
    model = _model([node], [_value("x", elem, x.shape)], [_value("y", TensorProto.INT32, None)],
                   [_init("w", w), _init("x_zp", x_zp), _init("w_zp", w_zp)])  # fmt: skip
    return model, {"x": x}


def matmul_integer_case(a_type=np.uint8, b_type=np.int8, per_axis: bool = True,
                        seed: int = 0) -> Case:  # fmt: skip
    """``MatMulInteger`` with per-row ``a`` and per-column ``b`` zero points (or per tensor)."""
    from onnx import TensorProto, helper  # pylint: disable=import-outside-toplevel

    rng = np.random.default_rng(seed)
    a, b = _ints(rng, a_type, (5, 7)), _ints(rng, b_type, (7, 6))
    a_zp = _ints(rng, a_type, (5,) if per_axis else ())
    b_zp = _ints(rng, b_type, (6,) if per_axis else ())
    node = helper.make_node("MatMulInteger", ["a", "b", "a_zp", "b_zp"], ["y"])
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(a_type))
    model = _model([node], [_value("a", elem, a.shape), _value("a_zp", elem, a_zp.shape)],
                   [_value("y", TensorProto.INT32, None)], [_init("b", b), _init("b_zp", b_zp)])
    return model, {"a": a, "a_zp": a_zp}


def qlinear_conv_case(x_type=np.uint8, w_type=np.int8, per_channel: bool = True,
                      bias: bool = True, y_scale: float = 0.05, seed: int = 0,
                      full_range: bool = False, **attrs) -> Case:  # fmt: skip
    """``QLinearConv``; a small ``y_scale`` drives outputs to the type's limits (saturation);
    int8 weights against uint8 inputs span 7 bits unless ``full_range`` (see
    :func:`_weight_range`)."""
    from onnx import helper  # pylint: disable=import-outside-toplevel

    rng = np.random.default_rng(seed)
    channels = 4
    x = _ints(rng, x_type, (1, 3, 5, 5))
    w = _ints(rng, w_type, (channels, 3, 3, 3), *_weight_range(x_type, w_type, full_range))
    w_scale = (rng.random(channels if per_channel else ()) * 0.01 + 0.001).astype(np.float32)
    w_zp = _ints(rng, w_type, w_scale.shape, -3, 3) if w_type == np.int8 else \
        _ints(rng, w_type, w_scale.shape, 120, 136)
    inits = [_init("x_scale", np.float32(0.02)), _init("x_zp", _ints(rng, x_type, ())),
             _init("w", w), _init("w_scale", w_scale), _init("w_zp", w_zp),
             _init("y_scale", np.float32(y_scale)), _init("y_zp", _ints(rng, x_type, ()))]
    names = ["x", "x_scale", "x_zp", "w", "w_scale", "w_zp", "y_scale", "y_zp"]
    if bias:
        inits.append(_init("B", rng.integers(-2000, 2000, channels).astype(np.int32)))
        names.append("B")
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(x_type))
    node = helper.make_node("QLinearConv", names, ["y"], **attrs)
    model = _model([node], [_value("x", elem, x.shape)], [_value("y", elem, None)], inits)
    return model, {"x": x}


def qlinear_matmul_case(a_type=np.uint8, b_type=np.int8, per_column: bool = False,
                        y_scale: float = 0.05, seed: int = 0,
                        full_range: bool = False) -> Case:  # fmt: skip
    """``QLinearMatMul`` (per-column ``b`` scale and zero point when ``per_column``)."""
    from onnx import helper  # pylint: disable=import-outside-toplevel

    rng = np.random.default_rng(seed)
    a = _ints(rng, a_type, (4, 8))
    b = _ints(rng, b_type, (8, 5), *_weight_range(a_type, b_type, full_range))
    b_scale = (rng.random(5 if per_column else ()) * 0.01 + 0.001).astype(np.float32)
    b_zp = _ints(rng, b_type, b_scale.shape, -3, 3) if b_type == np.int8 else \
        _ints(rng, b_type, b_scale.shape, 120, 136)
    inits = [_init("a_scale", np.float32(0.03)), _init("a_zp", _ints(rng, a_type, ())),
             _init("b", b), _init("b_scale", b_scale), _init("b_zp", b_zp),
             _init("y_scale", np.float32(y_scale)), _init("y_zp", _ints(rng, a_type, ()))]
    names = ["a", "a_scale", "a_zp", "b", "b_scale", "b_zp", "y_scale", "y_zp"]
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(a_type))
    node = helper.make_node("QLinearMatMul", names, ["y"])
    model = _model([node], [_value("a", elem, a.shape)], [_value("y", elem, None)], inits)
    return model, {"a": a}


# ---------------------------------------------------------------------------------------------
# Small operators and schema functions
# ---------------------------------------------------------------------------------------------


def unary_case(op: str, shape=(2, 3, 5), opset: int = 17, seed: int = 0, **attrs) -> Case:
    """One float operator with one input (``LpNormalization``, ``Celu``, ``Swish``, ...)."""
    from onnx import TensorProto, helper  # pylint: disable=import-outside-toplevel

    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32)
    node = helper.make_node(op, ["x"], ["y"], **attrs)
    model = _model([node], [_value("x", TensorProto.FLOAT, shape)],
                   [_value("y", TensorProto.FLOAT, None)], opset=opset)  # fmt: skip
    return model, {"x": x}


def reverse_sequence_case(time_axis: int = 0, batch_axis: int = 1, lens=(4, 1, 3),
                          constant_lens: bool = False) -> Case:  # fmt: skip
    """``ReverseSequence`` over a ``[time, batch, 2]`` (or ``[batch, time, 2]``) input."""
    from onnx import TensorProto, helper  # pylint: disable=import-outside-toplevel

    shape = [4, 3, 2] if time_axis == 0 else [3, 4, 2]
    x = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    lens = np.array(lens, np.int64)
    node = helper.make_node("ReverseSequence", ["x", "lens"], ["y"], time_axis=time_axis,
                            batch_axis=batch_axis)  # fmt: skip
    inputs = [_value("x", TensorProto.FLOAT, shape)]
    feeds = {"x": x}
    inits = [_init("lens", lens)] if constant_lens else []
    if not constant_lens:
        inputs.append(_value("lens", TensorProto.INT64, [3]))
        feeds["lens"] = lens
    model = _model([node], inputs, [_value("y", TensorProto.FLOAT, None)], inits)
    return model, feeds


def cumprod_case(axis: int = 1, exclusive: int = 0, reverse: int = 0) -> Case:
    """``CumProd`` (opset 26) over a ``[2, 5, 3]`` input."""
    from onnx import TensorProto, helper  # pylint: disable=import-outside-toplevel

    rng = np.random.default_rng(axis + 2 * exclusive + 4 * reverse)
    x = (rng.random((2, 5, 3)) + 0.5).astype(np.float32) * np.where(
        rng.random((2, 5, 3)) < 0.3, -1, 1).astype(np.float32)
    node = helper.make_node("CumProd", ["x", "axis"], ["y"], exclusive=exclusive, reverse=reverse)
    model = _model([node], [_value("x", TensorProto.FLOAT, x.shape)],
                   [_value("y", TensorProto.FLOAT, None)],
                   [_init("axis", np.array(axis, np.int64))], opset=26)  # fmt: skip
    return model, {"x": x}


def cumprod_reference(x: np.ndarray, axis: int, exclusive: int, reverse: int) -> np.ndarray:
    """numpy's cumulative product with ONNX's ``exclusive``/``reverse``."""
    if reverse:
        x = np.flip(x, axis)
    y = np.cumprod(x, axis=axis)
    if exclusive:
        y = np.concatenate([np.ones_like(np.take(y, [0], axis)),
                            np.take(y, range(x.shape[axis] - 1), axis)], axis)  # fmt: skip
    return np.flip(y, axis) if reverse else y


def quantizable_model_path(directory: str) -> str:
    """A float conv + relu + linear model exported by ``torch.onnx`` (opset 17); its path."""
    import os  # pylint: disable=import-outside-toplevel

    import torch  # pylint: disable=import-outside-toplevel

    class _Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
            self.linear = torch.nn.Linear(8 * 6 * 6, 10)

        def forward(self, x):
            return self.linear(torch.relu(self.conv(x)).flatten(1)) + 1.0

    torch.manual_seed(0)
    path = os.path.join(directory, "float.onnx")
    torch.onnx.export(_Net().eval(), (torch.randn(1, 3, 6, 6),), path, input_names=["x"],
                      opset_version=17, dynamo=False)  # fmt: skip
    return path


def calibration_inputs(count: int = 4) -> List[Dict[str, np.ndarray]]:
    """Random inputs for static quantization's calibration."""
    rng = np.random.default_rng(1)
    return [{"x": rng.standard_normal((1, 3, 6, 6)).astype(np.float32)} for _ in range(count)]


# ---------------------------------------------------------------------------------------------
# Running
# ---------------------------------------------------------------------------------------------


def run_tvm(model, feeds: Dict[str, np.ndarray], simplifier: str = "none") -> List[np.ndarray]:
    """Import with tvm-ollie's loader (preparation and decomposition), build for llvm, run."""
    return run_tvm_with_shapes(model, feeds, None, simplifier)


def run_tvm_with_shapes(model, feeds: Dict[str, np.ndarray], shapes, simplifier: str = "auto"
                        ) -> List[np.ndarray]:  # fmt: skip
    """:func:`run_tvm` with input shapes fixed (what ``--shape`` does)."""
    # pylint: disable=import-outside-toplevel
    import tvm
    from tvm import relax

    from tvm_ollie.frontend.loader import load_onnx

    mod = load_onnx(model, shapes, simplifier=simplifier)
    executable = tvm.compile(mod, "llvm")
    vm = relax.VirtualMachine(executable, tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(np.array(feeds[i.name], order="C"))
                       for i in model.graph.input if i.name in feeds])  # fmt: skip
    outs = [out] if isinstance(out, tvm.runtime.Tensor) else list(out)
    return [o.numpy() for o in outs]


def run_ort(model, feeds: Dict[str, np.ndarray], optimize: bool = True,
            threads: int = 0) -> List[np.ndarray]:
    """The model run by ONNX Runtime on CPU; ``optimize=False`` runs the nodes as written
    (no fusion of ``DequantizeLinear -> Conv -> QuantizeLinear`` into integer kernels);
    ``threads``: its intra-op threads (0: its default)."""
    import onnxruntime  # pylint: disable=import-outside-toplevel

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    if not optimize:
        options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = onnxruntime.InferenceSession(model.SerializeToString(), options,
                                           providers=["CPUExecutionProvider"])  # fmt: skip
    return session.run(None, feeds)


def max_error(ours: Sequence[np.ndarray], reference: Sequence[np.ndarray]) -> float:
    """Largest absolute difference over all outputs (shapes must agree)."""
    assert len(ours) == len(reference)
    worst = 0.0
    for a, b in zip(ours, reference):
        assert a.shape == b.shape, (a.shape, b.shape)
        worst = max(worst, float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)),
                                        initial=0.0)))  # fmt: skip
    return worst


def integer_reference(model, feeds: Dict[str, np.ndarray]) -> List[np.ndarray]:
    """The specification's integer arithmetic in numpy/torch (float64, exact for these sizes)
    for ``ConvInteger``, ``MatMulInteger``, ``QLinearConv`` and ``QLinearMatMul``."""
    # pylint: disable=import-outside-toplevel
    import torch
    from onnx import helper, numpy_helper

    node = model.graph.node[0]
    values = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    values.update(feeds)
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    get = [values.get(name) if name else None for name in node.input]
    layout = {"ConvInteger": (0, None, 2, 1, None, 3), "MatMulInteger": (0, None, 2, 1, None, 3),
              "QLinearConv": (0, 1, 2, 3, 4, 5), "QLinearMatMul": (0, 1, 2, 3, 4, 5)}
    x_i, xs_i, xz_i, w_i, ws_i, wz_i = layout[node.op_type]
    conv = "Conv" in node.op_type
    x = get[x_i].astype(np.float64)
    w = get[w_i].astype(np.float64)
    if len(get) > xz_i and get[xz_i] is not None:
        xz = get[xz_i].astype(np.float64)
        x = x - (xz.reshape(-1, 1) if xz.ndim == 1 and xz.size > 1 else xz)
    if len(get) > wz_i and get[wz_i] is not None:
        wz = get[wz_i].astype(np.float64)
        w = w - (wz.reshape(-1, *([1] * (w.ndim - 1))) if conv and wz.size > 1 else wz)
    if conv:
        pads = attrs.get("pads", [0, 0, 0, 0])
        acc = torch.nn.functional.conv2d(
            torch.nn.functional.pad(torch.tensor(x), (pads[1], pads[3], pads[0], pads[2])),
            torch.tensor(w), stride=attrs.get("strides", [1, 1]),
            groups=attrs.get("group", 1)).numpy()
    else:
        acc = x @ w
    if xs_i is None:
        return [acc.astype(np.int32)]
    if len(get) > 8 and get[8] is not None:
        acc = acc + get[8].reshape(1, -1, 1, 1)
    scale = np.float32(get[xs_i]) * get[ws_i].astype(np.float32) / np.float32(get[6])
    scale = scale.reshape(1, -1, 1, 1) if conv and scale.size > 1 else scale
    zero = get[7]
    info = np.iinfo(zero.dtype)
    value = np.round(acc.astype(np.float32) * scale.astype(np.float32)) + zero
    return [np.clip(value, info.min, info.max).astype(zero.dtype)]


def qlinear_binary_case(op: str = "QLinearAdd", dtype=np.uint8, seed: int = 0) -> Case:
    """com.microsoft ``QLinearAdd``/``QLinearMul`` with a broadcast second operand."""
    from onnx import helper  # pylint: disable=import-outside-toplevel

    rng = np.random.default_rng(seed)
    a, b = _ints(rng, dtype, (2, 3, 4)), _ints(rng, dtype, (4,))
    scale = 0.02 if op == "QLinearAdd" else 0.5
    inits = [_init("a_scale", np.float32(0.03)), _init("a_zp", _ints(rng, dtype, ())),
             _init("b_scale", np.float32(0.05)), _init("b_zp", _ints(rng, dtype, ())),
             _init("c_scale", np.float32(scale)), _init("c_zp", _ints(rng, dtype, ()))]
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    node = helper.make_node(op, ["a", "a_scale", "a_zp", "b", "b_scale", "b_zp", "c_scale",
                                 "c_zp"], ["c"], domain="com.microsoft")  # fmt: skip
    model = _model([node], [_value("a", elem, a.shape), _value("b", elem, b.shape)],
                   [_value("c", elem, None)], inits, domains=("com.microsoft",))  # fmt: skip
    return model, {"a": a, "b": b}


def window_case(op: str = "HannWindow", size: int = 8, periodic: int = 1) -> Case:
    """A window function (opset 17) of a constant size: a schema function body."""
    from onnx import TensorProto, helper  # pylint: disable=import-outside-toplevel

    node = helper.make_node(op, ["size"], ["y"], periodic=periodic)
    model = _model([node], [_value("x", TensorProto.FLOAT, [size])],
                   [_value("z", TensorProto.FLOAT, None)],
                   [_init("size", np.array(size, np.int64))])  # fmt: skip
    model.graph.node.append(helper.make_node("Add", ["x", "y"], ["z"]))
    return model, {"x": np.zeros(size, np.float32)}


def loss_case(op: str = "SoftmaxCrossEntropyLoss", reduction: str = "mean") -> Case:
    """``SoftmaxCrossEntropyLoss``/``NegativeLogLikelihoodLoss`` (context-dependent bodies)."""
    from onnx import TensorProto, helper  # pylint: disable=import-outside-toplevel

    rng = np.random.default_rng(0)
    scores = rng.standard_normal((4, 5)).astype(np.float32)
    labels = rng.integers(0, 5, 4).astype(np.int64)
    node = helper.make_node(op, ["scores", "labels"], ["loss"], reduction=reduction)
    model = _model([node], [_value("scores", TensorProto.FLOAT, scores.shape),
                            _value("labels", TensorProto.INT64, labels.shape)],
                   [_value("loss", TensorProto.FLOAT, None)])  # fmt: skip
    return model, {"scores": scores, "labels": labels}


def rotary_case(interleaved: int = 0) -> Case:
    """``RotaryEmbedding`` (opset 23, a context-dependent body) on a ``[batch, heads, seq,
    head]`` input with position ids."""
    from onnx import TensorProto, helper  # pylint: disable=import-outside-toplevel

    rng = np.random.default_rng(0)
    batch, heads, seq, head = 1, 2, 3, 4
    x = rng.standard_normal((batch, heads, seq, head)).astype(np.float32)
    cos = rng.standard_normal((8, head // 2)).astype(np.float32)
    sin = rng.standard_normal((8, head // 2)).astype(np.float32)
    ids = np.array([[0, 2, 5]], np.int64)
    node = helper.make_node("RotaryEmbedding", ["x", "cos", "sin", "ids"], ["y"],
                            interleaved=interleaved)  # fmt: skip
    model = _model([node], [_value("x", TensorProto.FLOAT, x.shape)],
                   [_value("y", TensorProto.FLOAT, None)],
                   [_init("cos", cos), _init("sin", sin), _init("ids", ids)], opset=23)
    return model, {"x": x}


def crnn_model_path(directory: str) -> str:
    """A CRNN-style OCR recognizer (conv backbone, 2-layer bidirectional LSTM, linear,
    log-softmax) exported by ``torch.onnx`` with dynamic batch and width; its path."""
    import os  # pylint: disable=import-outside-toplevel

    import torch  # pylint: disable=import-outside-toplevel

    class _Crnn(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.backbone = torch.nn.Sequential(
                torch.nn.Conv2d(1, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
                torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.ReLU(),
                torch.nn.MaxPool2d((4, 1)))
            self.rnn = torch.nn.LSTM(32, 12, num_layers=2, bidirectional=True)
            self.head = torch.nn.Linear(24, 11)

        def forward(self, x):
            features = self.backbone(x)
            batch, channels, height, width = features.shape
            sequence = features.reshape(batch, channels * height, width).permute(2, 0, 1)
            return self.head(self.rnn(sequence)[0]).log_softmax(-1)

    torch.manual_seed(0)
    path = os.path.join(directory, "crnn.onnx")
    torch.onnx.export(_Crnn().eval(), (torch.randn(1, 1, 16, 32),), path, input_names=["x"],
                      dynamic_axes={"x": {0: "batch", 3: "width"}}, opset_version=17,
                      dynamo=False)  # fmt: skip
    return path
