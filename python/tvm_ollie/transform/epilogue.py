"""Fold the consumers of native library kernels into the kernel call: bias, residual, activation.

The native kernels compute ``Out = act(op(A, B) + bias + residual)`` in one pass over the
output (:mod:`tvm_ollie.codegen.library`). When the pass has put a kernel in place of an
operator, the operator's consumers in the model (``add`` of a per-channel bias, ``add`` of a
same-shaped shortcut, an activation) would otherwise each read and write the whole output
again. One rule, applied in a dataflow block while it matches::

    y = call_dps_packed(K, (attrs, a, b, ...));  z = add(y, bias)   ->  z = K(attrs+bias, .., bias)
    y = call_dps_packed(K, (attrs, ...));        z = add(y, r)      ->  z = K(attrs+res, .., r)
    y = call_dps_packed(K, (attrs, ...));        z = act(y)         ->  z = K(attrs+act, ...)

``act`` is one Relax activation (:data:`ACTIVATIONS`, leaky ReLU with its slope), a product
by a float32 scalar constant (``multiply(y, c)``: ``act=scale_c``, attention's ``1/sqrt(d)``
after ``Q @ K^T``; oneDNN's ``eltwise_linear`` post-op, one rounding as TVM's multiply), or one
of the canonical composites of :mod:`.activations`, several bindings folded at once: hard-sigmoid
``clip(y·α + β, 0, 1)`` and hard-swish ``y·clip(y·α + β, 0, 1)`` (Relax has no operator for
them; TVM builds the composite where no library kernel precedes it). The activations added with
them (:data:`CPU_ONLY_ACTIVATIONS`) fold into the CPU kernels only: the CUDA epilogue lacks them.

Guards (each named below): ``y`` is used once, by ``z``, in the same block; the epilogue keeps
the kernel's order (bias, then residual, then activation; each at most once); ``z`` has ``y``'s
shape and dtype; a bias broadcasts along the output channel only; a residual is float32 of the
output's shape.

A reshape between the kernel and its consumer (what importers write around a linear layer on a
``[batch, seq, hidden]`` input: ``reshape`` to 2-D, ``matmul``, ``add`` of the bias,
``reshape`` back, then the activation or the residual ``add``) is sunk below the consumer
first (:data:`SINK_RESHAPE`), so that the consumer folds too::

    r = reshape(y, S2);  z = act(r)         ->  z0 = act(y);  z = reshape(z0, S2)
    r = reshape(y, S2);  z = add(r, res)    ->  z0 = add(y, reshape(res, S1));  z = reshape(z0, S2)
    r = reshape(y, S2);  z = add(r, bias)   ->  z0 = add(y, bias);  z = reshape(z0, S2)

(``S1`` is ``y``'s shape.) Exact: a reshape renumbers the elements of a row-major tensor and
the consumers are elementwise. Guards: ``y`` and ``r`` are each read once, in the same block;
the consumer folds into the kernel afterwards (the sink is made only then); a bias runs along
the last axis of both shapes, which is the kernel's output channel.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np

from .. import native
from ..codegen import library as lib
from ..compat import relax, tvm
from .activations import match_hardsigmoid, match_hardswish
from .module_update import with_functions

__all__ = ["ACTIVATIONS", "BlockIndex", "CPU_ONLY_ACTIVATIONS", "FoldedChain", "SINK_RESHAPE",
           "activation_value", "block_index", "fold_chain", "fuse_epilogues", "is_f32",
           "rewrite_dataflow_blocks", "static_shape", "use_counts"]

#: Relax activation -> the kernel's ``act`` value (``clip`` takes its bounds from the call,
#: ``leaky_relu`` its slope: ``clip_LO_HI``, ``leaky_relu_A``).
ACTIVATIONS = {
    "relax.nn.relu": "relu", "relax.sigmoid": "sigmoid", "relax.tanh": "tanh",
    "relax.nn.gelu": "gelu", "relax.nn.gelu_tanh": "gelu_tanh", "relax.nn.silu": "silu",
    "relax.clip": "clip", "relax.nn.leakyrelu": "leaky_relu",
}

#: Activations the CPU kernels take and the CUDA kernels do not (``hardswish_A_B``,
#: ``hardsigmoid_A_B``: the composites of :mod:`.activations`; ``scale_A``: a product by a
#: float32 scalar constant, :func:`_scale`).
CPU_ONLY_ACTIVATIONS = ("leaky_relu", "hardswish", "hardsigmoid", "scale")

#: The composite activations: a matcher of the chain's last value, the kernel's name, and how
#: many times the chain reads its input.
_COMPOSITES = ((match_hardsigmoid, "hardsigmoid", 1), (match_hardswish, "hardswish", 2))
#: The longest composite chain (hard-swish: multiply, add, clip, multiply).
_COMPOSITE_STEPS = 4

#: Epilogue steps in the order the kernel applies them.
_ORDER = ("bias", "res", "act")


@relax.expr_functor.visitor
class _UseCounter(relax.PyExprVisitor):
    """How many times each variable is read."""

    def __init__(self):
        super().__init__()
        self.uses: Counter = Counter()

    def visit_var_(self, var):  # pylint: disable=arguments-renamed
        self.uses[var] += 1

    def visit_dataflow_var_(self, var):  # pylint: disable=arguments-renamed
        self.uses[var] += 1


def static_shape(expr) -> Optional[Tuple[int, ...]]:
    """The static shape of a tensor-typed ``expr``, else None."""
    ty = expr.ty
    if not isinstance(ty, relax.TensorType) or ty.shape is None:
        return None
    try:
        return tuple(int(s) for s in ty.shape)
    except (TypeError, ValueError):
        return None


def is_f32(expr) -> bool:
    """Whether ``expr`` is a float32 tensor."""
    return isinstance(expr.ty, relax.TensorType) and str(expr.ty.dtype) == "float32"


def _channel_axis(call: lib.LibCall, rank: int) -> int:
    """The output axis a bias runs along (NCHW convolutions and instance norms: 1, or the last
    when a convolution writes channels-last, ``dst_fmt=nhwc``, or a norm reads and writes it,
    ``fmt=nhwc``; -1, none, when either is in a blocked format; otherwise the last)."""
    fmt = None
    if call.kind in ("conv2d", "conv2d_transpose") and call.get("layout") == "NCHW":
        fmt = call.get("dst_fmt", "nchw")
    elif call.kind == "instance_norm":
        fmt = call.get("fmt", "nchw")
    if fmt is not None:
        return 1 if fmt == "nchw" else rank - 1 if fmt == "nhwc" else -1
    return rank - 1


def _guard_step_order(call: lib.LibCall, step: str) -> bool:
    """The kernel applies bias, residual, activation in that order, each once."""
    done = [k for k in _ORDER if call.get(k, "0" if k != "act" else "none") not in ("0", "none")]
    return not done or _ORDER.index(step) > max(_ORDER.index(k) for k in done)


def _bias_length(bias, out_shape: Tuple[int, ...], axis: int) -> Optional[int]:
    """The bias's length when it broadcasts along ``axis`` of the output only, else None."""
    shape = static_shape(bias)
    if shape is None or not is_f32(bias) or len(shape) > len(out_shape):
        return None
    offset = len(out_shape) - len(shape)
    for k, s in enumerate(shape):
        if s != 1 and k + offset != axis:
            return None
    if axis < offset or shape[axis - offset] != out_shape[axis]:
        return None
    return out_shape[axis]


