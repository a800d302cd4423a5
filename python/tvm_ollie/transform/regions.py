"""Regions: connected subgraphs of liftable calls around one compute-heavy operator.

A region starts at a compute-heavy call (:data:`HEAVY_OPS`) of a dataflow block and grows

* up through *producers* that only move data (:data:`MOVE_OPS`: pad, reshape, permute,
  strided_slice, take with an affine constant index, ...) and whose every use is inside the
  region, so that the heavy operator reads its operands through them; and
* down through *consumers* (data movement, elementwise, activation, reduction: any call with a
  registered lift) that read exactly one region value, as long as the region's current output
  has no other use,

up to :data:`MAX_CALLS` calls. A value used outside the region is never swallowed: growth stops
there, so a region has a single output and can be replaced as a whole.

A region lifts into one expression (:func:`Region.lift`): each call is lifted alone and its
reads of region values are replaced by the producers' scopes (nested scopes; a padded read of a
producer becomes the producer's scope with output padding). The derivation then merges the
stages it can, which is how ``pad + take + reshape/permute + matmul`` reaches the G2BMM/GBMM
matchers.

A heavy call without data-movement producers is a region of one call: the pass decides it
exactly as it always did (its epilogues are folded into library kernels by :mod:`.epilogue`).

The def-use facts of a dataflow block (:class:`BlockFacts`) are shared with the shared-input
groups of :mod:`.groups`, which are built on regions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from ..codegen.library import current_device
from ..compat import relax, tvm
from ..config import DEFAULTS
from ..derive.program import Program, map_accesses, stage_merge
from ..ir.nodes import (Access, BinOp, Const, IterVar, Scope, Tensor, free_vars, fresh_var,
                        iter_nodes, scope_var_names, substitute)
from ..ir.simplify import simplify
from ..lift import LiftError, Operands, lift_relax_call
from ..lift.common import is_identifier
from .emit import EmitError
from .layout_absorb import AbsorbedConv, absorbed_conv
from .units import build_isolated_module

__all__ = ["BlockFacts", "HEAVY_OPS", "MAX_CALLS", "MOVE_OPS", "Region", "find_regions",
           "flatten", "inputs_text", "isolated_region_module", "outside_uses", "rebind_arg",
           "static_tensor", "used_vars", "var_name", "dataflow_blocks"]

#: Operators a region is built around.
HEAVY_OPS = (
    "relax.nn.conv1d", "relax.nn.conv2d", "relax.nn.conv3d",
    "relax.nn.conv1d_transpose", "relax.nn.conv2d_transpose", "relax.nn.conv3d_transpose",
    "relax.matmul",
)
#: Producers a region grows through (they only move or pad data).
MOVE_OPS = (
    "relax.nn.pad", "relax.reshape", "relax.permute_dims", "relax.strided_slice",
    "relax.take", "relax.gather_nd", "relax.expand_dims", "relax.squeeze", "relax.flatten",
    "relax.broadcast_to",
    "relax.concat",
)
#: Ops whose second operand is a constant index tensor (consumed by the lift, not an input).
_GATHERS = ("relax.take", "relax.gather_nd")
#: Default bound on the calls of one region (:attr:`OllieConfig.region_calls`).
MAX_CALLS = DEFAULTS.region_calls

_CONST = tvm.ir.expr.Constant


def var_name(var) -> str:
    """The name a Relax variable prints with (``""`` for an unnamed value)."""
    return str(getattr(var, "name", None) or getattr(var, "name_hint", ""))


def static_tensor(expr) -> bool:
    """Whether ``expr`` is a tensor of a fully known (integer) shape."""
    ty = expr.ty
    if not isinstance(ty, relax.TensorType) or ty.shape is None:
        return False
    try:
        [int(s) for s in ty.shape]
    except (TypeError, ValueError):
        return False
    return True


def _leaves(args) -> list:
    out = []
    for a in args:
        if isinstance(a, relax.Tuple):
            out.extend(_leaves(a.fields))
        else:
            out.append(a)
    return out


@dataclass
class Region:
    """One region of a dataflow block.

    Attributes
    ----------
    function : str
        The Relax function.
    bindings : list of relax.VarBinding
        The region's calls in block order; the last one computes :attr:`output`.
    heavy : relax.Var
        The variable of the compute-heavy call the region was grown from.
    """

    function: str
    bindings: List[object]
    heavy: object
    mod: Optional[object] = field(default=None, repr=False)
    #: members that stay bound when the region is replaced (their shape is read outside)
    keep: frozenset = field(default=frozenset(), repr=False)
    _expr: Optional[Scope] = field(default=None, repr=False)
    _inputs: Optional[List[Tuple[str, object]]] = field(default=None, repr=False)
    _forms: Dict[str, Optional[AbsorbedConv]] = field(default_factory=dict, repr=False)

    is_region = True

    @property
    def output(self):
        """The variable of the region's result."""
        return self.bindings[-1].var

    @property
    def heavy_call(self):
        """The compute-heavy call the region was grown from."""
        return next(b.value for b in self.bindings if b.var.same_as(self.heavy))

    @property
    def out_shape(self) -> Tuple[int, ...]:
        """Static shape of the region's result."""
        return tuple(int(s) for s in self.output.ty.shape)

    @property
    def size(self) -> int:
        return len(self.bindings)

    @property
    def calls(self) -> List[object]:
        return [b.value for b in self.bindings]

    @property
    def op_names(self) -> List[str]:
        """Operator of each call (``relax.call_tir:<PrimFunc>`` for ``call_tir``)."""
        return [_op_label(c) for c in self.calls]

    def describe(self) -> str:
        """``lv31 = matmul(reshape(permute_dims(take(pad(lv14)))), ...)``-like one-line summary:
        the calls in order, each ``var=op``."""
        return ", ".join(f"{var_name(b.var)}={_op_label(b.value).replace('relax.', '')}"
                         for b in self.bindings)

    # -- inputs and the lifted expression ----------------------------------------------------

    def _members(self) -> Dict[int, object]:
        return {hash(b.var): b for b in self.bindings}

    def inputs(self) -> List[Tuple[str, object]]:
        """``(name, value)`` of every tensor the region reads from outside, first use first.

        Variables keep their name when it is an identifier no other input has; constants are
        ``const<k>``; others ``in<k>``. Constant index tensors of lifted ``take`` calls are not
        inputs (the lift consumed them).
        """
        if self._inputs is not None:
            return self._inputs
        members = self._members()
        values: List[object] = []
        seen = set()
        for b in self.bindings:
            for a in _leaves(b.value.args):
                if not isinstance(a.ty, relax.TensorType) or hash(a) in members:
                    continue
                if b.value.op.name in _GATHERS and a is not b.value.args[0] and \
                        isinstance(a, _CONST):
                    continue
                if isinstance(a, _CONST) and _scalar(a):
                    continue
                if hash(a) not in seen:
                    seen.add(hash(a))
                    values.append(a)
        counts: Dict[str, int] = {}
        for v in values:
            if isinstance(v, relax.Var):
                counts[var_name(v)] = counts.get(var_name(v), 0) + 1
        out, n_const, taken = [], 0, set()
        for k, v in enumerate(values):
            if isinstance(v, relax.Var) and is_identifier(var_name(v)) and counts[var_name(v)] == 1:
                name = var_name(v)
            elif isinstance(v, _CONST):
                name, n_const = f"const{n_const}", n_const + 1
            else:
                name = f"in{k}"
            while name in taken:
                name += "_"
            taken.add(name)
            out.append((name, v))
        self._inputs = out
        return out

    def lift(self) -> Scope:
        """The region's result as one expression (producers as nested scopes)."""
        if self._expr is not None:
            return self._expr
        members = self._members()
        input_name = {hash(v): n for n, v in self.inputs()}
        scopes: Dict[int, Scope] = {}
        for b in self.bindings:
            call = b.value
            expr = lift_relax_call(call, self.mod)
            ops = Operands(call, self.mod)
            by_name = {}
            for a in _leaves(call.args):
                if isinstance(a.ty, relax.TensorType):
                    by_name.setdefault(ops.name(a), a)

            def rebind(acc: Access, by_name=by_name):
                src = acc.source
                if not isinstance(src, Tensor):
                    return None
                arg = by_name.get(src.name)
                if arg is None:
                    raise LiftError(f"region: unknown operand {src.name}")
                key = hash(arg)
                if key in members:
                    inner = scopes[key]
                    if any(lo or hi for lo, hi in src.pad):
                        if src.pad_value != 0.0:
                            raise LiftError("region: a non-zero padded read of a region value")
                        inner = inner.replace(pad=src.pad)
                    return Access(inner, acc.indices)
                if key not in input_name:
                    raise LiftError(f"region: operand {src.name} is neither an input nor "
                                    "a region value")
                t = Tensor(input_name[key], src.shape, src.dtype, src.pad, src.pad_value)
                return Access(t, acc.indices)

            scopes[hash(b.var)] = map_accesses(expr, rebind)
        self._expr = flatten(scopes[hash(self.output)])
        return self._expr

    def signature(self) -> str:
        """Equal for regions that compute the same expression on the same input shapes."""
        ins = inputs_text(self.inputs())
        return f"region[{' '.join(o.replace('relax.', '') for o in self.op_names)}] {ins} " \
               f"{self.lift()}"

    def with_input_names(self, inputs: List[Tuple[str, object]]) -> "Region":
        """Name the region's inputs as ``inputs`` (every tensor it reads, and possibly more) and
        return the region: a part of a larger unit lifts over that unit's names."""
        self._inputs = list(inputs)
        self._expr = None
        return self

    def isolated_module(self, program: Optional[Program] = None,
                        names: Optional[Sequence[str]] = None,
                        impl: str = "tvm") -> "tvm.IRModule":
        """:func:`isolated_region_module` of this region."""
        return isolated_region_module(self, program, names, impl)

    def library_form(self) -> Optional[AbsorbedConv]:
        """The region as one library convolution with its layout permutations, bias and
        activation absorbed (:func:`~.layout_absorb.absorbed_conv`), or None."""
        device = current_device()
        if device not in self._forms:
            self._forms[device] = absorbed_conv(self.bindings, self.heavy)
        return self._forms[device]

    def replay(self, bb: "relax.BlockBuilder", values: Dict[str, object], funcs=None,
               impl: str = "tvm"):
        """Emit the region's original calls on ``values`` (by input name; ``funcs`` maps the
        callees of ``call_tir`` to the builder's copies), or with ``impl="native"`` its
        :meth:`library_form`; return the output (not bound)."""
        env = {hash(v): values[n] for n, v in self.inputs()}
        env.update(funcs or {})
        if impl != "tvm":
            form = self.library_form()
            if form is None:
                raise EmitError("the region has no library form")
            return form.emit(bb, self.bindings, env)
        out = None
        for k, b in enumerate(self.bindings):
            call = b.value
            args = [rebind_arg(a, env) for a in call.args]
            new = relax.Call(call.op, args, call.attrs, call.ty_args)
            if k == len(self.bindings) - 1:
                out = new
            else:
                env[hash(b.var)] = bb.emit(new)
        return out


