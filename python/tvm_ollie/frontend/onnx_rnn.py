"""ONNX ``LSTM``, ``GRU`` and ``RNN`` unrolled over their static sequence length.

Each layer becomes, per direction and step, the specification's two projections, so that
derivation and the vendor library see GEMMs:

* step ``t`` of direction ``d``: ``gates = (X[t] @ W_d^T + (Wb + Rb)) + H_{t-1} @ R_d^T``, then
  the gate equations of the specification (in each emitter's docstring). The input projections
  of all steps read one weight and no state: the optimizer batches them into one GEMM (the
  classic "hoist the input projection", found as a shared-weight group by
  :mod:`tvm_ollie.transform.groups`, not written here).

``sequence_lens`` shorter than the sequence mask the steps as the specification says: a padded
step keeps the state and writes zeros to ``Y``; the reverse direction, which walks from the last
step down, starts its recurrence at each sequence's last valid step. The names of the
activations are case-insensitive; ``activation_alpha``/``activation_beta`` are consumed in order
by the activations that take them (ONNX Runtime's reading), with the operators' defaults.
"""

from __future__ import annotations

import functools
from typing import List, Optional, Sequence, Tuple

import numpy as np

from .onnx_emit import RuleContext, attributes, optional_input
from .onnx_native import DOMAIN, LSTM_KERNEL, LSTM_LAYER, native_layer_available

#: Activation -> (takes alpha, takes beta, default alpha, default beta).
ACTIVATIONS = {
    "sigmoid": (False, False, 0.0, 0.0),
    "tanh": (False, False, 0.0, 0.0),
    "relu": (False, False, 0.0, 0.0),
    "affine": (True, True, 1.0, 0.0),
    "leakyrelu": (True, False, 0.01, 0.0),
    "thresholdedrelu": (True, False, 1.0, 0.0),
    "scaledtanh": (True, True, 1.0, 1.0),
    "hardsigmoid": (True, True, 0.2, 0.5),
    "elu": (True, False, 1.0, 0.0),
    "softsign": (False, False, 0.0, 0.0),
    "softplus": (False, False, 0.0, 0.0),
}

#: Operator -> (gates, activations per direction, their defaults).
LAYERS = {
    "LSTM": (4, 3, ("Sigmoid", "Tanh", "Tanh")),
    "GRU": (3, 2, ("Sigmoid", "Tanh")),
    "RNN": (1, 1, ("Tanh",)),
    "DynamicQuantizeLSTM": (4, 3, ("Sigmoid", "Tanh", "Tanh")),
}

#: The largest number of steps (sequence length x directions) a layer is unrolled into.
MAX_STEPS = 4096

Activation = Tuple[str, float, float]


def recurrent_guard(node, ctx: RuleContext) -> str:
    """"" when the layer can be unrolled exactly; otherwise why not."""
    attrs = attributes(node)
    x_shape, w_shape, r_shape = (ctx.shape(optional_input(node, i)) for i in range(3))
    if x_shape is None or len(x_shape) != 3:
        return "the input X needs a static shape (fix it with --shape)"
    if w_shape is None or r_shape is None:
        return "W and R need static shapes"
    if ctx.opset < 10:
        return f"opset {ctx.opset} < 10"
    if ctx.dtype(node.input[0]) not in (np.dtype(np.float32), np.dtype(np.float64),
                                        np.dtype(np.float16)):  # fmt: skip
        return "X is not a float tensor"
    names = attrs.get("activations")
    if names is not None:
        unknown = [a for a in names if a.lower() not in ACTIVATIONS]
        if unknown:
            return f"activation {unknown[0]} is not one the specification allows"
        per_direction = LAYERS[node.op_type][1]
        if len(names) != per_direction * _directions(attrs):
            return f"{len(names)} activations for {_directions(attrs)} direction(s)"
    seq = x_shape[1] if attrs.get("layout", 0) else x_shape[0]
    if seq * _directions(attrs) > MAX_STEPS:
        return f"{seq} steps x {_directions(attrs)} direction(s) exceed {MAX_STEPS}"
    return ""


