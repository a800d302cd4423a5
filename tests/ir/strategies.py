"""Hypothesis strategies for random, valid expressions of the IR, shared by the test suites.

Every scope these strategies produce is *closed* (its body uses only its own iterators) and reads
only *in bounds*: each subscript of a tensor stays inside ``[-lo, n + hi)`` of its padded extent,
and each subscript of a nested scope inside ``[begin - lo, end + hi)`` of that scope's loop. The
guarantee comes from interval arithmetic done here (:func:`index_bounds`), not from the project's
simplifier or bound checker, so those modules can be tested against it. Tensor shapes are chosen
*after* the subscripts are drawn, just large enough (plus padding) for every read; each tensor
name has one shape and dtype (float32) per expression, as the printer's ``where`` clause requires.

Import from test modules in ``tests/ir`` with ``from strategies import scopes`` (pytest puts the
test file's directory on ``sys.path``); from elsewhere, ``from tests.ir.strategies import scopes``
works when the tests run as ``python -m pytest`` from the repository root.

Strategies:

* :func:`index_exprs` -- affine index expressions over given iterators, with ``//`` and ``%``.
* :func:`scopes` -- random closed, in-bounds scopes (loops, sum/max reductions, padding, nesting).
* :func:`conv_like_scopes` -- matmul / conv / G2BMM-shaped scopes: products of two tensors
  summed over reductions, the shapes derivation rules care about.
"""

from __future__ import annotations

from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from hypothesis import strategies as st

from tvm_ollie.ir.nodes import Access, BinOp, Call, Const, IterVar, Node, Scope, Tensor, Var

Ranges = Mapping[Var, Tuple[int, int]]

#: Iterator names the strategies use (none clashes with a function name or a keyword).
ITER_NAMES = ("i", "j", "k", "n", "c", "h", "w", "f", "r", "s", "p", "q", "x", "y", "z", "m")
#: Tensor names the strategies use.
TENSOR_NAMES = ("A", "B", "C")
#: Float constants that may appear in bodies: exact in binary, none is -0.0 or nan.
FLOAT_CONSTS = (0.5, 2.0, -1.0, 1.5, 0.25, 3.0)
#: Unary functions applied to arbitrary sub-bodies (``exp`` is applied to single reads only).
UNARY_FUNCS = ("relu", "tanh", "sigmoid", "abs", "neg")


# ---------------------------------------------------------------------------------------------
# Interval arithmetic
# ---------------------------------------------------------------------------------------------
def index_bounds(node: Node, ranges: Ranges) -> Tuple[int, int]:
    """Inclusive ``(lo, hi)`` bounds of an integer index expression.

    ``ranges`` maps each :class:`Var` to its half-open ``(begin, end)``. Sound (the true range is
    inside the result) for ``+ - *`` and for ``//``/``%`` by positive constants; anything else
    raises ``ValueError``. Kept here, independent of ``tvm_ollie.ir.simplify``, so strategies can
    guarantee in-bounds reads without trusting the code under test.
    """
    if isinstance(node, Var):
        begin, end = ranges[node]
        return begin, end - 1
    if isinstance(node, Const) and node.dtype.startswith("int"):
        return node.value, node.value
    if isinstance(node, BinOp):
        a0, a1 = index_bounds(node.a, ranges)
        if node.op in ("//", "%"):
            if not (isinstance(node.b, Const) and node.b.dtype.startswith("int")
                    and node.b.value > 0):
                raise ValueError(f"{node.op} by a non-constant or non-positive divisor: {node}")
            k = node.b.value
            if node.op == "//":
                return a0 // k, a1 // k
            if a0 // k == a1 // k:
                return a0 % k, a1 % k
            return 0, k - 1
        b0, b1 = index_bounds(node.b, ranges)
        if node.op == "+":
            return a0 + b0, a1 + b1
        if node.op == "-":
            return a0 - b1, a1 - b0
        if node.op == "*":
            products = (a0 * b0, a0 * b1, a1 * b0, a1 * b1)
            return min(products), max(products)
    raise ValueError(f"not an affine index expression: {node}")


