"""The table of ONNX decompositions (:data:`RULES`) and the small rules themselves.

Each entry names the operator it replaces, a guard (the attribute combinations it reproduces
exactly; "" when it applies, else the reason) and an emitter whose docstring holds the
specification's equation. The recurrent layers live in :mod:`.onnx_rnn`, the integer operators
in :mod:`.onnx_quant`; operators whose schema has a function body need no rule (they are
inlined by :mod:`.onnx_decompose`).
"""

from __future__ import annotations

from typing import Dict

import numpy as np

from . import onnx_quant, onnx_rnn
from .onnx_emit import Rule, RuleContext, attributes

#: The longest axis CumProd is unrolled over (one multiply per element of the axis).
MAX_CUMPROD_LENGTH = 1024

_MICROSOFT = ("com.microsoft",)


def lp_normalization_guard(node, ctx: RuleContext) -> str:
    """p must be 1 or 2 (the only values the specification allows)."""
    del ctx
    p = attributes(node).get("p", 2)
    return "" if p in (1, 2) else f"p={p} (the specification allows 1 and 2)"


def emit_lp_normalization(node, ctx: RuleContext) -> None:
    """``y = x / ||x||_p`` along ``axis`` (default -1), ``p`` 1 or 2 (default 2); a zero norm
    leaves the (zero) slice as it is."""
    attrs = attributes(node)
    x, axis, p = node.input[0], attrs.get("axis", -1), attrs.get("p", 2)
    if p == 2:
        norm = ctx.add("Sqrt", [ctx.reduce("ReduceSum", ctx.add("Mul", [x, x]), [axis])])
    else:
        norm = ctx.reduce("ReduceSum", ctx.add("Abs", [x]), [axis])
    dtype = ctx.dtype(x) or np.dtype(np.float32)
    zero, one = ctx.const(np.zeros((), dtype), "zero"), ctx.const(np.ones((), dtype), "one")
    safe = ctx.add("Where", [ctx.add("Equal", [norm, zero]), one, norm])
    ctx.bind(ctx.add("Div", [x, safe]), node.output[0])


def reverse_sequence_guard(node, ctx: RuleContext) -> str:
    """The input needs a static shape."""
    return "" if ctx.shape(node.input[0]) else "the input needs a static shape"


def emit_reverse_sequence(node, ctx: RuleContext) -> None:
    """``y[t, b] = x[len[b] - 1 - t, b]`` for ``t < len[b]``, ``x[t, b]`` otherwise (``t``
    along ``time_axis``, ``b`` along ``batch_axis``): one ``GatherElements`` along time."""
    attrs = attributes(node)
    shape = ctx.shape(node.input[0])
    time_axis, batch_axis = attrs.get("time_axis", 0), attrs.get("batch_axis", 1)
    steps = np.arange(shape[time_axis], dtype=np.int64).reshape(
        [-1 if axis == time_axis else 1 for axis in range(len(shape))])
    lens_shape = [-1 if axis == batch_axis else 1 for axis in range(len(shape))]
    lens_value = ctx.value(node.input[1])
    if lens_value is not None:
        lens = lens_value.astype(np.int64).reshape(lens_shape)
        index = ctx.const(np.broadcast_to(np.where(steps < lens, lens - 1 - steps, steps), shape),
                          "index")  # fmt: skip
    else:
        lens = ctx.reshape(ctx.add("Cast", [node.input[1]], to=7), lens_shape)
        t = ctx.const(steps, "t")
        flipped = ctx.add("Sub", [ctx.add("Sub", [lens, ctx.const(np.int64(1), "one")]), t])
        index = ctx.add("Where", [ctx.add("Less", [t, lens]), flipped, t])
        index = ctx.add("Expand", [index, ctx.const(np.array(shape, np.int64), "shape")])
    ctx.bind(ctx.add("GatherElements", [node.input[0], index], axis=time_axis), node.output[0])