def emit_lstm(node, ctx: RuleContext) -> None:
    """LSTM (gates ``iofc``; ``f``, ``g``, ``h`` the activations, default Sigmoid, Tanh, Tanh):

    ``i = f(Xt Wi^T + H Ri^T + Pi . C + Wbi + Rbi)``,
    ``f = f(Xt Wf^T + H Rf^T + Pf . C + Wbf + Rbf)`` (``1 - i`` with ``input_forget``),
    ``c = g(Xt Wc^T + H Rc^T + Wbc + Rbc)``, ``C' = f . C + i . c``,
    ``o = f(Xt Wo^T + H Ro^T + Po . C' + Wbo + Rbo)``, ``H' = o . h(C')``; ``clip`` bounds every
    gate's argument to [-clip, clip].

    Where :func:`whole_lstm_guard` allows, the layer is one ``tvm_ollie.LSTMLayer`` node (the
    native kernel, :mod:`~tvm_ollie.frontend.onnx_native`) instead of the unrolled steps.
    """
    if not whole_lstm_guard(node, ctx):
        _emit_whole_lstm(node, ctx)
        return
    _emit_layer(node, ctx, _lstm_step)


def whole_lstm_guard(node, ctx: RuleContext) -> str:
    """"" when the native whole-layer kernel computes the LSTM exactly: float32, constant
    ``W``, ``R`` (and ``B``), the default activations, no ``clip``, ``input_forget`` or
    peepholes, ``sequence_lens`` absent or the full length everywhere, and ``Y_c`` unread (the
    kernel writes ``Y``; ``Y_h`` is read from it). Otherwise why not (the layer is unrolled)."""
    if any(ctx.value(optional_input(node, i)) is None for i in (1, 2)) or (
            optional_input(node, 3) and ctx.value(node.input[3]) is None):
        return "W, R or B is not a constant"
    return _whole_layer_guard(node, ctx)


def _whole_layer_guard(node, ctx: RuleContext) -> str:
    """What the native kernel needs of an LSTM or DynamicQuantizeLSTM beyond its weights."""
    why = native_layer_available(LSTM_KERNEL)
    if why:
        return why
    attrs = attributes(node)
    if ctx.dtype(node.input[0]) != np.dtype(np.float32):
        return "X is not float32"
    if optional_input(node, 3) and ctx.value(node.input[3]) is None:
        return "B is not a constant"
    names = [a.lower() for a in attrs.get("activations") or ()]
    if names and names != ["sigmoid", "tanh", "tanh"] * _directions(attrs):
        return "activations other than the defaults"
    if attrs.get("clip") is not None or attrs.get("input_forget", 0):
        return "clip or input_forget"
    if optional_input(node, 7):
        return "peepholes"
    lens = optional_input(node, 4)
    seq = _Layer(node, ctx).seq
    if lens and (ctx.value(lens) is None or np.any(ctx.value(lens) != seq)):
        return "sequence_lens shorter than the sequence"
    y_c = optional_output(node, 2)
    if y_c and y_c in ctx.consumed:
        return "Y_c is read"
    return ""


def optional_output(node, position: int) -> str:
    """The node's output at ``position``, or "" when absent."""
    return node.output[position] if position < len(node.output) else ""


def _emit_whole_lstm(node, ctx: RuleContext, quantized: bool = False) -> None:
    """``Y = LSTMLayer(X, W', R', B', H0, C0)`` with the weights packed for the kernel once
    here: ``W' = [W_0^T | W_1^T]`` (``[input, dirs*4*hidden]``), ``R'_d = R_d^T``, ``B'_d = Wb_d +
    Rb_d``; zeros for absent initial states. Quantized (DynamicQuantizeLSTM, its weights stored
    transposed): ``W'``, ``R'`` the centered weights ``W - w_zp`` as floats (exact: integers in
    [-255, 255]) and two more operands, the scales per column ``[dirs, 4*hidden]``. ``Y_h[d]`` is
    ``Y`` at direction ``d``'s last step (step ``seq - 1`` forward, step 0 reverse)."""
    layer = _Layer(node, ctx)
    f32 = np.float32
    dirs, gh = layer.directions, 4 * layer.hidden
    if quantized:
        (w, w_scale), (r, r_scale) = (_centered_weight(ctx, node, i, dirs, gh) for i in (1, 2))
        scales = [ctx.const(w_scale, "w_scale"), ctx.const(r_scale, "r_scale")]
    else:
        w = ctx.value(node.input[1]).astype(f32).transpose(0, 2, 1)
        r = ctx.value(node.input[2]).astype(f32).transpose(0, 2, 1)
        scales = []
    packed_w = np.ascontiguousarray(np.concatenate(list(w), axis=1))
    packed_r = np.ascontiguousarray(r)
    b = ctx.value(optional_input(node, 3))
    bias = (b[:, :gh] + b[:, gh:]).astype(f32) if b is not None else np.zeros((dirs, gh), f32)
    x = node.input[0]
    if layer.layout:
        x = ctx.add("Transpose", [x], perm=[1, 0, 2])
    states = [_layer_state(ctx, optional_input(node, i), layer) for i in (5, 6)]
    y = ctx.add(LSTM_LAYER, [x, ctx.const(packed_w, "w_packed"), ctx.const(packed_r, "r_packed"),
                             ctx.const(bias, "bias"), *states, *scales],
                domain=DOMAIN, reverse=int(layer.direction == "reverse"), quant=int(quantized))
    if optional_output(node, 0):
        ctx.bind(ctx.add("Transpose", [y], perm=[2, 0, 1, 3]) if layer.layout else y,
                 node.output[0])
    if optional_output(node, 1):
        ends = [0 if layer.reverse(d) else layer.seq - 1 for d in range(dirs)]
        last = [ctx.slice(ctx.slice(y, 0, t, t + 1), 1, d, d + 1) for d, t in enumerate(ends)]
        y_h = ctx.reshape(_concat(ctx, last, 1), [dirs, layer.batch, layer.hidden])
        ctx.bind(ctx.add("Transpose", [y_h], perm=[1, 0, 2]) if layer.layout else y_h,
                 node.output[1])