def activation_value(value) -> Optional[str]:
    """The kernel's ``act`` value for an activation call (clip with its bounds, leaky ReLU with
    its slope), else None."""
    name = value.op.name
    act = ACTIVATIONS.get(name)
    if act == "leaky_relu":
        return f"leaky_relu_{float(value.attrs.alpha)!r}"
    if act != "clip":
        return act
    try:
        lo, hi = (float(a.value) for a in value.args[1:3])
    except (AttributeError, TypeError, ValueError):
        return None
    return f"clip_{lo!r}_{hi!r}"


def _scale(value, y) -> Optional[float]:
    """``c`` when ``value`` is ``multiply(y, c)`` or ``multiply(c, y)`` with ``c`` a float32
    constant of one element that does not widen ``y``; else None."""
    if not _is_op(value, "relax.multiply") or len(value.args) != 2:
        return None
    a, b = value.args
    other = b if a.same_as(y) else a if b.same_as(y) else None
    if other is None or other.same_as(y) or not isinstance(other, tvm.ir.expr.Constant):
        return None
    shape, out = static_shape(other), static_shape(y)
    if shape is None or out is None or not is_f32(other) or int(np.prod(shape)) != 1 \
            or len(shape) > len(out):
        return None
    c = float(other.value.numpy().reshape(()))
    return c if np.isfinite(c) else None


