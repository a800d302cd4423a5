"""Activations as exporters write them, rewritten to one activation each.

ONNX and PyTorch exports spell GELU, hard-swish, hard-sigmoid, ReLU6 and leaky ReLU as chains
of elementwise ops (``0.5 * x * (1 + erf(x / sqrt(2)))``, ``x * clip(x + 3, 0, 6) / 6``...).
Left as chains, TVM builds them as several kernels, and the native kernels cannot take them as
one epilogue step (:mod:`.epilogue`). These rules (:class:`~.fold_rule.FoldRule` data, applied
by :func:`~.inference_fold.fold_inference` after the batch-norm folds) rewrite each chain to
one Relax activation: ``nn.gelu``, ``nn.gelu_tanh``, ``clip``, ``nn.leakyrelu``.

Relax has no hard-sigmoid or hard-swish operator, so those two become *canonical composites*
(:func:`hardsigmoid_composite`, :func:`hardswish_composite`): one fixed spelling that TVM
builds as it builds any elementwise chain, and that the epilogue rule recognizes after a native
kernel (:func:`match_hardsigmoid`, :func:`match_hardswish`). The rules leave a spelling
that is canonical already, so a rewritten module is a fixed point.

Constants are matched with a relative tolerance per element type (:data:`CONST_RTOL`:
exporters round them to the model's type, ``0.70710677`` for ``1/sqrt(2)`` in float32);
every intermediate value must have no other reader (else the chain would still be computed
for it).
"""

from __future__ import annotations

import math
from collections import Counter
from typing import List, Optional, Tuple

from ..compat import relax, tvm
from .fold_rule import FoldRule, Matches, const_value, scalar_value

__all__ = ["ACTIVATION_RULES", "CONST_RTOL", "hardsigmoid_composite", "hardswish_composite",
           "match_hardsigmoid", "match_hardswish"]

_dpl = relax.dpl

#: Relative tolerance of a matched constant against its exact value, per element type (a few
#: units of the type's rounding: 1/sqrt(2) is 0.70703125 in float16, 1/6 is 0.1665 in bfloat16).
CONST_RTOL = {"float64": 1e-6, "float32": 1e-4, "float16": 1e-3, "bfloat16": 1e-2}

_MUL, _ADD, _DIV = "relax.multiply", "relax.add", "relax.divide"


def _op(name: str, *args):
    return _dpl.is_op(name)(*args)


def _comm(name: str, a, b):
    """``name(a, b)`` or ``name(b, a)``."""
    return _op(name, a, b) | _op(name, b, a)


def _clip(x):
    return _op("relax.clip", x, _dpl.wildcard(), _dpl.wildcard())


def _product3(x, h, p):
    """``x · h · p`` in every association and operand order."""
    return (_comm(_MUL, _comm(_MUL, x, h), p) | _comm(_MUL, _comm(_MUL, x, p), h)
            | _comm(_MUL, x, _comm(_MUL, p, h)))


# --- guards -------------------------------------------------------------------------------


def _near(value: Optional[float], want: float, dtype: str = "float32") -> bool:
    """``value`` equals ``want`` within :data:`CONST_RTOL` of ``dtype``."""
    rtol = CONST_RTOL.get(dtype, CONST_RTOL["float32"])
    return value is not None and abs(value - want) <= rtol * abs(want)


def _float_like(root, x) -> bool:
    """``x`` is a float tensor of the chain's shape and dtype (a broadcasting constant must
    not have widened the result)."""
    tx, tr = x.ty, root.ty
    if not isinstance(tx, relax.TensorType) or not isinstance(tr, relax.TensorType):
        return False
    if str(tx.dtype) not in CONST_RTOL or tx.dtype != tr.dtype:
        return False
    if tx.shape is None or tr.shape is None:
        return False
    try:
        return [int(s) for s in tx.shape] == [int(s) for s in tr.shape]
    except (TypeError, ValueError):
        return False