def inputs_text(inputs: Sequence[Tuple[str, object]]) -> str:
    """``4x128:float32:c 128:float32:v``: shape, dtype and constness of each input, for
    signatures. Constness is part of a decision: what a program computes from constants alone
    is folded at compile time (:func:`~tvm_ollie.tune.analytic.folded_stages`), so the same
    rewrite can win on constant weights and lose on weights fed at run time."""
    return " ".join(f"{'x'.join(str(int(s)) for s in v.ty.shape)}:{v.ty.dtype}:"
                    f"{'c' if isinstance(v, _CONST) else 'v'}" for _, v in inputs)


def flatten(scope: Scope) -> Scope:
    """Merge the stages of a lifted region where that is exact, then simplify indices.

    Two equations, applied bottom-up: a read of a stage without reduction or padding is its
    body with the loop iterators replaced by the read's indices (stage merging); a stage whose
    whole body is one read of a reducing stage without padding becomes that reduction
    (``L<x> { (L<y> Σ<k> f(y, k))[g(x)] } = L<x> Σ<k> f(g(x), k)``). What remains nested (padded
    stages, reads of reductions under arithmetic) stays nested.
    """
    merged = map_accesses(scope, stage_merge)
    merged = simplify(_merge_reduction(merged))
    return simplify(_split_loops(_drop_unit_loops(merged)))