def _as_ranges(vars_with_ranges) -> Dict[Var, Tuple[int, int]]:
    if isinstance(vars_with_ranges, Mapping):
        return {(Var(v) if isinstance(v, str) else v): (int(r[0]), int(r[1]))
                for v, r in vars_with_ranges.items()}
    return {iv.var: (iv.begin, iv.end) for iv in vars_with_ranges}


# ---------------------------------------------------------------------------------------------
# Index expressions
# ---------------------------------------------------------------------------------------------
@st.composite
def index_exprs(
    draw,
    vars_with_ranges: Union[Mapping[Union[Var, str], Tuple[int, int]], Sequence[IterVar]],
    max_terms: int = 3,
    max_coeff: int = 2,
    max_offset: int = 2,
    allow_divmod: bool = True,
) -> Node:
    """Affine integer index expressions over the given iterators.

    The result is ``±c1*v1 ± c2*v2 ... ± offset`` with up to ``max_terms`` terms, coefficients in
    ``[1, max_coeff]`` (written ``k * v`` or ``v * k``, or ``v`` alone when 1), and sometimes a
    term ``(affine) // k`` or ``(affine) % k`` for ``k`` in 2..4. With no iterators (or when the
    draw picks no terms) it is an integer constant. Always ``is_index``.

    Parameters
    ----------
    vars_with_ranges : Mapping[Var | str, (begin, end)] or Sequence[IterVar]
        The iterators that may appear; ranges matter only to callers that bound the result.
    """
    ranges = _as_ranges(vars_with_ranges)
    names = sorted(ranges, key=lambda v: v.name)
    n_terms = 0
    if names and draw(st.integers(0, 5)):  # a constant index one time in six
        n_terms = draw(st.integers(1, min(max_terms, len(names))))
    chosen = draw(st.permutations(names))[:n_terms] if n_terms else []
    expr: Optional[Node] = None
    for var in chosen:
        coeff = draw(st.integers(1, max_coeff))
        term: Node = var
        if coeff != 1:
            term = Const(coeff) * var if draw(st.booleans()) else var * Const(coeff)
        if expr is None:
            expr = term if draw(st.integers(0, 4)) else Const(-1) * term
        else:
            expr = expr + term if draw(st.booleans()) else expr - term
    if expr is not None and allow_divmod and draw(st.integers(0, 3)) == 0:
        k = draw(st.integers(2, 4))
        expr = expr // Const(k) if draw(st.booleans()) else expr % Const(k)
        if names and draw(st.booleans()):
            expr = expr + draw(st.sampled_from(names))
    offset = draw(st.integers(-max_offset, max_offset))
    if expr is None:
        return Const(offset)
    if offset > 0:
        return expr + Const(offset)
    if offset < 0:
        return expr - Const(-offset)
    return expr


# ---------------------------------------------------------------------------------------------
# Random scopes
# ---------------------------------------------------------------------------------------------
class _Read:
    """A pending tensor read: its tensor is built once every read of the name is known."""

    def __init__(self, name: str, indices: Tuple[Node, ...], bounds: List[Tuple[int, int]],
                 padded: bool):
        self.name, self.indices, self.bounds, self.padded = name, indices, bounds, padded


def _call_plan(func: str, *args: Callable[[], Node]) -> Callable[[], Node]:
    return lambda: Call(func, tuple(a() for a in args))


def _binop_plan(op: str, a: Callable[[], Node], b: Callable[[], Node]) -> Callable[[], Node]:
    return lambda: BinOp(op, a(), b())