#: The CUDA kernels (their activations: :func:`_guard_device_has`).
_CUDA_KERNELS = (lib.CUDA_MATMUL, lib.CUDA_CONV2D)


def _guard_device_has(kernel: lib.LibCall, act: str) -> bool:
    """The kernel's device implements the activation (CUDA: not :data:`CPU_ONLY_ACTIVATIONS`)."""
    if kernel.func not in _CUDA_KERNELS:
        return True
    return not any(act.startswith(name) for name in CPU_ONLY_ACTIVATIONS)


def _fold(kernel, operands, consumer, y) -> Optional[Tuple[lib.LibCall, list, list]]:
    """The kernel with ``consumer`` folded in: ``(call, operands, bindings to emit first)``;
    None for a kernel without epilogue keys (the banded matmuls)."""
    if kernel.func not in lib.EPILOGUE_KERNELS:
        return None
    value = consumer.value
    if not isinstance(value, relax.Call) or not isinstance(value.op, tvm.ir.Op):
        return None
    out_shape = static_shape(y)
    if static_shape(consumer.var) != out_shape or not is_f32(consumer.var):
        return None
    if value.op.name in ACTIVATIONS and len(value.args) >= 1 and value.args[0].same_as(y):
        act = activation_value(value)
        if act is None or not _guard_step_order(kernel, "act"):
            return None
        if not _guard_device_has(kernel, act):
            return None
        return kernel.with_attrs(act=act), operands, []
    scale = _scale(value, y)
    if scale is not None:
        act = f"scale_{scale!r}"
        if not _guard_step_order(kernel, "act") or not _guard_device_has(kernel, act):
            return None
        if kernel.func not in _CUDA_KERNELS and not native.takes_activation(act):
            return None  # a library built before scale_A
        return kernel.with_attrs(act=act), operands, []
    if value.op.name != "relax.add" or len(value.args) != 2:
        return None
    a, b = value.args
    other = b if a.same_as(y) else a if b.same_as(y) else None
    if other is None or other.same_as(y):
        return None
    if static_shape(other) == out_shape and is_f32(other) and _guard_step_order(kernel, "res"):
        return kernel.with_attrs(res=1), operands + [other], []
    length = _bias_length(other, out_shape, _channel_axis(kernel, len(out_shape)))
    if length is None or not _guard_step_order(kernel, "bias"):
        return None
    pre = []
    if static_shape(other) != (length,):
        if isinstance(other, tvm.ir.expr.Constant):
            other = relax.const(other.value.numpy().reshape(length).astype(np.float32))
        else:
            flat = relax.DataflowVar("ollie_bias", relax.TensorType((length,), "float32"))
            pre.append(relax.VarBinding(flat, relax.op.reshape(other, (length,))))
            other = flat
    return kernel.with_attrs(bias=1), operands + [other], pre


