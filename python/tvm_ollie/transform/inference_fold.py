"""Inference folding: batch norms into the convolutions before them, activations as one op.

Exported models compute, between two convolutions, what inference does not need to compute
apart. A batch norm in inference mode is a per-channel affine map, so after a convolution
whose weight is a constant it folds into that weight and a bias; and exporters write SiLU as
``x * sigmoid(x)``. Left as they are, the batch norm sits between the convolution and its
activation, so the native kernels cannot take the bias and activation as epilogues
(:mod:`.epilogue`), and every pair costs two extra memory-bound kernels: paper-size YOLOX spent
half its time in ``batch_norm + sigmoid + multiply`` next to the library convolutions. ONNX
Runtime folds both at load time; this pass does it on the Relax module, before the derivation
decides anything, so the convolutions it weighs are the ones that will run.

The rules (:data:`FOLD_RULES`): ``bn_into_conv`` (constant weight and statistics: the fold is
computed now), ``bn_runtime`` (a weight or statistics given at run time: ``P(x, W·s) + t`` with
``s``, ``t`` computed by Relax ops on the per-channel vectors, for conv2d, conv2d_transpose and
matmul; the output is never scaled, so the kernels need no scale step, and ``t`` becomes their
bias epilogue), ``space_to_depth_conv`` (:mod:`.space_to_depth`), ``silu``, then the activation
spellings of :mod:`.activations`.

Each rule is data (:class:`FoldRule`: a name, a TVM dataflow pattern, a rewrite that returns
``None`` when a guard fails); :func:`fold_inference` applies them in order with TVM's
``rewrite_call`` and returns how often each fired. The weight arithmetic runs in float64 on the
constants and is cast back to their dtype; every folded weight is checked against the unfolded
batch norm on a random input patch before it is used (:func:`_folds_exactly`).
"""

from __future__ import annotations

from collections import Counter
from typing import Dict, Optional, Tuple

import numpy as np

from ..compat import relax, tvm
from .activations import ACTIVATION_RULES
from .epilogue import use_counts
from .fold_rule import FoldRule, Matches
from .fold_rule import const_value as _const
from .fold_rule import used_once as _used_once
from .module_update import with_functions
from .regions import static_tensor
from .space_to_depth import SPACE_TO_DEPTH_RULES

__all__ = ["FOLD_RULES", "GPU_FOLD_RULES", "FoldRule", "FoldInference", "fold_inference"]

_dpl = relax.dpl


# --- guards -------------------------------------------------------------------------------


def _float(dtype: str) -> bool:
    return dtype in ("float32", "float16", "float64")


def _inference_batch_norm(bn) -> bool:
    """``bn`` normalizes with its running statistics (inference) over axis 1 (NCHW)."""
    attrs = bn.attrs
    return not bool(getattr(attrs, "training", False)) and int(attrs.axis) == 1


def _nchw_conv(conv) -> bool:
    """A convolution whose output channels are axis 1 and weight channels axis 0 (conv2d)
    or axis 1 with one group (conv2d_transpose)."""
    attrs = conv.attrs
    if attrs.data_layout != "NCHW" or attrs.out_layout not in ("NCHW", ""):
        return False
    if conv.op.name == "relax.nn.conv2d":
        return attrs.kernel_layout == "OIHW"
    return attrs.kernel_layout == "IOHW" and int(attrs.groups) == 1


# --- rules --------------------------------------------------------------------------------

_X, _W, _B_CONST = _dpl.wildcard(), _dpl.is_const(), _dpl.is_const()
# the bias as a constant, or as a reshape of one (TVM's PyTorch frontend writes it so)
_B = _B_CONST | _dpl.is_op("relax.reshape")(_B_CONST, _dpl.wildcard())
_GAMMA, _BETA, _MEAN, _VAR = (_dpl.is_const() for _ in range(4))
_CONV = _dpl.is_op("relax.nn.conv2d")(_X, _W) | _dpl.is_op("relax.nn.conv2d_transpose")(_X, _W)
_CONV_BIAS = _dpl.is_op("relax.add")(_CONV, _B)
_BN = _dpl.is_op("relax.nn.batch_norm")(_CONV | _CONV_BIAS, _GAMMA, _BETA, _MEAN, _VAR)
_BN_OUT = _dpl.is_tuple_get_item(_BN, 0)