class _ScopeGen:
    """Draws one expression in two phases.

    Bodies are first drawn as trees of callables ("plans") while ``reads`` collects every tensor
    subscript with its index bounds; :meth:`choose_shapes` then fixes one shape per tensor name,
    and calling the top plan builds the nodes, each read getting the padding it needs.
    """

    def __init__(self, draw, max_extent: int, allow_pad: bool, allow_max: bool,
                 pad_values: Sequence[float]):
        self.draw = draw
        self.max_extent = max_extent
        self.allow_pad = allow_pad
        self.allow_max = allow_max
        self.pad_values = tuple(pad_values)
        n_tensors = draw(st.integers(1, len(TENSOR_NAMES)))
        self.names = TENSOR_NAMES[:n_tensors]
        self.ranks: Dict[str, int] = {}
        self.reads: List[_Read] = []

    def iterators(self, count: int, begin_choices: Sequence[int], max_extent: int
                  ) -> List[Tuple[str, int, int]]:
        names = self.draw(st.permutations(ITER_NAMES))[:count]
        out = []
        for name in names:
            begin = self.draw(st.sampled_from(begin_choices))
            out.append((name, begin, begin + self.draw(st.integers(1, max_extent))))
        return out

    def scope_plan(self, depth: int, loops: List[Tuple[str, int, int]], pad,
                   max_reduce: int) -> Callable[[], Scope]:
        taken = {name for name, _, _ in loops}
        n_reduce = self.draw(st.integers(0, max_reduce))
        free = [n for n in self.draw(st.permutations(ITER_NAMES)) if n not in taken]
        reduce = []
        for name in free[:n_reduce]:
            begin = self.draw(st.sampled_from((0, 0, 0, 1, -1)))
            reduce.append((name, begin, begin + self.draw(st.integers(1, self.max_extent))))
        reducer = "max" if reduce and self.allow_max and self.draw(st.integers(0, 3)) == 0 \
            else "sum"
        loop_ivs = tuple(IterVar(*it) for it in loops)
        reduce_ivs = tuple(IterVar(*it) for it in reduce)
        ranges = {iv.var: (iv.begin, iv.end) for iv in loop_ivs + reduce_ivs}
        body = self.body(depth, ranges)
        return lambda: Scope(loop_ivs, reduce_ivs, body(), pad, reducer)

    def body(self, depth: int, ranges: Ranges) -> Callable[[], Node]:
        n_leaves = self.draw(st.integers(1, 3))
        return self.subtree(depth, ranges, n_leaves, need_read=True)

    def subtree(self, depth: int, ranges: Ranges, n_leaves: int, need_read: bool
                ) -> Callable[[], Node]:
        draw = self.draw
        if n_leaves == 1:
            plan = self.leaf(depth, ranges, need_read)
            if draw(st.integers(0, 7)) == 0 and need_read:
                plan = _call_plan("exp", plan)  # exp only of a single read: values stay small
        else:
            split = draw(st.integers(1, n_leaves - 1))
            left = self.subtree(depth, ranges, split, need_read)
            right = self.subtree(depth, ranges, n_leaves - split, False)
            op = draw(st.sampled_from(("+", "-", "*", "+", "*", "max", "min")))
            plan = _call_plan(op, left, right) if op in ("max", "min") \
                else _binop_plan(op, left, right)
        if draw(st.integers(0, 5)) == 0:
            plan = _call_plan(draw(st.sampled_from(UNARY_FUNCS)), plan)
        return plan

    def leaf(self, depth: int, ranges: Ranges, need_read: bool) -> Callable[[], Node]:
        kind = self.draw(st.integers(0, 9))
        if kind == 0 and not need_read:
            value = self.draw(st.sampled_from(FLOAT_CONSTS))
            return lambda: Const(value)
        if kind <= 2 and depth > 1:
            return self.nested_read(depth, ranges)
        return self.tensor_read(ranges)

    def tensor_read(self, ranges: Ranges) -> Callable[[], Node]:
        draw = self.draw
        name = draw(st.sampled_from(self.names))
        rank = self.ranks.setdefault(name, draw(st.integers(1, 3)))
        padded = self.allow_pad and draw(st.booleans())
        indices, bounds = [], []
        for _ in range(rank):
            index = draw(index_exprs(ranges))
            lo, hi = index_bounds(index, ranges)
            keep = draw(st.integers(0, 2)) if padded else 0  # at most 2 below 0 read padding
            if lo < -keep:  # shift the rest up instead of padding it
                shift = -lo - keep
                index, lo, hi = index + Const(shift), lo + shift, hi + shift
            indices.append(index)
            bounds.append((lo, hi))
        read = _Read(name, tuple(indices), bounds, padded)
        self.reads.append(read)
        return lambda: Access(self.tensor_for(read), read.indices)

    def nested_read(self, depth: int, ranges: Ranges) -> Callable[[], Node]:
        """Subscripts first, then an inner scope whose (padded) loop ranges cover them."""
        draw = self.draw
        rank = draw(st.integers(1, 3))
        indices, loops, pad = [], [], []
        names = draw(st.permutations(ITER_NAMES))[:rank]
        for name in names:
            index = draw(index_exprs(ranges, max_terms=draw(st.integers(1, 2)), max_coeff=1,
                                     allow_divmod=draw(st.booleans())))
            lo, hi = index_bounds(index, ranges)
            mode = draw(st.sampled_from(("exact", "exact", "padded", "wide")))
            begin, end, margin = lo, hi + 1, (0, 0)
            if mode == "padded" and hi > lo:
                plo = draw(st.integers(0, 1))
                phi = draw(st.integers(0, min(1, hi - lo - plo)))
                begin, end, margin = lo + plo, hi + 1 - phi, (plo, phi)
            elif mode == "wide":
                begin, end = lo - draw(st.integers(0, 1)), hi + 1 + draw(st.integers(0, 1))
            indices.append(index)
            loops.append((name, begin, end))
            pad.append(margin)
        inner = self.scope_plan(depth - 1, loops, tuple(pad), max_reduce=2)
        return lambda: Access(inner(), tuple(indices))

    # -- shapes --------------------------------------------------------------------------------
    def choose_shapes(self) -> None:
        """Pick each tensor's shape from every read of it; padding then covers the rest."""
        self.shapes: Dict[str, Tuple[int, ...]] = {}
        for name, rank in self.ranks.items():
            reads = [r for r in self.reads if r.name == name]
            shape = []
            for d in range(rank):
                need_all = max(r.bounds[d][1] + 1 for r in reads)
                plain = [r.bounds[d][1] + 1 for r in reads if not r.padded]
                extent = max(plain) if plain else need_all - self.draw(st.integers(0, 2))
                extent += self.draw(st.sampled_from((0, 0, 0, 1)))
                shape.append(max(1, extent))
            self.shapes[name] = tuple(shape)

    def tensor_for(self, read: _Read) -> Tensor:
        shape = self.shapes[read.name]
        pad = tuple((max(0, -lo), max(0, hi + 1 - n)) for (lo, hi), n in zip(read.bounds, shape))
        value = 0.0
        if any(lo or hi for lo, hi in pad):
            value = self.draw(st.sampled_from(self.pad_values))
        return Tensor(read.name, shape, "float32", pad, value)


