"""Operator-fission rules (Korch): each composite Relax operator as a graph of primitives.

Korch plans kernels over *primitives* of four kinds (elementwise, reduce/broadcast, layout,
linear) rather than over framework operators, so that a kernel may cut through what used to be
one operator (e.g. the max-reduction of a softmax fused into the producer of its input). This
module is the data of that split: :data:`PRIMITIVE_KINDS` says which standard Relax operators
are already primitives and of which kind, and :data:`FISSION_RULES` says how every composite
operator found in the model zoo (and a few more) becomes primitives.

Each :class:`FissionRule` has a name, the equation it implements (the first line of its build
function's docstring), small named guards, and a build function that emits standard Relax
operators through a ``BlockBuilder``. A rule applies only to static shapes and floating-point
data, and keeps the numerically stable forms (softmax subtracts the row maximum; Korch's
released code dropped it and overflows on large logits).

HardSwish and HardSigmoid need no rule: TVM 0.27 has no Relax op for them, and both the torch
and the ONNX importers already write them as add/multiply/clip/divide. Windowed pooling with
overlapping windows (ResNet's and YOLOX's max pools) is kept as one reduce primitive.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..compat import relax, tvm
from .primitives import OP_KIND

# --------------------------------------------------------------------------------------------
# Primitive kinds
# --------------------------------------------------------------------------------------------

ELEMENTWISE = "elementwise"
REDUCE = "reduce"
LAYOUT = "layout"
LINEAR = "linear"

#: Operators that :data:`.primitives.OP_KIND` counts as one primitive (so orchestration can
#: still place them when fission is off) but that fission splits: composites of primitives.
COMPOSITE_OPS = frozenset(f"relax.{n}" for n in (
    "nn.softmax", "nn.log_softmax", "nn.layer_norm", "nn.rms_norm", "nn.batch_norm",
    "nn.instance_norm", "nn.group_norm", "nn.gelu", "nn.gelu_tanh", "nn.silu", "nn.selu",
    "nn.softplus", "nn.dropout", "nn.cross_entropy_with_logits", "nn.nll_loss", "nn.attention",
    "nn.attention_bias",
))

#: Relax op name (``relax.`` prefix) -> primitive kind: the one kind table of
#: :mod:`.primitives` without the composites. Windowed pooling stays a reduce primitive (a
#: rule splits it only when its windows tile the input). Anything else is not a primitive.
PRIMITIVE_KINDS: Dict[str, str] = {
    name: kind for name, kind in OP_KIND.items() if name not in COMPOSITE_OPS
}


def primitive_kind(op_name: str) -> Optional[str]:
    """The primitive kind of a Relax op name, or None when the op is not a primitive."""
    return PRIMITIVE_KINDS.get(op_name)


# --------------------------------------------------------------------------------------------
# Rules
# --------------------------------------------------------------------------------------------


class RuleContext:
    """What a rule may ask about the surrounding function (set up by the fission mutator).

    ``producer(var)`` is the original call bound to ``var`` (None if ``var`` is not bound to an
    operator call); ``use_count(var)`` counts the bindings and returns that read ``var``;
    ``remap(expr)`` gives the rewritten form of an original expression. This base class is the
    context of a lone call (nothing known upstream); the fission pass supplies a real one.
    """

    def producer(self, var: relax.Expr) -> Optional[relax.Call]:
        """Original call bound to ``var``."""
        del var
        return None

    def use_count(self, var: relax.Expr) -> int:
        """How many bindings (and returns) read ``var``."""
        del var
        return 0

    def remap(self, expr: relax.Expr) -> relax.Expr:
        """Rewritten form of an original expression."""
        return expr


#: A guard: (original call, context) -> whether the rule may apply.
Guard = Callable[[relax.Call, RuleContext], bool]
#: A build function: (builder, call with rewritten arguments, context) -> replacement.
Build = Callable[["relax.BlockBuilder", relax.Call, RuleContext], relax.Expr]


@dataclasses.dataclass(frozen=True)
class FissionRule:
    """One fission rule: the calls of ``op_name`` that pass every guard become ``build``'s graph.

    Attributes
    ----------
    name : str
        Rule name, as reported.
    op_name : str
        The Relax op (``relax.nn.softmax``) whose calls the rule rewrites.
    build : Build
        Emits the primitive graph; its docstring's first line is the equation.
    guards : tuple of (str, Guard)
        Named predicates; the first that fails is the reason the call stays untouched.
    """

    name: str
    op_name: str
    build: Build
    guards: Tuple[Tuple[str, Guard], ...]

    @property
    def equation(self) -> str:
        """The identity the rule implements."""
        return (self.build.__doc__ or "").strip().splitlines()[0]

    def failed_guard(self, call: relax.Call, ctx: RuleContext) -> Optional[str]:
        """Name of the first guard ``call`` fails, or None when the rule applies."""
        for name, guard in self.guards:
            if not guard(call, ctx):
                return name
        return None

    def apply(self, bb: "relax.BlockBuilder", call: relax.Call, ctx: RuleContext,
              new_call: Optional[relax.Call] = None) -> Optional[relax.Expr]:
        """The replacement of ``call``, or None when the rule does not apply.

        ``new_call`` is ``call`` with its arguments already rewritten (default: ``call``);
        guards look at the original, the graph is built from the rewritten one.
        """
        if call.op.name != self.op_name or self.failed_guard(call, ctx) is not None:
            return None
        return self.build(bb, call if new_call is None else new_call, ctx)


# ------------------------------------------------------------------------ shape/dtype helpers


def _static_shape(expr: relax.Expr) -> Optional[Tuple[int, ...]]:
    ty = expr.ty
    if not isinstance(ty, relax.TensorType) or ty.shape is None:
        return None
    shape = getattr(ty.shape, "values", None)
    if shape is None:
        return None
    if not all(isinstance(s, tvm.tirx.IntImm) for s in shape):
        return None
    return tuple(int(s) for s in shape)


def _shape(expr: relax.Expr) -> Tuple[int, ...]:
    shape = _static_shape(expr)
    assert shape is not None, "guarded by static_shapes"
    return shape


def _dtype(expr: relax.Expr) -> str:
    return str(expr.ty.dtype)


def _tensor_exprs(call: relax.Call) -> List[relax.Expr]:
    """The call's tensor arguments and its result (tuple results: every field)."""
    out = [a for a in call.args if isinstance(a.ty, relax.TensorType)]
    ret = call.ty
    fields = ret.fields if isinstance(ret, tvm.ir.TupleType) else [ret]
    out.extend(_TypeOnly(f) for f in fields)
    return out