def _inner_used_once(matches: Matches, root, x, uses: Counter, binding_of) -> bool:
    """Every matched value between ``x`` and ``root`` has one reader."""
    for expr in matches.values():
        if expr.same_as(root) or expr.same_as(x):
            continue
        var = binding_of.get(expr)
        if var is not None and uses[var] > 1:
            return False
    return True


def _clip_bounds(clip) -> Optional[Tuple[float, float]]:
    """A clip's ``(lo, hi)``, else None."""
    lo, hi = (scalar_value(a) for a in clip.args[1:3])
    return None if lo is None or hi is None else (lo, hi)


def _chain_ok(matches: Matches, root_pattern, x_pattern, uses, binding_of) -> bool:
    """The shared guards: a float ``x`` of the chain's type, intermediates read once."""
    root, x = matches[root_pattern], matches[x_pattern]
    return _float_like(root, x) and _inner_used_once(matches, root, x, uses, binding_of)


def _operand(matches: Matches, x_pattern, binding_of):
    """The matched ``x`` as the replacement should read it: its variable when it is bound in
    the function (the pattern sees through bindings to the value; reusing the value would
    compute it again)."""
    x = matches[x_pattern]
    return binding_of.get(x, x)


def _const(value: float, like) -> "relax.Constant":
    """A scalar constant of ``like``'s dtype."""
    return relax.const(value, str(like.ty.dtype))


# --- canonical composites -----------------------------------------------------------------


def hardsigmoid_composite(x, alpha: float, beta: float):
    """``clip(x · α + β, 0, 1)``, the one spelling of hard-sigmoid the epilogue recognizes."""
    return relax.op.clip(relax.op.add(relax.op.multiply(x, _const(alpha, x)), _const(beta, x)),
                         0.0, 1.0)


def hardswish_composite(x, alpha: float = 1 / 6, beta: float = 0.5):
    """``x · clip(x · α + β, 0, 1)`` (hard-swish for α = 1/6, β = 1/2)."""
    return relax.op.multiply(x, hardsigmoid_composite(x, alpha, beta))


def _call(expr, op: str) -> bool:
    return (isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op)
            and expr.op.name == op)


def match_hardsigmoid(value, value_of) -> Optional[Tuple[object, float, float, List]]:
    """``(x, α, β, [add, multiply])`` when ``value`` is ``clip(x · α + β, 0, 1)``
    (:func:`hardsigmoid_composite`); ``value_of(var)`` gives a variable's bound value (or
    None) and the list holds the variables bound to the inner steps."""
    if not _call(value, "relax.clip") or _clip_bounds(value) != (0.0, 1.0):
        return None
    add_var = value.args[0]
    add = value_of(add_var)
    if not _call(add, _ADD):
        return None
    mul_var, beta = add.args[0], scalar_value(add.args[1])
    mul = value_of(mul_var)
    if beta is None or not _call(mul, _MUL):
        return None
    alpha = scalar_value(mul.args[1])
    if alpha is None or const_value(mul.args[0]) is not None:
        return None
    return mul.args[0], alpha, beta, [add_var, mul_var]


def match_hardswish(value, value_of) -> Optional[Tuple[object, float, float, List]]:
    """``(x, α, β, [clip, add, multiply])`` when ``value`` is ``x · clip(x · α + β, 0, 1)``
    (:func:`hardswish_composite`, either operand order)."""
    if not _call(value, _MUL):
        return None
    for x, hs_var in (value.args, tuple(reversed(value.args))):
        found = match_hardsigmoid(value_of(hs_var), value_of)
        if found is not None and found[0].same_as(x):
            return x, found[1], found[2], [hs_var] + found[3]
    return None


# --- rules --------------------------------------------------------------------------------

# GELU, erf form: 0.5 · x · (1 + erf(x / √2))
_GX, _G_HALF, _G_ONE, _G_C = _dpl.wildcard(), _dpl.is_const(), _dpl.is_const(), _dpl.is_const()
_G_DIV = _op(_DIV, _GX, _G_C)
_G_ERF = _op("relax.erf", _comm(_MUL, _GX, _G_C) | _G_DIV)
_G_ERF_1 = _comm(_ADD, _G_ERF, _G_ONE)
_GELU = _product3(_GX, _G_HALF, _G_ERF_1)