def _drop_unit_loops(scope: Scope) -> Scope:
    """Loops of extent 1 (without padding) read as 0: the same elements in the same row-major
    order, one dimension fewer (the emitted result is viewed back in the original shape)."""
    keep = [iv for iv, (lo, hi) in zip(scope.loops, scope.pad) if iv.extent != 1 or lo or hi]
    if len(keep) == len(scope.loops) or not keep or any(iv.begin for iv in scope.loops):
        return scope
    pad = [p for iv, p in zip(scope.loops, scope.pad) if iv in keep]
    body = substitute(scope.body, {iv.var: 0 for iv in scope.loops if iv not in keep})
    return Scope(keep, scope.reduce, body, pad, scope.reducer)


def _split_loops(scope: Scope) -> Scope:
    """A loop ``v`` read only as ``v // c`` and ``v % c`` becomes two loops ``(v // c, v % c)``
    (row-major: the same elements in the same order)."""
    if any(lo or hi for lo, hi in scope.pad) or any(iv.begin for iv in scope.loops):
        return scope
    loops = list(scope.loops)
    body = scope.body
    taken = scope_var_names(scope)
    k = 0
    while k < len(loops):
        iv = loops[k]
        c = _div_mod_factor(body, iv.var)
        if c is None or iv.extent % c or c in (1, iv.extent):
            k += 1
            continue
        hi_v, lo_v = fresh_var(taken, iv.var.name + "_"), None
        taken.add(hi_v.name)
        lo_v = fresh_var(taken, iv.var.name + "_")
        taken.add(lo_v.name)
        body = substitute(body, {BinOp("//", iv.var, c): hi_v, BinOp("%", iv.var, c): lo_v})
        if iv.var in free_vars(body):
            return scope
        loops[k:k + 1] = [IterVar(hi_v, 0, iv.extent // c), IterVar(lo_v, 0, c)]
    if len(loops) == len(scope.loops):
        return scope
    return Scope(loops, scope.reduce, body, None, scope.reducer)


def _div_mod_factor(body, var) -> Optional[int]:
    """``c`` when ``var`` occurs in ``body`` (outside nested scopes) as ``var // c`` or
    ``var % c`` with one constant ``c``, else None."""
    factors = set()
    for node in iter_nodes(body):
        if isinstance(node, Scope):
            continue
        if isinstance(node, BinOp) and node.op in ("//", "%") and node.a is var and \
                isinstance(node.b, Const):
            factors.add(int(node.b.value))
    return factors.pop() if len(factors) == 1 else None


def _merge_reduction(scope: Scope) -> Scope:
    body = scope.body
    if scope.reduce or not isinstance(body, Access) or not isinstance(body.source, Scope):
        return scope
    inner = body.source
    if not inner.reduce or any(lo or hi for lo, hi in inner.pad) or \
            any(iv.begin for iv in inner.loops):
        return scope
    taken = {iv.var.name for iv in scope.loops} | scope_var_names(inner)
    mapping, reduce = {}, []
    for iv in inner.reduce:
        v = fresh_var(taken, iv.var.name)
        taken.add(v.name)
        mapping[iv.var] = v
        reduce.append(IterVar(v, iv.begin, iv.end))
    for iv, idx in zip(inner.loops, body.indices):
        mapping[iv.var] = idx
    new_body = substitute(inner.body, mapping)
    return Scope(scope.loops, reduce, new_body, scope.pad, inner.reducer)


def _op_label(call) -> str:
    name = call.op.name
    if name == "relax.call_tir":
        return f"{name}:{call.args[0].name_hint}"
    return name


def rebind_arg(arg, env: Dict[int, object]):
    """``arg`` with every value that ``env`` maps (by hash) replaced, inside tuples too: a call's
    argument re-read on the values an isolated module or a replay binds."""
    if isinstance(arg, relax.Tuple):
        return relax.Tuple([rebind_arg(f, env) for f in arg.fields])
    return env.get(hash(arg), arg)


def _scalar(const) -> bool:
    return int(const.value.numpy().size) == 1 and isinstance(const.ty, relax.TensorType)


class BlockFacts:
    """Def-use facts of one dataflow block: its bindings (a gather's normalized constant index
    read as the constant), where each variable is bound and read, which results only have
    their shape read, and how each binding takes part in regions (:meth:`kind`).

    Parameters
    ----------
    block : relax.DataflowBlock
        The block.
    outside : dict
        :func:`outside_uses` of the block's function.
    mod : IRModule, optional
        The module holding ``call_tir`` callees (for lifting them).
    """

    def __init__(self, block, outside: Dict[int, int], mod=None):
        self.mod = mod
        self.bindings = [_with_constant_index(b, block) for b in block.bindings]
        self.index = {hash(b.var): k for k, b in enumerate(self.bindings)}
        self.users: Dict[int, List[int]] = {}
        #: variables whose shape is read (``shape_of``): a static shape, not the values
        self.shape_read: set = set()
        for k, b in enumerate(self.bindings):
            value = getattr(b, "value", None)
            if isinstance(value, relax.Call) and getattr(value.op, "name", "") == \
                    "relax.shape_of":
                self.shape_read.update(hash(v) for v in used_vars(value))
                continue
            for v in used_vars(value):
                self.users.setdefault(hash(v), []).append(k)
        self.outside = outside
        self._kinds: Dict[int, Optional[str]] = {}

    def used_outside(self, var) -> bool:
        """Used after the block (a later block, the function output) or not a dataflow var."""
        return self.outside.get(hash(var), 0) > 0 or not isinstance(var, relax.DataflowVar)

    def kind(self, k: int) -> Optional[str]:
        """``"heavy"``, ``"move"``, ``"other"`` (liftable) or None (see :func:`_kind`)."""
        if k not in self._kinds:
            self._kinds[k] = _kind(self.bindings[k], self.mod)
        return self._kinds[k]


def used_vars(expr) -> List[object]:
    """Every Relax variable ``expr`` reads (post-order, with repeats; none for ``None``)."""
    out: List[object] = []
    if expr is None:
        return out

    def visit(e):
        if isinstance(e, relax.Var):
            out.append(e)

    relax.analysis.post_order_visit(expr, visit)
    return out


def _kind(binding, mod=None) -> Optional[str]:
    """How a binding takes part in regions: ``"heavy"`` (a compute-heavy operator, or a
    ``call_tir`` whose PrimFunc is a sum of products), ``"move"`` (data movement: a
    :data:`MOVE_OPS` call, or a ``call_tir`` that reads one element), ``"other"`` (any other call
    that lifts) or None (does not lift)."""
    value = getattr(binding, "value", None)
    if not (isinstance(binding, relax.VarBinding) and isinstance(value, relax.Call) and
            isinstance(value.op, tvm.ir.Op) and static_tensor(value)):
        return None
    if not all(static_tensor(a) for a in _leaves(value.args) if isinstance(a.ty, relax.TensorType)):
        return None
    try:
        expr = lift_relax_call(value, mod)
    except (LiftError, ValueError, TypeError):
        return None
    name = value.op.name
    if name in HEAVY_OPS:
        return "heavy"
    if name in MOVE_OPS:
        return "move"
    if name == "relax.call_tir":
        body = expr.body
        if expr.reduce and expr.reducer == "sum" and isinstance(body, BinOp) and \
                body.op == "*" and isinstance(body.a, Access) and isinstance(body.b, Access):
            return "heavy"
        if not expr.reduce and isinstance(body, Access) and isinstance(body.source, Tensor):
            return "move"
    return "other"


def _with_constant_index(binding, block):
    """``binding`` with the index operand of a gather replaced by its constant value when the
    index is computed from a constant by the exporters' negative-index normalization
    ``where(c < 0, c + n, c)`` and ``c`` has no negative entry (so the result is ``c``)."""
    value = getattr(binding, "value", None)
    if not (isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op) and
            value.op.name in _GATHERS and isinstance(value.args[1], relax.Var)):
        return binding
    defs = {hash(b.var): getattr(b, "value", None) for b in block.bindings}
    const = _normalized_constant(value.args[1], defs)
    if const is None:
        return binding
    new = relax.Call(value.op, [value.args[0], const] + list(value.args[2:]), value.attrs,
                     value.ty_args)
    return relax.VarBinding(binding.var, relax.BlockBuilder().normalize(new))


def _normalized_constant(var, defs):
    where = defs.get(hash(var))
    if not (isinstance(where, relax.Call) and getattr(where.op, "name", "") == "relax.where"):
        return None
    cond, _, other = where.args
    if not isinstance(other, _CONST):
        return None
    cond = defs.get(hash(cond), cond) if isinstance(cond, relax.Var) else cond
    if not (isinstance(cond, relax.Call) and getattr(cond.op, "name", "") == "relax.less" and
            isinstance(cond.args[0], _CONST) and isinstance(cond.args[1], _CONST) and
            float(cond.args[1].value.numpy()) == 0):
        return None
    arr = other.value.numpy()
    if not np.array_equal(cond.args[0].value.numpy(), arr):
        return None
    if arr.dtype.kind not in "iu" or (arr.size and int(arr.min()) < 0):
        return None
    return other


def _is_pad_tir(block: BlockFacts, k: int) -> bool:
    """A ``call_tir`` that pads: its lifted read is of a padded tensor."""
    call = block.bindings[k].value
    if call.op.name != "relax.call_tir" or block.kind(k) != "move":
        return False
    body = lift_relax_call(call, block.mod).body
    return any(lo or hi for lo, hi in body.source.pad)


def _grow_producers(block: BlockFacts, seed: int, taken: set, max_calls: int) -> List[int]:
    """The heavy call and the data-movement producers whose every use is in the region."""
    members = [seed]
    frontier = [seed]
    while frontier and len(members) < max_calls:
        k = frontier.pop()
        if block.bindings[k].value.op.name == "relax.nn.pad" or _is_pad_tir(block, k):
            continue  # the padded value stays an input: its reads are padded tensor reads
        for v in used_vars(block.bindings[k].value):
            p = block.index.get(hash(v))
            if p is None or p in members or p in taken or block.kind(p) != "move":
                continue
            pv = block.bindings[p].var
            if block.used_outside(pv) or \
                    any(u not in members for u in block.users.get(hash(pv), [])):
                continue
            members.append(p)
            frontier.append(p)
            if len(members) >= max_calls:
                break
    return members


def _grow_consumers(block: BlockFacts, members: List[int], seed: int, taken: set,
                    max_calls: int) -> List[int]:
    """Consumers that read one region value, while the region's output has no other use."""
    out = seed
    members = list(members)
    while len(members) < max_calls:
        ov = block.bindings[out].var
        users = block.users.get(hash(ov), [])
        if block.used_outside(ov) or len(set(users)) != 1:
            break
        c = users[0]
        if c in taken or block.kind(c) in (None, "heavy"):
            break
        reads = {block.index.get(hash(v)) for v in used_vars(block.bindings[c].value)}
        if len(reads & set(members)) != 1:
            break
        members.append(c)
        out = c
    return sorted(members)


def _kept(block: BlockFacts, members: List[int]) -> frozenset:
    """Members whose shape is read outside (``shape_of``), with the members they read: they
    stay bound when the region is replaced (TVM folds the static shape and drops them)."""
    keep = {m for m in members if hash(block.bindings[m].var) in block.shape_read}
    frontier = list(keep)
    while frontier:
        k = frontier.pop()
        for v in used_vars(block.bindings[k].value):
            p = block.index.get(hash(v))
            if p is not None and p in members and p not in keep:
                keep.add(p)
                frontier.append(p)
    return frozenset(hash(block.bindings[m].var) for m in keep)


def outside_uses(func) -> Dict[int, int]:
    """Uses of each variable outside the dataflow block that binds it (approximated by uses in
    other blocks and in the function's result)."""
    counts: Dict[int, int] = {}
    body = func.body
    blocks = list(body.blocks)
    for bi, block in enumerate(blocks):
        defined = {hash(b.var) for b in block.bindings}
        for other_i, other in enumerate(blocks):
            if other_i == bi:
                continue
            for b in other.bindings:
                for v in used_vars(getattr(b, "value", None)):
                    if hash(v) in defined:
                        counts[hash(v)] = counts.get(hash(v), 0) + 1
    for v in used_vars(body.body):
        counts[hash(v)] = counts.get(hash(v), 0) + 1
    return counts


def find_regions(mod: "tvm.IRModule", max_calls: int = MAX_CALLS,
                 heavy_ops: Sequence[str] = HEAVY_OPS) -> List[Region]:
    """The regions of every Relax function of ``mod`` (in function and block order).

    Parameters
    ----------
    mod : IRModule
        The module.
    max_calls : int
        Most calls in one region (1: every region is its heavy call alone).
    heavy_ops : sequence of str
        Operators regions are built around.
    """
    out: List[Region] = []
    for gv, blk in dataflow_blocks(mod):
        seeds = [k for k, b in enumerate(blk.bindings) if blk.kind(k) == "heavy" and
                 (b.value.op.name in heavy_ops or b.value.op.name == "relax.call_tir")]
        # producers first, for every heavy call: data movement in front of a heavy call
        # belongs to the call that reads through it, not to an earlier call's epilogue
        taken: set = set(seeds)
        grown = {}
        for k in seeds:
            grown[k] = _grow_producers(blk, k, taken, max(1, max_calls))
            taken.update(grown[k])
        for k in seeds:
            # a heavy call that reads no data movement is decided alone, as it always was
            # (its epilogues are folded into library kernels by the epilogue pass)
            members = grown[k] if len(grown[k]) == 1 else \
                _grow_consumers(blk, grown[k], k, taken, max(1, max_calls))
            taken.update(members)
            keep = _kept(blk, members)
            out.append(Region(gv.name_hint, [blk.bindings[m] for m in members],
                              blk.bindings[k].var, mod, keep=keep))
    return out


def dataflow_blocks(mod: "tvm.IRModule") -> Iterator[Tuple["relax.GlobalVar", BlockFacts]]:
    """Every dataflow block of every Relax function of ``mod``, in order, with its function's
    global var: the blocks regions and shared-input groups are found in."""
    for gv, func in mod.functions_items():
        if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
            continue
        outside = outside_uses(func)
        for block in func.body.blocks:
            if isinstance(block, relax.DataflowBlock):
                yield gv, BlockFacts(block, outside, mod)


def isolated_region_module(region: Region, program: Optional[Program] = None,
                           names: Optional[Sequence[str]] = None,
                           impl: str = "tvm") -> "tvm.IRModule":
    """A module whose ``main`` computes the region alone (or ``program`` in its place).

    Variable inputs become parameters in :meth:`Region.inputs` order; constants stay constants.
    The PrimFuncs the region's ``call_tir`` calls are copied into the module first.
    """
    bb = relax.BlockBuilder()
    funcs = {}
    for call in region.calls:
        if call.op.name == "relax.call_tir" and region.mod is not None:
            gv = call.args[0]
            funcs[hash(gv)] = bb.add_func(region.mod[gv], gv.name_hint)
    return build_isolated_module(region.inputs(),
                                 lambda b, values: region.replay(b, values, funcs, impl),
                                 region.out_shape, program, names, impl, "ollie_region", bb)