class _TypeOnly:  # pylint: disable=too-few-public-methods
    """Adapter so that result types pass through the same shape helpers as arguments."""

    def __init__(self, ty):
        self.ty = ty


def _axes(axes, ndim: int) -> List[int]:
    if isinstance(axes, (int, tvm.tirx.IntImm)):
        axes = [axes]
    return sorted(int(a) % ndim for a in axes)


def _const(value: float, dtype: str) -> relax.Constant:
    return relax.const(value, dtype)


def _broadcast_param(bb, param: relax.Expr, ndim: int, axes: Sequence[int],
                     data_shape: Sequence[int]) -> relax.Expr:
    """``param`` (shape = data_shape at ``axes``) reshaped to broadcast against the data; a
    constant is reshaped here, into a constant. Why: emitted as a ``reshape`` binding, each
    became a ``call_tir`` of constants that ``FoldConstant`` builds and runs (YOLOX quick's 94
    batch norms: 377 of them, about 60 ms of LLVM each, in every orchestrated plan)."""
    if list(axes) == list(range(ndim - len(axes), ndim)):
        return param  # trailing axes: numpy broadcasting already lines it up
    shape = [data_shape[i] if i in axes else 1 for i in range(ndim)]
    if isinstance(param, tvm.ir.expr.Constant):
        return relax.const(param.value.numpy().reshape(shape), str(param.value.dtype))
    return bb.emit(relax.op.reshape(param, shape))