def _gelu(matches: Matches, uses: Counter, binding_of) -> Optional[object]:
    """``gelu``: ``0.5·x·(1 + erf(x·(1/√2))) = gelu(x)`` (``x / √2`` too; any association)."""
    if not _chain_ok(matches, _GELU, _GX, uses, binding_of):
        return None
    c_want = math.sqrt(2.0) if _G_DIV in matches else 1 / math.sqrt(2.0)
    wants = ((_G_HALF, 0.5), (_G_ONE, 1.0), (_G_C, c_want))
    dtype = str(matches[_GX].ty.dtype)
    if not all(_near(scalar_value(matches[p]), w, dtype) for p, w in wants):
        return None
    return relax.op.nn.gelu(_operand(matches, _GX, binding_of))


# GELU, tanh form: 0.5 · x · (1 + tanh(√(2/π) · (x + 0.044715 · x³)))
_TX, _T_HALF, _T_ONE, _T_K, _T_C, _T_3 = (_dpl.wildcard(), *(_dpl.is_const() for _ in range(5)))
_T_CUBE = (_op("relax.power", _TX, _T_3) | _comm(_MUL, _comm(_MUL, _TX, _TX), _TX))
_T_INNER = _comm(_ADD, _TX, _comm(_MUL, _T_CUBE, _T_C))
_T_K2, _T_C2 = _dpl.is_const(), _dpl.is_const()
# onnxruntime's FastGelu distributes √(2/π): √(2/π)·x + (0.044715·√(2/π))·x³
_T_SPREAD = _comm(_ADD, _comm(_MUL, _TX, _T_K2), _comm(_MUL, _T_CUBE, _T_C2))
_T_TANH = _op("relax.tanh", _comm(_MUL, _T_INNER, _T_K) | _T_SPREAD)
_GELU_TANH = _product3(_TX, _T_HALF, _comm(_ADD, _T_TANH, _T_ONE))


def _gelu_tanh(matches: Matches, uses: Counter, binding_of) -> Optional[object]:
    """``gelu_tanh``: ``0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))) = gelu_tanh(x)`` (``x³`` as
    ``power(x, 3)`` or ``x·x·x``; ``√(2/π)`` distributed over the sum too)."""
    if not _chain_ok(matches, _GELU_TANH, _TX, uses, binding_of):
        return None
    k = math.sqrt(2 / math.pi)
    wants = ((_T_HALF, 0.5), (_T_ONE, 1.0))
    if _T_SPREAD in matches:
        wants += ((_T_K2, k), (_T_C2, 0.044715 * k))
    else:
        wants += ((_T_K, k), (_T_C, 0.044715))
    if _T_3 in matches:
        wants += ((_T_3, 3.0),)
    dtype = str(matches[_TX].ty.dtype)
    if not all(_near(scalar_value(matches[p]), w, dtype) for p, w in wants):
        return None
    return relax.op.nn.gelu_tanh(_operand(matches, _TX, binding_of))


# clip from minimum/maximum (ReLU6 among them): minimum(maximum(x, lo), hi)
_CX, _C_LO, _C_HI = _dpl.wildcard(), _dpl.is_const(), _dpl.is_const()
_MIN_MAX = (_comm("relax.minimum", _comm("relax.maximum", _CX, _C_LO), _C_HI)
            | _comm("relax.maximum", _comm("relax.minimum", _CX, _C_HI), _C_LO))


def _clip_rule(matches: Matches, uses: Counter, binding_of) -> Optional[object]:
    """``clip``: ``minimum(maximum(x, lo), hi) = maximum(minimum(x, hi), lo) = clip(x, lo, hi)``
    for scalar ``lo ≤ hi`` (ReLU6: ``lo = 0``, ``hi = 6``)."""
    lo, hi = scalar_value(matches[_C_LO]), scalar_value(matches[_C_HI])
    if lo is None or hi is None or lo > hi:
        return None
    if not _chain_ok(matches, _MIN_MAX, _CX, uses, binding_of):
        return None
    return relax.op.clip(_operand(matches, _CX, binding_of), lo, hi)


