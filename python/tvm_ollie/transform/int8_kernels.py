"""Integer convolutions and matmuls of quantized models onto the native int8 kernels.

The ONNX importer writes ``ConvInteger``/``QLinearConv`` and ``MatMulInteger``/
``QLinearMatMul``/``QGemm`` as int32 arithmetic (:mod:`tvm_ollie.frontend.onnx_quant`):
``conv2d(int32(x) - x_zp, W)`` and ``matmul(int32(a) - a_zp, W)`` with 8-bit ``x``/``a`` and the
weight ``W`` a constant already centered on its zero point. TVM compiles those to generic
int32 loops; oneDNN's int8 kernels (``tvm_ollie.cpu.conv2d_int8``/``matmul_int8``) compute the
same sums on 8-bit operands with the zero point inside the primitive. Where the int32 sum is
requantized as ``QLinearConv``/``QLinearMatMul`` specify (the importer writes
``quantize(float32(acc + B) * M, 1, y_zp)``), the requantization moves into the kernel too
(oneDNN post-ops, ``rq=1``: the bias before the multiplier, rounding half to even before the
zero point), and the call returns the 8-bit result instead of an int32 tensor.

Each rule (:class:`~.inference_fold.FoldRule`: a name, a dataflow pattern, a rewrite that
returns ``None`` when a guard fails) replaces the int32 call by the kernel with an int32 result
only when that result is provably the same integers:

* the centered weight fits int8 (``-128 <= W <= 127``), and in ``[-64, 63]`` where the CPU
  lacks VNNI (:func:`tvm_ollie.native.int8_exact_products`: oneDNN then adds pairs of products
  in saturating int16);
* every accumulator is below ``2^24`` in magnitude, where float32 is exact (oneDNN converts the
  int32 sum to float32 for its epilogue even for an int32 output):
  ``max_o Σ |W[o, ...]| · max(|lo - x_zp|, |hi - x_zp|) <= 2^24`` with ``[lo, hi]`` the range
  of ``x``'s type;
* for a convolution, an unsigned source where the CPU lacks VNNI (oneDNN halves the weights
  of an int8-source convolution there, :func:`_conv_source_exact`);
* the kernel, run once on an input at the extremes of that range over one receptive field,
  gives numpy's integers (:func:`_kernel_agrees`).

The requantizing rules add: the bias an int32 constant per output channel (or one value) with
``max|B| <= 2^24`` (with ``|acc| <= 2^24`` both are exact in float32, so the one rounding of
``float(acc) + float(B)``, what oneDNN adds, is that of ``float(acc + B)``, what ONNX Runtime
converts; accumulators that may pass ``2^24`` are accepted only when every such value
saturates in both, :func:`saturates_past_limit`); the multiplier a float32 constant per output
channel or per tensor; the quantize's scale exactly 1 and its zero point one constant of the
8-bit output type; each intermediate read once; and the fused kernel, probed on one receptive
field, equal to :func:`requantize_reference`. A chain that fails any of them keeps the int32
kernel and TVM's elementwise requantization (the plain rules below).

A zero point known at run time only (``DynamicQuantizeLinear`` before ``ConvInteger``/
``MatMulInteger``, and the ``DynamicQuantizeLSTM`` rule's products: ``int32(x) - int32(z)``
with ``z`` an 8-bit scalar tensor) is the kernel's zero-point operand as it is (oneDNN reads
it per call). Its rules (``int8_conv2d_dynamic_zp``, ``int8_matmul_dynamic_zp``) take the
accumulator bound over every value of ``z``'s type (:func:`dynamic_bound`) and probe the
kernel at both ends of that range; a centered weight outside int8 (a uint8 weight with an
asymmetric zero point spans up to ``[-255, 255]``) is split into int8 parts whose int32
results are added (:func:`int8_parts`).

After the rules, chains of int8 convolutions are put in NHWC (:mod:`.int8_layout`: oneDNN's
int8 primitives run on ``nhwc``, so an NCHW call reorders its source and result inside), and
then the constant weights are packed for the calls as they finally are (:func:`_packed_conv`,
the library's ``conv2d_int8_pack_weight``, and ``matmul_int8_pack_weight`` for a matmul's B):
oneDNN's format with the zero point's compensation, which it otherwise recomputes in every
call.

The pass applies them on CPU targets when the library is in use; without the library (or with
``TVM_OLLIE_DISABLE_NATIVE=1``) the module keeps the int32 form.
"""

from __future__ import annotations

from collections import Counter
from typing import Dict, List, NamedTuple, Optional, Tuple

import numpy as np

from .. import native
from ..codegen import library as lib
from ..compat import relax, tirx, tvm
from . import epilogue
from .fold_rule import used_once
from .inference_fold import FoldRule, fold_inference
from .int8_choice import INT8, INT8_REQUANT, INT32, Int8Choice
from .int8_layout import conv_int8_of, int8_call_of, int8_layout

__all__ = ["INT8_RULES", "int8_kernels", "accumulator_bound", "dynamic_bound", "int8_parts",
           "pack_conv_weights", "requantize_reference", "saturates_past_limit"]

_dpl = relax.dpl

#: The largest accumulator magnitude float32 holds exactly.
EXACT_LIMIT = 2 ** 24