def _normalize(bb, x: relax.Expr, axes: Sequence[int], eps: float) -> relax.Var:
    """(x - mean(x)) / sqrt(var(x) + eps) over ``axes``, two-pass (stable) variance."""
    dtype = _dtype(x)
    mean = bb.emit(relax.op.mean(x, axes, keepdims=True))
    diff = bb.emit(relax.op.subtract(x, mean))
    var = bb.emit(relax.op.mean(bb.emit(relax.op.multiply(diff, diff)), axes, keepdims=True))
    std = bb.emit(relax.op.sqrt(bb.emit(relax.op.add(var, _const(eps, dtype)))))
    return bb.emit(relax.op.divide(diff, std))


def _affine(bb, y: relax.Expr, gamma: Optional[relax.Expr], beta: Optional[relax.Expr],
            ndim: int, axes: Sequence[int], shape: Sequence[int]) -> relax.Expr:
    """y * gamma + beta with the parameters broadcast over ``axes``; the last op unbound."""
    out = y
    if gamma is not None:
        out = relax.op.multiply(out, _broadcast_param(bb, gamma, ndim, axes, shape))
    if beta is not None:
        if gamma is not None:
            out = bb.emit(out)
        out = relax.op.add(out, _broadcast_param(bb, beta, ndim, axes, shape))
    return out


# ------------------------------------------------------------------------ guards


def static_shapes(call: relax.Call, ctx: RuleContext) -> bool:
    """Every tensor argument and result has a static shape."""
    del ctx
    return all(_static_shape(e) is not None for e in _tensor_exprs(call))


def float_data(call: relax.Call, ctx: RuleContext) -> bool:
    """The data (first argument) is floating point (integer math would round differently)."""
    del ctx
    ty = call.args[0].ty
    return isinstance(ty, relax.TensorType) and str(ty.dtype).startswith(("float", "bfloat"))


def inference_mode(call: relax.Call, ctx: RuleContext) -> bool:
    """batch_norm uses its moving statistics (training mode would update them)."""
    del ctx
    return not bool(call.attrs.training)


def channels_divisible(call: relax.Call, ctx: RuleContext) -> bool:
    """group_norm: the channel count is a multiple of num_groups, not a normalized axis."""
    del ctx
    shape = _shape(call.args[0])
    ndim = len(shape)
    channel = int(call.attrs.channel_axis) % ndim
    return (shape[channel] % int(call.attrs.num_groups) == 0
            and channel not in _axes(call.attrs.axes, ndim))


_POOL_LAYOUTS = {"NCHW": (2, 3), "NHWC": (1, 2)}


def _pool_layout_ok(call: relax.Call) -> bool:
    layout = str(call.attrs.layout)
    return layout in _POOL_LAYOUTS and str(call.attrs.out_layout) == layout


def tiled_windows(call: relax.Call, ctx: RuleContext) -> bool:
    """Pool windows tile the input exactly: stride = size, no padding/dilation, exact division.

    Overlapping windows have no clean fission; such a pool stays one reduce primitive.
    """
    del ctx
    if not _pool_layout_ok(call):
        return False
    attrs = call.attrs
    size = [int(s) for s in attrs.pool_size]
    if [int(s) for s in attrs.strides] != size or any(int(p) for p in attrs.padding):
        return False
    if any(int(d) != 1 for d in attrs.dilation):
        return False
    h_axis, w_axis = _POOL_LAYOUTS[str(attrs.layout)]
    shape = _shape(call.args[0])
    return shape[h_axis] % size[0] == 0 and shape[w_axis] % size[1] == 0


def adaptive_tiled(call: relax.Call, ctx: RuleContext) -> bool:
    """adaptive_avg_pool2d: the output size divides the input size (equal, disjoint bins)."""
    del ctx
    if not _pool_layout_ok(call) or call.attrs.output_size is None:
        return False
    h_axis, w_axis = _POOL_LAYOUTS[str(call.attrs.layout)]
    shape = _shape(call.args[0])
    out = [int(s) for s in call.attrs.output_size]
    if len(out) == 1:
        out = out * 2
    return shape[h_axis] % out[0] == 0 and shape[w_axis] % out[1] == 0