def _bn_scale_shift(bn, matches: Matches, channels: int) -> Optional[Tuple[np.ndarray, ...]]:
    """``s = γ / √(σ² + ε)`` and ``t = β − μ·s`` per channel, in float64 (None if the shapes
    are not one value per channel)."""
    gamma, beta, mean, var = (_const(matches[p]).astype(np.float64)
                              for p in (_GAMMA, _BETA, _MEAN, _VAR))
    if any(a.shape != (channels,) for a in (gamma, beta, mean, var)):
        return None
    attrs = bn.attrs
    if not bool(attrs.scale):
        gamma = np.ones_like(gamma)
    if not bool(attrs.center):
        beta = np.zeros_like(beta)
    scale = gamma / np.sqrt(var + float(attrs.epsilon))
    return scale, beta - mean * scale


def _conv_bias(matches: Matches, channels: int) -> Optional[np.ndarray]:
    """The constant bias added to the convolution (zeros without one), one per channel."""
    if _B not in matches:
        return np.zeros(channels)
    bias = _const(matches[_B_CONST]).astype(np.float64)
    if not static_tensor(matches[_B]):
        return None
    shape = tuple(int(d) for d in matches[_B].ty.shape)  # as added (after a reshape)
    if bias.size != channels or shape not in ((1, channels, 1, 1), (channels, 1, 1)):
        return None  # (channels,) would run along the output's width
    return bias.reshape(channels)