_X8 = _dpl.wildcard()
_ZP = _dpl.is_const()
_W = _dpl.is_const()
_WIDE = _dpl.is_op("relax.astype")(_X8)
_SRC = _dpl.is_op("relax.subtract")(_WIDE, _ZP) | _WIDE
_CONV = _dpl.is_op("relax.nn.conv2d")(_SRC, _W)
_MATMUL = _dpl.is_op("relax.matmul")(_SRC, _W)
_BIAS = _dpl.is_const()
_MULTIPLIER = _dpl.is_const()
_ONE = _dpl.is_const()
_YZP = _dpl.is_const()


class _Requantized(NamedTuple):
    """``quantize(float32(acc [+ B]) * M, 1, y_zp)``, the importer's QLinear requantization of
    ``acc``, with a pattern per step (the matched expressions of the chain)."""

    acc: object
    add: object
    wide: object
    scaled: object
    root: object


def _requantized(acc) -> _Requantized:
    add = _dpl.is_op("relax.add")(acc, _BIAS)
    wide = _dpl.is_op("relax.astype")(add | acc)
    scaled = _dpl.is_op("relax.multiply")(wide, _MULTIPLIER)
    return _Requantized(acc, add, wide, scaled,
                        _dpl.is_op("relax.quantize")(scaled, _ONE, _YZP))


_RQ_CONV = _requantized(_CONV)
_RQ_MATMUL = _requantized(_MATMUL)

#: A zero point computed at run time (``DynamicQuantizeLinear``'s): an 8-bit scalar tensor.
_ZPV = _dpl.wildcard()
_ZPW = _dpl.is_op("relax.astype")(_ZPV)
_SRC_DYN = _dpl.is_op("relax.subtract")(_WIDE, _ZPW)
#: A weight still written as ``int32(B) - int32(b_zero_point)`` of two constants (TVM's own
#: ``MatMulInteger`` converter leaves it so; :func:`_weight_value` evaluates it).
_WB, _WZP = _dpl.is_const(), _dpl.is_const()
_W_CENTERED = _dpl.is_op("relax.subtract")(_dpl.is_op("relax.astype")(_WB),
                                           _dpl.is_op("relax.astype")(_WZP))
_CONV_DYN = _dpl.is_op("relax.nn.conv2d")(_SRC_DYN, _W)
_MATMUL_DYN = _dpl.is_op("relax.matmul")(_SRC_DYN, _W | _W_CENTERED)

#: The most int8 weights a wider centered weight is split into (:func:`int8_parts`).
MAX_PARTS = 3

Matches = Dict[object, object]


# --- guards -------------------------------------------------------------------------------


def _dtype(expr) -> str:
    return str(expr.ty.dtype)


def _source_range(matches: Matches) -> Optional[Tuple[int, int, int]]:
    """``(lo, hi, zero point)`` of the 8-bit source widened to int32, or None when it is not
    8-bit or the zero point is not one int32 constant."""
    if _dtype(matches[_X8]) not in ("uint8", "int8") or _dtype(matches[_WIDE]) != "int32":
        return None
    info = np.iinfo(_dtype(matches[_X8]))
    if _ZP not in matches:
        return int(info.min), int(info.max), 0
    zp = matches[_ZP].value.numpy()
    if zp.dtype != np.int32 or zp.size != 1:
        return None
    return int(info.min), int(info.max), int(zp.reshape(()))


def _int8_weight(matches: Matches, rank: int) -> Optional[np.ndarray]:
    """The constant int32 weight as int8 when it fits (in ``[-64, 63]`` without VNNI)."""
    w = matches[_W].value.numpy()
    if w.dtype != np.int32 or w.ndim != rank or w.size == 0:
        return None
    low, high = (-128, 127) if native.int8_exact_products() else (-64, 63)
    if w.min() < low or w.max() > high:
        return None
    return w.astype(np.int8)


def accumulator_bound(weight: np.ndarray, axis: int, lo: int, hi: int, zp: int) -> int:
    """``max_o Σ |W| · max(|lo - zp|, |hi - zp|)``, the sums over every axis but ``axis``
    (the output channel): no accumulator of the product with a source in ``[lo, hi]`` minus
    ``zp`` exceeds it in magnitude."""
    per_output = np.abs(np.moveaxis(weight.astype(np.int64), axis, 0)).reshape(
        weight.shape[axis], -1).sum(axis=1)
    return int(per_output.max()) * max(abs(lo - zp), abs(hi - zp))


def _int32_out(call) -> bool:
    """An int32 result of static shape (the kernel's output is allocated by the caller)."""
    out_dtype = str(getattr(call.attrs, "out_dtype", "") or "")
    shape = call.ty.shape
    static = shape is not None and all(isinstance(d, tirx.IntImm) for d in shape)
    return out_dtype in ("", "void", "int32") and _dtype(call) == "int32" and static


def _extreme_input(shape, lo: int, hi: int, dtype: str) -> np.ndarray:
    """An input whose entries are the range's ends (where int16 pair sums would saturate)."""
    rng = np.random.default_rng(0)
    return np.where(rng.random(shape) < 0.5, lo, hi).astype(dtype)


def _run(func: str, attrs: str, operands, out_shape) -> np.ndarray:
    out = tvm.runtime.tensor(np.zeros(out_shape, np.int32))
    args = [tvm.runtime.tensor(a) for a in operands]
    tvm.get_global_func(func)(attrs, *args, out)
    return out.numpy()