def _composite(kernel: lib.LibCall, var, bindings: List, index: "BlockIndex",
               uses: Counter) -> Optional[Tuple[lib.LibCall, List[int]]]:
    """The kernel with a composite activation of ``var`` folded (:data:`_COMPOSITES`), and the
    positions of the chain's bindings (the last one's variable is the result); else None.

    Guards: the chain's last value is a composite of ``var`` itself, ``var`` has no reader
    outside it, every inner step has one reader, and the result has ``var``'s shape."""
    if kernel.func not in lib.EPILOGUE_KERNELS or not _guard_step_order(kernel, "act"):
        return None
    readers, position, value_of = index.readers, index.position, index.values.get
    first = readers.get(var)
    if first is None or not _is_op(bindings[first].value, "relax.multiply"):
        return None  # both composites start with y·α
    cur = var
    for _ in range(_COMPOSITE_STEPS):
        at = readers.get(cur)
        if at is None:
            return None
        cur = bindings[at].var
        for matcher, name, reads in _COMPOSITES:
            found = matcher(bindings[at].value, value_of)
            if found is None or not found[0].same_as(var) or uses[var] != reads:
                continue
            _, alpha, beta, inner = found
            if any(uses[v] != 1 or v not in position for v in inner):
                continue
            if static_shape(cur) != static_shape(var) or not is_f32(cur):
                continue
            act = f"{name}_{alpha!r}_{beta!r}"
            if not _guard_device_has(kernel, act):
                return None
            return kernel.with_attrs(act=act), sorted(position[v] for v in inner) + [at]
    return None


def _is_op(value, name: str) -> bool:
    return (isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op)
            and value.op.name == name)


def _next_fold(kernel: lib.LibCall, operands: list, var, bindings: List,
               index: "BlockIndex", uses: Counter):
    """The kernel computing ``var`` with its next consumer folded in: ``(call, operands,
    bindings to emit first, positions of the folded bindings)`` (the last position's variable
    is the call's result); None when nothing folds."""
    composite = _composite(kernel, var, bindings, index, uses)
    if composite is not None:
        return composite[0], operands, [], composite[1]
    if uses[var] != 1 or var not in index.readers:
        return None
    at = index.readers[var]
    folded = _fold(kernel, operands, bindings[at], var)
    return None if folded is None else (*folded, [at])


@dataclass
class FoldedChain:
    """A library kernel with the consumer chain of a value folded in (:func:`fold_chain`).

    ``kernel`` and ``operands`` form the folded call; ``pre`` are bindings to emit before it
    (a bias viewed as a vector); ``consumers`` are the positions of the folded consumers in the
    block (the call's result stands for the last one's variable); ``steps`` names the folded
    epilogue steps (``bias``, ``res``, the activation) in order.
    """

    kernel: lib.LibCall
    operands: list
    pre: list
    consumers: List[int]
    steps: List[str]


def fold_chain(kernel: lib.LibCall, operands: list, var, bindings: List,
               uses: Counter, index: Optional["BlockIndex"] = None) -> Optional[FoldedChain]:
    """The kernel ``kernel(operands)``, which computes ``var``, with every consumer of ``var``
    that :func:`fuse_epilogues` would fold (same guards, same order) folded in; None when the
    first consumer does not fold. ``bindings``: the dataflow block holding ``var``; ``uses``:
    reads of every variable in the function (:func:`use_counts`); ``index``: the block's
    :func:`block_index` (computed here when None; a caller folding several calls of one block
    passes it: computing it walks the whole block, which made one offer quadratic in the
    block's length). Lets the joint selection (:mod:`tvm_ollie.orchestrate.joint`) offer a
    library alternative with its epilogue."""
    index = index if index is not None else block_index(bindings)
    pre: List = []
    consumers: List[int] = []
    steps: List[str] = []
    while True:
        folded = _next_fold(kernel, operands, var, bindings, index, uses)
        if folded is None:
            break
        new_kernel, operands, more, positions = folded
        step = next(k for k in _ORDER if new_kernel.get(k) != kernel.get(k))
        steps.append(new_kernel.get("act") if step == "act" else step)
        kernel = new_kernel
        pre.extend(more)
        consumers.extend(positions)
        var = bindings[positions[-1]].var
    if not consumers:
        return None
    bb = relax.BlockBuilder()
    pre = [relax.VarBinding(p.var, bb.normalize(p.value)) for p in pre]
    return FoldedChain(kernel, operands, pre, consumers, steps)