_BASIC: Tuple[Tuple[str, Guard], ...] = (("static_shapes", static_shapes),
                                         ("float_data", float_data))


# ------------------------------------------------------------------------ build functions


def _build_softmax(bb, call, ctx):
    """softmax(x) = exp(x - max(x)) / sum(exp(x - max(x)))  (reductions over the axis)."""
    del ctx
    x, axis = call.args[0], [int(call.attrs.axis)]
    top = bb.emit(relax.op.max(x, axis, keepdims=True))
    num = bb.emit(relax.op.exp(bb.emit(relax.op.subtract(x, top))))
    den = bb.emit(relax.op.sum(num, axis, keepdims=True))
    return relax.op.divide(num, den)


def _build_log_softmax(bb, call, ctx):
    """log_softmax(x) = (x - max(x)) - log(sum(exp(x - max(x))))  (over the axis)."""
    del ctx
    x, axis = call.args[0], [int(call.attrs.axis)]
    top = bb.emit(relax.op.max(x, axis, keepdims=True))
    shifted = bb.emit(relax.op.subtract(x, top))
    total = bb.emit(relax.op.sum(bb.emit(relax.op.exp(shifted)), axis, keepdims=True))
    return relax.op.subtract(shifted, bb.emit(relax.op.log(total)))


def _build_layer_norm(bb, call, ctx):
    """layer_norm(x) = (x - mean(x)) / sqrt(mean((x - mean(x))^2) + eps) * gamma + beta."""
    del ctx
    x, gamma, beta = call.args
    shape = _shape(x)
    axes = _axes(call.attrs.axes, len(shape))
    y = _normalize(bb, x, axes, float(call.attrs.epsilon))
    return _affine(bb, y, gamma if call.attrs.scale else None,
                   beta if call.attrs.center else None, len(shape), axes, shape)


def _build_rms_norm(bb, call, ctx):
    """rms_norm(x) = x / sqrt(mean(x^2) + eps) * weight  (mean over the axes)."""
    del ctx
    x, weight = call.args
    shape = _shape(x)
    axes = _axes(call.attrs.axes, len(shape))
    eps = _const(float(call.attrs.epsilon), _dtype(x))
    square = bb.emit(relax.op.multiply(x, x))
    mean = bb.emit(relax.op.mean(square, axes, keepdims=True))
    rms = bb.emit(relax.op.sqrt(bb.emit(relax.op.add(mean, eps))))
    y = bb.emit(relax.op.divide(x, rms))
    return relax.op.multiply(y, _broadcast_param(bb, weight, len(shape), axes, shape))


def _build_batch_norm(bb, call, ctx):
    """batch_norm(x) = ((x - mu) / sqrt(var + eps) * gamma + beta, mu, var)  (moving stats)."""
    del ctx
    x, gamma, beta, mean, var = call.args
    shape = _shape(x)
    ndim = len(shape)
    axes = [int(call.attrs.axis) % ndim]
    eps = _const(float(call.attrs.epsilon), _dtype(x))
    mean_b = _broadcast_param(bb, mean, ndim, axes, shape)
    var_b = _broadcast_param(bb, var, ndim, axes, shape)
    diff = bb.emit(relax.op.subtract(x, mean_b))
    if isinstance(var_b, tvm.ir.expr.Constant):  # the moving variance of a model's weights
        # computed here (float32 add and sqrt round alike in numpy and in TVM's kernel),
        # not left to FoldConstant: two LLVM builds per batch norm in every orchestrated plan
        data = var_b.value.numpy()
        std = relax.const(np.sqrt(data + np.asarray(call.attrs.epsilon, data.dtype)),
                          str(data.dtype))
    else:
        std = bb.emit(relax.op.sqrt(bb.emit(relax.op.add(var_b, eps))))
    y = bb.emit(relax.op.divide(diff, std))
    out = _affine(bb, y, gamma if call.attrs.scale else None,
                  beta if call.attrs.center else None, ndim, axes, shape)
    if not isinstance(out, relax.Var):
        out = bb.emit(out)
    return relax.Tuple([out, mean, var])