# clip of a clip (TVM's PyTorch frontend writes relu6 as clip(clip(x, 0, inf), -inf, 6))
_KX = _dpl.wildcard()
_K_INNER = _clip(_KX)
_CLIP_CLIP = _clip(_K_INNER)


def _clip_of_clip(matches: Matches, uses: Counter, binding_of) -> Optional[object]:
    """``clip_of_clip``: ``clip(clip(x, a, b), c, d) = clip(x, max(a, c), min(b, d))`` when
    the bounds meet (``max(a, c) ≤ min(b, d)``)."""
    inner, outer = _clip_bounds(matches[_K_INNER]), _clip_bounds(matches[_CLIP_CLIP])
    if inner is None or outer is None:
        return None
    lo, hi = max(inner[0], outer[0]), min(inner[1], outer[1])
    if lo > hi or not _chain_ok(matches, _CLIP_CLIP, _KX, uses, binding_of):
        return None
    return relax.op.clip(_operand(matches, _KX, binding_of), lo, hi)


# hard-sigmoid: clip(x + c, 0, m) / m, and clip(x·a + b, 0, 1) spelled otherwise
_HX, _H_C, _H_M = _dpl.wildcard(), _dpl.is_const(), _dpl.is_const()
_H_CLIP = _clip(_comm(_ADD, _HX, _H_C))
_H_SCALED = _op(_DIV, _H_CLIP, _H_M) | _comm(_MUL, _H_CLIP, _H_M)
_HA, _HB = _dpl.is_const(), _dpl.is_const()
_H_XD = _op(_DIV, _HX, _HA)
_H_XA = _comm(_MUL, _HX, _HA)
_H_AFFINE = _comm(_ADD, _H_XA | _H_XD, _HB)
_H_UNIT = _clip(_H_AFFINE)
_HARDSIGMOID = _H_SCALED | _H_UNIT


def _divisor(root, constant) -> Optional[float]:
    """``m`` of ``... / m``, or of ``... · k`` with ``k = 1/m``; None for a zero."""
    value = scalar_value(constant)
    if value is None or value == 0:
        return None
    return value if _call(root, _DIV) else 1 / value


def _unit_clip(bounds, scale: Optional[float]) -> bool:
    """``clip(·, 0, m) / m`` is ``clip(· / m, 0, 1)``: the bounds are ``(0, m)``, ``m > 0``."""
    return (bounds is not None and scale is not None and scale > 0 and bounds[0] == 0.0
            and _near(bounds[1], scale))


def _canonical_hardsigmoid(matches: Matches, binding_of) -> bool:
    """The matched ``clip(x·a + b, 0, 1)`` is spelled as :func:`hardsigmoid_composite`
    already: ``add(multiply(x, a), b)`` in that operand order (TVM's patterns match
    ``add``/``multiply`` in either order, so the pattern alone cannot exclude it)."""
    if _H_XD in matches:
        return False
    add, mul = matches[_H_AFFINE], matches[_H_XA]
    x = matches[_HX]
    return add.args[1].same_as(matches[_HB]) and (mul.args[0].same_as(x) or
                                                   mul.args[0].same_as(binding_of.get(x)))