def _centered_weight(ctx: RuleContext, node, position: int, dirs: int,
                     gh: int) -> Tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """A DynamicQuantizeLSTM weight (input ``position``, ``[dirs, K, 4*hidden]``) as the kernel
    takes it: ``W - w_zp`` in float32 and its scales per column ``[dirs, 4*hidden]`` (the guard
    checked one zero point per direction, the first)."""
    scale_at = {1: 8, 2: 10}[position]  # its scale, then its zero point
    value = ctx.value(node.input[position]).astype(np.float32)
    zps = ctx.value(node.input[scale_at + 1]).reshape(dirs, -1)[:, 0].astype(np.float32)
    scale = ctx.value(node.input[scale_at]).astype(np.float32)
    scale = np.ascontiguousarray(np.broadcast_to(scale.reshape(dirs, -1), (dirs, gh)))
    return value - zps.reshape(dirs, 1, 1), scale


def _layer_state(ctx: RuleContext, name: str, layer: _Layer) -> str:
    """An initial state as the kernel takes it, ``[dirs, batch, hidden]``: the input (layout 1:
    transposed from ``[batch, dirs, hidden]``), or zeros without one."""
    if not name:
        shape = (layer.directions, layer.batch, layer.hidden)
        return ctx.const(np.zeros(shape, np.float32), "zeros")
    return ctx.add("Transpose", [name], perm=[1, 0, 2]) if layer.layout else name


def dynamic_quantize_lstm_guard(node, ctx: RuleContext) -> str:
    """:func:`recurrent_guard`, and the quantized weights ``W`` ``[dirs, input, 4*hidden]``
    and ``R`` ``[dirs, hidden, 4*hidden]`` 8-bit constants with constant float32 scales per
    direction (``[dirs]``) or per column (``[dirs, 4*hidden]``) and constant zero points equal
    within each direction (ONNX Runtime reads one per direction: the first)."""
    why = recurrent_guard(node, ctx) or ("" if ctx.opset >= 11 else f"opset {ctx.opset} < 11")
    if why:
        return why
    for w, scale, zp in ((1, 8, 9), (2, 10, 11)):
        value = ctx.value(node.input[w])
        if value is None or value.dtype not in (np.int8, np.uint8) or value.ndim != 3:
            return f"input {w} is not a constant 8-bit [dirs, K, 4*hidden] weight"
        scales = ctx.value(optional_input(node, scale))
        if scales is None or scales.dtype != np.float32 or scales.shape not in (
                (value.shape[0],), (value.shape[0], value.shape[2])):
            return f"input {scale} is not a constant float32 scale per direction or column"
        zps = ctx.value(optional_input(node, zp))
        if zps is None or zps.dtype != value.dtype or zps.shape[:1] != value.shape[:1]:
            return f"input {zp} is not a constant zero point per direction"
        if any(np.any(row != row.reshape(-1)[0]) for row in zps):
            return f"input {zp}: zero points differ within a direction"
    return ""