def _scaled_weight(conv, weight: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """``W · s`` along the weight's output-channel axis (0 for OIHW, 1 for IOHW)."""
    axis = 0 if conv.op.name == "relax.nn.conv2d" else 1
    shape = [1] * weight.ndim
    shape[axis] = scale.size
    return weight.astype(np.float64) * scale.reshape(shape)


def _folds_exactly(conv, weight, new_weight, bias, scale, shift, new_bias, dtype) -> bool:
    """Check the fold on a random input patch: the unfolded batch norm of the convolution's
    response to it equals the folded weight's response plus the folded bias."""
    rng = np.random.default_rng(0)
    axis = 0 if conv.op.name == "relax.nn.conv2d" else 1
    w = np.moveaxis(weight.astype(np.float64), axis, 0)
    w2 = np.moveaxis(new_weight, axis, 0)
    patch = rng.standard_normal(w.shape[1:])
    before = (np.tensordot(w, patch, axes=w.ndim - 1) + bias) * scale + shift
    after = np.tensordot(w2.astype(dtype).astype(np.float64), patch, axes=w.ndim - 1) + new_bias
    tol = 1e-5 if dtype == "float32" else 1e-2
    return bool(np.allclose(before, after, rtol=tol, atol=tol * np.abs(before).max()))


def _fold_bn(matches: Matches, uses: Counter, binding_of) -> Optional[object]:
    """``bn_into_conv``: ``batch_norm(conv(x, W) [+ b])[0] = conv(x, W·s) + ((b − μ)·s + β)``."""
    bn = matches[_BN]
    conv = matches[_CONV]
    weight = _const(matches[_W])
    dtype = str(weight.dtype)
    if not (_inference_batch_norm(bn) and _nchw_conv(conv) and _float(dtype)):
        return None
    if not _used_once(conv, uses, binding_of) or not _used_once(bn, uses, binding_of):
        return None
    if _B in matches and not _used_once(matches[_CONV_BIAS], uses, binding_of):
        return None
    channels = int(conv.ty.shape[1])
    found = _bn_scale_shift(bn, matches, channels)
    bias = _conv_bias(matches, channels)
    if found is None or bias is None:
        return None
    scale, shift = found
    new_weight = _scaled_weight(conv, weight, scale)
    new_bias = bias * scale + shift
    if not _folds_exactly(conv, weight, new_weight, bias, scale, shift, new_bias, dtype):
        return None
    folded = relax.Call(conv.op, [matches[_X], relax.const(new_weight.astype(dtype))],
                        conv.attrs)
    return relax.op.add(folded, relax.const(new_bias.astype(dtype).reshape(1, channels, 1, 1)))


# batch norm with parameters given at run time (or a weight that is): the same fold, computed
# by Relax ops on the small per-channel vectors and the weight
_RX, _RW, _RB = _dpl.wildcard(), _dpl.wildcard(), _dpl.wildcard()
_RGAMMA, _RBETA, _RMEAN, _RVAR = (_dpl.wildcard() for _ in range(4))
_RPROD = (_dpl.is_op("relax.nn.conv2d")(_RX, _RW)
          | _dpl.is_op("relax.nn.conv2d_transpose")(_RX, _RW)
          | _dpl.is_op("relax.matmul")(_RX, _RW))
_RPROD_BIAS = _dpl.is_op("relax.add")(_RPROD, _RB)
_RBN = _dpl.is_op("relax.nn.batch_norm")(_RPROD | _RPROD_BIAS, _RGAMMA, _RBETA, _RMEAN, _RVAR)
_RBN_OUT = _dpl.is_tuple_get_item(_RBN, 0)


def _weight_channel_axis(prod, bn) -> Optional[int]:
    """The weight axis of the output channels the batch norm normalizes, else None: a conv2d
    in NCHW (``O`` of its kernel layout), a conv2d_transpose in NCHW with one group, a matmul
    normalized along its last axis (its weight's last axis)."""
    rank = len(prod.ty.shape)
    axis = int(bn.attrs.axis) % rank
    name = prod.op.name
    if name == "relax.matmul":
        weight_rank = len(prod.args[1].ty.shape)
        return weight_rank - 1 if axis == rank - 1 and weight_rank >= 2 else None
    attrs = prod.attrs
    if attrs.data_layout != "NCHW" or attrs.out_layout not in ("NCHW", "") or axis != 1:
        return None
    if name == "relax.nn.conv2d_transpose" and int(attrs.groups) != 1:
        return None
    return str(attrs.kernel_layout).index("O")


def _vector(expr, channels: int, dtype: str, along: Optional[Tuple[int, int]] = None):
    """``expr`` (a per-channel tensor) as a vector of ``channels``: a constant is reshaped
    now, a variable by a reshape op; None when it is not one value per channel. ``along``:
    ``(axis, rank)`` of an output ``expr`` is added to, whose ``axis`` its values must run
    along when broadcast (a bias)."""
    if not static_tensor(expr):
        return None
    shape = tuple(int(d) for d in expr.ty.shape)
    if int(np.prod(shape)) != channels or sum(d != 1 for d in shape) > 1 or \
            str(expr.ty.dtype) != dtype:
        return None
    if along is not None and not _runs_along(shape, channels, *along):
        return None
    value = _const(expr)
    if value is not None:
        return relax.const(value.reshape(channels).astype(dtype))
    return expr if shape == (channels,) else relax.op.reshape(expr, (channels,))


def _runs_along(shape: Tuple[int, ...], channels: int, axis: int, rank: int) -> bool:
    """A tensor of ``shape`` broadcast against a rank-``rank`` output has its ``channels``
    values along ``axis``."""
    offset = rank - len(shape)
    return offset >= 0 and axis - offset >= 0 and shape[axis - offset] == channels


def _runtime_scale_shift(bn, matches: Matches, binding_of, channels: int, dtype: str):
    """``(s, t)`` of :func:`_bn_scale_shift` as Relax expressions on vectors (the conv's bias
    ``b`` included: ``t = (b − μ)·s + β``); None when a parameter is not per channel."""
    rank = len(bn.args[0].ty.shape)
    along = (int(bn.attrs.axis) % rank, rank)

    def vector(pattern, along=None):
        expr = matches[pattern]
        return _vector(binding_of.get(expr, expr), channels, dtype, along)

    gamma, beta, mean, var = (vector(p) for p in (_RGAMMA, _RBETA, _RMEAN, _RVAR))
    bias = vector(_RB, along) if _RB in matches else None
    if any(v is None for v in (gamma, beta, mean, var)) or (_RB in matches and bias is None):
        return None
    op, attrs = relax.op, bn.attrs
    scale = op.rsqrt(op.add(var, relax.const(float(attrs.epsilon), dtype)))
    if bool(attrs.scale):
        scale = op.multiply(gamma, scale)
    centered = op.negative(mean) if bias is None else op.subtract(bias, mean)
    shift = op.multiply(centered, scale)
    if bool(attrs.center):
        shift = op.add(shift, beta)
    return scale, shift


def _fold_bn_runtime(matches: Matches, uses: Counter, binding_of) -> Optional[object]:
    """``bn_runtime``: ``batch_norm(P(x, W) [+ b])[0] = P(x, W·s) + ((b − μ)·s + β)`` with
    ``s = γ / √(σ² + ε)`` computed at run time (a weight or batch-norm parameter that is not a
    constant), ``P`` a conv2d/conv2d_transpose (NCHW) or a matmul along its last axis; the
    weight is scaled along its output-channel axis, and the shift becomes the bias the native
    kernels take as an epilogue."""
    bn, prod = matches[_RBN], matches[_RPROD]
    dtype = str(prod.ty.dtype)
    if not (_float(dtype) and not bool(getattr(bn.attrs, "training", False))):
        return None
    if not _used_once(prod, uses, binding_of) or not _used_once(bn, uses, binding_of):
        return None
    if _RB in matches and not _used_once(matches[_RPROD_BIAS], uses, binding_of):
        return None
    weight = matches[_RW]
    if not (static_tensor(prod) and static_tensor(weight)) or str(weight.ty.dtype) != dtype:
        return None
    axis = _weight_channel_axis(prod, bn)
    if axis is None:
        return None
    rank = len(prod.ty.shape)
    channels = int(prod.ty.shape[int(bn.attrs.axis) % rank])
    found = _runtime_scale_shift(bn, matches, binding_of, channels, dtype)
    if found is None or int(weight.ty.shape[axis]) != channels:
        return None
    scale, shift = found
    view = [1] * len(weight.ty.shape)
    view[axis] = channels
    new_weight = relax.op.multiply(binding_of.get(weight, weight), relax.op.reshape(scale, view))
    folded = relax.Call(prod.op, [binding_of.get(matches[_RX], matches[_RX]), new_weight],
                        prod.attrs)
    out_view = [1] * rank
    out_view[int(bn.attrs.axis) % rank] = channels
    return relax.op.add(folded, relax.op.reshape(shift, out_view))


_Y = _dpl.wildcard()
_SIGMOID = _dpl.is_op("relax.sigmoid")(_Y)
_SILU = _dpl.is_op("relax.multiply")(_Y, _SIGMOID) | _dpl.is_op("relax.multiply")(_SIGMOID, _Y)


def _silu(matches: Matches, uses: Counter, binding_of) -> Optional[object]:
    """``silu``: ``x · sigmoid(x) = silu(x)`` (either operand order), when the sigmoid has no
    other reader."""
    if not _used_once(matches[_SIGMOID], uses, binding_of):
        return None
    return relax.op.nn.silu(matches[_Y])


#: The folds, in the order they are applied: the batch norms, a space-to-depth before a
#: convolution (:mod:`.space_to_depth`), then the activations as exporters write them
#: (:mod:`.activations`).
FOLD_RULES: Tuple[FoldRule, ...] = (
    FoldRule("bn_into_conv", _BN_OUT, _fold_bn),
    FoldRule("bn_runtime", _RBN_OUT, _fold_bn_runtime),
) + SPACE_TO_DEPTH_RULES + (
    FoldRule("silu", _SILU, _silu),
) + ACTIVATION_RULES

#: The folds on a GPU: all but ``bn_runtime``. Its per-call scale of the weights and shift are
#: Relax ops that the CPU library's epilogue absorbs; on a GPU each is one more kernel launch,
#: while TVM fuses the batch norm after the convolution into one kernel (quick YOLOX on the
#: H200, weights as parameters: 1226 VM instructions against TVM's 618, 2.2-2.5 ms against
#: 1.16, docs/device_bundle.md).
GPU_FOLD_RULES: Tuple[FoldRule, ...] = tuple(r for r in FOLD_RULES if r.name != "bn_runtime")


# --- driver -------------------------------------------------------------------------------


def _bindings(func: "relax.Function") -> Dict[object, object]:
    """Bound value -> its variable, for the use counts of matched sub-expressions."""
    out = {}
    for block in func.body.blocks:
        for binding in block.bindings:
            out[binding.value] = binding.var
    return out


def _apply(rule: FoldRule, func: "relax.Function", counts: Counter) -> "relax.Function":
    uses, binding_of = use_counts(func), _bindings(func)

    def rewrite(expr, matches):
        out = rule.rewrite(matches, uses, binding_of)
        if out is None:
            return expr
        counts[rule.name] += 1
        return out

    return _dpl.rewrite_call(rule.pattern, rewrite, func)


def fold_inference(mod: "tvm.IRModule",
                   rules: Tuple[FoldRule, ...] = FOLD_RULES) -> Tuple["tvm.IRModule", Dict[str, int]]:
    """``mod`` with every rule of ``rules`` applied to every Relax function (bindings left
    dead are removed); and how many times each rule fired."""
    counts: Counter = Counter()
    updates = {}
    for gv, func in mod.functions_items():
        if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
            continue
        new = func
        for rule in rules:
            new = _apply(rule, new, counts)
        if not new.same_as(func):
            updates[gv] = relax.analysis.remove_all_unused(new)
    return with_functions(mod, updates), dict(counts)


@tvm.transform.module_pass(opt_level=0, name="FoldInference")
class FoldInference:
    """The module pass of :func:`fold_inference` (for ``tvm.transform.Sequential``)."""

    def transform_module(self, mod: "tvm.IRModule", _ctx) -> "tvm.IRModule":
        return fold_inference(mod)[0]
