"""Integer ONNX operators as int32 arithmetic TVM imports: ``ConvInteger``, ``MatMulInteger``,
``QLinearConv``, ``QLinearMatMul`` and the ``com.microsoft`` ops quantized exports carry
(``QGemm``, ``QLinearAdd``, ``QLinearMul``).

Products accumulate in int32 (``Cast`` to int32, zero points subtracted, ``Conv``/``MatMul`` on
int32: TVM compiles both on llvm, exactly). Requantization follows ONNX Runtime's (MLAS's)
order: the int32 accumulator (plus the int32 bias) converted to float32, times the float32
multiplier ``x_scale * w_scale / y_scale`` (computed in float32, per output channel where the
weight scale is), rounded half to even, the output zero point added, saturated to the output
type (one ``QuantizeLinear`` with scale 1). Converting the accumulator to float32 is exact up
to ``2^24`` in magnitude and rounds like ONNX Runtime's conversion beyond; past that the result
saturates anyway unless the multiplier is below ``2^-17`` (a case both evaluate identically, in
float32).
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from .onnx_emit import RuleContext, attributes, optional_input

_INT8 = (np.dtype(np.int8), np.dtype(np.uint8))

_CONV_ATTRIBUTES = ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")


def integer_guard(node, ctx: RuleContext) -> str:
    """"" when the quantized inputs are 8-bit integers with per-tensor or per-axis (1-D)
    zero points and scales; otherwise why not."""
    data = {"ConvInteger": (0, 1), "MatMulInteger": (0, 1), "QLinearConv": (0, 3),
            "QLinearMatMul": (0, 3), "QGemm": (0, 3), "QLinearAdd": (0, 3),
            "QLinearMul": (0, 3)}[node.op_type]  # fmt: skip
    for position in data:
        if ctx.dtype(node.input[position]) not in _INT8:
            return f"input {position} is not int8/uint8"
    for position, name in enumerate(node.input):
        if position in data or not name:
            continue
        shape = ctx.shape(name)
        if shape is None or len(shape) > 1:
            return f"input {position} ({name}) is not a scalar or a 1-D tensor"
    if node.op_type == "QGemm" and attributes(node).get("transA", 0):
        return "transA is not supported"
    return ""


def emit_conv_integer(node, ctx: RuleContext) -> None:
    """``y = conv(int32(x) - x_zero_point, int32(w) - w_zero_point)`` (int32; ``w_zero_point``
    per output channel or per tensor; padding reads ``x_zero_point``, so zeros after the
    subtraction)."""
    x = _centered(ctx, node.input[0], optional_input(node, 2), 0)
    w = _centered(ctx, node.input[1], optional_input(node, 3), 0, weight=True)
    ctx.bind(ctx.add("Conv", [x, w], **_conv_attributes(node)), node.output[0])


def emit_matmul_integer(node, ctx: RuleContext) -> None:
    """``y = (int32(a) - a_zero_point) @ (int32(b) - b_zero_point)`` (int32; ``a_zero_point``
    per row of ``a``, ``b_zero_point`` per column of ``b``, or per tensor)."""
    a = _centered(ctx, node.input[0], optional_input(node, 2), -2)
    b = _centered(ctx, node.input[1], optional_input(node, 3), -1, weight=True)
    ctx.bind(ctx.add("MatMul", [a, b]), node.output[0])


def emit_qlinear_conv(node, ctx: RuleContext) -> None:
    """``y = saturate(round((conv(x - x_zp, w - w_zp) + B) * x_scale * w_scale / y_scale) +
    y_zp)`` (the accumulator int32; ``w_scale``/``w_zp`` per output channel or per tensor)."""
    x = _centered(ctx, node.input[0], node.input[2], 0)
    w = _centered(ctx, node.input[3], node.input[5], 0, weight=True)
    acc = ctx.add("Conv", [x, w], **_conv_attributes(node))
    rank = len(ctx.shape(node.input[3]) or (0, 0, 0, 0))
    bias = optional_input(node, 8)
    if bias:
        acc = ctx.add("Add", [acc, _per_axis(ctx, bias, 1, rank)])
    scale = _multiplier(ctx, node.input[1], node.input[4], node.input[6], 1, rank)
    ctx.bind(_requantize(ctx, acc, scale, node.input[7]), node.output[0])


def emit_qlinear_matmul(node, ctx: RuleContext) -> None:
    """``y = saturate(round((a - a_zp) @ (b - b_zp) * a_scale * b_scale / y_scale) + y_zp)``
    (int32 accumulator; ``b_scale``/``b_zp`` per column or per tensor)."""
    a = _centered(ctx, node.input[0], node.input[2], -2)
    b = _centered(ctx, node.input[3], node.input[5], -1, weight=True)
    acc = ctx.add("MatMul", [a, b])
    scale = _multiplier(ctx, node.input[1], node.input[4], node.input[6], -1, 2)
    ctx.bind(_requantize(ctx, acc, scale, node.input[7]), node.output[0])


def emit_qgemm(node, ctx: RuleContext) -> None:
    """com.microsoft ``QGemm``: ``acc = (a - a_zp) @ op(b - b_zp) + C`` (int32, ``op`` the
    transpose with ``transB``); with ``y_scale``: ``y = saturate(round(acc * alpha * a_scale *
    b_scale / y_scale) + y_zp)``, without: ``y = float(acc) * alpha * a_scale * b_scale``."""
    attrs = attributes(node)
    a = _centered(ctx, node.input[0], node.input[2], -2)
    b = node.input[3]
    if attrs.get("transB", 0):
        b = _transposed(ctx, b)
    b_zp = node.input[5]
    b = _centered(ctx, b, b_zp, -1, weight=True)
    acc = ctx.add("MatMul", [a, b])
    bias = optional_input(node, 6)
    if bias:
        acc = ctx.add("Add", [acc, bias])
    alpha = float(attrs.get("alpha", 1.0))
    y_scale, y_zp = optional_input(node, 7), optional_input(node, 8)
    scale = _multiplier(ctx, node.input[1], node.input[4], y_scale, -1, 2, alpha)
    if y_scale:
        ctx.bind(_requantize(ctx, acc, scale, y_zp), node.output[0])
    else:
        ctx.bind(ctx.add("Mul", [ctx.add("Cast", [acc], to=1), scale]), node.output[0])


def emit_qlinear_add(node, ctx: RuleContext) -> None:
    """com.microsoft ``QLinearAdd``: ``c = saturate(round((a - a_zp) * (a_scale / c_scale) +
    (b - b_zp) * (b_scale / c_scale)) + c_zp)``. Where ``a`` and ``b`` have one static shape
    and the scales and zero points are constants, ONNX Runtime's own arithmetic
    (:func:`qlinear_add_table`) as a table of the 65536 pairs ``(a, b)``, read with one
    ``Gather``; otherwise this formula in float32 (ONNX Runtime may round a few elements the
    other way)."""
    if _add_table_applies(node, ctx):
        _emit_add_table(node, ctx)
        return
    terms = [ctx.add("Mul", [_float_centered(ctx, node.input[base], optional_input(node, base + 2)),
                             _ratio(ctx, node.input[base + 1], node.input[6])])
             for base in (0, 3)]  # fmt: skip
    total = ctx.add("Add", terms)
    ctx.bind(_requantize(ctx, total, None, optional_input(node, 7), node.input[0]),
             node.output[0])  # fmt: skip


def _fma32(x: np.ndarray, y: np.ndarray, z: np.ndarray) -> np.ndarray:
    """``float32(x * y + z)`` rounded once (a fused multiply-add) for float32 arrays: in float64,
    where the product is exact, checked to be the exact sum (TwoSum), and in exact rational
    arithmetic for any element where it is not."""
    p = x.astype(np.float64) * y.astype(np.float64)
    q = z.astype(np.float64)
    s = p + q
    bp = s - p
    exact = ((p - (s - bp)) + (q - bp)) == 0
    out = s.astype(np.float32)
    for i in np.flatnonzero(~exact.reshape(-1)):
        from fractions import Fraction  # pylint: disable=import-outside-toplevel

        value = Fraction(float(p.reshape(-1)[i])) + Fraction(float(q.reshape(-1)[i]))
        out.reshape(-1)[i] = _round_fraction32(value)
    return out


def _round_fraction32(value) -> np.float32:
    """The float32 nearest to the rational ``value`` (ties to even)."""
    candidate = np.float32(float(value))  # within one float32 step
    below = np.nextafter(candidate, np.float32(-np.inf))
    above = np.nextafter(candidate, np.float32(np.inf))
    from fractions import Fraction  # pylint: disable=import-outside-toplevel

    return min((below, candidate, above), key=lambda c: (abs(Fraction(float(c)) - value),
                                                        int(c.view(np.int32)) & 1))


def qlinear_add_table(a_scale: float, a_zp: int, b_scale: float, b_zp: int, c_scale: float,
                      c_zp: int, dtype) -> np.ndarray:  # fmt: skip
    """``QLinearAdd`` of every pair of 8-bit values as ONNX Runtime computes it on x86 CPUs with
    AVX2 (MLAS's ``MlasQLinearAddKernelAvx2Helper``, both inputs of one shape), indexed
    ``[(a - lo) * 256 + (b - lo)]`` with ``lo`` the type's minimum:

        rA = float32(a_scale / c_scale), rB = float32(b_scale / c_scale)
        F  = float32(c_zp) - fma(rA, a_zp, float32(rB * b_zp))
        c  = saturate(round_half_even(fma(a, rA, fma(b, rB, F))))

    (``fma`` rounds once; the zero point is inside ``F``). Checked against ONNX Runtime on all
    65536 pairs for random scales and zero points in ``tests/frontend``."""
    dtype = np.dtype(dtype)
    info = np.iinfo(dtype)
    f32 = np.float32
    r_a, r_b = f32(f32(a_scale) / f32(c_scale)), f32(f32(b_scale) / f32(c_scale))
    fixed = f32(f32(c_zp) - _fma32(np.array([r_a]), np.array([f32(a_zp)]),
                                   np.array([f32(r_b * f32(b_zp))]))[0])
    values = np.arange(info.min, info.max + 1).astype(f32)
    a, b = np.repeat(values, values.size), np.tile(values, values.size)
    partial = _fma32(b, np.full_like(b, r_b), np.full_like(b, fixed))
    total = _fma32(a, np.full_like(a, r_a), partial)
    return np.clip(np.rint(total), info.min, info.max).astype(dtype)


def _add_table_applies(node, ctx: RuleContext) -> bool:
    """Guard of the table form: constant scalar scales and zero points (all present), ``a``
    and ``b`` of one static shape (ONNX Runtime's scalar and broadcast paths add differently)."""
    names = [node.input[i] if len(node.input) > i else "" for i in (1, 2, 4, 5, 6, 7)]
    if not all(names):
        return False
    values = [ctx.value(n) for n in names]
    if any(v is None or v.size != 1 for v in values):
        return False
    shape_a, shape_b = ctx.shape(node.input[0]), ctx.shape(node.input[3])
    return shape_a is not None and shape_a == shape_b and all(
        isinstance(d, (int, np.integer)) and d > 0 for d in shape_a)


def _emit_add_table(node, ctx: RuleContext) -> None:
    a_scale, a_zp, b_scale, b_zp, c_scale, c_zp = (
        ctx.value(node.input[i]).reshape(()) for i in (1, 2, 4, 5, 6, 7))
    dtype = ctx.dtype(node.input[0])
    table = qlinear_add_table(float(a_scale), int(a_zp), float(b_scale), int(b_zp),
                              float(c_scale), int(c_zp), dtype)
    low = ctx.const(np.int32(np.iinfo(dtype).min), "low")
    wide = [ctx.add("Sub", [ctx.add("Cast", [node.input[i]], to=6), low]) for i in (0, 3)]
    index = ctx.add("Add", [ctx.add("Mul", [wide[0], ctx.const(np.int32(256), "rows")]),
                            wide[1]])
    ctx.bind(ctx.add("Gather", [ctx.const(table, "add_table"), index], axis=0), node.output[0])


def emit_qlinear_mul(node, ctx: RuleContext) -> None:
    """com.microsoft ``QLinearMul``: ``c = saturate(round((a - a_zp) * (b - b_zp) * (a_scale *
    b_scale / c_scale)) + c_zp)``."""
    product = ctx.add("Mul", [_float_centered(ctx, node.input[0], optional_input(node, 2)),
                              _float_centered(ctx, node.input[3], optional_input(node, 5))])
    scale = _multiplier(ctx, node.input[1], node.input[4], node.input[6], -1, 1)
    total = ctx.add("Mul", [product, scale])
    ctx.bind(_requantize(ctx, total, None, optional_input(node, 7), node.input[0]),
             node.output[0])  # fmt: skip


def qlinear_lookup_guard(node, ctx: RuleContext) -> str:
    """An 8-bit ``x``, constant scalar scales and zero points (or none: 0), as ONNX Runtime
    needs to build its table once."""
    if ctx.dtype(node.input[0]) not in _INT8:
        return "input 0 is not int8/uint8"
    for position in (1, 2, 3, 4):
        name = optional_input(node, position)
        if not name and position in (2, 4):
            continue
        value = ctx.value(name) if name else None
        if value is None or value.size != 1:
            return f"input {position} is not a constant scalar"
    return ""


def leaky_relu_table(x_scale: float, x_zp: int, y_scale: float, y_zp: int, alpha: float,
                     dtype) -> np.ndarray:  # fmt: skip
    """ONNX Runtime's QLinearLeakyRelu table: :func:`lookup_table` of ``f(v) = v`` if ``v >=
    0`` else ``float32(alpha) * v``."""
    def leaky(v):
        return np.where(v >= 0, v, np.float32(alpha) * v).astype(np.float32)

    return lookup_table(x_scale, x_zp, y_scale, y_zp, leaky, dtype)


#: MLAS's logistic (``MlasLogisticConstants``: Eigen's rational approximation): the input
#: range, the numerator's and the denominator's coefficients, highest power first.
_LOGISTIC_RANGE = (-18.0, 18.0)
_LOGISTIC_P = (4.37031012579801e-11, 1.15627324459942e-07, 6.08574864600143e-05,
               8.51377133304701e-03, 2.48287947061529e-01)
_LOGISTIC_Q = (6.10247389755681e-13, 5.76102136993427e-09, 6.29106785017040e-06,
               1.70198817374094e-03, 1.16817656904453e-01, 9.93151921023180e-01)


def mlas_logistic(x: np.ndarray) -> np.ndarray:
    """ONNX Runtime's ``MlasComputeLogistic`` on x86-64 with FMA (its FMA3 kernel), in float32:
    ``v = clamp(x, -18, 18)``, ``s = v * v``, ``p = v * horner_fma(s, P)``, ``q =
    horner_fma(s, Q)``, ``clamp(p / q + 0.5, 0, 1)`` (each Horner step one fused
    multiply-add)."""
    f32 = np.float32
    v = np.clip(x.astype(f32), f32(_LOGISTIC_RANGE[0]), f32(_LOGISTIC_RANGE[1]))
    square = (v * v).astype(f32)

    def horner(coefficients):
        acc = _fma32(square, np.full_like(square, f32(coefficients[0])),
                     np.full_like(square, f32(coefficients[1])))
        for c in coefficients[2:]:
            acc = _fma32(acc, square, np.full_like(square, f32(c)))
        return acc

    p = (horner(_LOGISTIC_P) * v).astype(f32)
    return np.clip((p / horner(_LOGISTIC_Q)).astype(f32) + f32(0.5), f32(0), f32(1)).astype(f32)


def lookup_table(x_scale: float, x_zp: int, y_scale: float, y_zp: int, fn, dtype) -> np.ndarray:
    """ONNX Runtime's table of a QLinear lookup activation (``QlinearBuildLookupTable``), one
    entry per value of ``dtype`` from its minimum: ``v = float32(x_scale) * float32(x -
    x_zp)``, ``y = sat(rint(fn(v) / float32(y_scale)) + y_zp)`` (``fn`` on float32 arrays)."""
    info = np.iinfo(dtype)
    v = np.float32(x_scale) * (np.arange(info.min, info.max + 1) - x_zp).astype(np.float32)
    q = np.rint(fn(v).astype(np.float32) / np.float32(y_scale)).astype(np.float64) + y_zp
    return np.clip(q, info.min, info.max).astype(dtype)


def _emit_lookup(node, ctx: RuleContext, fn, hint: str) -> None:
    """``y = table[x]`` (:func:`lookup_table` of ``fn``), read by one ``Gather``."""
    x_scale, y_scale = (float(ctx.value(node.input[i]).reshape(())) for i in (1, 3))
    x_zp, y_zp = (int(ctx.value(optional_input(node, i)).reshape(()))
                  if optional_input(node, i) else 0 for i in (2, 4))
    dtype = ctx.dtype(node.input[0])
    table = lookup_table(x_scale, x_zp, y_scale, y_zp, fn, dtype)
    low = ctx.const(np.int32(np.iinfo(dtype).min), "low")
    index = ctx.add("Sub", [ctx.add("Cast", [node.input[0]], to=6), low])
    ctx.bind(ctx.add("Gather", [ctx.const(table, hint), index], axis=0), node.output[0])


def emit_qlinear_sigmoid(node, ctx: RuleContext) -> None:
    """com.microsoft ``QLinearSigmoid``: ``y = table[x]``, ONNX Runtime's table of its own
    logistic (:func:`mlas_logistic`; :func:`lookup_table`)."""
    _emit_lookup(node, ctx, mlas_logistic, "sigmoid_table")


def qlinear_global_average_pool_guard(node, ctx: RuleContext) -> str:
    """:func:`qlinear_lookup_guard`'s constants, ``channels_last`` 0, a static input of rank 3+
    and ONNX Runtime's range for the multiplier (``2^-32 <= scale < 256``, image below
    ``2^24``: it refuses the others)."""
    why = qlinear_lookup_guard(node, ctx)
    shape = ctx.shape(node.input[0])
    if why or shape is None or len(shape) < 3:
        return why or "the input needs a static shape of rank 3 or more"
    if attributes(node).get("channels_last", 0):
        return "channels_last=1"
    size = int(np.prod(shape[2:]))
    scale = _pool_scale(ctx, node, size)
    if size >= 1 << 24 or not 2.0 ** -32 <= scale < 256.0:
        return "the scale or the image size is outside ONNX Runtime's range"
    return ""


def _pool_scale(ctx: RuleContext, node, size: int) -> np.float32:
    """``x_scale / (y_scale * float32(size))`` in float32 (MLAS's order)."""
    x_scale, y_scale = (np.float32(ctx.value(node.input[i]).reshape(())) for i in (1, 3))
    return np.float32(x_scale / np.float32(y_scale * np.float32(size)))


def emit_qlinear_global_average_pool(node, ctx: RuleContext) -> None:
    """com.microsoft ``QLinearGlobalAveragePool`` (NCHW), MLAS's arithmetic: ``acc = sum(x) -
    x_zp * size`` over the spatial axes in int32, ``y = sat(rint(float32(acc) * (x_scale /
    (y_scale * size))) + y_zp)``."""
    shape = ctx.shape(node.input[0])
    size = int(np.prod(shape[2:]))
    total = ctx.reduce("ReduceSum", ctx.add("Cast", [node.input[0]], to=6),
                       list(range(2, len(shape))))
    zp = optional_input(node, 2)
    if zp:
        offset = int(ctx.value(zp).reshape(())) * size
        total = ctx.add("Sub", [total, ctx.const(np.int32(offset), "zp_sum")])
    scale = ctx.const(_pool_scale(ctx, node, size), "pool_scale")
    ctx.bind(_requantize(ctx, total, scale, optional_input(node, 4), node.input[0]),
             node.output[0])


def emit_qlinear_leaky_relu(node, ctx: RuleContext) -> None:
    """com.microsoft ``QLinearLeakyRelu``: ``y = table[x]`` with ONNX Runtime's table
    (:func:`leaky_relu_table`, ``alpha`` default 0.01), read by one ``Gather``."""
    alpha = np.float32(attributes(node).get("alpha", 0.01))
    _emit_lookup(node, ctx, lambda v: np.where(v >= 0, v, alpha * v), "leaky_table")


# ---------------------------------------------------------------------------------------------
# Pieces
# ---------------------------------------------------------------------------------------------


def _conv_attributes(node):
    return {k: v for k, v in attributes(node).items() if k in _CONV_ATTRIBUTES}


def _centered(ctx: RuleContext, x: str, zero_point: str, axis: int, weight: bool = False) -> str:
    """``int32(x) - zero_point``, the zero point broadcast along ``axis`` when it is 1-D (folded
    to an int32 initializer when both are constants, as weights are)."""
    rank = len(ctx.shape(x) or ()) or 2
    value, zp_value = ctx.value(x), ctx.value(zero_point)
    if weight and value is not None and (not zero_point or zp_value is not None):
        centered = value.astype(np.int32)
        if zero_point:
            centered = centered - _axis_shaped(zp_value.astype(np.int32), axis, rank)
        return ctx.const(centered, "centered")
    wide = ctx.add("Cast", [x], to=6)
    if not zero_point:
        return wide
    if zp_value is not None:
        zp = ctx.const(_axis_shaped(zp_value.astype(np.int32), axis, rank), "zp")
    else:
        zp = _per_axis(ctx, ctx.add("Cast", [zero_point], to=6), axis, rank)
    return ctx.add("Sub", [wide, zp])


def _float_centered(ctx: RuleContext, x: str, zero_point: str) -> str:
    """``float32(int32(x) - zero_point)`` (exact: 8-bit differences)."""
    return ctx.add("Cast", [_centered(ctx, x, zero_point, -1)], to=1)


def _axis_shaped(value: np.ndarray, axis: int, rank: int) -> np.ndarray:
    """A 1-D per-axis ``value`` shaped to broadcast along ``axis`` of a rank-``rank`` tensor."""
    if value.ndim == 0 or value.size == 1:
        return value.reshape(())
    axis = axis % rank
    shape = [1] * rank
    shape[axis] = value.size
    return value.reshape(shape)


def _per_axis(ctx: RuleContext, name: str, axis: int, rank: int) -> str:
    """``name`` (scalar or 1-D) reshaped to broadcast along ``axis``."""
    value = ctx.value(name)
    if value is not None:
        return ctx.const(_axis_shaped(value, axis, rank), "axis")
    shape = ctx.shape(name)
    if not shape or shape[0] == 1:
        return name
    target = [1] * rank
    target[axis % rank] = shape[0]
    return ctx.reshape(name, target)


def _multiplier(ctx: RuleContext, scale_a: str, scale_b: str, scale_y: str, axis: int,
                rank: int, alpha: float = 1.0) -> str:  # fmt: skip
    """float32 ``alpha * scale_a * scale_b / scale_y`` (ONNX Runtime's order), along ``axis``."""
    values = [ctx.value(scale_a), ctx.value(scale_b), ctx.value(scale_y) if scale_y else None]
    if all(v is not None for v in values[:2]) and (not scale_y or values[2] is not None):
        product = np.float32(alpha) * values[0].astype(np.float32) if alpha != 1.0 else \
            values[0].astype(np.float32)
        product = product * values[1].astype(np.float32)
        if scale_y:
            product = product / values[2].astype(np.float32)
        return ctx.const(_axis_shaped(np.asarray(product, np.float32), axis, rank), "scale")
    product = ctx.add("Mul", [_per_axis(ctx, scale_a, -2 if axis == -1 else axis, rank),
                              _per_axis(ctx, scale_b, axis, rank)])
    if alpha != 1.0:
        product = ctx.add("Mul", [ctx.const(np.float32(alpha), "alpha"), product])
    if scale_y:
        product = ctx.add("Div", [product, scale_y])
    return product


def _ratio(ctx: RuleContext, scale: str, scale_out: str) -> str:
    """float32 ``scale / scale_out``."""
    values = ctx.value(scale), ctx.value(scale_out)
    if values[0] is not None and values[1] is not None:
        return ctx.const(np.asarray(values[0].astype(np.float32) / values[1].astype(np.float32)),
                         "ratio")  # fmt: skip
    return ctx.add("Div", [scale, scale_out])


def _requantize(ctx: RuleContext, acc: str, scale: Optional[str], zero_point: str,
                like: str = "") -> str:  # fmt: skip
    """``saturate(round(float32(acc) * scale) + zero_point)`` in the zero point's type (the
    type of ``like`` when there is no zero point: 8-bit unsigned by the specification's
    default), written as ``QuantizeLinear(float32(acc) * scale, 1, zero_point)``: the same
    arithmetic (``x / 1`` is ``x``; rounding half to even, then the zero point, then
    saturation), one operator TVM imports as ``relax.quantize`` (which
    :mod:`tvm_ollie.transform.int8_kernels` folds into the int8 kernel)."""
    value = acc if scale is None else ctx.add("Mul", [ctx.add("Cast", [acc], to=1), scale])
    if zero_point:
        zp_value, shape = ctx.value(zero_point), ctx.shape(zero_point)
        if zp_value is not None and zp_value.ndim:
            zero_point = ctx.const(zp_value.reshape(()), "y_zp")
        elif shape is not None and len(shape) == 1:
            zero_point = ctx.reshape(zero_point, [])
    else:
        dtype = (ctx.dtype(like) if like else None) or np.dtype(np.uint8)
        zero_point = ctx.const(np.zeros((), dtype), "y_zp")
    return ctx.add("QuantizeLinear", [value, ctx.const(np.float32(1.0), "one"), zero_point])


def _transposed(ctx: RuleContext, name: str) -> str:
    value = ctx.value(name)
    if value is not None:
        return ctx.const(np.ascontiguousarray(value.T), "bt")
    return ctx.add("Transpose", [name], perm=[1, 0])