def emit_dynamic_quantize_lstm(node, ctx: RuleContext) -> None:
    """com.microsoft DynamicQuantizeLSTM: the LSTM of :func:`emit_lstm` whose two products
    are ONNX Runtime's dynamically quantized GEMMs (its ``rnn::detail::ComputeGemm`` on an
    8-bit weight). For ``A`` (all of ``X`` at once for the input projection; ``H`` at every
    step for the recurrent one):

    ``lo = min(min(A), 0)``, ``hi = max(max(A), 0)``, ``s = (hi - lo) / 255`` (1 when
    ``hi = lo``), ``z = sat_u8(rint(-lo / s))``, ``q = sat_u8(rint(A / s) + z)``;
    ``A W = float(sum_k (q - z) (W - w_zp)) * (s * w_scale)`` (int32 sums, the multiplier
    per direction or per column), and the gates ``(X W + H R) + (Wb + Rb)`` in that order.
    ``W``/``R`` are stored as ``[dirs, K, 4*hidden]`` (already transposed).

    Where the whole-layer conditions of :func:`whole_lstm_guard` hold, the layer is one
    ``tvm_ollie.LSTMLayer`` node with ``quant = 1`` (the native kernel computes these
    equations, the integer sums exactly) instead of the unrolled steps."""
    if not _whole_layer_guard(node, ctx):
        _emit_whole_lstm(node, ctx, quantized=True)
        return
    _emit_layer(node, ctx, _lstm_step, quantized=True)


def emit_gru(node, ctx: RuleContext) -> None:
    """GRU (gates ``zrh``; ``f``, ``g`` default Sigmoid, Tanh):

    ``z = f(Xt Wz^T + H Rz^T + Wbz + Rbz)``, ``r = f(Xt Wr^T + H Rr^T + Wbr + Rbr)``,
    ``h = g(Xt Wh^T + (r . H) Rh^T + Rbh + Wbh)`` (``linear_before_reset`` = 0) or
    ``h = g(Xt Wh^T + r . (H Rh^T + Rbh) + Wbh)`` (otherwise), ``H' = (1 - z) . h + z . H``.
    """
    _emit_layer(node, ctx, _gru_step)


def emit_rnn(node, ctx: RuleContext) -> None:
    """RNN: ``H' = f(Xt Wi^T + H Ri^T + Wbi + Rbi)`` (``f`` default Tanh)."""
    _emit_layer(node, ctx, _rnn_step)


# ---------------------------------------------------------------------------------------------
# The layer: directions, steps (input and recurrent projections), outputs
# ---------------------------------------------------------------------------------------------


class _Layer:
    """The attributes and shapes one recurrent node is unrolled with."""

    def __init__(self, node, ctx: RuleContext) -> None:
        attrs = attributes(node)
        self.kind = node.op_type
        self.gates, per_direction, defaults = LAYERS[node.op_type]
        self.layout = attrs.get("layout", 0)
        x_shape = ctx.shape(node.input[0])
        self.seq, self.batch = (x_shape[1], x_shape[0]) if self.layout else x_shape[:2]
        self.input_size = x_shape[2]
        r_shape = ctx.shape(node.input[2])  # [dirs, 4*hidden, hidden]; quantized: transposed
        self.hidden = attrs.get("hidden_size") or r_shape[1 if node.domain else 2]
        self.direction = attrs.get("direction", "forward")
        self.directions = _directions(attrs)
        self.clip = attrs.get("clip")
        self.input_forget = attrs.get("input_forget", 0)
        self.linear_before_reset = attrs.get("linear_before_reset", 0)
        self.dtype = ctx.dtype(node.input[0])
        #: the bias added after both products (DynamicQuantizeLSTM), "" without one
        self.late_bias = ""
        names = attrs.get("activations") or list(defaults) * self.directions
        acts = _read_activations(names, attrs.get("activation_alpha", []),
                                 attrs.get("activation_beta", []))  # fmt: skip
        self.activations = [acts[d * per_direction:(d + 1) * per_direction]
                            for d in range(self.directions)]  # fmt: skip

    def reverse(self, d: int) -> bool:
        return self.direction == "reverse" or (self.direction == "bidirectional" and d == 1)