def _hardsigmoid(matches: Matches, uses: Counter, binding_of) -> Optional[object]:
    """``hardsigmoid``: ``clip(x + c, 0, m) / m = clip(x·(1/m) + c/m, 0, 1)`` (``· (1/m)`` too),
    and ``clip(b + a·x, 0, 1) = clip(x·a + b, 0, 1)``: the canonical composite."""
    root = matches[_HARDSIGMOID]
    if not _chain_ok(matches, _HARDSIGMOID, _HX, uses, binding_of):
        return None
    if _H_CLIP in matches:
        scale = _divisor(root, matches[_H_M])
        bounds, c = _clip_bounds(matches[_H_CLIP]), scalar_value(matches[_H_C])
        if not _unit_clip(bounds, scale) or c is None:
            return None
        return hardsigmoid_composite(_operand(matches, _HX, binding_of), 1 / scale, c / scale)
    if _clip_bounds(root) != (0.0, 1.0) or _canonical_hardsigmoid(matches, binding_of):
        return None
    a, b = scalar_value(matches[_HA]), scalar_value(matches[_HB])
    if a is None or b is None or (_H_XD in matches and a == 0):
        return None
    x = _operand(matches, _HX, binding_of)
    return hardsigmoid_composite(x, 1 / a if _H_XD in matches else a, b)


# hard-swish: x · clip(x + c, 0, m) / m
_SX, _S_C, _S_M = _dpl.wildcard(), _dpl.is_const(), _dpl.is_const()
_S_CLIP = _clip(_comm(_ADD, _SX, _S_C))
_S_PROD = _comm(_MUL, _SX, _S_CLIP)
_HARDSWISH = _op(_DIV, _S_PROD, _S_M) | _comm(_MUL, _S_PROD, _S_M)


def _hardswish(matches: Matches, uses: Counter, binding_of) -> Optional[object]:
    """``hardswish``: ``x·clip(x + c, 0, m) / m = x·clip(x·(1/m) + c/m, 0, 1)`` (``· (1/m)``
    too; ``c = 3, m = 6`` is hard-swish): the canonical composite."""
    if not _chain_ok(matches, _HARDSWISH, _SX, uses, binding_of):
        return None
    scale = _divisor(matches[_HARDSWISH], matches[_S_M])
    bounds, c = _clip_bounds(matches[_S_CLIP]), scalar_value(matches[_S_C])
    if not _unit_clip(bounds, scale) or c is None:
        return None
    return hardswish_composite(_operand(matches, _SX, binding_of), 1 / scale, c / scale)


# leaky ReLU: where(x > 0, x, x·a) = maximum(x, x·a), 0 < a < 1
_LX, _L_A, _L_ZERO = _dpl.wildcard(), _dpl.is_const(), _dpl.is_const()
_L_XA = _comm(_MUL, _LX, _L_A)
_L_COND = _op("relax.greater", _LX, _L_ZERO) | _op("relax.greater_equal", _LX, _L_ZERO)
_LEAKY = _op("relax.where", _L_COND, _LX, _L_XA) | _comm("relax.maximum", _LX, _L_XA)


def _leaky_relu(matches: Matches, uses: Counter, binding_of) -> Optional[object]:
    """``leaky_relu``: ``where(x > 0, x, x·a) = maximum(x, x·a) = leakyrelu(x, a)`` for
    ``0 < a < 1`` (``x ≥ 0`` too)."""
    a = scalar_value(matches[_L_A])
    if a is None or not 0 < a < 1:
        return None
    if _L_ZERO in matches and scalar_value(matches[_L_ZERO]) != 0.0:
        return None
    if not _chain_ok(matches, _LEAKY, _LX, uses, binding_of):
        return None
    return relax.op.nn.leakyrelu(_operand(matches, _LX, binding_of), a)


#: The activation rules, in the order they are applied (the clips first: the hard-sigmoid and
#: hard-swish patterns read ReLU6 as one clip).
ACTIVATION_RULES: Tuple[FoldRule, ...] = (
    FoldRule("clip", _MIN_MAX, _clip_rule),
    FoldRule("clip_of_clip", _CLIP_CLIP, _clip_of_clip),
    FoldRule("gelu", _GELU, _gelu),
    FoldRule("gelu_tanh", _GELU_TANH, _gelu_tanh),
    FoldRule("hardswish", _HARDSWISH, _hardswish),
    FoldRule("hardsigmoid", _HARDSIGMOID, _hardsigmoid),
    FoldRule("leaky_relu", _LEAKY, _leaky_relu),
)
