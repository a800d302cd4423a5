"""Resizes, the concatenation they feed and the layout transform after it as one native call.

TVM fuses the bilinear resizes that feed a concatenation, the concatenation and the layout
transform that a channels-last convolution chain puts after it into one untuned kernel, which
recomputes the taps' index arithmetic per element: at paper-size Segformer its decode head's
kernel took 73.4 ms against ONNX Runtime's 4 ``Resize`` + ``Concat`` 17.0 ms
(docs/benchmarks.md). The native kernel (``tvm_ollie.cpu.resize2d``, ``tvm_ollie/resize.cc``)
writes each resized operand into its channel slice of one output, in either format. Rules, by
name with their equations (``K`` the kernel, ``R`` an accepted ``image.resize2d``, ``T`` the
transform between NCHW and NHWC, ``V`` a view of a channels-last tensor as NCHW)::

    resize_concat:  concat(R(x_1), y, .., R(x_k), axis = C)
                        = K[copy = 0, 1, .., 0](x_1, y, .., x_k)
    resize_alone:   R(x) = K(x)
    resize_exit:    T(K(..)) = K[dst = T's format](..)
    resize_view:    K(.., V(t), ..) = K[src = .., nhwc, ..](.., t, ..)

``C`` is the channel axis of the resizes' layout (1 in NCHW, 3 in NHWC). A ``V`` is a
``permute_dims`` or ``layout_transform`` from the other format, or what the PyTorch importer
writes for ``x.permute(0, 2, 1).reshape(n, c, h, w)`` of tokens ``[N, H*W, C]`` (a reshape of a
transpose: the tokens are the channels-last tensor, viewed ``[N, H, W, C]``); it is read through
only when its format is the output's, so the kernel's operands and output share their
contiguous axis.

Guards: an accepted resize is float32, 4-D, static shapes, layout NCHW or NHWC, method
``linear`` or ``nearest_neighbor``, coordinate mode ``half_pixel``, ``pytorch_half_pixel``,
``align_corners`` (output at least 2x2), ``asymmetric`` or ``tf_half_pixel_for_nn``, any rounding
(``""`` resolved as TVM resolves it), no other output dtype; a concatenation folds the resizes
read by it alone that share the first one's attributes, its other operands are copied (they have
the output's spatial size), and at least one resize; the transform (``T``) is folded when it is
the only reader. Anything else (bicubic, ``tf_crop_and_resize``, dynamic shapes, float16) keeps
TVM's kernel. Exact up to rounding: the kernel evaluates TVM's formulas in float32
(``tests/native/test_native_resize.py`` checks every accepted mode against TVM's build); a tap
of weight 0 is not read. Run after the layout step (its transforms are what ``resize_exit``
folds), on CPU targets with the library.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Set, Tuple

from .. import native
from ..codegen import library as lib
from ..compat import relax, tvm
from .epilogue import block_index, is_f32, rewrite_dataflow_blocks, static_shape, use_counts

__all__ = ["RESIZE_ALONE", "RESIZE_CONCAT", "RESIZE_EXIT", "RESIZE_VIEW", "resize_kernels",
           "resize_spec"]

#: The rules, by name with their equation (module docstring).
RESIZE_CONCAT = ("resize_concat", "concat(R(x_1), y, .., R(x_k), axis=C) = K[copy](x_1, y, ..)")
RESIZE_ALONE = ("resize_alone", "R(x) = K(x)")
RESIZE_EXIT = ("resize_exit", "T(K(..)) = K[dst = T's format](..)")
RESIZE_VIEW = ("resize_view", "K(.., V(t), ..) = K[src = .., nhwc, ..](.., t, ..)")

_COORDS = ("half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric",
           "tf_half_pixel_for_nn")
_ROUNDS = ("round", "floor", "ceil", "round_prefer_floor", "round_prefer_ceil")
#: The format each layout stores, and the other one.
_FORMAT = {"NCHW": "nchw", "NHWC": "nhwc"}
_OTHER = {"nchw": "nhwc", "nhwc": "nchw"}
#: ``permute_dims`` axes (and a layout transform's image of (0, 1, 2, 3)) that turn a tensor
#: stored in the key's format into the other one.
_TO_OTHER = {"nchw": (0, 2, 3, 1), "nhwc": (0, 3, 1, 2)}


def _is_op(value, name: str) -> bool:
    return (isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op)
            and value.op.name == name)


def resize_spec(value) -> Optional[Tuple[Tuple[str, str], ...]]:
    """The kernel's resize attributes (``method``, ``coord``, ``round``) when ``value`` is an
    ``image.resize2d`` the kernel computes exactly (module docstring), else None."""
    if not _is_op(value, "relax.image.resize2d"):
        return None
    at = value.attrs
    x = value.args[0]
    shape, out = static_shape(x), static_shape(value)
    layout = str(at.layout)
    if shape is None or out is None or len(shape) != 4 or not is_f32(x) or not is_f32(value) \
            or layout not in _FORMAT:
        return None
    if at.out_dtype is not None and str(at.out_dtype) not in ("", "None", "void", "float32"):
        return None
    method, coord, rounding = str(at.method), str(at.coordinate_transformation_mode), \
        str(at.rounding_method)
    h, w = (1, 2) if layout == "NHWC" else (2, 3)
    if method not in ("linear", "nearest_neighbor") or coord not in _COORDS \
            or 0 in (shape[h], shape[w]):
        return None
    if coord == "align_corners" and min(out[h], out[w]) < 2:
        return None
    if method == "linear":
        return (("method", "linear"), ("coord", coord))
    if rounding == "":
        rounding = "round" if coord == "align_corners" else "floor"
    if rounding not in _ROUNDS:
        return None
    return (("method", "nearest"), ("coord", coord), ("round", rounding))


def _spatial(shape: Tuple[int, ...], fmt: str) -> Tuple[int, int]:
    return (shape[1], shape[2]) if fmt == "nhwc" else (shape[2], shape[3])


@dataclass
class _Site:
    """One kernel call to emit: it replaces the binding of ``var`` and removes ``removed``."""

    var: object
    spec: Tuple[Tuple[str, str], ...]
    operands: List[object]
    formats: List[str]
    copies: List[bool]
    dst: str
    removed: List[object]
    rules: List[str]
    views: List[object] = field(default_factory=list)  # new bindings before the call
    passed: List[object] = field(default_factory=list)  # the view variables read through

    def call(self) -> "relax.Call":
        attrs = list(self.spec)
        if any(f != "nchw" for f in self.formats):
            attrs.append(("src", ",".join(self.formats)))
        if any(self.copies):
            attrs.append(("copy", ",".join("1" if c else "0" for c in self.copies)))
        if self.dst != "nchw":
            attrs.append(("dst", self.dst))
        return lib.emit_call(lib.LibCall(lib.RESIZE2D, tuple(attrs)), self.operands,
                             static_shape(self.var))


def _transform_to(value, fmt: str) -> Optional[object]:
    """The tensor ``value`` stores in ``_OTHER[fmt]`` format when ``value`` is its
    ``permute_dims`` or ``layout_transform`` into ``fmt``; else None."""
    axes = _TO_OTHER[_OTHER[fmt]]
    if _is_op(value, "relax.permute_dims"):
        got = value.attrs.axes
        return value.args[0] if got is not None and tuple(int(a) for a in got) == axes else None
    if _is_op(value, "relax.layout_transform") and value.attrs.pad_value is None:
        index_map = value.attrs.index_map
        if len(index_map.initial_indices) != 4 or len(index_map.final_indices) != 4:
            return None
        image = index_map.map_indices([tvm.tirx.IntImm("int64", i) for i in range(4)])
        return value.args[0] if all(isinstance(i, tvm.tirx.IntImm) for i in image) \
            and tuple(int(i) for i in image) == axes else None
    return None


@dataclass
class _Block:
    """What the rules look up in a dataflow block: its bindings, their index and the reads of
    every variable in the function."""

    bindings: List[object]
    index: object
    uses: Counter

    @property
    def values(self) -> Dict[object, object]:
        return self.index.values


def _exit(var, block: _Block, fmt: str) -> Optional[object]:
    """The binding that transforms ``var`` (stored in ``fmt``) into the other format when it is
    ``var``'s only reader; else None."""
    if block.uses[var] != 1 or var not in block.index.readers:
        return None
    reader = block.bindings[block.index.readers[var]]
    value = reader.value
    if _transform_to(value, _OTHER[fmt]) is None or not value.args[0].same_as(var):
        return None
    return reader