def _emit_layer(node, ctx: RuleContext, step, quantized: bool = False) -> None:
    layer = _Layer(node, ctx)
    x = node.input[0]
    if layer.layout:
        x = ctx.add("Transpose", [x], perm=[1, 0, 2])
    masks = _step_masks(ctx, optional_input(node, 4), layer)
    outputs_y, finals_h, finals_c = [], [], []
    x_scale = x_zp = None
    if quantized:  # X quantized at once (ONNX Runtime's one input GEMM over all steps)
        x, x_zp, x_scale = _dynamic_quantized(ctx, x, 3)
    steps = [ctx.gather(x, t, 0, (layer.seq, layer.batch, layer.input_size))
             for t in range(layer.seq)]  # fmt: skip
    for d in range(layer.directions):
        bias = _input_bias(ctx, node, layer, d)
        state = _initial_states(ctx, node, layer, d)
        per_step: List[Optional[str]] = [None] * layer.seq
        if quantized:
            wq, rq = _QuantizedWeight(ctx, node, 1, 8, d), _QuantizedWeight(ctx, node, 2, 10, d)
            zero_state = "" if optional_input(node, 5) else state[0]
            rt = functools.partial(_recurrent_product, ctx, rq, zero_state)
            layer.late_bias = bias
        else:
            wt, rt = _weights_t(ctx, node.input[1], d), _recurrent_t(ctx, node.input[2], d)
        order = range(layer.seq - 1, -1, -1) if layer.reverse(d) else range(layer.seq)
        for t in order:
            if quantized:
                x_t = wq.product(_centered(ctx, steps[t], x_zp), x_scale)
            else:
                x_t = _input_projection(ctx, steps[t], wt, bias)
            new = step(ctx, node, layer, d, x_t, rt, state)
            if masks is not None:
                held = [ctx.add("Where", [masks[t], n, s]) for n, s in zip(new, state)]
                per_step[t] = ctx.add("Where", [masks[t], new[0], _zeros(ctx, layer)])
                state = held
            else:
                state, per_step[t] = new, new[0]
        outputs_y.append(per_step)
        finals_h.append(state[0])
        finals_c.append(state[1] if len(state) > 1 else None)
    ctx.unrolled_steps[node.name or f"{node.op_type}:{node.output[0]}"] = \
        layer.seq * layer.directions
    _write_outputs(ctx, node, layer, outputs_y, finals_h, finals_c)


def _lstm_step(ctx, node, layer, d, x_t, rt, state) -> List[str]:
    h_prev, c_prev = state
    f_act, g_act, h_act = layer.activations[d]
    size = layer.hidden
    if callable(rt):  # DynamicQuantizeLSTM: (X W + H R) + (Wb + Rb), ONNX Runtime's order
        hr = rt(h_prev)
        gates = ctx.add("Add", [x_t, hr]) if hr else x_t
        gates = ctx.add("Add", [gates, layer.late_bias]) if layer.late_bias else gates
    else:
        gates = ctx.add("Add", [x_t, ctx.add("MatMul", [h_prev, rt])])
    i_pre, o_pre, f_pre, c_pre = (ctx.slice(gates, 1, k * size, (k + 1) * size) for k in range(4))
    peep = _peepholes(ctx, optional_input(node, 7), d, layer)
    if peep:
        i_pre = ctx.add("Add", [i_pre, ctx.add("Mul", [peep[0], c_prev])])
        f_pre = ctx.add("Add", [f_pre, ctx.add("Mul", [peep[2], c_prev])])
    i = _activate(ctx, f_act, _clip(ctx, i_pre, layer), layer.dtype)
    if layer.input_forget:
        f = ctx.add("Sub", [ctx.const(np.ones((), layer.dtype), "one"), i])
    else:
        f = _activate(ctx, f_act, _clip(ctx, f_pre, layer), layer.dtype)
    c = _activate(ctx, g_act, _clip(ctx, c_pre, layer), layer.dtype)
    c_new = ctx.add("Add", [ctx.add("Mul", [f, c_prev]), ctx.add("Mul", [i, c])])
    if peep:
        o_pre = ctx.add("Add", [o_pre, ctx.add("Mul", [peep[1], c_new])])
    o = _activate(ctx, f_act, _clip(ctx, o_pre, layer), layer.dtype)
    h_new = ctx.add("Mul", [o, _activate(ctx, h_act, c_new, layer.dtype)])
    return [h_new, c_new]


def _gru_step(ctx, node, layer, d, x_t, rt, state) -> List[str]:
    (h_prev,) = state
    f_act, g_act = layer.activations[d]
    size = layer.hidden
    x_zr, x_h = ctx.slice(x_t, 1, 0, 2 * size), ctx.slice(x_t, 1, 2 * size, 3 * size)
    if layer.linear_before_reset:
        hr = ctx.add("MatMul", [h_prev, rt])
        hr_zr, hr_h = ctx.slice(hr, 1, 0, 2 * size), ctx.slice(hr, 1, 2 * size, 3 * size)
        rbh = _recurrent_h_bias(ctx, optional_input(node, 3), d, layer)
        if rbh:
            hr_h = ctx.add("Add", [hr_h, rbh])
    else:
        hr_zr = ctx.add("MatMul", [h_prev, ctx.slice(rt, 1, 0, 2 * size)])
    zr = _activate(ctx, f_act, _clip(ctx, ctx.add("Add", [x_zr, hr_zr]), layer), layer.dtype)
    z, r = ctx.slice(zr, 1, 0, size), ctx.slice(zr, 1, size, 2 * size)
    if layer.linear_before_reset:
        h_pre = ctx.add("Add", [x_h, ctx.add("Mul", [r, hr_h])])
    else:
        rh_t = ctx.slice(rt, 1, 2 * size, 3 * size)
        h_pre = ctx.add("Add", [x_h, ctx.add("MatMul", [ctx.add("Mul", [r, h_prev]), rh_t])])
    h = _activate(ctx, g_act, _clip(ctx, h_pre, layer), layer.dtype)
    one_minus_z = ctx.add("Sub", [ctx.const(np.ones((), layer.dtype), "one"), z])
    h_new = ctx.add("Add", [ctx.add("Mul", [one_minus_z, h]), ctx.add("Mul", [z, h_prev])])
    return [h_new]