def use_counts(func: "relax.Function") -> Counter:
    """Reads of every variable in ``func``'s body (its blocks and its result)."""
    counter = _UseCounter()
    for block in func.body.blocks:
        for binding in block.bindings:
            counter.visit_expr(binding.value)
    counter.visit_expr(func.body.body)
    return counter.uses


def rewrite_dataflow_blocks(mod: "tvm.IRModule",
                            rewrite: Callable[[List, "relax.Function"], List],
                            dataflow_only: bool = True) -> "tvm.IRModule":
    """``mod`` with the bindings of every dataflow block of every Relax function replaced by
    ``rewrite(bindings, func)`` (``func`` the function as it was before the walk); normalized
    when a block changed, ``mod`` itself when none did.

    The walk that the kernel rules share (the norm, softmax and resize kernels, the int8
    weight packs): ``rewrite`` returns the list it was given, or the same binding objects, for
    a block it leaves alone. ``dataflow_only=False`` rewrites the plain binding blocks too (a
    rewrite that replaces one call by another of the same effects, e.g. a packed weight, is
    as valid outside a dataflow block as inside one)."""
    updates = {}
    for gv, func in mod.functions_items():
        if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
            continue
        blocks, changed = [], False
        for block in func.body.blocks:
            dataflow = isinstance(block, relax.DataflowBlock)
            if dataflow or not dataflow_only:
                old = list(block.bindings)
                new = rewrite(old, func)
                if len(new) != len(old) or any(a is not b for a, b in zip(new, old)):
                    block = relax.DataflowBlock(new) if dataflow else relax.BindingBlock(new)
                    changed = True
            blocks.append(block)
        if changed:
            updates[gv] = relax.Function(func.params, relax.SeqExpr(blocks, func.body.body),
                                         func.ret_ty, func.is_pure, func.attrs)
    return with_functions(mod, updates)


@dataclass
class BlockIndex:
    """What the fold's guards look up in a dataflow block: for each variable the position of
    the first binding reading it (``readers``), the position of its binding (``position``) and
    its bound value (``values``). Valid for the bindings it was made from only."""

    readers: Dict[object, int]
    position: Dict[object, int]
    values: Dict[object, object]


def block_index(bindings: List) -> BlockIndex:
    """The :class:`BlockIndex` of a dataflow block's bindings: one walk over the block.

    One visitor serves every binding: constructing a ``PyExprVisitor`` costs about 0.1 ms
    (TVM collects its overridden methods), which per binding and per folded call made the
    library offer of YOLOX quick spend 12 s here."""
    first: Dict[object, int] = {}
    counter = _UseCounter()
    for j, binding in enumerate(bindings):
        counter.uses = Counter()
        counter.visit_expr(binding.value)
        for var in counter.uses:
            first.setdefault(var, j)
    return BlockIndex(first, {b.var: j for j, b in enumerate(bindings)},
                      {b.var: b.value for b in bindings})