def cumprod_guard(node, ctx: RuleContext) -> str:
    """A constant axis of static length at most :data:`MAX_CUMPROD_LENGTH`."""
    shape, axis = ctx.shape(node.input[0]), ctx.value(node.input[1])
    if shape is None or axis is None:
        return "CumProd needs a static input shape and a constant axis"
    length = shape[int(axis.reshape(-1)[0]) % len(shape)]
    return "" if length <= MAX_CUMPROD_LENGTH else f"axis length {length} > {MAX_CUMPROD_LENGTH}"


def emit_cumprod(node, ctx: RuleContext) -> None:
    """``y[k] = prod_{j <= k} x[j]`` along ``axis`` (``j < k`` with ``exclusive``, the empty
    product 1; ``j >= k`` / ``j > k`` with ``reverse``): one running multiply per element."""
    attrs = attributes(node)
    shape = ctx.shape(node.input[0])
    axis = int(ctx.value(node.input[1]).reshape(-1)[0]) % len(shape)
    length = shape[axis]
    slices = [ctx.slice(node.input[0], axis, k, k + 1) for k in range(length)]
    order = list(range(length))[::-1] if attrs.get("reverse", 0) else list(range(length))
    ones = list(shape)
    ones[axis] = 1
    running = ctx.const(np.ones(ones, ctx.dtype(node.input[0])), "one")
    out = [""] * length
    for k in order:
        if attrs.get("exclusive", 0):
            out[k] = running
            running = ctx.add("Mul", [running, slices[k]])
        else:
            running = ctx.add("Mul", [running, slices[k]])
            out[k] = running
    ctx.bind(ctx.add("Concat", out, axis=axis) if length > 1 else out[0], node.output[0])


_TABLE = (
    Rule("LSTM", onnx_rnn.recurrent_guard, onnx_rnn.emit_lstm),
    Rule("GRU", onnx_rnn.recurrent_guard, onnx_rnn.emit_gru),
    Rule("RNN", onnx_rnn.recurrent_guard, onnx_rnn.emit_rnn),
    Rule("DynamicQuantizeLSTM", onnx_rnn.dynamic_quantize_lstm_guard,
         onnx_rnn.emit_dynamic_quantize_lstm, _MICROSOFT),
    Rule("ConvInteger", onnx_quant.integer_guard, onnx_quant.emit_conv_integer),
    Rule("MatMulInteger", onnx_quant.integer_guard, onnx_quant.emit_matmul_integer),
    Rule("QLinearConv", onnx_quant.integer_guard, onnx_quant.emit_qlinear_conv),
    Rule("QLinearMatMul", onnx_quant.integer_guard, onnx_quant.emit_qlinear_matmul),
    Rule("QGemm", onnx_quant.integer_guard, onnx_quant.emit_qgemm, _MICROSOFT),
    Rule("QLinearAdd", onnx_quant.integer_guard, onnx_quant.emit_qlinear_add, _MICROSOFT),
    Rule("QLinearMul", onnx_quant.integer_guard, onnx_quant.emit_qlinear_mul, _MICROSOFT),
    Rule("QLinearLeakyRelu", onnx_quant.qlinear_lookup_guard, onnx_quant.emit_qlinear_leaky_relu,
         _MICROSOFT),
    Rule("QLinearSigmoid", onnx_quant.qlinear_lookup_guard, onnx_quant.emit_qlinear_sigmoid,
         _MICROSOFT),
    Rule("QLinearGlobalAveragePool", onnx_quant.qlinear_global_average_pool_guard,
         onnx_quant.emit_qlinear_global_average_pool, _MICROSOFT),
    Rule("LpNormalization", lp_normalization_guard, emit_lp_normalization),
    Rule("ReverseSequence", reverse_sequence_guard, emit_reverse_sequence),
    Rule("CumProd", cumprod_guard, emit_cumprod),
)

#: Operator -> its decomposition.
RULES: Dict[str, Rule] = {rule.op: rule for rule in _TABLE}

__all__ = ["RULES", "Rule", "RuleContext"]