def _view(x, values, want: str) -> Optional[Tuple[object, List[object], List[object]]]:
    """``(t, new bindings, variables passed)`` when ``x`` (stored in the other format than
    ``want``) is a view of a tensor ``t`` stored in ``want`` (module docstring's ``V``); else
    None."""
    value = values.get(x)
    if value is None:
        return None
    source = _transform_to(value, _OTHER[want])
    if source is not None:
        return source, [], [x]
    # reshape(permute_dims(u, [0, 2, 1]), 4-D) with u = [N, H*W, C] (want nhwc) or [N, C, H*W]
    if not _is_op(value, "relax.reshape"):
        return None
    inner = values.get(value.args[0])
    shape = static_shape(x)
    if inner is None or shape is None or not _is_op(inner, "relax.permute_dims") \
            or inner.attrs.axes is None or tuple(int(a) for a in inner.attrs.axes) != (0, 2, 1):
        return None
    u = inner.args[0]
    ushape = static_shape(u)
    if want == "nhwc":  # x is [N, C, H, W]
        n, c, h, w = shape
        stored, expect = (n, h, w, c), (n, h * w, c)
    else:  # x is [N, H, W, C]
        n, h, w, c = shape
        stored, expect = (n, c, h, w), (n, c, h * w)
    if ushape != expect:
        return None
    view = relax.DataflowVar("ollie_resize_view", relax.TensorType(stored, "float32"))
    return view, [relax.VarBinding(view, relax.op.reshape(u, stored))], [x, value.args[0]]