def _build_instance_norm(bb, call, ctx):
    """instance_norm(x) = (x - mean(x)) / sqrt(var(x) + eps) * gamma + beta  (per N, C)."""
    del ctx
    x, gamma, beta = call.args
    shape = _shape(x)
    ndim = len(shape)
    y = _normalize(bb, x, _axes(call.attrs.axes, ndim), float(call.attrs.epsilon))
    channel = [int(call.attrs.channel_axis) % ndim]
    return _affine(bb, y, gamma if call.attrs.scale else None,
                   beta if call.attrs.center else None, ndim, channel, shape)


def _build_group_norm(bb, call, ctx):
    """group_norm(x) = reshape(normalize(reshape(x, [.., G, C/G, ..])), x.shape) * gamma + beta."""
    del ctx
    x, gamma, beta = call.args
    shape = _shape(x)
    ndim = len(shape)
    channel = int(call.attrs.channel_axis) % ndim
    groups = int(call.attrs.num_groups)
    grouped = list(shape[:channel]) + [groups, shape[channel] // groups] + list(shape[channel + 1:])
    axes = [channel + 1] + [a if a < channel else a + 1
                            for a in _axes(call.attrs.axes, ndim)]
    xg = bb.emit(relax.op.reshape(x, grouped))
    yg = _normalize(bb, xg, sorted(axes), float(call.attrs.epsilon))
    y = bb.emit(relax.op.reshape(yg, list(shape)))
    return _affine(bb, y, gamma if call.attrs.scale else None,
                   beta if call.attrs.center else None, ndim, [channel], shape)


def _build_gelu(bb, call, ctx):
    """gelu(x) = 0.5 * x * (1 + erf(x / sqrt(2)))."""
    del ctx
    x = call.args[0]
    dtype = _dtype(x)
    erf = bb.emit(relax.op.erf(bb.emit(relax.op.multiply(x, _const(math.sqrt(0.5), dtype)))))
    half_x = bb.emit(relax.op.multiply(x, _const(0.5, dtype)))
    return relax.op.multiply(half_x, bb.emit(relax.op.add(erf, _const(1.0, dtype))))


def _build_gelu_tanh(bb, call, ctx):
    """gelu_tanh(x) = 0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x^3)))."""
    del ctx
    x = call.args[0]
    dtype = _dtype(x)
    cube = bb.emit(relax.op.multiply(bb.emit(relax.op.multiply(x, x)), x))
    inner = bb.emit(relax.op.add(x, bb.emit(relax.op.multiply(cube, _const(0.044715, dtype)))))
    scaled = bb.emit(relax.op.multiply(inner, _const(math.sqrt(2.0 / math.pi), dtype)))
    tanh = bb.emit(relax.op.tanh(scaled))
    half_x = bb.emit(relax.op.multiply(x, _const(0.5, dtype)))
    return relax.op.multiply(half_x, bb.emit(relax.op.add(tanh, _const(1.0, dtype))))


def _build_silu(bb, call, ctx):
    """silu(x) = x * sigmoid(x)."""
    del ctx
    x = call.args[0]
    return relax.op.multiply(x, bb.emit(relax.op.sigmoid(x)))


def _tiled_pool(bb, x: relax.Expr, layout: str, size: Sequence[int], reduce_op) -> relax.Expr:
    """Reduce each disjoint size[0] x size[1] tile of x (split H and W, reduce the tile axes)."""
    shape = _shape(x)
    h_axis, w_axis = _POOL_LAYOUTS[layout]
    if size[0] == shape[h_axis] and size[1] == shape[w_axis]:
        return reduce_op(x, [h_axis, w_axis], keepdims=True)  # global pooling
    split: List[int] = []
    tile_axes: List[int] = []
    for axis, extent in enumerate(shape):
        if axis in (h_axis, w_axis):
            k = size[0] if axis == h_axis else size[1]
            split += [extent // k, k]
            tile_axes.append(len(split) - 1)
        else:
            split.append(extent)
    tiles = bb.emit(relax.op.reshape(x, split))
    return reduce_op(tiles, tile_axes, keepdims=False)


def _build_avg_pool2d(bb, call, ctx):
    """avg_pool2d(x) = mean over each disjoint window (reshape H, W into tiles; mean)."""
    del ctx
    size = [int(s) for s in call.attrs.pool_size]
    return _tiled_pool(bb, call.args[0], str(call.attrs.layout), size, relax.op.mean)


def _build_max_pool2d(bb, call, ctx):
    """max_pool2d(x) = max over each disjoint window (reshape H, W into tiles; max)."""
    del ctx
    size = [int(s) for s in call.attrs.pool_size]
    return _tiled_pool(bb, call.args[0], str(call.attrs.layout), size, relax.op.max)


def _build_adaptive_avg_pool2d(bb, call, ctx):
    """adaptive_avg_pool2d(x, (oh, ow)) = avg_pool2d(x, size=stride=(H/oh, W/ow))."""
    del ctx
    x = call.args[0]
    layout = str(call.attrs.layout)
    shape = _shape(x)
    out = [int(s) for s in call.attrs.output_size]
    if len(out) == 1:
        out = out * 2
    h_axis, w_axis = _POOL_LAYOUTS[layout]
    size = [shape[h_axis] // out[0], shape[w_axis] // out[1]]
    return _tiled_pool(bb, x, layout, size, relax.op.mean)


# ------------------------------------------------------------------------ attention


def _row_wise(call: relax.Call) -> bool:
    """A layout op that moves whole rows (last axis kept intact), so softmax commutes with it."""
    name = call.op.name
    if name not in ("relax.reshape", "relax.broadcast_to", "relax.permute_dims"):
        return False
    src, dst = _static_shape(call.args[0]), _static_shape(call)
    if src is None or dst is None or not src or not dst or src[-1] != dst[-1]:
        return False
    if name == "relax.permute_dims":
        axes = call.attrs.axes
        return axes is not None and int(axes[-1]) % len(src) == len(src) - 1
    return True


@dataclasses.dataclass(frozen=True)
class SoftmaxChain:
    """``lhs = L_k(...L_1(softmax(S)))`` with row-wise layout ops ``L_i``, each value read once.

    Attributes
    ----------
    softmax : relax.Call
        The softmax call.
    layout : tuple of relax.Call
        The row-wise layout calls, from the softmax outwards.
    absorbed : tuple of relax.Var
        The variables bound to the softmax and the layout calls; the rewrite replaces them.
    """

    softmax: relax.Call
    layout: Tuple[relax.Call, ...]
    absorbed: Tuple[relax.Var, ...]


def softmax_chain(lhs: relax.Expr, ctx: RuleContext,
                  max_layout_ops: int = 4) -> Optional[SoftmaxChain]:
    """The softmax feeding ``lhs`` through at most ``max_layout_ops`` row-wise layout ops.

    torch.export writes ``softmax(S) @ V`` as softmax -> broadcast_to -> reshape -> matmul;
    moving those row-wise ops onto S before the softmax does not change the result.
    """
    layout: List[relax.Call] = []
    absorbed: List[relax.Var] = []
    var = lhs
    while True:
        producer = ctx.producer(var)
        if producer is None or ctx.use_count(var) != 1:
            return None
        absorbed.append(var)
        if producer.op.name == "relax.nn.softmax":
            return SoftmaxChain(producer, tuple(reversed(layout)), tuple(absorbed))
        if len(layout) >= max_layout_ops or not _row_wise(producer):
            return None
        layout.append(producer)
        var = producer.args[0]


def softmax_lhs(call: relax.Call, ctx: RuleContext) -> bool:
    """matmul(P, V): P = softmax(S) (maybe through row-wise layout ops), each read once."""
    return (not call.args[0].same_as(call.args[1])
            and softmax_chain(call.args[0], ctx) is not None)


def scores_static_float(call: relax.Call, ctx: RuleContext) -> bool:
    """The softmax input S has a static shape and a floating-point dtype."""
    producer = softmax_chain(call.args[0], ctx).softmax
    return static_shapes(producer, ctx) and float_data(producer, ctx)


def last_axis_matrices(call: relax.Call, ctx: RuleContext) -> bool:
    """softmax is over the last axis of S; P and V are at least 2-D; one dtype throughout."""
    lhs, rhs = call.args
    if len(_shape(lhs)) < 2 or len(_shape(rhs)) < 2:
        return False
    producer = softmax_chain(lhs, ctx).softmax
    ndim = len(_shape(producer.args[0]))
    if int(producer.attrs.axis) % ndim != ndim - 1:
        return False
    out_dtype = call.attrs.out_dtype
    return (out_dtype is None or str(out_dtype) in ("", "void", _dtype(lhs))) and _dtype(
        rhs) == _dtype(lhs)


def _build_attention(bb, call, ctx):
    """softmax(S) @ V = (E @ [V, 1])[..., :d] / (E @ [V, 1])[..., d:],  E = exp(S - max(S))."""
    chain = softmax_chain(call.args[0], ctx)
    scores = ctx.remap(chain.softmax.args[0])
    for layout in chain.layout:  # row-wise: applied to S instead of softmax(S)
        rest = [ctx.remap(a) for a in layout.args[1:]]
        scores = bb.emit(relax.Call(layout.op, [scores] + rest, layout.attrs, layout.ty_args))
    values = call.args[1]
    v_shape = _shape(values)
    dtype = _dtype(values)
    top = bb.emit(relax.op.max(scores, [-1], keepdims=True))
    num = bb.emit(relax.op.exp(bb.emit(relax.op.subtract(scores, top))))
    ones = relax.op.ones(list(v_shape[:-1]) + [1], dtype)
    extended = bb.emit(relax.op.concat([values, bb.emit(ones)], axis=-1))
    both = bb.emit(relax.op.matmul(num, extended))
    last = len(_shape(both)) - 1
    d = v_shape[-1]
    weighted = bb.emit(relax.op.strided_slice(both, [last], [0], [d]))
    total = bb.emit(relax.op.strided_slice(both, [last], [d], [d + 1]))
    return relax.op.divide(weighted, total)


def _rule(name: str, op: str, build: Build, *extra: Tuple[str, Guard]) -> FissionRule:
    return FissionRule(name, f"relax.{op}", build, _BASIC + tuple(extra))


#: op name -> rule, for every composite op the default fission splits.
FISSION_RULES: Dict[str, FissionRule] = {
    r.op_name: r
    for r in (
        _rule("softmax", "nn.softmax", _build_softmax),
        _rule("log_softmax", "nn.log_softmax", _build_log_softmax),
        _rule("layer_norm", "nn.layer_norm", _build_layer_norm),
        _rule("rms_norm", "nn.rms_norm", _build_rms_norm),
        _rule("batch_norm", "nn.batch_norm", _build_batch_norm,
              ("inference_mode", inference_mode)),
        _rule("instance_norm", "nn.instance_norm", _build_instance_norm),
        _rule("group_norm", "nn.group_norm", _build_group_norm,
              ("channels_divisible", channels_divisible)),
        _rule("gelu", "nn.gelu", _build_gelu),
        _rule("gelu_tanh", "nn.gelu_tanh", _build_gelu_tanh),
        _rule("silu", "nn.silu", _build_silu),
        _rule("avg_pool2d", "nn.avg_pool2d", _build_avg_pool2d, ("tiled_windows", tiled_windows)),
        _rule("max_pool2d", "nn.max_pool2d", _build_max_pool2d, ("tiled_windows", tiled_windows)),
        _rule("adaptive_avg_pool2d", "nn.adaptive_avg_pool2d", _build_adaptive_avg_pool2d,
              ("adaptive_tiled", adaptive_tiled)),
    )
}

#: Korch's attention rewrite (optional; ``fission(mod, attention=True)``): softmax then matmul
#: become one matmul against [V, 1] whose last column is the softmax denominator.
ATTENTION_RULE = FissionRule(
    "attention_softmax_matmul", "relax.matmul", _build_attention,
    (("softmax_lhs", softmax_lhs), ("static_shapes", static_shapes),
     ("float_data", float_data), ("scores_static_float", scores_static_float),
     ("last_axis_matrices", last_axis_matrices)))
