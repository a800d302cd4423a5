"""Instance normalization as one native library call (``tvm_ollie.cpu.instance_norm``).

TVM builds an instance norm as two kernels (the variance, then the mean fused with the
normalization and its affine), each a serial loop nest over the whole tensor; Candy's nine norms
took four times ONNX Runtime's ``InstanceNormalization`` + ``Relu`` nodes (docs/profiling.md).
The native kernel normalizes each ``(n, c)`` plane in one call, the plane in the cache, planes
in parallel, with the affine and the epilogue (residual, activation) applied on the way out.

Two rules, by name, with their equations (``K`` the kernel, ``vec`` a view as ``[C]``)::

    instance_norm_op:      nn.instance_norm(x, γ, β; channel 1, spatial axes, ε)
                               = K[eps=ε, scale=1, bias=1](x, vec(γ), vec(β))
    instance_norm_onnx:    ((x - mean(x, S)) / sqrt(variance(x, S) + ε)) · γ + β
                               = K[eps=ε, scale=1, bias=1](x, vec(γ), vec(β))

where ``S`` are the spatial axes (every axis after the channel axis 1, and axis 0 when it has
extent 1), and in the second ``· γ`` and ``+ β`` are optional, per-channel (shape ``[C, 1, ..]``
or ``[1, C, 1, ..]``), in that order (the ONNX importer's decomposition). The intermediate
values must have no reader outside the pattern. Afterwards the residual ``add`` and the
activation after the norm fold into the call like any library kernel's epilogue
(:func:`~.epilogue.fuse_epilogues`).

Guards: float32 ``x`` of static rank >= 3 and static shape; ``ε`` a float constant of one
element; ``γ``/``β`` float32 with ``C`` elements along the channel axis only; the native library
provides the kernel (an older build keeps TVM's kernels). Exact up to rounding: the kernel sums in
double and multiplies by ``γ / sqrt(var + ε)`` where TVM divides, then multiplies.
"""

from __future__ import annotations

from collections import Counter
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from .. import native
from ..codegen import library as lib
from ..compat import relax, tvm
from .epilogue import (block_index, fuse_epilogues, is_f32, rewrite_dataflow_blocks, static_shape,
                       use_counts)

__all__ = ["INSTANCE_NORM_ONNX", "INSTANCE_NORM_OP", "instance_norm_kernels"]

#: The rules, by name with their equation (module docstring).
INSTANCE_NORM_OP = ("instance_norm_op",
                    "nn.instance_norm(x, γ, β) = K[eps, scale, bias](x, vec(γ), vec(β))")
INSTANCE_NORM_ONNX = ("instance_norm_onnx",
                      "((x - mean(x)) / sqrt(variance(x) + ε)) · γ + β = K[eps, scale, bias](x, "
                      "vec(γ), vec(β))")

_Match = Tuple[Dict[str, str], list, List[object]]  # attrs, operands, bindings replaced


def _is_op(value, name: str) -> bool:
    return (isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op)
            and value.op.name == name)


def _plane_axes(axes: Sequence[int], shape: Tuple[int, ...]) -> bool:
    """Whether reducing over ``axes`` normalizes each ``(n, c)`` plane: every axis after the
    channel axis 1, plus axis 0 only when it has extent 1."""
    rank = len(shape)
    norm = {int(a) % rank for a in axes}
    spatial = set(range(2, rank))
    return norm == spatial or (norm == spatial | {0} and shape[0] == 1)


def _channel_vector(expr, shape: Tuple[int, ...]) -> bool:
    """``expr`` is float32 with ``C = shape[1]`` elements along the channel axis only
    (``[C]``, ``[C, 1, ..]`` aligned to the channel axis, or ``[1, C, 1, ..]``)."""
    vs = static_shape(expr)
    if vs is None or not is_f32(expr):
        return False
    if vs == (shape[1],):
        return True
    rank = len(shape)
    if len(vs) > rank or len(vs) < rank - 1:
        return False
    offset = rank - len(vs)
    return all(s == (shape[1] if k + offset == 1 else 1) for k, s in enumerate(vs))


def _scalar(expr) -> Optional[float]:
    """The value of a float constant of one element, else None."""
    if not isinstance(expr, tvm.ir.expr.Constant):
        return None
    arr = expr.value.numpy()
    if arr.size != 1 or arr.dtype.kind != "f":
        return None
    value = float(arr.reshape(()))
    return value if np.isfinite(value) and value >= 0 else None


def _match_op(binding) -> Optional[_Match]:
    """:data:`INSTANCE_NORM_OP` at ``binding``."""
    value = binding.value
    if not _is_op(value, "relax.nn.instance_norm"):
        return None
    x, gamma, beta = value.args
    shape = static_shape(x)
    if shape is None or len(shape) < 3 or not is_f32(x) or static_shape(binding.var) != shape:
        return None
    at = value.attrs
    if int(at.channel_axis) % len(shape) != 1 or not _plane_axes(list(at.axes), shape):
        return None
    attrs, operands = {"eps": repr(float(at.epsilon))}, [x]
    for key, flag, vec in (("scale", bool(at.scale), gamma), ("bias", bool(at.center), beta)):
        if flag:
            if not _channel_vector(vec, shape):
                return None
            attrs[key] = "1"
            operands.append(vec)
    return attrs, operands, []