def _kernel_agrees(func: str, attrs: str, x: np.ndarray, weight: np.ndarray, zp: int,
                   expected: np.ndarray, out_shape) -> bool:
    """The kernel's int32 result on ``x`` equals ``expected`` (numpy's, in int64)."""
    got = _run(func, attrs, (x, weight, np.array([zp], np.int32)), out_shape)
    return bool(np.array_equal(got.astype(np.int64), expected))


# --- rules --------------------------------------------------------------------------------


def _exact_operands(matches: Matches, rank: int, reduce_axis: int, bounded: bool = True):
    """``(weight, lo, hi, zp)`` when the source is 8-bit with one constant zero point, the
    rank-``rank`` weight fits the kernel and (``bounded``) every accumulator over
    ``reduce_axis`` stays within :data:`EXACT_LIMIT`; else None (the guards the int8 rules
    share; the requantizing ones check the bound themselves)."""
    source, weight = _source_range(matches), _int8_weight(matches, rank)
    if source is None or weight is None:
        return None
    lo, hi, zp = source
    if bounded and accumulator_bound(weight, reduce_axis, lo, hi, zp) > EXACT_LIMIT:
        return None
    return weight, lo, hi, zp


def _conv_source_exact(matches: Matches) -> bool:
    """Whether oneDNN's convolution sums this source's products exactly: not an int8 source
    on a CPU without VNNI, where oneDNN keeps the source signed and halves the weights in its
    reorder (its s8s8 compensation, rounded half to even: weight 1 -> 0, 3 -> 4 measured on an
    AVX2 EPYC). The one-receptive-field probe finds that for odd weights, but the call's own
    shape may get another implementation than the probe's, so such convolutions stay TVM's."""
    return native.int8_exact_products() or _dtype(matches[_X8]) != "int8"


def _conv_operands(matches: Matches, bounded: bool = True):
    """``(attrs, weight, lo, hi, zp)`` of an NCHW/OIHW int32 conv2d the kernel computes exactly
    (``attrs``: strides, padding, dilation, groups), else None."""
    conv = matches[_CONV]
    at = conv.attrs
    if (str(at.data_layout), str(at.kernel_layout)) != ("NCHW", "OIHW"):
        return None
    if not _conv_source_exact(matches):
        return None
    if (str(at.out_layout) or "NCHW") != "NCHW" or not _int32_out(conv):
        return None
    checked = _exact_operands(matches, 4, 0, bounded)
    if checked is None:
        return None
    dims = (at.strides, at.padding, [int(d) for d in at.dilation], int(at.groups))
    return (dims,) + checked


def _packed_conv(call: "lib.LibCall", data, weight: np.ndarray, out_shape, out_dtype: str):
    """``(call, weight operand)``: the call with ``wpacked=1`` and the weight packed once into
    oneDNN's blocked format for this very call (with the zero point's compensation, which
    oneDNN otherwise recomputes in every call: 8-12 ms for a 256x256x3x3 weight against a 0.09
    ms convolution); None when the library cannot pack or a shape is not static."""
    shape = data.ty.shape
    if not native.provides(native.CONV2D_INT8_PACK_WEIGHT) or shape is None or not all(
            isinstance(d, tirx.IntImm) for d in shape):
        return None
    attrs = call.text()
    x = tvm.runtime.tensor(np.zeros([int(d) for d in shape], _dtype(data)))
    out = tvm.runtime.tensor(np.zeros(out_shape, out_dtype))
    wt = tvm.runtime.tensor(weight)
    size = int(tvm.get_global_func(native.CONV2D_INT8_PACKED_SIZE)(attrs, x, wt, out))
    packed = tvm.runtime.tensor(np.zeros(size, np.int8))
    tvm.get_global_func(native.CONV2D_INT8_PACK_WEIGHT)(attrs, x, wt, out, packed)
    kh, kw = weight.shape[2:] if call.get("klayout", "OIHW") == "OIHW" else weight.shape[1:3]
    return call.with_attrs(wpacked="1", kernel=f"{kh},{kw}"), relax.const(packed.numpy())


def _packed_binding(var, value):
    """The ``conv2d_int8`` call ``value`` (bound to ``var``) with its constant weight packed,
    or None."""
    found = conv_int8_of(value)
    if found is None or found[0].get("wpacked", "0") == "1":
        return None
    call, ops = found
    shape = var.ty.shape
    if not isinstance(ops[1], tvm.ir.expr.Constant) or shape is None or not all(
            isinstance(d, tirx.IntImm) for d in shape):
        return None
    out_shape = [int(d) for d in shape]
    packed = _packed_conv(call, ops[0], ops[1].value.numpy(), out_shape, _dtype(var))
    if packed is None:
        return None
    return lib.emit_call(packed[0], [ops[0], packed[1]] + list(ops[2:]), out_shape,
                         _dtype(var))


#: The library's matmul weight packing (``matmul_int8_packed_size``/``_pack_weight``).
MATMUL_INT8_PACKED_SIZE = "tvm_ollie.cpu.matmul_int8_packed_size"
MATMUL_INT8_PACK_WEIGHT = "tvm_ollie.cpu.matmul_int8_pack_weight"


def _static(shape) -> bool:
    return shape is not None and all(isinstance(d, tirx.IntImm) for d in shape)