def _rnn_step(ctx, node, layer, d, x_t, rt, state) -> List[str]:
    (h_prev,) = state
    (f_act,) = layer.activations[d]
    pre = ctx.add("Add", [x_t, ctx.add("MatMul", [h_prev, rt])])
    return [_activate(ctx, f_act, _clip(ctx, pre, layer), layer.dtype)]


# ---------------------------------------------------------------------------------------------
# Weights, biases, states
# ---------------------------------------------------------------------------------------------


def _weights_t(ctx: RuleContext, w: str, d: int) -> str:
    """``W_d^T``: ``[input, gates * hidden]`` (one tensor every step of the direction reads)."""
    value = ctx.value(w)
    if value is not None:
        return ctx.const(np.ascontiguousarray(value[d].T), "wt")
    return ctx.add("Transpose", [ctx.gather(w, d, 0)], perm=[1, 0])


def _input_projection(ctx: RuleContext, x_t: str, wt: str, bias: str) -> str:
    """``Xt W^T + (Wb + Rb)``: the step's input projection, as the specification writes it.

    Every step of a direction reads the same ``W^T`` and bias, and no step's projection reads
    the recurrence: the optimizer's shared-weight groups
    (:func:`~tvm_ollie.transform.groups.find_shared_input_groups`) batch them into one GEMM
    over the steps' rows, verified and costed like any candidate."""
    xw = ctx.add("MatMul", [x_t, wt])
    return ctx.add("Add", [xw, bias]) if bias else xw


def _dynamic_quantized(ctx: RuleContext, a: str, rank: int) -> Tuple[str, str, str]:
    """``(q, z, s)``: ``a`` quantized to uint8 ``q`` with the uint8 zero point ``z`` and the
    scale ``s`` as ONNX Runtime's ``GetQuantizationParameter`` and ``MlasQuantizeLinear`` do
    (the docstring of :func:`emit_dynamic_quantize_lstm`), one scale and zero point for the
    whole tensor (``q`` and ``z`` are integers in ``[0, 255]`` before the casts)."""
    f32 = np.float32
    axes = list(range(rank))
    zero, one = ctx.const(np.array(0, f32), "zero"), ctx.const(np.array(1, f32), "one")
    lo = ctx.add("Min", [ctx.reduce("ReduceMin", a, axes, keepdims=0), zero])
    hi = ctx.add("Max", [ctx.reduce("ReduceMax", a, axes, keepdims=0), zero])
    span = ctx.add("Div", [ctx.add("Sub", [hi, lo]), ctx.const(np.array(255, f32), "qrange")])
    scale = ctx.add("Where", [ctx.add("Equal", [hi, lo]), one, span])
    top = ctx.const(np.array(255, f32), "qmax")
    z = ctx.add("Clip", [ctx.add("Round", [ctx.add("Sub", [zero, ctx.add("Div", [lo, scale])])]),
                         zero, top])
    q = ctx.add("Clip", [ctx.add("Add", [ctx.add("Round", [ctx.add("Div", [a, scale])]), z]),
                         zero, top])
    return ctx.add("Cast", [q], to=2), ctx.add("Cast", [z], to=2), scale  # 2: uint8 (exact)


def _centered(ctx: RuleContext, q: str, z: str) -> str:
    """``int32(q) - int32(z)`` of the uint8 ``q`` and zero point ``z`` (the form of
    ``ConvInteger``/``MatMulInteger``: the int8 kernels take it with ``z`` a run-time zero
    point, :mod:`tvm_ollie.transform.int8_kernels`)."""
    return ctx.add("Sub", [ctx.add("Cast", [q], to=6), ctx.add("Cast", [z], to=6)])  # 6: int32


