"""Layout permutations around a library convolution absorbed into its memory formats.

Transformer-style models keep activations as tokens ``[.., H*W, C]`` and view them as an image
only for a convolution: SegFormer's Mix-FFN computes ``gelu(tokens(conv(image(t)) + b))`` with
``image(t) = reshape(permute(reshape(t, [N, H*W, C]), [0, 2, 1]), [N, C, H, W])`` and
``tokens`` its inverse. A region (:mod:`.regions`) holds the whole chain, and TVM builds it as
transposes around the convolution. But the tokens *are* the channels-last image ``[N, H, W, C]``
in memory, and the library's convolution reads and writes channels-last directly
(``src_fmt=nhwc``/``dst_fmt=nhwc``, docs/layouts.md): the transposes become the kernel's memory
format, as ONNX Runtime's layout transformer and oneDNN's graph API make them. One rule,
:func:`absorbed_conv` (``conv_layout_absorb``)::

    act(Q(conv(P(t), w) + b))  =  view_S(K[src=F_in, dst=F_out, bias, act](view_in(t), w, vec(b)))

* ``P`` is a chain of row-major views and permutations (reshape, expand_dims, squeeze, flatten,
  permute_dims) from a value ``t`` to the convolution's NCHW data ``x`` with
  ``x[n, c, h, w] = flat(t)[off_F(n, c, h, w)]`` for a format ``F`` the kernel reads:
  ``off_nchw = ((n*C + c)*H + h)*W + w`` or ``off_nhwc = ((n*H + h)*W + w)*C + c``; then
  ``view_in(t)`` is ``t`` reshaped (no copy) to ``[N, C, H, W]`` or ``[N, H, W, C]``. When no
  format fits, the chain is computed as before and the kernel reads ``x`` as NCHW;
* after the convolution, the region's single chain of consumers is, in any interleaving,
  such views and permutations, at most one ``add`` of a bias ``b`` that broadcasts along the
  output channel (in the layout where it is added) and then at most one activation the kernel
  applies (:data:`~.epilogue.ACTIVATIONS`); elementwise steps commute with the permutations, so
  they become the kernel's epilogue ``act(. + b)``;
* the region's result ``r`` (shape ``S``) satisfies ``flat(r)[i] = flat_F(y)[i]`` for the
  convolution's output ``y`` in a format ``F`` the kernel writes (nchw or nhwc), so ``r`` is
  the kernel's output viewed as ``S``. Where the chain meets a consumer that does not fold
  (a layer norm, a slice, a residual), the call computes the last value before it whose
  positions spell a format, and the remaining consumers run on that view as they were.

Which positions reach which is found by evaluating the chains on index tensors (``arange``
through the same reshapes and permutations, exact: a permutation of distinct integers), so the
rule holds for any N, H, W, C, any order of views and any conv the kernel computes (stride,
padding, dilation, groups); it folds nothing else (a slice, a pad, a second bias, a residual,
an add after the activation) and returns None when it absorbs nothing at all. The result is one more alternative of the
region (``original [native]``, :mod:`.alternatives`), checked against TVM's build of the
region and timed against the others like every alternative.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..codegen import library as lib
from ..compat import relax, tvm
from .epilogue import ACTIVATIONS, activation_value

__all__ = ["AbsorbedConv", "FORMAT_ORDER", "VIEW_OPS", "absorbed_conv", "format_of",
           "read_format"]

#: The activation formats the conv kernel reads and writes (``src_fmt``/``dst_fmt``) as the
#: axis order of the NCHW tensor they store in row-major order.
FORMAT_ORDER: Dict[str, Tuple[int, int, int, int]] = {"nchw": (0, 1, 2, 3),
                                                      "nhwc": (0, 2, 3, 1)}

#: Relax operators that only view or permute a tensor, as the numpy function that does the
#: same to an index tensor: ``f(ids, call) -> ids``.
VIEW_OPS = {
    "relax.reshape": lambda a, call: a.reshape(_shape(call)),
    "relax.expand_dims": lambda a, call: a.reshape(_shape(call)),
    "relax.squeeze": lambda a, call: a.reshape(_shape(call)),
    "relax.flatten": lambda a, call: a.reshape(_shape(call)),
    "relax.permute_dims": lambda a, call: np.transpose(a, _axes(call, a.ndim)),
}

_CONST = tvm.ir.expr.Constant


def _shape(expr) -> Tuple[int, ...]:
    return tuple(int(s) for s in expr.ty.shape)


def _axes(call, ndim: int) -> Optional[Sequence[int]]:
    axes = call.attrs.axes
    return None if axes is None else [int(a) % ndim for a in axes]


def _op(value) -> str:
    if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op):
        return value.op.name
    return ""


def _f32(expr) -> bool:
    ty = expr.ty
    return isinstance(ty, relax.TensorType) and str(ty.dtype) == "float32" and \
        ty.shape is not None


def format_of(ids: np.ndarray, nchw_shape: Sequence[int]) -> Optional[str]:
    """The format ``F`` of :data:`FORMAT_ORDER` in which a tensor lists the elements of an
    NCHW tensor of ``nchw_shape``, given ``ids`` (its elements' flat NCHW positions):
    ``flat(ids) = flat(permute(arange(NCHW), order_F))``; None if none (a result's view)."""
    base = np.arange(int(np.prod(nchw_shape))).reshape(tuple(nchw_shape))
    flat = ids.reshape(-1)
    for name, order in FORMAT_ORDER.items():
        if flat.size == base.size and \
                np.array_equal(flat, np.transpose(base, order).reshape(-1)):
            return name
    return None


def read_format(ids: np.ndarray) -> Optional[str]:
    """The format ``F`` in which an NCHW tensor is stored in a source tensor, given ``ids``
    (shape NCHW: each element's flat position in the source): ``flat(permute(ids, order_F))
    = arange``; None if none (a data operand's view)."""
    for name, order in FORMAT_ORDER.items():
        if np.array_equal(np.transpose(ids, order).reshape(-1), np.arange(ids.size)):
            return name
    return None


def _formatted(shape: Sequence[int], fmt: str) -> Tuple[int, ...]:
    """The 4-D shape of an NCHW ``shape`` stored in format ``fmt``."""
    return tuple(int(shape[k]) for k in FORMAT_ORDER[fmt])


@dataclass
class AbsorbedConv:
    """The region as one library convolution call (see the module docstring).

    ``source`` is the value the kernel reads (``t``, or the conv's own data when no view
    chain fits), ``src_fmt``/``dst_fmt`` the formats, ``bias`` the bias operand as the region
    reads it (None: none), ``absorbed`` the region bindings the call computes (the others, e.g.
    the weight's producers or consumers it does not fold, are emitted around it as they
    were)."""

    kernel: lib.LibCall
    source: object
    src_fmt: str
    dst_fmt: str
    weight: object
    bias: Optional[object]
    in_shape: Tuple[int, int, int, int]
    out_shape: Tuple[int, int, int, int]
    result_shape: Tuple[int, ...]
    absorbed: frozenset
    #: the region value the call computes (the result, or the last value the consumer chain
    #: folds up to: the consumers after it are emitted on the call's result as they were)
    computes: object = None

    @property
    def absorbs_layout(self) -> bool:
        """Whether a transpose was absorbed (a format other than nchw on either side)."""
        return self.src_fmt != "nchw" or self.dst_fmt != "nchw"

    def emit(self, bb: "relax.BlockBuilder", bindings: Sequence, env: Dict[int, object]):
        """Emit the region's ``bindings`` on the values ``env`` maps (by hash of the region's
        values): the call in place of the bindings it absorbs, the others as they were (the
        weight's producers before it, the consumers it does not fold after it, on its result
        viewed as :attr:`computes`); return the last value (not bound)."""
        env = dict(env)
        pending = None  # (key, expression) of the last binding, bound once another follows
        for b in bindings:
            if pending is not None:
                env[pending[0]] = bb.emit(pending[1])
                pending = None
            if hash(b.var) in self.absorbed:
                if b.var.same_as(self.computes):
                    pending = (hash(b.var),
                               relax.op.reshape(self._call(bb, env), self.result_shape))
                continue
            call = b.value
            pending = (hash(b.var), relax.Call(call.op, [_rebind(a, env) for a in call.args],
                                               call.attrs, call.ty_args))
        return pending[1]

    def _call(self, bb: "relax.BlockBuilder", env: Dict[int, object]):
        """The bound kernel call on the values of ``env``."""
        data = bb.emit(relax.op.reshape(_rebind(self.source, env), self.in_shape))
        operands = [data, _rebind(self.weight, env)]
        if self.bias is not None:
            operands.append(_bias_vector(bb, _rebind(self.bias, env), self.out_channels))
        return bb.emit(lib.emit_call(self.kernel, operands, self.out_shape))

    @property
    def out_channels(self) -> int:
        return self.out_shape[FORMAT_ORDER[self.dst_fmt].index(1)]


def _rebind(arg, env: Dict[int, object]):
    if isinstance(arg, relax.Tuple):
        return relax.Tuple([_rebind(f, env) for f in arg.fields])
    return env.get(hash(arg), arg)


def _bias_vector(bb, bias, length: int):
    """``bias`` as the kernel's ``[length]`` vector (a constant reshaped now, else a view)."""
    if _shape(bias) == (length,):
        return bias
    if isinstance(bias, _CONST):
        return relax.const(bias.value.numpy().reshape(length).astype(np.float32))
    return bb.emit(relax.op.reshape(bias, (length,)))


def _source_chain(conv, members: Dict[int, object], readers: Dict[int, int]) -> List[object]:
    """The member view bindings the conv's data is computed by, each read once (by the next
    one or the conv), nearest the source first."""
    chain, value = [], conv.args[0]
    while hash(value) in members and readers.get(hash(value), 0) == 1:
        b = members[hash(value)]
        if _op(b.value) not in VIEW_OPS or not _f32(b.value.args[0]):
            break
        chain.append(b)
        value = b.value.args[0]
    return chain[::-1]


def _source(conv, members, readers) -> Tuple[object, str, List[object]]:
    """``(t, format, absorbed bindings)``: the longest view chain whose positions spell a
    format, else the conv's data itself read as NCHW."""
    x_shape = _shape(conv.args[0])
    chain = _source_chain(conv, members, readers)
    for start in range(len(chain)):
        src = chain[start].value.args[0]
        ids = np.arange(int(np.prod(_shape(src)))).reshape(_shape(src))
        for b in chain[start:]:
            ids = VIEW_OPS[_op(b.value)](ids, b.value)
        fmt = read_format(ids) if ids.shape == x_shape else None
        if fmt is not None:
            return src, fmt, chain[start:]
    return conv.args[0], "nchw", []


@dataclass
class _Epilogue:
    """The consumer chain's state: positions (flat NCHW indices of the conv's output) of the
    current value, the bias and the activation found so far."""

    ids: np.ndarray
    channels: np.ndarray
    bias: Optional[object] = None
    act: Optional[str] = None


def _bias_of(value, cur, state: _Epilogue, members) -> Optional[object]:
    """The operand of ``add(cur, b)`` when ``b`` broadcasts along the output channel:
    ``broadcast(arange(F) viewed as b) == channel(position)`` element by element."""
    a, b = value.args
    other = b if a.same_as(cur) else a if b.same_as(cur) else None
    if other is None or other.same_as(cur) or hash(other) in members or not _f32(other):
        return None
    if _shape(value) != state.ids.shape:
        return None
    length = int(state.channels.max()) + 1
    shape = _shape(other)
    if int(np.prod(shape)) != length:
        return None
    try:
        spread = np.broadcast_to(np.arange(length).reshape(shape), state.ids.shape)
    except ValueError:
        return None
    return other if np.array_equal(spread, state.channels) else None


def _step(b, cur, state: _Epilogue, members) -> bool:
    """Fold consumer binding ``b`` of ``cur`` into ``state``; False when it does not fold."""
    value, name = b.value, _op(b.value)
    if name in VIEW_OPS:
        state.ids = VIEW_OPS[name](state.ids, value)
        state.channels = VIEW_OPS[name](state.channels, value)
        return True
    if name == "relax.add" and state.bias is None and state.act is None:
        state.bias = _bias_of(value, cur, state, members)
        return state.bias is not None
    if name in ACTIVATIONS and state.act is None and value.args[0].same_as(cur) and \
            _shape(value) == state.ids.shape:
        state.act = activation_value(value)
        return state.act is not None
    return False


def absorbed_conv(bindings: Sequence, heavy) -> Optional[AbsorbedConv]:
    """The region of ``bindings`` (block order, the last computes the result) around the
    convolution bound to ``heavy`` as one library call (:class:`AbsorbedConv`), or None when
    the rule does not apply (module docstring; CPU kernels only: the CUDA conv has no
    formats)."""
    members = {hash(b.var): b for b in bindings}
    conv_binding = members.get(hash(heavy))
    if conv_binding is None or _op(conv_binding.value) != "relax.nn.conv2d" or \
            lib.current_device() != "cpu":
        return None
    conv = conv_binding.value
    kernel = lib.call_form(conv)
    if kernel is None or kernel.func != lib.CONV2D or kernel.get("layout") != "NCHW" or \
            len(conv.args) < 2 or not _f32(conv.args[1]):
        return None
    readers: Dict[int, int] = {}
    for b in bindings:
        for v in {hash(a) for a in _tensor_args(b.value)}:
            readers[v] = readers.get(v, 0) + 1
    source, src_fmt, pre = _source(conv, members, readers)
    y_shape = _shape(conv)
    ids = np.arange(int(np.prod(y_shape))).reshape(y_shape)
    state = _Epilogue(ids, np.broadcast_to(
        np.arange(y_shape[1]).reshape(1, -1, 1, 1), y_shape).copy())
    order = list(bindings)
    at = next(k for k, b in enumerate(order) if b.var.same_as(heavy))
    end, dst_fmt, final = _last_stop(order, at, state, members, y_shape)
    if end == at and not pre:
        return None  # nothing to absorb: the region as it was
    kernel = _with_formats(kernel, src_fmt, dst_fmt, final)
    absorbed = {hash(b.var) for b in pre} | {hash(b.var) for b in order[at:end + 1]}
    return AbsorbedConv(kernel, source, src_fmt, dst_fmt, conv.args[1], final.bias,
                        _formatted(_shape(conv.args[0]), src_fmt),
                        _formatted(y_shape, dst_fmt), _shape(order[end].var),
                        frozenset(absorbed), order[end].var)


def _last_stop(order: List, at: int, state: _Epilogue, members,
               y_shape) -> Tuple[int, str, _Epilogue]:
    """The last consumer (position in ``order``) up to which the chain folds and whose
    positions spell a format: ``(position, format, state there)``; the conv itself (``at``,
    NCHW, nothing folded) when no consumer does."""
    stops = [(at, "nchw", replace(state))]
    cur = order[at].var
    for k in range(at + 1, len(order)):
        b = order[k]
        if not any(v.same_as(cur) for v in _tensor_args(b.value)) or \
                not _step(b, cur, state, members):
            break
        cur = b.var
        fmt = format_of(state.ids, y_shape)
        if fmt is not None:
            stops.append((k, fmt, replace(state)))
    return stops[-1]


def _tensor_args(value) -> List[object]:
    return [a for a in getattr(value, "args", []) if isinstance(a, relax.Expr)]


def _with_formats(kernel: lib.LibCall, src_fmt: str, dst_fmt: str,
                  state: _Epilogue) -> lib.LibCall:
    """The kernel with its formats (only where not NCHW) and epilogue keys."""
    updates: Dict[str, str] = {}
    if src_fmt != "nchw":
        updates["src_fmt"] = src_fmt
    if dst_fmt != "nchw":
        updates["dst_fmt"] = dst_fmt
    if state.bias is not None:
        updates["bias"] = "1"
    if state.act is not None:
        updates["act"] = state.act
    return kernel.with_attrs(**updates) if updates else kernel