@st.composite
def scopes(
    draw,
    max_depth: int = 2,
    max_loops: int = 3,
    max_reduce: int = 3,
    max_extent: int = 5,
    allow_pad: bool = True,
    allow_max: bool = True,
    pad_values: Sequence[float] = (0.0,),
) -> Scope:
    """Random closed scopes whose every read is in bounds.

    1..``max_loops`` loops and 0..``max_reduce`` reductions (sum, or max when ``allow_max``), with
    extents 1..``max_extent``; loop ranges usually start at 0, sometimes at -2..2. The body
    combines 1-3 reads of 1-3 float32 tensors (``A``, ``B``, ``C``; each with one shape per
    expression) with ``+ - *``, ``max``/``min``, unary calls and float constants; subscripts are
    affine in the scope's iterators (:func:`index_exprs`). When ``allow_pad``, reads may rely on
    tensor padding (values from ``pad_values``) and the outer scope may carry output padding.
    Up to ``max_depth`` scope levels: the body may read a nested, closed scope whose loop ranges
    (plus its padding) are chosen to cover the subscripts that read it; nested extents follow
    those subscripts and can exceed ``max_extent`` (at most ``2 * max_extent + 1`` when
    ``max_depth`` is 2; deeper levels can grow further).
    """
    gen = _ScopeGen(draw, max_extent, allow_pad, allow_max, pad_values)
    n_loops = draw(st.integers(1, max_loops))
    loops = gen.iterators(n_loops, (0, 0, 0, 0, 0, 0, 1, 2, -1, -2), max_extent)
    pad = None
    if allow_pad and draw(st.integers(0, 4)) == 0:
        pad = tuple((draw(st.integers(0, 1)), draw(st.integers(0, 1))) for _ in loops)
    plan = gen.scope_plan(max_depth, loops, pad, max_reduce)
    gen.choose_shapes()
    return plan()