def _finish(site: _Site, block: _Block, fmt: str) -> _Site:
    """``site`` with its exit transform folded and its operands read through views, in
    ``fmt`` (the resizes' format)."""
    reader = _exit(site.var, block, fmt)
    if reader is not None:
        site.removed.append(site.var)
        site.var, site.dst = reader.var, _OTHER[fmt]
        site.rules.append(RESIZE_EXIT[0])
    for i, x in enumerate(site.operands):
        if site.formats[i] == site.dst:
            continue
        found = _view(x, block.values, site.dst)
        if found is not None:
            site.operands[i], site.formats[i] = found[0], site.dst
            site.views.extend(found[1])
            site.passed.extend(found[2])
            site.rules.append(RESIZE_VIEW[0])
    return site


def _concat_site(binding, block: _Block) -> Optional[_Site]:
    """:data:`RESIZE_CONCAT` at ``binding``."""
    values, uses = block.values, block.uses
    value = binding.value
    if not _is_op(value, "relax.concat") or value.attrs.axis is None:
        return None
    fields = value.args[0]
    fields = values.get(fields, fields)
    out = static_shape(binding.var)
    if not isinstance(fields, relax.Tuple) or out is None or len(out) != 4 \
            or not is_f32(binding.var):
        return None
    axis = int(value.attrs.axis) % 4
    if axis not in (1, 3):
        return None
    fmt = "nchw" if axis == 1 else "nhwc"
    layout = "NCHW" if axis == 1 else "NHWC"
    spec, resized = None, []
    for f in fields.fields:
        r = values.get(f)
        s = resize_spec(r) if r is not None else None
        if s is None or str(r.attrs.layout) != layout or uses[f] != 1:
            continue
        spec = spec or s
        if s == spec:
            resized.append(f)
    if spec is None:
        return None
    operands, copies = [], []
    for f in fields.fields:
        shape = static_shape(f)
        if f in resized:
            operands.append(values[f].args[0])
            copies.append(False)
        elif shape is not None and len(shape) == 4 and is_f32(f) \
                and _spatial(shape, fmt) == _spatial(out, fmt):
            operands.append(f)
            copies.append(True)
        else:
            return None
    site = _Site(binding.var, spec, operands, [fmt] * len(operands), copies, fmt, list(resized),
                 [RESIZE_CONCAT[0]])
    return _finish(site, block, fmt)


def _alone_site(binding, block: _Block) -> Optional[_Site]:
    """:data:`RESIZE_ALONE` at ``binding``."""
    spec = resize_spec(binding.value)
    if spec is None:
        return None
    fmt = _FORMAT[str(binding.value.attrs.layout)]
    site = _Site(binding.var, spec, [binding.value.args[0]], [fmt], [False], fmt, [],
                 [RESIZE_ALONE[0]])
    return _finish(site, block, fmt)


def _rewrite_block(bindings: List, uses: Counter, counts: Dict[str, int],
                   views: Set[object]) -> List:
    """The block with its resize sites as kernel calls (concatenations first, then the resizes
    that none took); the views they read through are added to ``views``."""
    block = _Block(bindings, block_index(bindings), uses)
    sites: List[_Site] = []
    taken: Set[object] = set()
    for finder in (_concat_site, _alone_site):
        for binding in bindings:
            if binding.var in taken:
                continue
            site = finder(binding, block)
            if site is None or taken & set([site.var] + site.removed):
                continue
            sites.append(site)
            taken.update([site.var] + site.removed)
    if not sites:
        return bindings
    at = {site.var: site for site in sites}
    removed = {v for site in sites for v in site.removed}
    out: List = []
    for binding in bindings:
        if binding.var in removed:
            continue
        site = at.get(binding.var)
        if site is None:
            out.append(binding)
            continue
        out.extend(site.views)
        out.append(relax.VarBinding(binding.var, relax.BlockBuilder().normalize(site.call())))
        for rule in site.rules:
            counts[rule] = counts.get(rule, 0) + 1
        views.update(site.passed)
    return out


def _drop_dead(bindings: List, func, candidates: Set[object]) -> List:
    """``bindings`` without the ``candidates`` (the views read through, in their first form)
    that nothing reads any more."""
    uses = use_counts(func)
    return [b for b in bindings if not (b.var in candidates and uses[b.var] == 0)]


def resize_kernels(mod: "tvm.IRModule") -> Tuple["tvm.IRModule", Dict[str, int]]:
    """``mod`` with its resizes (and the concatenations and transforms around them) as native
    calls; and how many times each rule applied (empty when the library lacks the kernel or
    nothing matched)."""
    if not native.provides(lib.RESIZE2D):
        return mod, {}
    counts: Dict[str, int] = {}
    viewed: Set[object] = set()
    new_mod = rewrite_dataflow_blocks(
        mod, lambda bindings, func: _rewrite_block(bindings, use_counts(func), counts, viewed))
    if not counts:
        return mod, {}
    for _ in range(2):  # a reshape of a transpose: two levels of views
        new_mod = rewrite_dataflow_blocks(
            new_mod, lambda bindings, func: _drop_dead(bindings, func, viewed))
    return new_mod, counts