def _fuse_block(bindings: List, uses: Counter, counts: Dict[str, int]) -> Tuple[List, bool]:
    """One pass over a dataflow block's bindings (each binding folded at most once); whether
    anything was folded."""
    out: List = list(bindings)
    index = block_index(bindings)
    changed = False
    for k, binding in enumerate(bindings):
        found = lib.lib_call_of(binding.value)
        if found is None or out[k] is not binding:
            continue
        kernel, operands = found
        folded = _next_fold(kernel, operands, binding.var, bindings, index, uses)
        if folded is None:
            continue
        # the guards keep bias before residual, so appended operands are in the kernel's order
        new_kernel, new_operands, pre, positions = folded
        if any(out[p] is not bindings[p] for p in positions):
            continue  # already folded in this pass
        at = positions[-1]
        call = lib.emit_call(new_kernel, new_operands, static_shape(binding.var))
        bb = relax.BlockBuilder()
        pre = [relax.VarBinding(p.var, bb.normalize(p.value)) for p in pre]
        out[k] = None
        for p in positions[:-1]:
            out[p] = None
        out[at] = pre + [relax.VarBinding(bindings[at].var, bb.normalize(call))]
        counts[kernel.kind] = counts.get(kernel.kind, 0) + 1
        changed = True
    return _flatten_slots(out), changed


def _flatten_slots(out: List) -> List:
    """The bindings of a block rewritten slot by slot: a slot holds its binding, a list of
    bindings that replace it, or None when it was folded away."""
    flat: List = []
    for item in out:
        if item is not None:
            flat.extend(item if isinstance(item, list) else [item])
    return flat


#: The rule that sinks a reshape below an epilogue step (module docstring), by name with its
#: equation: ``step(reshape(y, S2), other) = reshape(step(y, view(other, S1)), S2)`` for an
#: elementwise ``step`` (an activation, a product by a scalar constant, the ``add`` of a
#: residual or of a last-axis bias).
SINK_RESHAPE = ("sink_reshape_below_epilogue",
                "step(reshape(y, S2), o) = reshape(step(y, view(o, S1)), S2)")


def _viewed(expr, shape: Tuple[int, ...]) -> Tuple[object, list]:
    """``expr`` in ``shape`` (same elements, row-major): itself, a reshaped constant, or a new
    variable with its reshape binding to emit first."""
    if static_shape(expr) == tuple(shape):
        return expr, []
    if isinstance(expr, tvm.ir.expr.Constant):
        return relax.const(expr.value.numpy().reshape(shape).astype(np.float32)), []
    var = relax.DataflowVar("ollie_view", relax.TensorType(tuple(shape), "float32"))
    return var, [relax.VarBinding(var, relax.BlockBuilder().normalize(
        relax.op.reshape(expr, shape)))]


def _sunk_step(kernel: lib.LibCall, value, r, y, s1: Tuple[int, ...], s2: Tuple[int, ...]
               ) -> Optional[Tuple[object, list]]:
    """The consumer ``value`` of ``r = reshape(y, S2)`` rewritten on ``y`` (:data:`SINK_RESHAPE`)
    and the bindings to emit before it; None when it is not an elementwise epilogue step."""
    if not isinstance(value, relax.Call) or not isinstance(value.op, tvm.ir.Op):
        return None
    name = value.op.name
    if name in ACTIVATIONS:
        if not value.args or not value.args[0].same_as(r) or \
                any(a.same_as(r) for a in value.args[1:]):
            return None
        return relax.Call(value.op, [y] + list(value.args[1:]), value.attrs), []
    if _scale(value, r) is not None:
        a, b = value.args
        return relax.op.multiply(*([y, b] if a.same_as(r) else [a, y])), []
    if name != "relax.add" or len(value.args) != 2:
        return None
    a, b = value.args
    other = b if a.same_as(r) else a if b.same_as(r) else None
    if other is None or other.same_as(r) or not is_f32(other):
        return None
    if static_shape(other) == s2:  # a residual, viewed in the kernel's shape
        other, pre = _viewed(other, s1)
    else:  # a bias: along the last axis of both shapes, the kernel's channel axis
        if _channel_axis(kernel, len(s1)) != len(s1) - 1 or s1[-1] != s2[-1]:
            return None
        length = _bias_length(other, s2, len(s2) - 1)
        if length is None:
            return None
        other, pre = _viewed(other, (length,))
    return relax.op.add(*([y, other] if a.same_as(r) else [other, y])), pre