def _match_onnx(binding, values, uses: Counter) -> Optional[_Match]:
    """:data:`INSTANCE_NORM_ONNX` ending at ``binding`` (the divide, or the product by γ or the
    sum with β that follows it)."""
    chain: List[object] = []
    value, var = binding.value, binding.var
    beta = gamma = None
    if _is_op(value, "relax.add"):
        chain, beta, var = [var], value.args[1], value.args[0]
        value = values.get(var)
    if value is not None and _is_op(value, "relax.multiply"):
        chain, gamma, var = chain + [var], value.args[1], value.args[0]
        value = values.get(var)
    if value is None or not _is_op(value, "relax.divide"):
        return None
    chain.append(var)
    d, s = value.args
    parts = _normalized(d, s, values)
    if parts is None:
        return None
    x, eps, inner = parts
    shape = static_shape(x)
    chain = chain + inner
    # every value of the pattern but the last is read by the pattern alone, once
    if any(uses[v] != 1 for v in chain[1:] if v is not binding.var):
        return None
    if gamma is not None and not _channel_vector(gamma, shape):
        return None
    if beta is not None and not _channel_vector(beta, shape):
        return None
    attrs, operands = {"eps": repr(eps)}, [x]
    if gamma is not None:
        attrs["scale"] = "1"
        operands.append(gamma)
    if beta is not None:
        attrs["bias"] = "1"
        operands.append(beta)
    return attrs, operands, [v for v in chain if v is not binding.var]


def _normalized(d, s, values) -> Optional[Tuple[object, float, List[object]]]:
    """``(x, ε, intermediate variables)`` when ``d / s`` is ``(x - mean(x)) / sqrt(variance(x)
    + ε)`` over the planes of ``x``; else None."""
    dv, sv = values.get(d), values.get(s)
    if dv is None or sv is None or not _is_op(dv, "relax.subtract") or \
            not _is_op(sv, "relax.sqrt"):
        return None
    x, mu = dv.args
    muv, av = values.get(mu), values.get(sv.args[0])
    if muv is None or av is None or not _is_op(muv, "relax.mean") or \
            not _is_op(av, "relax.add"):
        return None
    v, e = av.args
    if values.get(v) is None:
        v, e = e, v
    vv = values.get(v)
    eps = _scalar(e)
    if vv is None or eps is None or not _is_op(vv, "relax.variance"):
        return None
    shape = static_shape(x)
    if shape is None or len(shape) < 3 or not is_f32(x) or static_shape(d) != shape:
        return None
    for red in (muv, vv):
        if not red.args[0].same_as(x) or not bool(red.attrs.keepdims) or red.attrs.axis is None \
                or not _plane_axes(list(red.attrs.axis), shape):
            return None
    return x, eps, [d, s, mu, sv.args[0], v]


def _rewrite_block(bindings: List, uses: Counter, counts: Dict[str, int]) -> List:
    """The block with every matched instance norm as one kernel call."""
    index = block_index(bindings)
    out: List = list(bindings)
    # last binding first: a pattern is matched at its longest end (the sum with β before the
    # divide it contains)
    for k in reversed(range(len(bindings))):
        binding = bindings[k]
        if out[k] is not binding:
            continue
        found = _match_op(binding)
        rule = INSTANCE_NORM_OP[0]
        if found is None:
            found = _match_onnx(binding, index.values, uses)
            rule = INSTANCE_NORM_ONNX[0]
        if found is None:
            continue
        attrs, operands, replaced = found
        positions = [index.position[v] for v in replaced]
        if any(out[p] is not bindings[p] for p in positions):
            continue
        for p in positions:
            out[p] = None
        call = lib.LibCall(lib.INSTANCE_NORM, tuple(attrs.items()))
        out[k] = relax.VarBinding(binding.var, relax.BlockBuilder().normalize(
            lib.emit_call(call, operands, static_shape(binding.var))))
        counts[rule] = counts.get(rule, 0) + 1
    return [b for b in out if b is not None]


def instance_norm_kernels(mod: "tvm.IRModule") -> Tuple["tvm.IRModule", Dict[str, int]]:
    """``mod`` with its instance norms as native calls, their residual adds and activations
    folded in; and how many norms each rule rewrote (empty when the library lacks the
    kernel)."""
    if not native.provides(lib.INSTANCE_NORM):
        return mod, {}
    counts: Dict[str, int] = {}
    new_mod = rewrite_dataflow_blocks(
        mod, lambda bindings, func: _rewrite_block(bindings, use_counts(func), counts))
    if not counts:
        return mod, {}
    new_mod, _ = fuse_epilogues(new_mod)
    return new_mod, counts