class _QuantizedWeight:
    """Direction ``d`` of a DynamicQuantizeLSTM weight (input ``w``, its scale at ``scale``
    and zero point after it): ``W - w_zp`` as an int32 ``[K, 4*hidden]`` constant and the
    float32 scales (one, or one per column)."""

    def __init__(self, ctx: RuleContext, node, w: int, scale: int, d: int) -> None:
        self.ctx = ctx
        value = ctx.value(node.input[w])[d].astype(np.int32)
        zp = int(ctx.value(node.input[scale + 1])[d].reshape(-1)[0])
        self.weight = ctx.const(value - zp, "wq")
        self.scale = ctx.const(ctx.value(node.input[scale])[d].astype(np.float32), "wscale")

    def product(self, centered: str, a_scale: str) -> str:
        """``float(centered @ (W - w_zp)) * (a_scale * w_scale)`` (MLAS's scale output
        processor after the int32 GEMM)."""
        acc = self.ctx.add("MatMul", [centered, self.weight])
        multiplier = self.ctx.add("Mul", [a_scale, self.scale])
        return self.ctx.add("Mul", [self.ctx.add("Cast", [acc], to=1), multiplier])


def _recurrent_product(ctx: RuleContext, weight: _QuantizedWeight, zero_state: str,
                       h: str) -> str:
    """``H R`` dynamically quantized (every step quantizes its own ``H``); "" for the zero
    initial state (its product is zero: ONNX Runtime quantizes it with scale 1, zero point 0)."""
    if zero_state and h == zero_state:
        return ""
    q, z, scale = _dynamic_quantized(ctx, h, 2)
    return weight.product(_centered(ctx, q, z), scale)


def _recurrent_t(ctx: RuleContext, r: str, d: int) -> str:
    """``R_d^T``: ``[hidden, gates * hidden]``."""
    value = ctx.value(r)
    if value is not None:
        return ctx.const(np.ascontiguousarray(value[d].T), "rt")
    return ctx.add("Transpose", [ctx.gather(r, d, 0)], perm=[1, 0])


def _input_bias(ctx: RuleContext, node, layer: _Layer, d: int) -> str:
    """``Wb + Rb`` of direction ``d``, ``[gates * hidden]`` (GRU with ``linear_before_reset``
    keeps ``Rbh`` out: it is added inside ``r . (H Rh^T + Rbh)``); "" without ``B``."""
    b = optional_input(node, 3)
    if not b:
        return ""
    gh = layer.gates * layer.hidden
    keep = np.ones(gh, layer.dtype)
    if layer.kind == "GRU" and layer.linear_before_reset:
        keep[2 * layer.hidden:] = 0
    value = ctx.value(b)
    if value is not None:
        return ctx.const(value[d, :gh] + value[d, gh:] * keep, "bias")
    row = ctx.gather(b, d, 0)
    wb, rb = ctx.slice(row, 0, 0, gh), ctx.slice(row, 0, gh, 2 * gh)
    return ctx.add("Add", [wb, ctx.add("Mul", [rb, ctx.const(keep, "keep")])])


def _recurrent_h_bias(ctx: RuleContext, b: str, d: int, layer: _Layer) -> str:
    """GRU's ``Rbh`` of direction ``d`` (``linear_before_reset``), "" without ``B``."""
    if not b:
        return ""
    start = layer.gates * layer.hidden + 2 * layer.hidden
    value = ctx.value(b)
    if value is not None:
        return ctx.const(value[d, start:start + layer.hidden], "rbh")
    return ctx.slice(ctx.gather(b, d, 0), 0, start, start + layer.hidden)


def _peepholes(ctx: RuleContext, p: str, d: int, layer: _Layer) -> Optional[List[str]]:
    """``[Pi, Po, Pf]`` of direction ``d``, or None without ``P``."""
    if not p:
        return None
    value = ctx.value(p)
    size = layer.hidden
    if value is not None:
        return [ctx.const(value[d, k * size:(k + 1) * size], "p") for k in range(3)]
    row = ctx.gather(p, d, 0)
    return [ctx.slice(row, 0, k * size, (k + 1) * size) for k in range(3)]


def _initial_states(ctx: RuleContext, node, layer: _Layer, d: int) -> List[str]:
    """``[H0]`` (GRU, RNN) or ``[H0, C0]`` (LSTM) of direction ``d``, ``[batch, hidden]``."""
    positions = (5, 6) if layer.gates == 4 else (5,)
    states = []
    for position in positions:
        name = optional_input(node, position)
        if not name:
            states.append(_zeros(ctx, layer))
        else:
            # [directions, batch, hidden], or [batch, directions, hidden] with layout 1.
            states.append(ctx.gather(name, d, 1 if layer.layout else 0))
    return states


def _zeros(ctx: RuleContext, layer: _Layer) -> str:
    return ctx.const(np.zeros((layer.batch, layer.hidden), layer.dtype), "zeros")