def _sink_one(kernel: lib.LibCall, operands: list, y, bindings: List, index: "BlockIndex",
              uses: Counter) -> Optional[Tuple[int, int, list]]:
    """For the kernel computing ``y``: ``(position of the reshape, position of its consumer,
    the consumer's new bindings)`` when :data:`SINK_RESHAPE` applies and the moved consumer
    then folds into the kernel; else None."""
    if kernel.func not in lib.EPILOGUE_KERNELS or uses[y] != 1 or y not in index.readers:
        return None
    j = index.readers[y]
    reshape = bindings[j]
    if not _is_op(reshape.value, "relax.reshape") or not reshape.value.args[0].same_as(y):
        return None
    r = reshape.var
    if uses[r] != 1 or r not in index.readers:
        return None
    m = index.readers[r]
    s1, s2 = static_shape(y), static_shape(r)
    if s1 is None or s2 is None or not is_f32(y) or static_shape(bindings[m].var) != s2:
        return None
    moved = _sunk_step(kernel, bindings[m].value, r, y, s1, s2)
    if moved is None:
        return None
    value, pre = moved
    bb = relax.BlockBuilder()
    z0 = relax.DataflowVar("ollie_epilogue", relax.TensorType(s1, "float32"))
    step = relax.VarBinding(z0, bb.normalize(value))
    if _fold(kernel, operands, step, y) is None:
        return None
    tail = relax.VarBinding(bindings[m].var,
                            bb.normalize(relax.op.reshape(z0, reshape.value.args[1])))
    return j, m, pre + [step, tail]


def _sink_reshapes(bindings: List, uses: Counter) -> Tuple[List, bool]:
    """One pass of :data:`SINK_RESHAPE` over a dataflow block's library calls; whether any
    reshape was sunk."""
    out: List = list(bindings)
    index = block_index(bindings)
    changed = False
    for binding in bindings:
        found = lib.lib_call_of(binding.value)
        if found is None:
            continue
        sunk = _sink_one(found[0], found[1], binding.var, bindings, index, uses)
        if sunk is None:
            continue
        j, m, new = sunk
        if out[j] is not bindings[j] or out[m] is not bindings[m]:
            continue
        out[j] = None
        out[m] = new
        changed = True
    return _flatten_slots(out), changed


def _fuse_function(func: "relax.Function", counts: Dict[str, int]) -> "relax.Function":
    body = func.body
    if not isinstance(body, relax.SeqExpr):
        return func
    blocks = list(body.blocks)
    changed_any = False
    for bi, block in enumerate(blocks):
        if not isinstance(block, relax.DataflowBlock):
            continue
        bindings = list(block.bindings)
        while True:
            bindings, sunk = _sink_reshapes(bindings, _uses_of(bindings, blocks, bi, body))
            bindings, changed = _fuse_block(bindings, _uses_of(bindings, blocks, bi, body),
                                            counts)
            changed_any = changed_any or sunk or changed
            if not changed:
                break
        blocks[bi] = relax.DataflowBlock(bindings)
    if not changed_any:
        return func
    return relax.Function(func.params, relax.SeqExpr(blocks, body.body), func.ret_ty,
                          func.is_pure, func.attrs)


def _uses_of(bindings, blocks, bi, body) -> Counter:
    """Reads of every variable in the function (the block ``bi`` as ``bindings``)."""
    counter = _UseCounter()
    for j, block in enumerate(blocks):
        for b in (bindings if j == bi else block.bindings):
            counter.visit_expr(b.value)
    counter.visit_expr(body.body)
    return counter.uses


def fuse_epilogues(mod: "tvm.IRModule") -> Tuple["tvm.IRModule", Dict[str, int]]:
    """``mod`` with every foldable bias/residual/activation folded into its native kernel call;
    and how many were folded per kernel kind."""
    counts: Dict[str, int] = {}
    updates = {}
    for gv, func in mod.functions_items():
        if isinstance(func, relax.Function):
            new = _fuse_function(func, counts)
            if not new.same_as(func):
                updates[gv] = new
    return with_functions(mod, updates), counts