def _packed_matmul_binding(var, value):
    """The ``matmul_int8`` call ``value`` (bound to ``var``) with its constant ``B`` packed once
    into the primitive's format with the source zero point's compensation (oneDNN otherwise
    sums every column of ``B`` again in each call), or None."""
    found = int8_call_of(value, lib.MATMUL_INT8)
    if found is None or found[0].get("wpacked", "0") == "1" or not native.provides(
            MATMUL_INT8_PACK_WEIGHT):
        return None
    call, ops = found
    if not isinstance(ops[1], tvm.ir.expr.Constant) or not _static(var.ty.shape) or \
            not _static(ops[0].ty.shape):
        return None
    attrs = call.text()
    a = tvm.runtime.tensor(np.zeros([int(d) for d in ops[0].ty.shape], _dtype(ops[0])))
    out_shape = [int(d) for d in var.ty.shape]
    out = tvm.runtime.tensor(np.zeros(out_shape, _dtype(var)))
    b = tvm.runtime.tensor(ops[1].value.numpy())
    size = int(tvm.get_global_func(MATMUL_INT8_PACKED_SIZE)(attrs, a, b, out))
    packed = tvm.runtime.tensor(np.zeros(size, np.int8))
    tvm.get_global_func(MATMUL_INT8_PACK_WEIGHT)(attrs, a, b, out, packed)
    return lib.emit_call(call.with_attrs(wpacked="1"),
                         [ops[0], relax.const(packed.numpy())] + list(ops[2:]), out_shape,
                         _dtype(var))


def pack_conv_weights(mod: "tvm.IRModule") -> "tvm.IRModule":
    """``mod`` with the constant weight of every ``conv2d_int8`` and ``matmul_int8`` call of
    static shapes packed (:func:`_packed_conv`, :func:`_packed_matmul_binding`), after the
    layouts are decided (a pack is made for one call's attributes and formats); in plain
    binding blocks as well as dataflow blocks."""
    return epilogue.rewrite_dataflow_blocks(mod, _packed_bindings, dataflow_only=False)


def _packed_bindings(bindings: List, _func) -> List:
    """``bindings`` with each int8 call whose weight can be packed replaced (the same binding
    objects where none can)."""
    out = []
    for b in bindings:
        packed = None
        if isinstance(b, relax.VarBinding):
            packed = _packed_binding(b.var, b.value)
            if packed is None:
                packed = _packed_matmul_binding(b.var, b.value)
        out.append(b if packed is None else relax.VarBinding(b.var, packed))
    return out


def _conv_int8(matches: Matches, _uses: Counter, _binding_of) -> Optional[object]:
    """``conv2d_int8``: ``conv2d(int32(x) - zp, W) = conv2d_int8(x, int8(W), zp)`` (NCHW/OIHW,
    int32 result; padding reads ``zp`` on both sides)."""
    found = _conv_operands(matches)
    if found is None:
        return None
    (strides, padding, dil, groups), weight, lo, hi, zp = found
    x, acc = _conv_patch(weight, groups, dil, lo, hi, zp, _dtype(matches[_X8]))
    attrs = f"dil={dil[0]},{dil[1]};groups={groups};xzp=1"
    if not _kernel_agrees(lib.CONV2D_INT8, attrs, x, weight, zp, acc, acc.shape):
        return None
    out_shape = [int(s) for s in matches[_CONV].ty.shape]
    operands = [matches[_X8], relax.const(weight), relax.const(np.array([zp], np.int32))]
    return lib.emit_call(lib.conv2d_int8_call(strides, padding, dil, groups, xzp=True),
                         operands, out_shape, "int32")