# ---------------------------------------------------------------------------------------------
# Convolution- and matmul-shaped scopes
# ---------------------------------------------------------------------------------------------
def fit_tensor(name: str, shape: Sequence[int], indices: Sequence[Node], ranges: Ranges
               ) -> Tensor:
    """The float32 tensor ``name`` with just the zero padding its subscripts need."""
    pad = []
    for index, n in zip(indices, shape):
        lo, hi = index_bounds(index, ranges)
        pad.append((max(0, -lo), max(0, hi + 1 - n)))
    return Tensor(name, shape, "float32", pad)


def _product_scope(loops: Sequence[IterVar], reduce: Sequence[IterVar],
                   a: Tuple[Sequence[int], Sequence[Node]],
                   b: Tuple[Sequence[int], Sequence[Node]]) -> Scope:
    ranges = {iv.var: (iv.begin, iv.end) for iv in tuple(loops) + tuple(reduce)}
    ta = fit_tensor("A", a[0], a[1], ranges)
    tb = fit_tensor("K", b[0], b[1], ranges)
    return Scope(loops, reduce, ta[tuple(a[1])] * tb[tuple(b[1])])


def _linear(terms: Sequence[Tuple[int, Var]], offset: int) -> Node:
    """``c1 * v1 + c2 * v2 ... + offset`` written the way a person would (no ``1 *``, no ``+ 0``).

    Coefficients must be positive.
    """
    expr: Node = None
    for coeff, var in terms:
        term = var if coeff == 1 else var * Const(coeff)
        expr = term if expr is None else expr + term
    if offset > 0:
        return expr + Const(offset)
    if offset < 0:
        return expr - Const(-offset)
    return expr


def _iv(name: str, extent: int) -> IterVar:
    return IterVar(name, 0, extent)


CONV_KINDS = ("matmul", "batch_matmul", "conv1d", "conv2d", "depthwise", "g2bmm", "gbmm")


