"""Hypothesis strategies for the operators the pass rewrites, built as Relax modules.

A case is a :class:`Case`: a one-function Relax module (random small shapes and attributes
that TVM accepts), the reduction length of its operator (to scale the comparison tolerance)
and a short description. Covered: conv1d/2d/3d (strides, asymmetric padding, dilation,
groups, the layouts Relax legalizes), conv1d/2d/3d_transpose (output padding, groups), matmul
(1-D operands, batch broadcasting, transposed operands through ``permute_dims``), each with a
bias and/or relu epilogue sometimes (what :mod:`tvm_ollie.transform.epilogue` folds), weights
as parameters or as constants, and a zero ``pad`` of the convolution's input sometimes (the
region units the pass lifts: pad + conv, conv + bias + relu, matmul + add).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Tuple

import numpy as np
from hypothesis import strategies as st
from tvm import relax

from tvm_ollie.codegen.builder import single_function_module, tensor_var

#: data/kernel layouts per convolution rank (the first is TVM's default)
CONV_LAYOUTS = {
    1: [("NCW", "OIW"), ("NWC", "WIO")],
    2: [("NCHW", "OIHW"), ("NHWC", "HWIO"), ("NHWC", "OHWI")],
    3: [("NCDHW", "OIDHW"), ("NDHWC", "DHWIO")],
}
#: largest spatial extent per rank (keeps a case to milliseconds of work)
MAX_SPATIAL = {1: 12, 2: 8, 3: 5}


@dataclass
class Case:
    """A generated module, its operator's reduction length and a description."""

    mod: object
    reduction: int
    text: str
    op: str

    @property
    def out_elems(self) -> int:
        """Elements of the output (a nearly empty output exercises little)."""
        return int(np.prod([int(s) for s in self.mod["main"].ret_ty.shape]))


def _conv_out(size: int, k: int, stride: int, pad: int, dil: int) -> int:
    return (size + pad - dil * (k - 1) - 1) // stride + 1


def _convt_out(size: int, k: int, stride: int, pad: int, dil: int, out_pad: int) -> int:
    return (size - 1) * stride - pad + dil * (k - 1) + out_pad + 1


def _permute_shape(shape, layout: str, canonical: str):
    """``shape`` given in ``canonical`` axis order, written in ``layout`` order."""
    return tuple(shape[canonical.index(c)] for c in layout)


def _epilogue(bb, y, bias_shape, bias, relu, rng):
    if bias:
        b = relax.const(rng.standard_normal(bias_shape).astype("float32"))
        y = relax.op.add(bb.emit(y), b)
    if relu:
        y = relax.op.nn.relu(bb.emit(y))
    return y