def _conv_patch(weight, groups, dil, lo, hi, zp, dtype) -> Tuple[np.ndarray, np.ndarray]:
    """An input of one receptive field at the range's extremes (no padding, stride 1) and
    numpy's int64 accumulators for it, shaped ``(1, O, 1, 1)``."""
    o, i, kh, kw = weight.shape
    ekh, ekw = (kh - 1) * dil[0] + 1, (kw - 1) * dil[1] + 1
    x = _extreme_input((1, i * groups, ekh, ekw), lo, hi, dtype)
    taps = x[:, :, ::dil[0], ::dil[1]].astype(np.int64) - zp
    per_group = o // groups
    expected = np.stack([
        np.tensordot(weight[c].astype(np.int64), taps[0, (c // per_group) * i:(c // per_group + 1)
                                                     * i], axes=3)
        for c in range(o)]).reshape(1, o, 1, 1)
    return x, expected


def _matmul_int8(matches: Matches, _uses: Counter, _binding_of) -> Optional[object]:
    """``matmul_int8``: ``matmul(int32(a) - zp, W) = matmul_int8(a, int8(W), zp)`` (``W`` a
    2-D ``[K, N]`` constant, int32 result)."""
    found = _matmul_operands(matches)
    if found is None:
        return None
    weight, lo, hi, zp = found
    x, expected = _matmul_probe(weight, lo, hi, zp, _dtype(matches[_X8]))
    if not _kernel_agrees(lib.MATMUL_INT8, "xzp=1", x, weight, zp, expected,
                          (1, weight.shape[1])):
        return None
    operands = [matches[_X8], relax.const(weight), relax.const(np.array([zp], np.int32))]
    return lib.emit_call(lib.matmul_int8_call(xzp=True), operands,
                         [int(s) for s in matches[_MATMUL].ty.shape], "int32")


def _matmul_operands(matches: Matches, bounded: bool = True):
    """``(weight, lo, hi, zp)`` of an int32 matmul with a 2-D constant the kernel computes
    exactly, else None."""
    call = matches[_MATMUL]
    if not _int32_out(call) or len(matches[_X8].ty.shape) < 2:
        return None
    return _exact_operands(matches, 2, 1, bounded)


def _matmul_probe(weight, lo, hi, zp, dtype) -> Tuple[np.ndarray, np.ndarray]:
    """One row at the range's extremes and numpy's int64 products for it."""
    x = _extreme_input((1, weight.shape[0]), lo, hi, dtype)
    return x, (x.astype(np.int64) - zp) @ weight.astype(np.int64)


# --- requantization inside the kernel --------------------------------------------------------


def requantize_reference(acc: np.ndarray, bias: np.ndarray, scale: np.ndarray, zero_point: int,
                         dtype: str) -> np.ndarray:  # fmt: skip
    """ONNX Runtime's requantization in numpy: ``saturate(rint(float32(acc + bias) * scale) +
    zero_point)`` with float32 arithmetic and rounding half to even (``bias`` and ``scale``
    broadcast along ``acc``'s channel axis by the caller)."""
    value = (acc.astype(np.int64) + bias.astype(np.int64)).astype(np.float32)
    value = value * scale.astype(np.float32)
    info = np.iinfo(dtype)
    return np.clip(np.rint(value) + zero_point, info.min, info.max).astype(dtype)


def _channel_vector(value: np.ndarray, channels: int, axis: int, rank: int):
    """``value`` as ``(vector of length channels, per_channel)`` when it holds one value or
    varies along ``axis`` only of a rank-``rank`` result (broadcast from the right), else
    None."""
    if value.size == 1:
        return np.full(channels, value.reshape(-1)[0]), False
    if value.ndim > rank or value.size != channels:
        return None
    shape = (1,) * (rank - value.ndim) + tuple(value.shape)
    if shape[axis] != channels:
        return None
    return value.reshape(channels), True


def saturates_past_limit(bias_max: int, scale_min: float, zero_point: int, dtype: str) -> bool:
    """Whether every accumulator past :data:`EXACT_LIMIT` saturates both in oneDNN's
    ``float(acc) + float(B)`` and in ONNX Runtime's ``float(acc + B)`` (which may round
    differently there): ``|acc + B| >= 2^24 - max|B|`` (4 of slack for the two roundings), times
    the smallest (positive) multiplier, lies beyond the output range seen from the zero
    point."""
    info = np.iinfo(dtype)
    reach = max(int(info.max) - zero_point, zero_point - int(info.min)) + 1
    return scale_min > 0 and (EXACT_LIMIT - bias_max - 4) * scale_min > reach


def _requant_operands(matches: Matches, pat: _Requantized, uses: Counter, binding_of,
                      axis: int, bound: int):  # fmt: skip
    """``(scale, bias, yzp, kind, out_dtype)`` of the requantization ``pat`` matched when the
    kernel reproduces it exactly (see the module docstring), else None. ``bound``: the largest
    accumulator magnitude (:func:`accumulator_bound`)."""
    acc = matches[pat.acc]
    out_dtype, rank = _dtype(matches[pat.root]), len(acc.ty.shape)
    channels = int(acc.ty.shape[axis])
    chain = [acc, matches[pat.wide], matches[pat.scaled]]
    chain += [matches[pat.add]] if pat.add in matches else []
    if out_dtype not in ("uint8", "int8") or _dtype(matches[pat.wide]) != "float32":
        return None
    if not all(used_once(e, uses, binding_of) for e in chain):
        return None
    one, yzp = matches[_ONE].value.numpy(), matches[_YZP].value.numpy()
    if one.size != 1 or float(one.reshape(-1)[0]) != 1.0 or yzp.size != 1 or \
            str(yzp.dtype) != out_dtype:
        return None
    scale = _channel_vector(matches[_MULTIPLIER].value.numpy(), channels, axis, rank)
    bias = np.zeros(channels, np.int64), False
    if pat.add in matches:
        b = matches[_BIAS].value.numpy()
        bias = _channel_vector(b, channels, axis, rank) if b.dtype == np.int32 else None
    if scale is None or bias is None or scale[0].dtype != np.float32:
        return None
    bias_max = int(np.abs(bias[0]).max(initial=0))
    if bias_max > EXACT_LIMIT:
        return None
    yzp_value = int(yzp.reshape(-1)[0])
    if bound > EXACT_LIMIT and not saturates_past_limit(bias_max, float(scale[0].min()),
                                                        yzp_value, out_dtype):
        return None
    kind = "channel" if scale[1] else "tensor"
    scale_arg = scale[0] if scale[1] else scale[0][:1]
    return scale_arg, bias[0], int(yzp.reshape(-1)[0]), kind, out_dtype


def _rq_agrees(func: str, attrs: str, x, weight, zp: int, acc: np.ndarray, rq, axis: int) -> bool:
    """The fused kernel on the probe input ``x`` equals :func:`requantize_reference` of numpy's
    accumulators ``acc``."""
    scale, bias, yzp, kind, out_dtype = rq
    shape = [1] * acc.ndim
    shape[axis] = acc.shape[axis]
    wide_scale = np.broadcast_to(scale, (acc.shape[axis],)).reshape(shape)
    expected = requantize_reference(acc, bias.reshape(shape), wide_scale, yzp, out_dtype)
    operands = (x, weight, np.array([zp], np.int32), scale.astype(np.float32),
                bias.astype(np.float32), np.array([yzp], np.int32))
    out = tvm.runtime.tensor(np.zeros(acc.shape, out_dtype))
    try:
        tvm.get_global_func(func)(attrs, *[tvm.runtime.tensor(a) for a in operands], out)
    except (RuntimeError, ValueError, TypeError):  # oneDNN lacks these post-ops here
        return False
    return bool(np.array_equal(out.numpy(), expected))


def _rq_call_operands(matches: Matches, weight, zp: int, rq) -> list:
    scale, bias, yzp, _, _ = rq
    return [matches[_X8], relax.const(weight), relax.const(np.array([zp], np.int32)),
            relax.const(scale.astype(np.float32)), relax.const(bias.astype(np.float32)),
            relax.const(np.array([yzp], np.int32))]


def _conv_int8_requant(matches: Matches, uses: Counter, binding_of) -> Optional[object]:
    """``quantize(float32(conv2d(int32(x) - zp, W) + B) * M, 1, y_zp) = conv2d_int8(x, int8(W),
    zp, M, float32(B), y_zp)`` with ``rq=1`` (the 8-bit result of QLinearConv)."""
    found = _conv_operands(matches, bounded=False)
    if found is None:
        return None
    (strides, padding, dil, groups), weight, lo, hi, zp = found
    bound = accumulator_bound(weight, 0, lo, hi, zp)
    rq = _requant_operands(matches, _RQ_CONV, uses, binding_of, 1, bound)
    if rq is None:
        return None
    pat = _RQ_CONV
    x, acc = _conv_patch(weight, groups, dil, lo, hi, zp, _dtype(matches[_X8]))
    call = lib.conv2d_int8_call(strides, padding, dil, groups, xzp=True, requant=rq[3])
    probe = lib.conv2d_int8_call((1, 1), (0, 0, 0, 0), dil, groups, xzp=True, requant=rq[3])
    if not _rq_agrees(lib.CONV2D_INT8, probe.text(), x, weight, zp, acc, rq, 1):
        return None
    out_shape = [int(s) for s in matches[pat.root].ty.shape]
    return lib.emit_call(call, _rq_call_operands(matches, weight, zp, rq), out_shape, rq[4])


def _matmul_int8_requant(matches: Matches, uses: Counter, binding_of) -> Optional[object]:
    """``quantize(float32(matmul(int32(a) - zp, W) [+ B]) * M, 1, y_zp) = matmul_int8(a,
    int8(W), zp, M, float32(B), y_zp)`` with ``rq=1`` (the 8-bit result of QLinearMatMul)."""
    found = _matmul_operands(matches, bounded=False)
    if found is None:
        return None
    weight, lo, hi, zp = found
    acc_expr = matches[_MATMUL]
    axis = len(acc_expr.ty.shape) - 1
    bound = accumulator_bound(weight, 1, lo, hi, zp)
    rq = _requant_operands(matches, _RQ_MATMUL, uses, binding_of, axis, bound)
    if rq is None:
        return None
    pat = _RQ_MATMUL
    x, acc = _matmul_probe(weight, lo, hi, zp, _dtype(matches[_X8]))
    call = lib.matmul_int8_call(xzp=True, requant=rq[3])
    if not _rq_agrees(lib.MATMUL_INT8, call.text(), x, weight, zp, acc, rq, 1):
        return None
    return lib.emit_call(call, _rq_call_operands(matches, weight, zp, rq),
                         [int(s) for s in matches[pat.root].ty.shape], rq[4])


# --- a zero point known at run time only ----------------------------------------------------


def int8_parts(weight: np.ndarray, low: int, high: int) -> Optional[list]:
    """``weight`` (integers) as a sum of at most :data:`MAX_PARTS` arrays in ``[low, high]``:
    each part the rest clipped to the range (``W = Σ parts``, exactly); None when more are
    needed. A uint8 weight centered on its zero point spans up to ``[-255, 255]``, which one
    int8 operand cannot hold; two or three int8 products summed in int32 give the same
    integers."""
    rest, parts = weight.astype(np.int64), []
    while rest.any() or not parts:
        if len(parts) == MAX_PARTS:
            return None
        part = np.clip(rest, low, high)
        parts.append(part.astype(np.int8))
        rest = rest - part
    return parts


def dynamic_bound(weight: np.ndarray, axis: int, lo: int, hi: int, zlo: int, zhi: int) -> int:
    """:func:`accumulator_bound` over every zero point ``z`` in ``[zlo, zhi]`` (the range of
    its type): ``max(|lo - z|, |hi - z|)`` is convex in ``z``, so its largest value is at
    ``z = zlo`` or ``z = zhi``."""
    return max(accumulator_bound(weight, axis, lo, hi, z) for z in (zlo, zhi))


def _dynamic_operands(matches: Matches, rank: int, reduce_axis: int):
    """``(parts, lo, hi, zlo, zhi)`` when the 8-bit source's zero point is an 8-bit scalar
    tensor widened to int32, the constant int32 weight of rank ``rank`` splits into int8 parts
    (:func:`int8_parts`; ``[-64, 63]`` without VNNI) and each part's accumulators stay within
    :data:`EXACT_LIMIT` for every zero point of the zero point's type; else None."""
    zp = matches[_ZPV]
    if _dtype(matches[_X8]) not in ("uint8", "int8") or _dtype(matches[_WIDE]) != "int32":
        return None
    if _dtype(zp) not in ("uint8", "int8") or _dtype(matches[_ZPW]) != "int32" or \
            not _static(zp.ty.shape) or int(np.prod([int(d) for d in zp.ty.shape])) != 1:
        return None
    w = _weight_value(matches)
    if w is None or w.dtype != np.int32 or w.ndim != rank or w.size == 0:
        return None
    low, high = (-128, 127) if native.int8_exact_products() else (-64, 63)
    parts = int8_parts(w, low, high)
    info, zinfo = np.iinfo(_dtype(matches[_X8])), np.iinfo(_dtype(zp))
    lo, hi, zlo, zhi = int(info.min), int(info.max), int(zinfo.min), int(zinfo.max)
    if parts is None or any(dynamic_bound(p, reduce_axis, lo, hi, zlo, zhi) > EXACT_LIMIT
                            for p in parts):
        return None
    return parts, lo, hi, zlo, zhi


def _weight_value(matches: Matches) -> Optional[np.ndarray]:
    """The constant int32 weight: ``_W``'s value, or ``int32(B) - int32(b_zero_point)``
    computed here (both widened to int32 in the graph, the zero point a scalar); None when
    the widening is not to int32."""
    if _W in matches:
        return matches[_W].value.numpy()
    centered = matches[_W_CENTERED]
    if _dtype(centered) != "int32" or any(_dtype(a) != "int32" for a in centered.args):
        return None
    zp = matches[_WZP].value.numpy()
    if zp.size != 1:
        return None
    return (matches[_WB].value.numpy().astype(np.int32) - zp.astype(np.int32).reshape(()))


def _summed(calls: list) -> object:
    """The int32 sum of the parts' calls."""
    total = calls[0]
    for call in calls[1:]:
        total = relax.op.add(total, call)
    return total


def _conv_int8_dynamic(matches: Matches, _uses: Counter, _binding_of) -> Optional[object]:
    """``conv2d_int8`` with a run-time zero point: ``conv2d(int32(x) - int32(z), W) = Σ_p
    conv2d_int8(x, W_p, int32(z))`` with ``W = Σ_p W_p`` (:func:`int8_parts`; NCHW/OIHW, int32
    result), ``z`` an 8-bit scalar tensor (``DynamicQuantizeLinear``'s zero point), probed at
    both ends of ``z``'s range."""
    conv = matches[_CONV_DYN]
    at = conv.attrs
    if (str(at.data_layout), str(at.kernel_layout), str(at.out_layout) or "NCHW") != (
            "NCHW", "OIHW", "NCHW") or not _int32_out(conv) or not _conv_source_exact(matches):
        return None
    found = _dynamic_operands(matches, 4, 0)
    if found is None:
        return None
    parts, lo, hi, zlo, zhi = found
    dil, groups = [int(d) for d in at.dilation], int(at.groups)
    attrs = f"dil={dil[0]},{dil[1]};groups={groups};xzp=1"
    for part in parts:
        for z in (zlo, zhi):
            x, acc = _conv_patch(part, groups, dil, lo, hi, z, _dtype(matches[_X8]))
            if not _kernel_agrees(lib.CONV2D_INT8, attrs, x, part, z, acc, acc.shape):
                return None
    zp = relax.op.reshape(matches[_ZPW], [1])
    call = lib.conv2d_int8_call(at.strides, at.padding, dil, groups, xzp=True)
    out_shape = [int(s) for s in conv.ty.shape]
    return _summed([lib.emit_call(call, [matches[_X8], relax.const(p), zp], out_shape, "int32")
                    for p in parts])


def _matmul_int8_dynamic(matches: Matches, _uses: Counter, _binding_of) -> Optional[object]:
    """``matmul_int8`` with a run-time zero point: ``matmul(int32(a) - int32(z), W) = Σ_p
    matmul_int8(a, W_p, int32(z))`` (``W`` a 2-D ``[K, N]`` constant split as in
    :func:`_conv_int8_dynamic`, int32 result)."""
    call = matches[_MATMUL_DYN]
    if not _int32_out(call) or len(matches[_X8].ty.shape) < 2:
        return None
    found = _dynamic_operands(matches, 2, 1)
    if found is None:
        return None
    parts, lo, hi, zlo, zhi = found
    for part in parts:
        for z in (zlo, zhi):
            x, expected = _matmul_probe(part, lo, hi, z, _dtype(matches[_X8]))
            if not _kernel_agrees(lib.MATMUL_INT8, "xzp=1", x, part, z, expected,
                                  (1, part.shape[1])):
                return None
    zp = relax.op.reshape(matches[_ZPW], [1])
    out_shape = [int(s) for s in call.ty.shape]
    return _summed([lib.emit_call(lib.matmul_int8_call(xzp=True), [matches[_X8],
                                                                   relax.const(p), zp],
                                  out_shape, "int32") for p in parts])


#: The int8 rewrites, in the order they are applied.
INT8_RULES: Tuple[FoldRule, ...] = (
    FoldRule("int8_conv2d_requant", _RQ_CONV.root, _conv_int8_requant),
    FoldRule("int8_matmul_requant", _RQ_MATMUL.root, _matmul_int8_requant),
    FoldRule("int8_conv2d", _CONV, _conv_int8),
    FoldRule("int8_matmul", _MATMUL, _matmul_int8),
    FoldRule("int8_conv2d_dynamic_zp", _CONV_DYN, _conv_int8_dynamic),
    FoldRule("int8_matmul_dynamic_zp", _MATMUL_DYN, _matmul_int8_dynamic),
)


# --- the measured decision --------------------------------------------------------------------

#: The plain rule of each requantizing rule (its int32 call alone) and the rewrite giving it.
_PLAIN = {"int8_conv2d_requant": ("int8_conv2d", _conv_int8, _RQ_CONV),
          "int8_matmul_requant": ("int8_matmul", _matmul_int8, _RQ_MATMUL)}


def _shape(expr) -> str:
    return "x".join(str(int(d)) for d in expr.ty.shape) + f" {_dtype(expr)}"


def _signature(rule: str, matches: Matches) -> str:
    """The timing signature of a unit (:mod:`.int8_choice`): the rule, the source's and the
    weight's shapes and dtypes, the convolution's attributes, whether a zero point, a bias and
    per-channel scales are present, the result's dtype; not the constants' values."""
    acc = _root(matches)
    zp = "zp" if _ZP in matches else "no zp"
    weight = matches[_W] if _W in matches else matches[_W_CENTERED]
    parts = [rule, _shape(matches[_X8]), "W " + _shape(weight),
             "run-time zp" if _ZPV in matches else zp]
    if _CONV in matches or _CONV_DYN in matches:
        at = acc.attrs
        parts.append("s{} p{} d{} g{}".format(*(",".join(str(int(v)) for v in a) for a in (
            at.strides, at.padding, at.dilation)), int(at.groups)))
    if rule in _PLAIN:
        pat = _PLAIN[rule][2]
        parts += ["bias" if pat.add in matches else "no bias",
                  f"M {matches[_MULTIPLIER].value.numpy().size}",
                  "-> " + _dtype(matches[pat.root])]
    return "; ".join(parts)


def _root(matches: Matches):
    """The int32 convolution or matmul of a plain rule's match."""
    for pattern in (_CONV, _MATMUL, _CONV_DYN, _MATMUL_DYN):
        if pattern in matches:
            return matches[pattern]
    raise KeyError("no convolution or matmul in the match")


def _requant_over(matches: Matches, pat: _Requantized, acc) -> object:
    """The matched requantization chain of ``pat`` recomputed over ``acc`` (TVM's
    requantization of the int8 kernel's int32 result)."""
    value = acc
    if pat.add in matches:
        add = matches[pat.add]
        value = relax.Call(add.op, [value, matches[_BIAS]], add.attrs)
    for step, operands in ((pat.wide, []), (pat.scaled, [matches[_MULTIPLIER]]),
                           (pat.root, [matches[_ONE], matches[_YZP]])):
        call = matches[step]
        value = relax.Call(call.op, [value] + operands, call.attrs, call.ty_args)
    return value


def _timed(rule: FoldRule, choice: "Int8Choice") -> FoldRule:
    """``rule`` with its replacement kept only where it is the fastest exact form
    (:mod:`.int8_choice`); the guards stay the rule's."""

    def rewrite(matches: Matches, uses: Counter, binding_of) -> Optional[object]:
        plain = _PLAIN.get(rule.name)
        sig = _signature(rule.name, matches)
        if plain is None:  # a plain rule: kept for it, or by its requantized unit's verdict
            known = choice.known(sig)
            if known is not None:
                out = rule.rewrite(matches, uses, binding_of)
                if out is not None:
                    choice.count(sig, _root(matches))
                return out if known == INT8 else None
        out = rule.rewrite(matches, uses, binding_of)
        if out is None:
            return None
        root = _root(matches) if plain is None else matches[plain[2].root]
        alts = {INT32: root}
        if plain is None:
            alts[INT8] = out
        else:
            alts[INT8_REQUANT] = out
            acc = plain[1](matches, uses, binding_of)
            if acc is not None:
                alts[INT8] = _requant_over(matches, plain[2], acc)
        values = {var: value for value, var in binding_of.items()}
        extra = [matches[_ZPV]] if _ZPV in matches else []
        kept, _ = choice.decide(sig, matches[_X8], alts, values, pack_conv_weights, extra)
        if plain is not None and kept != INT8_REQUANT:
            plain_sig = _signature(plain[0], matches)
            choice.settle(plain_sig, kept, [INT32, INT8], f"decided with {sig}")
            return None
        return out if kept != INT32 else None

    return FoldRule(rule.name, rule.pattern, rewrite)


def int8_kernels(mod: "tvm.IRModule", layout: bool = True,
                 choice: Optional["Int8Choice"] = None
                 ) -> Tuple["tvm.IRModule", Dict[str, int]]:  # fmt: skip
    """``mod`` with the int32 convolutions and matmuls of 8-bit sources on the int8 kernels
    (where every guard holds and, with ``choice``, where timing keeps them:
    :mod:`.int8_choice`), their chains in NHWC (``layout``: :mod:`.int8_layout`) and the
    convolution weights packed; and how many of each were rewritten (with ``int8_nhwc_*``: the
    chains converted, their convolutions, the permutes added). ``mod`` unchanged when the
    loaded library lacks the kernels."""
    if not (native.provides(lib.CONV2D_INT8) and native.provides(lib.MATMUL_INT8)):
        return mod, {}
    rules = INT8_RULES if choice is None else tuple(_timed(r, choice) for r in INT8_RULES)
    mod, counts = fold_inference(mod, rules)
    if layout and counts:
        mod, report = int8_layout(mod)
        counts = {**counts, **report.counts()}
    return pack_conv_weights(mod), counts