@st.composite
def conv_like_scopes(draw, kinds: Sequence[str] = CONV_KINDS, max_size: int = 5) -> Scope:
    """Scopes shaped like the operators derivation targets: ``Σ A[...] * K[...]``.

    ``kinds`` picks among: ``matmul`` (either operand possibly transposed), ``batch_matmul``,
    ``conv1d`` and ``conv2d`` (NCHW or NHWC, kernel 1-3, stride 1-2, dilation 1-2, zero padding
    0..R-1 on the input), ``depthwise`` (2-D), ``g2bmm`` (band of width ``2W+1``, dilation D:
    ``A[b, m, k] * K[b, m + D * (w - W), k]``) and ``gbmm`` (its transpose-like partner). The
    first operand is always named ``A``, the second ``K``; padding is exactly what the
    subscripts need, so every read is in bounds. Sizes stay at most ``max_size`` (channels 3).
    """
    kind = draw(st.sampled_from(tuple(kinds)))
    size = st.integers(1, max_size)
    if kind in ("matmul", "batch_matmul"):
        m, n, k = draw(size), draw(size), draw(size)
        iv_m, iv_n, iv_k = _iv("m", m), _iv("n", n), _iv("k", k)
        vm, vn, vk = iv_m.var, iv_n.var, iv_k.var
        a = ((m, k), [vm, vk]) if draw(st.booleans()) else ((k, m), [vk, vm])
        b = ((k, n), [vk, vn]) if draw(st.booleans()) else ((n, k), [vn, vk])
        if kind == "matmul":
            return _product_scope((iv_m, iv_n), (iv_k,), a, b)
        bs = draw(st.integers(1, 3))
        iv_b = _iv("b", bs)
        a = ((bs,) + a[0], [iv_b.var] + a[1])
        b = ((bs,) + b[0], [iv_b.var] + b[1])
        return _product_scope((iv_b, iv_m, iv_n), (iv_k,), a, b)
    if kind in ("g2bmm", "gbmm"):
        bs, m, k = draw(st.integers(1, 2)), draw(size), draw(size)
        width, dil = draw(st.integers(0, 2)), draw(st.integers(1, 2))
        iv_b, iv_m, iv_w = _iv("b", bs), _iv("m", m), _iv("w", 2 * width + 1)
        vb, vm, vw = iv_b.var, iv_m.var, iv_w.var
        band = _linear(((1, vm), (dil, vw)), -dil * width)
        if kind == "g2bmm":
            iv_k = _iv("k", k)
            return _product_scope((iv_b, iv_m, iv_w), (iv_k,), ((bs, m, k), [vb, vm, iv_k.var]),
                                  ((bs, m, k), [vb, band, iv_k.var]))
        iv_n = _iv("n", k)
        return _product_scope((iv_b, iv_m, iv_n), (iv_w,),
                              ((bs, m, 2 * width + 1), [vb, vm, vw]),
                              ((bs, m, k), [vb, band, iv_n.var]))
    return _conv(draw, kind, size)


def _conv_axis(draw, size) -> Tuple[int, int, int, int, int, int]:
    """``(in_extent, out_extent, kernel, stride, dilation, pad)`` for one spatial axis."""
    kernel, stride, dil = draw(st.integers(1, 3)), draw(st.integers(1, 2)), draw(st.integers(1, 2))
    pad = draw(st.integers(0, kernel - 1))
    span = dil * (kernel - 1) + 1
    extent = max(draw(size), span - 2 * pad)
    out = (extent + 2 * pad - span) // stride + 1
    return extent, out, kernel, stride, dil, pad


def _conv(draw, kind: str, size) -> Scope:
    n, c, f = draw(st.integers(1, 2)), draw(st.integers(1, 3)), draw(st.integers(1, 3))
    n_spatial = 1 if kind == "conv1d" else 2
    axes = [_conv_axis(draw, size) for _ in range(n_spatial)]
    out_names, red_names = ("h", "w")[:n_spatial], ("r", "s")[:n_spatial]
    spatial = [_iv(name, ax[1]) for name, ax in zip(out_names, axes)]
    taps = [_iv(name, ax[2]) for name, ax in zip(red_names, axes)]
    in_idx = [_linear(((ax[3], o.var), (ax[4], t.var)), -ax[5])
              for o, t, ax in zip(spatial, taps, axes)]
    in_ext = [ax[0] for ax in axes]
    k_ext = [ax[2] for ax in axes]
    iv_n, iv_c, iv_f = _iv("n", n), _iv("c", c), _iv("f", f)
    vn, vc, vf = iv_n.var, iv_c.var, iv_f.var
    if kind == "depthwise":
        return _product_scope((iv_n, iv_c, *spatial), tuple(taps),
                              ((n, c, *in_ext), [vn, vc, *in_idx]),
                              ((c, *k_ext), [vc, *(t.var for t in taps)]))
    if draw(st.booleans()):  # NCHW input, FCRS kernel
        return _product_scope((iv_n, iv_f, *spatial), (iv_c, *taps),
                              ((n, c, *in_ext), [vn, vc, *in_idx]),
                              ((f, c, *k_ext), [vf, vc, *(t.var for t in taps)]))
    return _product_scope((iv_n, *spatial, iv_f), (iv_c, *taps),  # NHWC input, RSFC kernel
                          ((n, *in_ext, c), [vn, *in_idx, vc]),
                          ((*k_ext, f, c), [*(t.var for t in taps), vf, vc]))