@st.composite
def conv_cases(draw, transpose: bool = False, ranks: Tuple[int, ...] = (1, 2, 3)) -> Case:
    """A convolution (or transposed convolution) of rank 1, 2 or 3 with an optional epilogue."""
    nd = draw(st.sampled_from(list(ranks)))
    spatial = "DHW"[3 - nd:] if nd > 1 else "W"
    groups = draw(st.sampled_from([1, 1, 1, 2, 3]))
    cg = draw(st.integers(1, 4))
    fg = draw(st.integers(1, 4))
    cin, cout = groups * cg, groups * fg
    batch = draw(st.integers(1, 2))
    if transpose or nd == 1:
        data_layout, kernel_layout = ("NC" + spatial, ("IO" if transpose else "OI") + spatial)
        if not transpose:
            data_layout, kernel_layout = draw(st.sampled_from(CONV_LAYOUTS[nd]))
    else:
        data_layout, kernel_layout = draw(st.sampled_from(CONV_LAYOUTS[nd]))
    sizes, ks, strides, dils, pads_lo, pads_hi, out_pads, outs = [], [], [], [], [], [], [], []
    for _ in range(nd):
        k = draw(st.integers(1, 3))
        s = draw(st.integers(1, 3))
        d = draw(st.integers(1, 2))
        lo, hi = draw(st.integers(0, 2)), draw(st.integers(0, 2))
        if transpose:
            size = draw(st.integers(1, MAX_SPATIAL[nd] // 2 + 1))
            op_ = draw(st.integers(0, max(s, d) - 1))
            op_ = min(op_, s - 1)
            out = _convt_out(size, k, s, lo + hi, d, op_)
            if out < 1:
                lo = hi = 0
                out = _convt_out(size, k, s, 0, d, op_)
            out_pads.append(op_)
        else:
            size = draw(st.integers(1, MAX_SPATIAL[nd]))
            out = _conv_out(size, k, s, lo + hi, d)
            if out < 1:
                size = d * (k - 1) + 1
                out = _conv_out(size, k, s, lo + hi, d)
        sizes.append(size)
        ks.append(k)
        strides.append(s)
        dils.append(d)
        pads_lo.append(lo)
        pads_hi.append(hi)
        outs.append(out)
    canon_d = "NC" + spatial
    dshape = _permute_shape((batch, cin, *sizes), data_layout, canon_d)
    if transpose:
        kshape = (cin, fg, *ks)
    else:
        kshape = _permute_shape((cout, cg, *ks), kernel_layout, "OI" + spatial)
    bias, relu = draw(st.booleans()), draw(st.booleans())
    const_w = draw(st.booleans())
    # a zero pad before a convolution (a region unit): the parameter is that much smaller
    pre_pad = [(0, 0)] * nd
    if not transpose and draw(st.booleans()):
        pre_pad = [(draw(st.integers(0, 1)), draw(st.integers(0, 1))) for _ in range(nd)]
        pre_pad = [(lo, hi) if size - lo - hi >= 1 else (0, 0)
                   for (lo, hi), size in zip(pre_pad, sizes)]
    seed = draw(st.integers(0, 2**16))
    rng = np.random.default_rng(seed)
    c_axis = data_layout.index("C")
    bias_shape = tuple(cout if i == c_axis else 1 for i in range(nd + 2))
    name = f"conv{nd}d" + ("_transpose" if transpose else "")
    op = getattr(relax.op.nn, name)
    attrs = dict(strides=strides, padding=pads_lo + pads_hi, dilation=dils, groups=groups,
                 data_layout=data_layout, kernel_layout=kernel_layout)
    if transpose:
        attrs["output_padding"] = out_pads
    pads_by_axis = {c: p for c, p in zip(spatial, pre_pad)}
    xshape = tuple(n - sum(pads_by_axis.get(c, (0, 0))) for n, c in zip(dshape, data_layout))
    pad_width = [w for c in data_layout for w in pads_by_axis.get(c, (0, 0))]
    params = [tensor_var("x", xshape)]
    if not const_w:
        params.append(tensor_var("w", kshape))
    wconst = relax.const(rng.standard_normal(kshape).astype("float32")) if const_w else None

    def body(bb, x, w=None):
        if any(pad_width):
            x = bb.emit(relax.op.nn.pad(x, pad_width))
        y = op(x, w if w is not None else wconst, **attrs)
        return _epilogue(bb, y, bias_shape, bias, relu, rng)

    mod = single_function_module(params, body)
    reduction = cg * int(np.prod(ks))
    text = (f"{name} x{dshape} w{kshape}{' const' if const_w else ''} {attrs} "
            f"bias={bias} relu={relu}" + (f" pad{pad_width}" if any(pad_width) else ""))
    return Case(mod, reduction, text, name)


@st.composite
def matmul_cases(draw) -> Case:
    """``matmul`` with 1-D operands, broadcast batches and transposed operands sometimes."""
    m, k, n = draw(st.integers(1, 12)), draw(st.integers(1, 16)), draw(st.integers(1, 12))
    rank_a, rank_b = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    batch = draw(st.lists(st.integers(1, 3), min_size=2, max_size=2))
    # batch axes align from the right (numpy broadcasting): each operand takes a suffix
    bat_a = [draw(st.sampled_from([b, 1])) for b in batch][len(batch) - max(rank_a - 2, 0):]
    bat_b = [draw(st.sampled_from([b, 1])) for b in batch][len(batch) - max(rank_b - 2, 0):]
    a_shape: Tuple[int, ...] = (k,) if rank_a == 1 else (*bat_a, m, k)
    b_shape: Tuple[int, ...] = (k,) if rank_b == 1 else (*bat_b, k, n)
    trans_a = rank_a >= 2 and draw(st.booleans())
    trans_b = rank_b >= 2 and draw(st.booleans())
    const_b = draw(st.booleans())
    bias = rank_b >= 2 and draw(st.booleans())
    relu = draw(st.booleans())
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))

    def stored(shape, trans):
        return (*shape[:-2], shape[-1], shape[-2]) if trans else shape

    def axes(rank):
        return list(range(rank - 2)) + [rank - 1, rank - 2]

    params = [tensor_var("a", stored(a_shape, trans_a))]
    if not const_b:
        params.append(tensor_var("b", stored(b_shape, trans_b)))
    bconst = relax.const(rng.standard_normal(stored(b_shape, trans_b)).astype("float32")) \
        if const_b else None

    def body(bb, a, b=None):
        b = b if b is not None else bconst
        if trans_a:
            a = bb.emit(relax.op.permute_dims(a, axes(rank_a)))
        if trans_b:
            b = bb.emit(relax.op.permute_dims(b, axes(rank_b)))
        return _epilogue(bb, relax.op.matmul(a, b), (n,), bias, relu, rng)

    mod = single_function_module(params, body)
    text = (f"matmul a{a_shape}{'^T' if trans_a else ''} b{b_shape}{'^T' if trans_b else ''}"
            f"{' const' if const_b else ''} bias={bias} relu={relu}")
    return Case(mod, k, text, "matmul")


