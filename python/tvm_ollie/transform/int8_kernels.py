"""Integer convolutions and matmuls of quantized models onto the native int8 kernels.

The ONNX importer writes ``ConvInteger``/``QLinearConv`` and ``MatMulInteger``/
``QLinearMatMul``/``QGemm`` as int32 arithmetic (:mod:`tvm_ollie.frontend.onnx_quant`):
``conv2d(int32(x) - x_zp, W)`` and ``matmul(int32(a) - a_zp, W)`` with 8-bit ``x``/``a`` and the
weight ``W`` a constant already centered on its zero point. TVM compiles those to generic
int32 loops; oneDNN's int8 kernels (``tvm_ollie.cpu.conv2d_int8``/``matmul_int8``) compute the
same sums on 8-bit operands with the zero point inside the primitive. The requantization after
them stays TVM elementwise code.

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
* the kernel, run once on an input at the extremes of that range over one receptive field,
  gives numpy's integers (:func:`_kernel_agrees`).

The pass applies them on CPU targets when the library is in use; without the library (or with
``TVM_OLLIE_DISABLE_NATIVE=1``) the module keeps the int32 form.
"""

from __future__ import annotations

from collections import Counter
from typing import Dict, Optional, Tuple

import numpy as np

from .. import native
from ..codegen import library as lib
from ..compat import relax, tirx, tvm
from .inference_fold import FoldRule, fold_inference

__all__ = ["INT8_RULES", "int8_kernels", "accumulator_bound"]

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


def _exact_operands(matches: Matches, rank: int, reduce_axis: int):
    """``(weight, lo, hi, zp)`` when the source is 8-bit with one constant zero point, the
    rank-``rank`` weight fits the kernel and every accumulator over ``reduce_axis`` stays within
    :data:`EXACT_LIMIT`; else None (the guards both int8 rules share)."""
    source, weight = _source_range(matches), _int8_weight(matches, rank)
    if source is None or weight is None:
        return None
    lo, hi, zp = source
    if accumulator_bound(weight, reduce_axis, lo, hi, zp) > EXACT_LIMIT:
        return None
    return weight, lo, hi, zp


def _conv_int8(matches: Matches, _uses: Counter, _binding_of) -> Optional[object]:
    """``conv2d_int8``: ``conv2d(int32(x) - zp, W) = conv2d_int8(x, int8(W), zp)`` (NCHW/OIHW,
    int32 result; padding reads ``zp`` on both sides)."""
    conv = matches[_CONV]
    at = conv.attrs
    if (str(at.data_layout), str(at.kernel_layout)) != ("NCHW", "OIHW"):
        return None
    if (str(at.out_layout) or "NCHW") != "NCHW" or not _int32_out(conv):
        return None
    checked = _exact_operands(matches, 4, 0)
    if checked is None:
        return None
    weight, lo, hi, zp = checked
    groups, dil = int(at.groups), [int(d) for d in at.dilation]
    call = lib.conv2d_int8_call(at.strides, at.padding, dil, groups, xzp=True)
    if not _conv_patch_agrees(weight, groups, dil, lo, hi, zp, _dtype(matches[_X8])):
        return None
    operands = [matches[_X8], relax.const(weight), relax.const(np.array([zp], np.int32))]
    return lib.emit_call(call, operands, [int(s) for s in conv.ty.shape], "int32")


def _conv_patch_agrees(weight, groups, dil, lo, hi, zp, dtype) -> bool:
    """The kernel on one receptive field (no padding, stride 1) against numpy."""
    o, i, kh, kw = weight.shape
    ekh, ekw = (kh - 1) * dil[0] + 1, (kw - 1) * dil[1] + 1
    x = _extreme_input((1, i * groups, ekh, ekw), lo, hi, dtype)
    taps = x[:, :, ::dil[0], ::dil[1]].astype(np.int64) - zp
    per_group = o // groups
    expected = np.stack([
        np.tensordot(weight[c].astype(np.int64), taps[0, (c // per_group) * i:(c // per_group + 1)
                                                     * i], axes=3)
        for c in range(o)]).reshape(1, o, 1, 1)
    attrs = f"dil={dil[0]},{dil[1]};groups={groups};xzp=1"
    return _kernel_agrees(lib.CONV2D_INT8, attrs, x, weight, zp, expected, (1, o, 1, 1))


def _matmul_int8(matches: Matches, _uses: Counter, _binding_of) -> Optional[object]:
    """``matmul_int8``: ``matmul(int32(a) - zp, W) = matmul_int8(a, int8(W), zp)`` (``W`` a
    2-D ``[K, N]`` constant, int32 result)."""
    call = matches[_MATMUL]
    if not _int32_out(call) or len(matches[_X8].ty.shape) < 2:
        return None
    checked = _exact_operands(matches, 2, 1)
    if checked is None:
        return None
    weight, lo, hi, zp = checked
    x = _extreme_input((1, weight.shape[0]), lo, hi, _dtype(matches[_X8]))
    expected = (x.astype(np.int64) - zp) @ weight.astype(np.int64)
    if not _kernel_agrees(lib.MATMUL_INT8, "xzp=1", x, weight, zp, expected,
                          (1, weight.shape[1])):
        return None
    operands = [matches[_X8], relax.const(weight), relax.const(np.array([zp], np.int32))]
    return lib.emit_call(lib.matmul_int8_call(xzp=True), operands,
                         [int(s) for s in call.ty.shape], "int32")


#: The int8 rewrites, in the order they are applied.
INT8_RULES: Tuple[FoldRule, ...] = (
    FoldRule("int8_conv2d", _CONV, _conv_int8),
    FoldRule("int8_matmul", _MATMUL, _matmul_int8),
)


def int8_kernels(mod: "tvm.IRModule") -> Tuple["tvm.IRModule", Dict[str, int]]:
    """``mod`` with the int32 convolutions and matmuls of 8-bit sources on the int8 kernels
    (where every guard holds), and how many of each were rewritten. ``mod`` unchanged when the
    loaded library lacks the kernels."""
    if not (native.provides(lib.CONV2D_INT8) and native.provides(lib.MATMUL_INT8)):
        return mod, {}
    return fold_inference(mod, INT8_RULES)