def _step_masks(ctx: RuleContext, lens: str, layer: _Layer) -> Optional[List[str]]:
    """Per step a ``[batch, 1]`` boolean: the step is inside the sequence. None when
    ``sequence_lens`` is absent or a constant equal to the sequence length everywhere."""
    if not lens:
        return None
    value = ctx.value(lens)
    if value is not None and np.all(value == layer.seq):
        return None
    lens_type = ctx.dtype(lens) or np.dtype(np.int32)
    column = ctx.reshape(lens, [layer.batch, 1])
    return [ctx.add("Less", [ctx.const(np.array(t, lens_type), "t"), column])
            for t in range(layer.seq)]  # fmt: skip


def _write_outputs(ctx: RuleContext, node, layer: _Layer, outputs_y, finals_h, finals_c) -> None:
    """``Y``: ``[seq, dirs, batch, hidden]`` (layout 1: ``[batch, seq, dirs, hidden]``);
    ``Y_h``, ``Y_c``: ``[dirs, batch, hidden]`` (layout 1: ``[batch, dirs, hidden]``)."""
    b, h = layer.batch, layer.hidden
    y = node.output[0] if node.output else ""
    if y:
        steps = []
        for t in range(layer.seq):
            shape = [b, 1, 1, h] if layer.layout else [1, 1, b, h]
            parts = [ctx.reshape(outputs_y[d][t], shape) for d in range(layer.directions)]
            steps.append(_concat(ctx, parts, 2 if layer.layout else 1))
        ctx.bind(_concat(ctx, steps, 1 if layer.layout else 0), y)
    for position, finals in ((1, finals_h), (2, finals_c)):
        name = node.output[position] if position < len(node.output) else ""
        if not name:
            continue
        shape = [b, 1, h] if layer.layout else [1, b, h]
        parts = [ctx.reshape(state, shape) for state in finals]
        ctx.bind(_concat(ctx, parts, 1 if layer.layout else 0), name)


def _concat(ctx: RuleContext, parts: Sequence[str], axis: int) -> str:
    return parts[0] if len(parts) == 1 else ctx.add("Concat", list(parts), axis=axis)


# ---------------------------------------------------------------------------------------------
# Activations and clipping
# ---------------------------------------------------------------------------------------------


def _directions(attrs) -> int:
    return 2 if attrs.get("direction", "forward") == "bidirectional" else 1


def _read_activations(names: Sequence[str], alphas: Sequence[float],
                      betas: Sequence[float]) -> List[Activation]:  # fmt: skip
    """``(name, alpha, beta)`` per activation; alphas and betas are consumed in order by the
    activations that take them, the operator's default otherwise."""
    alphas, betas = list(alphas), list(betas)
    read = []
    for name in names:
        key = name.lower()
        takes_alpha, takes_beta, alpha, beta = ACTIVATIONS[key]
        if takes_alpha and alphas:
            alpha = alphas.pop(0)
        if takes_beta and betas:
            beta = betas.pop(0)
        read.append((key, alpha, beta))
    return read


def _activate(ctx: RuleContext, activation: Activation, x: str, dtype) -> str:
    """The activation applied to ``x`` with importable operators."""
    name, alpha, beta = activation
    direct = {"sigmoid": "Sigmoid", "tanh": "Tanh", "relu": "Relu", "softsign": "Softsign",
              "softplus": "Softplus"}  # fmt: skip
    if name in direct:
        return ctx.add(direct[name], [x])
    if name in ("leakyrelu", "thresholdedrelu", "elu"):
        op = {"leakyrelu": "LeakyRelu", "thresholdedrelu": "ThresholdedRelu", "elu": "Elu"}[name]
        return ctx.add(op, [x], alpha=float(alpha))
    if name == "hardsigmoid":
        return ctx.add("HardSigmoid", [x], alpha=float(alpha), beta=float(beta))
    if name == "affine":  # alpha * x + beta
        scaled = ctx.add("Mul", [x, ctx.const(np.array(alpha, dtype), "alpha")])
        return ctx.add("Add", [scaled, ctx.const(np.array(beta, dtype), "beta")])
    # scaledtanh: alpha * tanh(beta * x)
    inner = ctx.add("Tanh", [ctx.add("Mul", [x, ctx.const(np.array(beta, dtype), "beta")])])
    return ctx.add("Mul", [inner, ctx.const(np.array(alpha, dtype), "alpha")])


def _clip(ctx: RuleContext, x: str, layer: _Layer) -> str:
    """``min(max(x, -clip), clip)`` when the layer has ``clip``."""
    if layer.clip is None:
        return x
    low = ctx.const(np.array(-layer.clip, layer.dtype), "clip_lo")
    high = ctx.const(np.array(layer.clip, layer.dtype), "clip_hi")
    return ctx.add("Min", [ctx.add("Max", [x, low]), high])