#: operator families by name (``OLLIE_FUZZ_FAMILY`` of the long run)
FAMILIES = {
    "conv": lambda: conv_cases(False),
    "conv2d": lambda: conv_cases(False, (2,)),
    "conv_transpose": lambda: conv_cases(True),
    "matmul": matmul_cases,
}


def any_case(family: str = "all") -> st.SearchStrategy:
    """Cases of one family, or of any family equally often (``"all"``)."""
    if family != "all":
        return FAMILIES[family]()
    return st.one_of(conv_cases(False), conv_cases(True), matmul_cases())


def substantial(strategy: st.SearchStrategy) -> st.SearchStrategy:
    """Cases with some work in them (for a short run whose first examples are the simplest)."""
    return strategy.filter(lambda c: c.reduction >= 4 and c.out_elems >= 8)


def random_inputs(mod, seed: int = 0) -> List[np.ndarray]:
    """Standard-normal float32 arrays for ``main``'s parameters."""
    rng = np.random.default_rng(seed)
    return [rng.standard_normal([int(s) for s in p.ty.shape]).astype("float32")
            for p in mod["main"].params]


def fixed_case(op: str, data: Tuple[int, ...], weight: Tuple[int, ...], **attrs) -> Case:
    """A hand-written case (explicit examples): ``op`` on a ``data`` parameter and a ``weight``
    parameter with ``attrs``; the reduction length is the weight's size per output."""
    fn = getattr(relax.op.nn, op) if op != "matmul" else relax.op.matmul
    mod = single_function_module([tensor_var("x", data), tensor_var("w", weight)],
                                 lambda bb, x, w: fn(x, w, **attrs))
    reduction = weight[-2] if op == "matmul" else int(np.prod(weight)) // weight[
        1 if "transpose" in op else 0]
    return Case(mod, reduction, f"{op} x{data} w{weight} {attrs}", op)
