"""Instantiation: match a scope against target operators with an iterator table.

A scope is a candidate for a target operator when its reducer is a sum and its body is the product
of two reads ``X[ix] * Y[iy]`` (of input tensors or of nested scopes). The *iterator table*
records, for every iterator of the scope, whether it is a traversal (output) or a summation
iterator and in which index dimensions of ``X`` and ``Y`` it appears, with its coefficient when
the index is affine. Each target is a small set of roles over that table:

==============  ==========================================================================
matmul          M (out, X), N (out, Y), K (sum, X and Y); each role a *group* of iterators
batch_matmul    as matmul plus Batch (out, X and Y)
conv2d          n (out, data), g (out, both: channel groups), f (out, weight), c (sum, both),
                and one or two spatial pairs: ``oh`` (out) and ``r`` (sum) sharing a data index
                ``st*oh ± dil*r + off`` (``-`` = flipped kernel); the weight index is free-form
g2bmm           ``out[b, i, j] = Σ_k A[b, i, k] * B[b, i + D*(j - W), k]``,  j in [0, 2W+1)
gbmm            ``out[b, i, n] = Σ_j A[b, i, j] * B[b, i + D*(j - W), n]``,  j in [0, 2W+1)
==============  ==========================================================================

Why groups: after derivation the iterators that play one role of a GEMM are often several
(``n, h, w`` form the M dimension of a convolution-as-matmul). A matched operand is then the
row-major flattening of its groups. When the operand's read is already exactly that flattening
of its source (plain iterators covering whole dimensions, in group order) it is a *view*: a free
reshape. Otherwise the operand is materialized by a *gather* eOperator, a scope over the
operand's iterators in operator order whose body is the original read; any index form is allowed
there (offsets, padding, ``//``, ``%``), which is how im2col-like layouts arise.

The matched operator itself is described by a canonical expression over fresh operand tensors
(:meth:`Match.operator_expr`), and its output by groups of the scope's traversal iterators
(:attr:`Match.out_dims`), so that readers of the matched scope can address the operator's output
through a row-major view (see :mod:`tvm_ollie.derive.program`).

This module is the matchers' side of the target table: each operator family has a public matcher
(:func:`match_gemm`, :func:`match_conv`, :func:`match_band`), its canonical expression and its
signature, and its own :class:`Match` subclass. The table that names them, in matching order,
and :func:`~tvm_ollie.derive.targets.match_scope`, which tries its rows, are in
:mod:`tvm_ollie.derive.targets`, which imports this module (never the other way round).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

from ..ir.nodes import Access, BinOp, IterVar, Node, Scope, Tensor, Var, free_vars, substitute
from ..ir.index import build_linear
from ..ir.index import linear_form as _base_linear_form

__all__ = [
    "BandMatch",
    "ConvMatch",
    "GemmMatch",
    "IterTable",
    "Match",
    "Operand",
    "Read",
    "band_expr",
    "band_signature",
    "conv_expr",
    "conv_signature",
    "form_to_node",
    "gemm_expr",
    "gemm_operator_expr",
    "gemm_signature",
    "iterator_table",
    "linear_form",
    "match_band",
    "match_conv",
    "match_gemm",
]

#: ``({var: coeff}, const)``: an integer-affine index.
Form = Tuple[Dict[Var, int], int]


# --------------------------------------------------------------------------------------------
# Index analysis


def linear_form(node: Node) -> Optional[Form]:
    """``node`` as ``({var: coeff}, const)`` when it is integer-affine in iterators, else None.

    Only ``+``, ``-`` and multiplication by constants are affine; ``//`` and ``%`` are not (they
    make an operand a gather, never a view or a compound operator index). The result is cached
    on the node and shared: never mutate it.
    """
    return _base_linear_form(node)


def form_to_node(coeffs: Mapping[Var, int], const: int, order: Sequence[Var] = ()) -> Node:
    """Rebuild ``Σ coeff*var + const`` as a node (vars in ``order`` first, then by name)."""
    return build_linear(dict(coeffs), const, order)


@dataclass(frozen=True, eq=False)
class Read:
    """One factor ``source[indices]`` of a matched body, analysed against its source's data box.

    The *box* of a source is where it holds data: ``[0, shape)`` for a tensor, the loop ranges
    ``[begin, end)`` for a nested scope (its padded margins, like a tensor's padding, read 0 or
    the pad value). ``forms`` are the indices relative to the box start, in iterators shifted to
    start at 0 (``v = begin + v'``), or None where an index is not affine.
    """

    access: Access
    box_begin: Tuple[int, ...]
    box_extent: Tuple[int, ...]
    forms: Tuple[Optional[Form], ...]
    dim_vars: Tuple[frozenset, ...]
    memo: Dict[str, object] = field(default_factory=dict, repr=False, compare=False)

    @property
    def source(self) -> Union[Tensor, Scope]:
        return self.access.source

    @property
    def margin_is_zero(self) -> bool:
        """Reads outside the box give 0 (scope margins always do; a tensor's pad_value may not)."""
        src = self.source
        return isinstance(src, Scope) or src.pad_value == 0.0

    def vars(self) -> frozenset:
        return frozenset().union(*self.dim_vars) if self.dim_vars else frozenset()


def _read(access: Access, ranges: Mapping[Var, IterVar]) -> Read:
    src = access.source
    if isinstance(src, Tensor):
        begin, extent = (0,) * src.ndim, src.shape
    else:
        begin = tuple(iv.begin for iv in src.loops)
        extent = tuple(iv.extent for iv in src.loops)
    forms = []
    for idx, b in zip(access.indices, begin):
        form = linear_form(idx)
        if form is not None:
            coeffs, const = form
            const += sum(c * ranges[v].begin for v, c in coeffs.items()) - b
            form = (coeffs, const)
        forms.append(form)
    dim_vars = tuple(free_vars(i) for i in access.indices)
    return Read(access, begin, tuple(extent), tuple(forms), dim_vars)


@dataclass(frozen=True, eq=False)
class IterTable:
    """The iterator table of a scope whose body is a product of two reads."""

    scope: Scope
    reads: Tuple[Read, Read]
    ranges: Dict[Var, IterVar]
    loops: Tuple[Var, ...]
    reduce: Tuple[Var, ...]

    def extent(self, v: Var) -> int:
        return self.ranges[v].extent

    def where(self, v: Var) -> Tuple[bool, bool, bool]:
        """``(is_loop, in X, in Y)``."""
        return (v in self._loopset, v in self.reads[0].vars(), v in self.reads[1].vars())

    @property
    def _loopset(self) -> frozenset:
        return frozenset(self.loops)

    def describe(self) -> str:
        """One row per iterator: ``name  range  L|Σ  X-dims  Y-dims`` (for explain output)."""
        rows = []
        for v in self.loops + self.reduce:
            iv = self.ranges[v]
            dims = [[d for d, s in enumerate(r.dim_vars) if v in s] for r in self.reads]
            kind = "L" if v in self._loopset else "Σ"
            rows.append(f"{v.name}:{iv.begin}:{iv.end} {kind} X{dims[0]} Y{dims[1]}")
        return "; ".join(rows)


def iterator_table(scope: Scope) -> Optional[IterTable]:
    """The iterator table of ``scope``, or None when its body is not ``X[..] * Y[..]`` summed."""
    if not isinstance(scope, Scope) or scope.reducer != "sum":
        return None
    body = scope.body
    if not (isinstance(body, BinOp) and body.op == "*"):
        return None
    if not (isinstance(body.a, Access) and isinstance(body.b, Access)):
        return None
    ranges = {iv.var: iv for iv in scope.loops + scope.reduce}
    reads = (_read(body.a, ranges), _read(body.b, ranges))
    return IterTable(
        scope, reads, ranges, tuple(iv.var for iv in scope.loops),
        tuple(iv.var for iv in scope.reduce),
    )


# --------------------------------------------------------------------------------------------
# Operands: views and gathers

# An operand dimension is either a group of iterators (flattened row-major) or a Compound: one
# index dimension of the source replaced by a fresh iterator of the given extent.


@dataclass(frozen=True)
class Compound:
    """Operand dimension ``dim`` of the source, re-indexed by a fresh iterator over ``extent``.

    The gather reads the source at ``fresh + offset`` (in box coordinates) on that dimension.
    """

    dim: int
    extent: int
    offset: int = 0


DimSpec = Union[Tuple[Var, ...], Compound]


@dataclass(frozen=True, eq=False)
class Operand:
    """One input of a matched operator.

    Attributes
    ----------
    role : str
        ``"A"``/``"B"`` (GEMM-like operators) or ``"data"``/``"weight"`` (conv2d).
    access : Access
        The read in the matched scope's body.
    shape : tuple[int, ...]
        Shape of the operand as the operator reads it.
    is_view : bool
        The operand is the read's source itself, reshaped row-major (free): no gather stage.
    gather : Scope
        (property) A scope that materializes the operand in a layout whose row-major
        flattening is ``shape`` (loops begin at 0, no padding). Built on first use: matching
        compares many candidate layouts and needs only ``is_view`` and ``shape`` for that.
    """

    role: str
    access: Access
    shape: Tuple[int, ...]
    is_view: bool
    build: Callable[[], Scope] = field(repr=False)

    @property
    def source(self) -> Union[Tensor, Scope]:
        return self.access.source

    @cached_property
    def gather(self) -> Scope:
        return self.build()


def _plain_sequence(read: Read, ranges: Mapping[Var, IterVar]
                    ) -> Optional[Tuple[Union[Var, int], ...]]:
    """The read as a sequence of whole-dimension plain iterators (box dims of extent 1 skipped).

    Entries are iterators, or the dimension number for a non-plain index (the caller decides
    whether that dimension is a compound operator index). None when a plain iterator repeats.
    ``ranges`` must be those of the read's scope (the result is memoized on the read).
    """
    if "plain" not in read.memo:
        read.memo["plain"] = _compute_plain_sequence(read, ranges)
    return read.memo["plain"]


def _compute_plain_sequence(read: Read, ranges: Mapping[Var, IterVar]
                            ) -> Optional[Tuple[Union[Var, int], ...]]:
    seq: List[Union[Var, int]] = []
    for d, (form, ext) in enumerate(zip(read.forms, read.box_extent)):
        if form is not None:
            coeffs, const = form
            if not coeffs and const == 0 and ext == 1:
                continue
            if len(coeffs) == 1 and const == 0:
                (v, c), = coeffs.items()
                if c == 1 and ranges[v].extent == ext:
                    seq.append(v)
                    continue
            merged = _merged_dim(coeffs, const, ext, ranges)
            if merged is not None:
                seq.extend(merged)
                continue
        seq.append(d)
    plain = [v for v in seq if isinstance(v, Var)]
    if len(set(plain)) != len(plain):
        return None
    return tuple(seq)


def _merged_dim(coeffs: Mapping[Var, int], const: int, ext: int,
                ranges: Mapping[Var, IterVar]) -> Optional[List[Var]]:
    """Iterators ``[v1, v2, ..]`` when the index is the row-major flattening ``Σ stride_k v_k``.

    A dimension read as ``3*g + c`` with ``c`` over 3 values and the dimension of extent
    ``3 * |g|`` (what variable merging produces) is the group ``(g, c)`` laid out row-major, so
    the read is still a free view. Unit iterators (always 0 in box coordinates) are dropped.
    """
    if const != 0 or len(coeffs) < 2:
        return None
    terms = sorted(((c, v) for v, c in coeffs.items() if ranges[v].extent > 1),
                   key=lambda t: (-t[0], t[1].name))
    if len(terms) < 2 or any(c < 1 for c, _ in terms):
        return None
    stride = 1
    for c, v in reversed(terms):
        if c != stride:
            return None
        stride *= ranges[v].extent
    return [v for _, v in terms] if stride == ext else None


def _squeeze(items: Iterable[Union[Var, int, Compound]], ranges: Mapping[Var, IterVar]) -> list:
    return [x for x in items if not (isinstance(x, Var) and ranges[x].extent == 1)]


def _is_view(read: Read, dims: Sequence[DimSpec], ranges: Mapping[Var, IterVar]) -> bool:
    """Whether the operand ``dims`` is the read's source reshaped row-major."""
    seq = _plain_sequence(read, ranges)
    if seq is None:
        return False
    want: list = []
    for spec in dims:
        if isinstance(spec, Compound):
            if spec.offset != 0 or read.box_extent[spec.dim] != spec.extent:
                return False
            want.append(spec.dim)
        else:
            want.extend(spec)
    return _squeeze(seq, ranges) == _squeeze(want, ranges)


def _spec_extent(spec: DimSpec, ranges: Mapping[Var, IterVar]) -> int:
    if isinstance(spec, Compound):
        return spec.extent
    out = 1
    for v in spec:
        out *= ranges[v].extent
    return out


def _make_operand(
    role: str, read: Read, dims: Sequence[DimSpec], ranges: Mapping[Var, IterVar],
    fresh_prefix: str = "j",
) -> Operand:
    """The operand (view or gather) laying ``read`` out as the flattened ``dims``."""
    shape = tuple(_spec_extent(s, ranges) for s in dims)
    dims = tuple(dims)
    return Operand(role, read.access, shape, _is_view(read, dims, ranges),
                   lambda: _gather_scope(read, dims, ranges, fresh_prefix))


def _gather_scope(read: Read, dims: Sequence[DimSpec], ranges: Mapping[Var, IterVar],
                  fresh_prefix: str) -> Scope:
    """The scope over the operand's iterators (in ``dims`` order) whose body is the read."""
    loops: List[IterVar] = []
    fresh_at: Dict[int, Node] = {}
    taken = {v.name for v in ranges}
    for k, spec in enumerate(dims):
        if isinstance(spec, Compound):
            name = f"{fresh_prefix}{k}"
            while name in taken:
                name += "_"
            taken.add(name)
            fresh = Var(name)
            loops.append(IterVar(fresh, 0, spec.extent))
            fresh_at[spec.dim] = fresh + (spec.offset + read.box_begin[spec.dim]) \
                if spec.offset + read.box_begin[spec.dim] else fresh
        else:
            loops.extend(IterVar(v, 0, ranges[v].extent) for v in spec)
    order = [iv.var for iv in loops]
    indices = []
    for d, (idx, form) in enumerate(zip(read.access.indices, read.forms)):
        if d in fresh_at:
            indices.append(fresh_at[d])
        elif form is not None:
            indices.append(form_to_node(form[0], form[1] + read.box_begin[d], order))
        else:
            shift = {v: v + ranges[v].begin for v in free_vars(idx) if ranges[v].begin}
            indices.append(substitute(idx, shift))
    return Scope(loops, (), Access(read.source, indices))


def _appearance(read: Read, group: Iterable[Var]) -> List[Var]:
    """Iterators of ``group`` in the order the read's dimensions use them (row-major order)."""
    group = set(group)
    out: List[Var] = []
    for form, dvars in zip(read.forms, read.dim_vars):
        if form is not None:
            ordered = sorted(form[0], key=lambda v: (-abs(form[0][v]), v.name))
        else:
            ordered = sorted(dvars, key=lambda v: v.name)
        for v in ordered:
            if v in group and v not in out:
                out.append(v)
    return out


def _order_from(reads: Sequence[Read], group: Iterable[Var], fallback: Sequence[Var],
                ranges: Mapping[Var, IterVar]) -> Tuple[Var, ...]:
    """Order a role group as the first read that holds it plainly does, else by ``fallback``."""
    group = list(group)
    for read in reads:
        seq = _plain_sequence(read, ranges)
        if seq is not None and all(v in seq for v in group):
            return tuple(v for v in seq if v in group)
    rank = {v: i for i, v in enumerate(fallback)}
    return tuple(sorted(group, key=lambda v: rank.get(v, len(rank))))


# --------------------------------------------------------------------------------------------
# Matches


@dataclass(frozen=True, eq=False)
class Match:
    """A scope instantiated as a target operator.

    Attributes
    ----------
    kind : str
        One of :data:`tvm_ollie.derive.targets.TARGET_NAMES`.
    scope : Scope
        The matched scope.
    attrs : dict
        Operator attributes: sizes (``M, N, K``; ``batch``; conv ``N, C, H, W, F, R, S, stride,
        dilation, padding, layouts``; g2bmm/gbmm ``batch, length, width, dilation``...).
    operands : tuple[Operand, Operand]
        The two inputs, in operator order.
    out_dims : tuple[tuple[Var, ...], ...]
        The operator's output dimensions as groups of the scope's traversal iterators (row-major
        within a group; an empty group is a unit dimension).
    out_shape : tuple[int, ...]
        The operator's output shape (one entry per ``out_dims`` group).
    """

    kind: str
    scope: Scope
    attrs: Dict[str, object]
    operands: Tuple[Operand, Operand]
    out_dims: Tuple[Tuple[Var, ...], ...]
    out_shape: Tuple[int, ...]

    @property
    def gathers(self) -> int:
        """How many operands need a gather eOperator."""
        return sum(not op.is_view for op in self.operands)

    @property
    def out_order(self) -> Tuple[Var, ...]:
        """Traversal iterators in the operator's row-major output order."""
        return tuple(v for group in self.out_dims for v in group)

    def output_is_view(self) -> bool:
        """Whether the operator output, reshaped, is the scope itself (same iterator order)."""
        ranges = {iv.var: iv for iv in self.scope.loops}
        loops = [iv.var for iv in self.scope.loops]
        return _squeeze(self.out_order, ranges) == _squeeze(loops, ranges)

    def operator_expr(self, a: Tensor, b: Tensor) -> Scope:
        """The canonical expression of the operator over operand tensors ``a`` and ``b``.

        ``a``/``b`` must have the operand shapes; the result has shape :attr:`out_shape`.
        Each operator family's match (:class:`GemmMatch`, :class:`ConvMatch`,
        :class:`BandMatch`) writes its own.
        """
        raise NotImplementedError(f"{type(self).__name__} is not an operator family's match")

    def signature(self) -> str:
        """Short text like ``matmul[49x512 @ 512x4608]`` (logical operand shapes); written by
        each operator family's match, like :meth:`operator_expr`."""
        raise NotImplementedError(f"{type(self).__name__} is not an operator family's match")

    def describe(self) -> str:
        """Kind, attributes and operand preparation, one line."""
        ops = ", ".join(f"{op.role}={'view' if op.is_view else 'gather'}{list(op.shape)}"
                        for op in self.operands)
        attrs = ", ".join(f"{k}={v}" for k, v in self.attrs.items())
        return f"{self.signature()} ({attrs}; {ops})"


class GemmMatch(Match):
    """A scope matched as ``matmul`` or ``batch_matmul`` (:func:`match_gemm`)."""

    def operator_expr(self, a: Tensor, b: Tensor) -> Scope:
        return gemm_operator_expr(self, a, b)

    def signature(self) -> str:
        return gemm_signature(self.attrs)


class ConvMatch(Match):
    """A scope matched as ``conv2d`` (:func:`match_conv`)."""

    def operator_expr(self, a: Tensor, b: Tensor) -> Scope:
        return conv_expr(self, a, b)

    def signature(self) -> str:
        return conv_signature(self.attrs)


class BandMatch(Match):
    """A scope matched as ``g2bmm`` or ``gbmm`` (:func:`match_band`)."""

    def operator_expr(self, a: Tensor, b: Tensor) -> Scope:
        return band_expr(self, a, b)

    def signature(self) -> str:
        return band_signature(self.attrs)


# -- matmul / batch_matmul ------------------------------------------------------------------


def _gemm_roles(table: IterTable) -> Optional[Dict[str, List[Var]]]:
    roles: Dict[str, List[Var]] = {"batch": [], "M": [], "N": [], "K": []}
    names = {(True, True, True): "batch", (True, True, False): "M", (True, False, True): "N",
             (False, True, True): "K"}
    for v in table.loops + table.reduce:
        role = names.get(table.where(v))
        if role is None:
            return None
        roles[role].append(v)
    if not roles["K"]:
        return None
    return roles


def match_gemm(table: IterTable, batched: bool) -> List[GemmMatch]:
    """The ways ``table``'s scope is a matmul (``batched``: a batch_matmul): both operand orders
    (``A @ B`` and ``B^T @ A^T``), cheapest first, when they differ.

    The orders compute the same product; they differ in which operand layouts are free views
    and whether the output is the scope itself or needs a transposing eOperator. When both
    orders prepare the same amount of data only the first is kept (the list stays small).
    """
    roles = _gemm_roles(table)
    if roles is None or bool(roles["batch"]) != batched:
        return []
    cands = []
    for first in (0, 1):
        cand = _gemm_orientation(table, roles, first)
        cands.append((_prep_score(cand), first, cand))
    cands.sort(key=lambda t: t[:2])
    if cands[0][0] == cands[1][0]:
        return [cands[0][2]]
    return [cands[0][2], cands[1][2]]


def _prep_score(match: Match) -> Tuple[int, int, int]:
    """``(output needs an eOperator, gathers, gathered elements)``: lower is cheaper."""
    elems = sum(_size(op.shape) for op in match.operands if not op.is_view)
    return (int(not match.output_is_view()), match.gathers, elems)


def _size(shape: Sequence[int]) -> int:
    out = 1
    for s in shape:
        out *= int(s)
    return out


def _gemm_orientation(table: IterTable, roles: Dict[str, List[Var]],
                      first: int) -> GemmMatch:
    """Operator ``A @ B`` with ``A`` the read number ``first``."""
    ranges, loops = table.ranges, table.loops
    ra, rb = table.reads[first], table.reads[1 - first]
    m_role, n_role = ("M", "N") if first == 0 else ("N", "M")
    batch = _order_from((ra, rb), roles["batch"], loops, ranges)
    k = _order_from((ra, rb), roles["K"], table.reduce, ranges)
    m = _order_from((ra,), roles[m_role], _appearance(ra, roles[m_role]), ranges)
    n = _order_from((rb,), roles[n_role], _appearance(rb, roles[n_role]), ranges)

    def operand(role: str, read: Read, free: Tuple[Var, ...]) -> Tuple[Operand, bool]:
        """The operand laid out ``[batch, free, k]`` or ``[batch, k, free]`` (k first: True)."""
        lead = [batch] if batch else []
        free_first, k_first = lead + [free, k], lead + [k, free]
        for dims, flag in ((free_first, False), (k_first, True)):
            if _is_view(read, dims, ranges):
                return _make_operand(role, read, dims, ranges), flag
        order = _appearance(read, list(free) + list(k))
        flag = bool(order) and order[0] in k
        return _make_operand(role, read, k_first if flag else free_first, ranges), flag

    op_a, k_first_a = operand("A", ra, m)
    op_b, k_first_b = operand("B", rb, n)
    trans_a, trans_b = k_first_a, not k_first_b  # A is [M, K] and B is [K, N] untransposed
    ext = lambda g: _spec_extent(g, ranges)  # noqa: E731
    attrs: Dict[str, object] = {"M": ext(m), "N": ext(n), "K": ext(k),
                                "transpose_a": trans_a, "transpose_b": trans_b}
    out_dims: Tuple[Tuple[Var, ...], ...] = (m, n)
    kind = "matmul"
    if batch:
        attrs = {"batch": ext(batch), **attrs}
        out_dims = (batch, m, n)
        kind = "batch_matmul"
    shape = tuple(_spec_extent(g, ranges) for g in out_dims)
    return GemmMatch(kind, table.scope, attrs, (op_a, op_b), out_dims, shape)


def gemm_expr(kind: str, at: Mapping[str, object], a: Tensor, b: Tensor) -> Scope:
    """The canonical (batch) matmul ``L<b, m, n> Σ<k> { A[b, m, k] * B[b, k, n] }`` with the
    transposes of ``at`` (``A[k, m]`` / ``B[n, k]``)."""
    m, n, k, bv = Var("m"), Var("n"), Var("k"), Var("b")
    lead = (bv,) if kind == "batch_matmul" else ()
    ia = lead + ((k, m) if at["transpose_a"] else (m, k))
    ib = lead + ((n, k) if at["transpose_b"] else (k, n))
    loops = [IterVar(m, 0, at["M"]), IterVar(n, 0, at["N"])]
    if lead:
        loops.insert(0, IterVar(bv, 0, at["batch"]))
    return Scope(loops, [IterVar(k, 0, at["K"])], Access(a, ia) * Access(b, ib))


def gemm_operator_expr(match: Match, a: Tensor, b: Tensor) -> Scope:
    """:func:`gemm_expr` of a GEMM match (its kind and attributes) over ``a`` and ``b``."""
    return gemm_expr(match.kind, match.attrs, a, b)


def gemm_signature(at: Mapping[str, object]) -> str:
    """``matmul[MxK @ KxN]`` / ``batch_matmul[BxMxK @ BxKxN]`` from GEMM attributes."""
    lead = f"{at['batch']}x" if "batch" in at else ""
    name = "batch_matmul" if "batch" in at else "matmul"
    return f"{name}[{lead}{at['M']}x{at['K']} @ {lead}{at['K']}x{at['N']}]"


# -- conv2d -----------------------------------------------------------------------------------
#
# Roles over the iterator table (data = one read, weight = the other):
#   n   traversal, data only        (a group: flattened into the operator's N)
#   g   traversal, data and weight  (a group: the conv's channel groups, ``groups = |g|``)
#   f   traversal, weight only      (a group: output channels per group)
#   c   summation, data and weight  (a group: input channels per group)
#   oh  traversal, data only, read as ``stride*oh + dilation*r + offset`` on one data dim
#   r   summation, data and weight, the kernel iterator of that data dim
# The weight may index its dims with any form of g, f, c and r (``K[3*f + r, ...]`` after a
# conv5x5 -> conv3x3 derivation): it is then gathered into OIHW. The data must isolate each
# spatial pair on one dim; its other dims may be any form of n, g and c (gathered when needed).


@dataclass(frozen=True)
class _Spatial:
    """One spatial pair: data dim ``dim`` reads ``stride*oh + dilation*r + offset`` (box coords)."""

    dim: int
    oh: Var
    r: Optional[Var]
    stride: int
    dilation: int
    offset: int
    flip: bool = False  # the data reads ``- dilation*r``: r runs backwards over the kernel

    def is_plain(self, read: Read, ranges: Mapping[Var, IterVar]) -> bool:
        """The dim is exactly ``oh`` over the whole box (a kernel-1 axis, e.g. of a 1xk conv)."""
        return (self.r is None and self.stride == 1 and self.offset == 0
                and ranges[self.oh].extent == read.box_extent[self.dim])

    def window(self, ranges: Mapping[Var, IterVar]) -> int:
        """How many consecutive data positions the pair reads."""
        r_ext = ranges[self.r].extent if self.r is not None else 1
        return self.stride * (ranges[self.oh].extent - 1) + self.dilation * (r_ext - 1) + 1


@dataclass(frozen=True)
class _ConvRoles:
    data: Read
    weight: Read
    n: Tuple[Var, ...]
    g: Tuple[Var, ...]
    f: Tuple[Var, ...]
    c: Tuple[Var, ...]
    hw: Tuple[Optional[_Spatial], Optional[_Spatial]]


def match_conv(table: IterTable) -> Optional[ConvMatch]:
    """The cheapest conv2d reading of the table (either read as data; output-channel orders),
    None when the scope is no convolution."""
    best = None
    for first in (0, 1):
        roles = _conv_roles(table, first)
        if roles is None:
            continue
        f_orders = [_order_from((roles.weight,), roles.f, table.loops, table.ranges),
                    tuple(v for v in table.loops if v in roles.f)]
        for f in dict.fromkeys(f_orders):
            cand = _conv_match(table, replace(roles, f=f))
            score = (cand.gathers, not cand.output_is_view())
            if best is None or score < best[0]:
                best = (score, cand)
    return best[1] if best is not None else None


def _spatial_of(form: Optional[Form], outs: frozenset, sums: frozenset,
                ranges: Mapping[Var, IterVar]) -> Optional[_Spatial]:
    """``stride*oh + dilation*r + offset`` (or ``stride*oh + offset``) as a pair, else None.

    A negative kernel coefficient (``h - r``, as in derived transposed convolutions) is a
    flipped kernel: with ``r' = R-1-r`` the read is ``stride*oh + |d|*r' + offset - |d|*(R-1)``
    and the weight is gathered at ``R-1-r'``.
    """
    if form is None:
        return None
    coeffs, off = form
    oh = [v for v in coeffs if v in outs]
    r = [v for v in coeffs if v in sums]
    if len(oh) != 1 or len(r) > 1 or len(coeffs) != 1 + len(r) or coeffs[oh[0]] < 1:
        return None
    if not r:
        return _Spatial(-1, oh[0], None, coeffs[oh[0]], 1, off)
    dil = coeffs[r[0]]
    if dil > 0:
        return _Spatial(-1, oh[0], r[0], coeffs[oh[0]], dil, off)
    return _Spatial(-1, oh[0], r[0], coeffs[oh[0]], -dil, off + dil * (ranges[r[0]].extent - 1),
                    True)


def _flip_read(read: Read, flips: Mapping[Var, int]) -> Optional[Read]:
    """``read`` with each iterator ``r`` of ``flips`` (to its extent) replaced by ``R-1-r``."""
    if not flips:
        return read
    forms = []
    for form, dv in zip(read.forms, read.dim_vars):
        if form is None:
            if dv & set(flips):
                return None
            forms.append(form)
            continue
        coeffs, const = dict(form[0]), form[1]
        for r, ext in flips.items():
            if r in coeffs:
                const += coeffs[r] * (ext - 1)
                coeffs[r] = -coeffs[r]
        forms.append((coeffs, const))
    return replace(read, forms=tuple(forms), memo={})


def _conv_roles(table: IterTable, first: int) -> Optional[_ConvRoles]:
    ranges = table.ranges
    data, weight = table.reads[first], table.reads[1 - first]
    loopset = set(table.loops)
    dvars, wvars = data.vars(), weight.vars()
    for v in table.loops + table.reduce:
        if v not in dvars and v not in wvars:
            return None  # a broadcast output dim or an unread summation: not an operator
        if v not in loopset and not (v in dvars and v in wvars):
            return None
    outs = frozenset(v for v in table.loops if v in dvars and v not in wvars)
    sums = frozenset(v for v in table.reduce)
    strong, weak = [], []
    for d, form in enumerate(data.forms):
        sp = _spatial_of(form, outs, sums, ranges)
        if sp is None:
            continue
        sp = replace(sp, dim=d)
        if any(k != d and (sp.oh in s or sp.r in s) for k, s in enumerate(data.dim_vars)):
            continue  # the pair's iterators are read elsewhere too: not separable
        (strong if sp.r is not None else weak).append(sp)
    if len(strong) > 2:
        return None
    spatial = list(strong)
    bent = [s for s in weak if not s.is_plain(data, ranges)]
    if len(spatial) + len(bent) <= 2:
        spatial += bent  # strided / offset kernel-1 axes
    if len(spatial) == 1:
        extra = _adjacent_plain_axis(data, spatial[0], weak, ranges)
        if extra is not None:
            spatial.append(extra)
    if not spatial:
        return None  # no spatial axis: a matmul, not a convolution
    spatial.sort(key=lambda s: s.dim)
    used = {s.oh for s in spatial} | {s.r for s in spatial if s.r is not None}
    n = tuple(v for v in table.loops if v in outs and v not in used)
    g = tuple(v for v in table.loops if v in dvars and v in wvars)
    f = tuple(v for v in table.loops if v not in dvars)
    c = tuple(v for v in table.reduce if v not in used)
    spatial_dims = {s.dim for s in spatial}
    for d, s in enumerate(data.dim_vars):
        if d not in spatial_dims and s & used:
            return None
    hw = (None, spatial[0]) if len(spatial) == 1 else (spatial[0], spatial[1])
    weight = _flip_read(weight, {s.r: ranges[s.r].extent for s in spatial if s.flip})
    if weight is None:
        return None
    return _ConvRoles(
        data, weight,
        _order_from((data,), n, table.loops, ranges),
        _order_from((data, weight), g, table.loops, ranges),
        f,
        _order_from((data, weight), c, table.reduce, ranges),
        hw,
    )


def _adjacent_plain_axis(data: Read, sp: _Spatial, weak: Sequence[_Spatial],
                         ranges: Mapping[Var, IterVar]) -> Optional[_Spatial]:
    """The kernel-1 spatial axis of a 1xk / kx1 conv: a plain data dim next to the other one.

    The dim right after the spatial one is preferred (``h + r, w`` is kx1), then the one right
    before it (``h, w + s`` is 1xk). Dims with constant indices are skipped.
    """
    dims = [d for d, s in enumerate(data.dim_vars) if s]
    pos = dims.index(sp.dim)
    plain = {s.dim: s for s in weak if s.is_plain(data, ranges)}
    for k in (pos + 1, pos - 1):
        if 0 <= k < len(dims) and dims[k] in plain:
            return plain[dims[k]]
    return None


def _insert_missing(letters: str, order: str) -> str:
    """Complete a layout with the unit dims it lacks: ``order[0]`` in front, ``order[1]`` after
    it, the first spatial letter before the second, the second after the first (or last)."""
    n, c, h, w = order
    if n not in letters:
        letters = n + letters
    if c not in letters:
        letters = letters.replace(n, n + c)
    if h not in letters:
        letters = letters.replace(w, h + w) if w in letters else letters + h
    if w not in letters:
        letters = letters.replace(h, h + w)
    return letters


def _layout_of(letters: Sequence[Optional[str]]) -> Optional[str]:
    """Collapse per-dim letters into a layout; None when a letter's dims are not contiguous."""
    out: List[str] = []
    for letter in letters:
        if letter is None:
            return None
        if out and out[-1] == letter:
            continue
        if letter in out:
            return None
        out.append(letter)
    return "".join(out)


def _read_letters(read: Read, letter_of) -> Optional[str]:
    """The layout a read's dims spell (dims with constant indices on unit extents skipped)."""
    letters = []
    for d, dv in enumerate(read.dim_vars):
        if not dv:
            if read.box_extent[d] == 1:
                continue
            return None
        letters.append(letter_of(d, dv))
    return _layout_of(letters)


def _conv_data(table: IterTable, roles: _ConvRoles):
    """The data operand, its layout and the spatial paddings: a view when the spatial reads
    have non-negative zero padding and whole dims, else a gather into NCHW (padding then part
    of the gather)."""
    ranges, data = table.ranges, roles.data
    hw = dict(zip("HW", roles.hw))
    n, g, c = roles.n, roles.g, roles.c
    pads = {}
    for letter, s in hw.items():
        if s is None:
            pads[letter] = (0, 0)
            continue
        lo, hi = -s.offset, s.window(ranges) + s.offset - data.box_extent[s.dim]
        if -s.stride < hi < 0:
            hi = 0  # the last window ends inside the data; the conv's floor division drops it
        pads[letter] = (lo, hi)
    spatial_letter = {s.dim: letter for letter, s in hw.items() if s is not None}
    nset, gcset = set(n), set(g) | set(c)

    def data_letter(d: int, dv: frozenset) -> Optional[str]:
        if d in spatial_letter:
            return spatial_letter[d]
        return "N" if dv <= nset else ("C" if dv <= gcset else None)

    def data_dims(layout: str, view: bool) -> List[DimSpec]:
        dims: List[DimSpec] = []
        for letter in layout:
            if letter in "NC":
                dims.append(n if letter == "N" else g + c)
                continue
            s = hw[letter]
            if s is None:
                dims.append(())
            elif view and s.is_plain(data, ranges):
                dims.append((s.oh,))
            elif view:
                dims.append(Compound(s.dim, data.box_extent[s.dim], 0))
            else:
                dims.append(Compound(s.dim, s.window(ranges), s.offset))
        return dims

    padded = any(lo or hi for lo, hi in pads.values())
    view_ok = all(lo >= 0 and hi >= 0 for lo, hi in pads.values()) and (
        data.margin_is_zero or not padded)
    data_layout = _read_letters(data, data_letter) if view_ok else None
    op_data = None
    if data_layout is not None:
        data_layout = _insert_missing(data_layout, "NCHW")
        op_data = _make_operand("data", data, data_dims(data_layout, True), ranges, "y")
    if op_data is None or not op_data.is_view:
        data_layout = "NCHW"
        pads = {"H": (0, 0), "W": (0, 0)}
        op_data = _make_operand("data", data, data_dims(data_layout, False), ranges, "y")
    return op_data, data_layout, pads


def _conv_weight(table: IterTable, roles: _ConvRoles):
    """The weight operand and its layout: O = (g, f), I = c, H/W the kernel iterators; any
    index form is gathered to OIHW."""
    ranges, weight = table.ranges, roles.weight
    g, f, c = roles.g, roles.f, roles.c
    rs = {letter: (s.r if s is not None else None) for letter, s in zip("HW", roles.hw)}
    ofs, cs = set(g) | set(f), set(c)

    def weight_letter(_d: int, dv: frozenset) -> Optional[str]:
        if dv <= ofs:
            return "O"
        if dv <= cs:
            return "I"
        for letter, r in rs.items():
            if r is not None and dv == {r}:
                return letter
        return None

    def weight_dims(layout: str) -> List[DimSpec]:
        groups = {"O": g + f, "I": c}
        return [groups[x] if x in groups else ((rs[x],) if rs[x] is not None else ())
                for x in layout]

    kernel_layout = _read_letters(weight, weight_letter)
    op_weight = None
    if kernel_layout is not None:
        kernel_layout = _insert_missing(kernel_layout, "OIHW")
        op_weight = _make_operand("weight", weight, weight_dims(kernel_layout), ranges)
    if op_weight is None or not op_weight.is_view:
        kernel_layout = "OIHW"
        op_weight = _make_operand("weight", weight, weight_dims(kernel_layout), ranges)
    return op_weight, kernel_layout


def _conv_output(table: IterTable, roles: _ConvRoles):
    """The output layout and dims: the scope's loop order when each role's loops are
    contiguous, else NCHW."""
    ranges, hw = table.ranges, dict(zip("HW", roles.hw))
    oletter = {v: "N" for v in roles.n}
    oletter.update({v: "C" for v in roles.g + roles.f})
    oletter.update({s.oh: letter for letter, s in hw.items() if s is not None})
    out_layout = _layout_of([oletter[v] for v in table.loops if ranges[v].extent > 1])
    out_layout = _insert_missing(out_layout if out_layout is not None else "NCHW", "NCHW")
    ogroups = {"N": roles.n, "C": roles.g + roles.f}
    ogroups.update({x: ((s.oh,) if s is not None else ()) for x, s in hw.items()})
    return out_layout, tuple(tuple(ogroups[x]) for x in out_layout)


def _conv_match(table: IterTable, roles: _ConvRoles) -> "ConvMatch":
    """The conv2d of ``roles``: its data, weight and output (:func:`_conv_data`,
    :func:`_conv_weight`, :func:`_conv_output`) and attributes."""
    ranges, hw = table.ranges, dict(zip("HW", roles.hw))
    ext = lambda grp: _spec_extent(grp, ranges)  # noqa: E731
    op_data, data_layout, pads = _conv_data(table, roles)
    in_h, in_w = (op_data.shape[data_layout.index(x)] for x in "HW")
    op_weight, kernel_layout = _conv_weight(table, roles)
    out_layout, out_dims = _conv_output(table, roles)

    def attr_of(letter, key):
        s = hw[letter]
        if s is None:
            return 1
        return {"stride": s.stride, "dilation": s.dilation,
                "kernel": ranges[s.r].extent if s.r is not None else 1,
                "out": ranges[s.oh].extent}[key]

    groups = ext(roles.g)
    attrs: Dict[str, object] = {
        "N": ext(roles.n), "C": groups * ext(roles.c), "H": in_h, "W": in_w,
        "F": groups * ext(roles.f),
        "R": attr_of("H", "kernel"), "S": attr_of("W", "kernel"),
        "OH": attr_of("H", "out"), "OW": attr_of("W", "out"),
        "stride": (attr_of("H", "stride"), attr_of("W", "stride")),
        "dilation": (attr_of("H", "dilation"), attr_of("W", "dilation")),
        "padding": (pads["H"][0], pads["W"][0], pads["H"][1], pads["W"][1]),
        "groups": groups,
        "data_layout": data_layout, "kernel_layout": kernel_layout, "out_layout": out_layout,
    }
    shape = tuple(_spec_extent(grp, ranges) for grp in out_dims)
    return ConvMatch("conv2d", table.scope, attrs, (op_data, op_weight), out_dims, shape)


def conv_expr(match: Match, data: Tensor, weight: Tensor) -> Scope:
    """``out[n, o, oh, ow] = Σ_{c,r,s} D[n, grp(o)*Cg + c, ..] * W[o, c, r, s]`` (grouped)."""
    at = match.attrs
    groups = at.get("groups", 1)
    c_per, f_per = at["C"] // groups, at["F"] // groups
    pl_h, pl_w, ph_h, ph_w = at["padding"]
    v = {ch: Var(nm) for ch, nm in zip("NCHWrs", ("n", "f", "oh", "ow", "r", "s"))}
    cv = Var("c")
    sizes_out = {"N": at["N"], "C": at["F"], "H": at["OH"], "W": at["OW"]}
    loops = [IterVar(v[ch], 0, sizes_out[ch]) for ch in at["out_layout"]]
    reduce = [IterVar(cv, 0, c_per), IterVar(v["r"], 0, at["R"]), IterVar(v["s"], 0, at["S"])]
    (sh, sw), (dh, dw) = at["stride"], at["dilation"]
    if groups == 1:
        channel: Node = cv
    elif f_per == 1:
        channel = build_linear({v["C"]: c_per, cv: 1}, 0, (v["C"], cv))
    else:
        channel = (v["C"] // f_per) * c_per + cv
    didx = {"N": v["N"], "C": channel,
            "H": build_linear({v["H"]: sh, v["r"]: dh}, -pl_h, (v["H"], v["r"])),
            "W": build_linear({v["W"]: sw, v["s"]: dw}, -pl_w, (v["W"], v["s"]))}
    pads = {"N": (0, 0), "C": (0, 0), "H": (pl_h, ph_h), "W": (pl_w, ph_w)}
    lay = at["data_layout"]
    dpad = [pads[ch] for ch in lay]
    dread = Access(data.with_pad(dpad), [didx[ch] for ch in lay])
    widx = {"O": v["C"], "I": cv, "H": v["r"], "W": v["s"]}
    wread = Access(weight, [widx[ch] for ch in at["kernel_layout"]])
    return Scope(loops, reduce, dread * wread)


def conv_signature(at: Mapping[str, object]) -> str:
    """``conv2d[NxCxHxW * FxCgxRxS s2x2 d1x1 p1,1,1,1 g2]`` from conv attributes (stride,
    dilation, padding and groups only when not the default)."""
    groups = at.get("groups", 1)
    extra = []
    if at["stride"] != (1, 1):
        extra.append(f"s{at['stride'][0]}x{at['stride'][1]}")
    if at["dilation"] != (1, 1):
        extra.append(f"d{at['dilation'][0]}x{at['dilation'][1]}")
    if any(at["padding"]):
        extra.append("p" + ",".join(str(p) for p in at["padding"]))
    if groups != 1:
        extra.append(f"g{groups}")
    tail = (" " + " ".join(extra)) if extra else ""
    return (f"conv2d[{at['N']}x{at['C']}x{at['H']}x{at['W']} * "
            f"{at['F']}x{at['C'] // groups}x{at['R']}x{at['S']}{tail}]")


# -- g2bmm / gbmm -----------------------------------------------------------------------------


def _band_roles(table: IterTable, w_is_loop: bool):
    """Common analysis of G2BMM/GBMM: the band read ``B[.., m + D*w - D*W, ..]``.

    Returns ``(a_read, b_read, m, w, band_dim, D, W)`` -- ``m`` plain in A, ``w`` the window
    iterator (a loop for g2bmm, a summation for gbmm), the band index ``m + D*w - D*W`` on
    dimension ``band_dim`` of B -- or None.
    """
    for first in (0, 1):
        ra, rb = table.reads[first], table.reads[1 - first]
        aseq = _plain_sequence(ra, table.ranges)
        if aseq is None:
            continue
        band = [d for d, form in enumerate(rb.forms) if form is not None and len(form[0]) == 2]
        if len(band) != 1:
            continue
        d = band[0]
        coeffs, off = rb.forms[d]
        ms = [v for v, cf in coeffs.items() if cf == 1 and v in table.loops and v in aseq]
        for m in ms:
            (w, dil), = [(v, cf) for v, cf in coeffs.items() if v is not m]
            if dil < 1 or (w in table.loops) != w_is_loop:
                continue
            width2 = table.extent(w) - 1
            if width2 % 2 or off != -dil * (width2 // 2):
                continue
            if table.extent(m) != rb.box_extent[d] or not rb.margin_is_zero:
                continue
            if (m in rb.vars() - rb.dim_vars[d]) or any(
                    w in s for k, s in enumerate(rb.dim_vars) if k != d):
                continue
            return ra, rb, m, w, d, dil, width2 // 2
    return None


def match_band(table: IterTable, kind: str) -> Optional[BandMatch]:
    """``table``'s scope as a banded operator ``kind`` (``"g2bmm"``: ``A[b, i, k]`` against a
    band of ``B`` rows, the window a loop; ``"gbmm"``: the window a summation), else None."""
    w_is_loop = kind == "g2bmm"
    found = _band_roles(table, w_is_loop)
    if found is None:
        return None
    ra, rb, m, w, d, dil, half = found
    ranges = table.ranges
    batch, other = [], []
    for v in table.loops + table.reduce:
        if v in (m, w):
            continue
        in_a = v in ra.vars()
        in_b = v in rb.vars()
        is_loop = v in table.loops
        if is_loop and in_a and in_b:
            batch.append(v)
        elif kind == "g2bmm" and not is_loop and in_a and in_b:
            other.append(v)
        elif kind == "gbmm" and is_loop and in_b and not in_a:
            other.append(v)
        else:
            return None
    if kind == "g2bmm" and not other:
        return None
    if w in ra.vars() if kind == "g2bmm" else w not in ra.vars():
        return None
    if m not in ra.vars():
        return None
    batch_t = _order_from((ra, rb), batch, table.loops, ranges)
    other_t = _order_from((rb, ra), other, table.loops + table.reduce, ranges)
    length = ranges[m].extent
    if kind == "g2bmm":
        a_dims = [batch_t, (m,), other_t]
    else:
        a_dims = [batch_t, (m,), (w,)]
    op_a = _make_operand("A", ra, a_dims, ranges)
    b_dims = [batch_t, Compound(d, length, 0), other_t]
    op_b = _make_operand("B", rb, b_dims, ranges)
    ext = lambda g: _spec_extent(g, ranges)  # noqa: E731
    attrs: Dict[str, object] = {"batch": ext(batch_t), "length": length, "width": half,
                                "dilation": dil}
    if kind == "g2bmm":
        attrs["K"] = ext(other_t)
        out_dims = (batch_t, (m,), (w,))
    else:
        attrs["N"] = ext(other_t)
        out_dims = (batch_t, (m,), other_t)
    shape = tuple(_spec_extent(g, ranges) for g in out_dims)
    return BandMatch(kind, table.scope, attrs, (op_a, op_b), out_dims, shape)


def band_expr(match: Match, a: Tensor, b: Tensor) -> Scope:
    """The canonical g2bmm / gbmm of a band match over ``a`` and ``b`` (``b`` zero-padded by
    ``dilation * width`` along the band)."""
    at = match.attrs
    bv, i, j, x = Var("b"), Var("i"), Var("j"), Var("k" if match.kind == "g2bmm" else "n")
    dil, half = at["dilation"], at["width"]
    band = build_linear({i: 1, j: dil}, -dil * half, (i, j))
    bpad = b.with_pad([(0, 0), (dil * half, dil * half), (0, 0)])
    win = IterVar(j, 0, 2 * half + 1)
    if match.kind == "g2bmm":
        loops = [IterVar(bv, 0, at["batch"]), IterVar(i, 0, at["length"]), win]
        body = Access(a, (bv, i, x)) * Access(bpad, (bv, band, x))
        return Scope(loops, [IterVar(x, 0, at["K"])], body)
    loops = [IterVar(bv, 0, at["batch"]), IterVar(i, 0, at["length"]), IterVar(x, 0, at["N"])]
    body = Access(a, (bv, i, j)) * Access(bpad, (bv, band, x))
    return Scope(loops, [win], body)


def band_signature(at: Mapping[str, object]) -> str:
    """``g2bmm[BxLxK, w=W, d=D]`` / ``gbmm[BxLx(2W+1) @ BxLxN, d=D]`` from band attributes."""
    if "K" in at:
        return (f"g2bmm[{at['batch']}x{at['length']}x{at['K']}, w={at['width']}, "
                f"d={at['dilation']}]")
    return (f"gbmm[{at['batch']}x{at['length']}x{2 * at['width'] + 1} @ "
            f"{at['batch']}x{at['length']}x{at['N']}, d={at['dilation']}]")
