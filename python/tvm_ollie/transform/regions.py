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
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..compat import relax, tvm
from ..config import DEFAULTS
from ..derive.program import map_accesses, stage_merge
from ..ir.nodes import (Access, BinOp, Const, IterVar, Scope, Tensor, free_vars, fresh_var,
                        iter_nodes, scope_var_names, substitute)
from ..ir.simplify import simplify
from ..lift import LiftError, Operands, lift_relax_call
from ..lift.common import is_identifier
from .units import bind_operands, original_form

__all__ = ["GROUP_OPS", "HEAVY_OPS", "MAX_CALLS", "MAX_GROUP", "MOVE_OPS", "Region",
           "SharedInputGroup", "find_regions", "find_shared_input_groups"]

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


def _name(var) -> str:
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
        return ", ".join(f"{_name(b.var)}={_op_label(b.value).replace('relax.', '')}"
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
                counts[_name(v)] = counts.get(_name(v), 0) + 1
        out, n_const, taken = [], 0, set()
        for k, v in enumerate(values):
            if isinstance(v, relax.Var) and is_identifier(_name(v)) and counts[_name(v)] == 1:
                name = _name(v)
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

    def replay(self, bb: "relax.BlockBuilder", values: Dict[str, object], funcs=None):
        """Emit the region's original calls on ``values`` (by input name; ``funcs`` maps the
        callees of ``call_tir`` to the builder's copies); return the output (not bound)."""
        env = {hash(v): values[n] for n, v in self.inputs()}
        env.update(funcs or {})
        out = None
        for k, b in enumerate(self.bindings):
            call = b.value
            args = [_rebind_arg(a, env) for a in call.args]
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


def _rebind_arg(arg, env):
    if isinstance(arg, relax.Tuple):
        return relax.Tuple([_rebind_arg(f, env) for f in arg.fields])
    return env.get(hash(arg), arg)


def _scalar(const) -> bool:
    return int(const.value.numpy().size) == 1 and isinstance(const.ty, relax.TensorType)


class _Block:
    """Def-use facts of one dataflow block."""

    def __init__(self, block, outside_uses: Dict[int, int], mod=None):
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
                self.shape_read.update(hash(v) for v in _used_vars(value))
                continue
            for v in _used_vars(value):
                self.users.setdefault(hash(v), []).append(k)
        self.outside = outside_uses
        self._kinds: Dict[int, Optional[str]] = {}

    def used_outside(self, var) -> bool:
        """Used after the block (a later block, the function output) or not a dataflow var."""
        return self.outside.get(hash(var), 0) > 0 or not isinstance(var, relax.DataflowVar)

    def kind(self, k: int) -> Optional[str]:
        """``"heavy"``, ``"move"``, ``"other"`` (liftable) or None (see :func:`_kind`)."""
        if k not in self._kinds:
            self._kinds[k] = _kind(self.bindings[k], self.mod)
        return self._kinds[k]


def _used_vars(expr) -> List[object]:
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


def _is_pad_tir(block: _Block, k: int) -> bool:
    """A ``call_tir`` that pads: its lifted read is of a padded tensor."""
    call = block.bindings[k].value
    if call.op.name != "relax.call_tir" or block.kind(k) != "move":
        return False
    body = lift_relax_call(call, block.mod).body
    return any(lo or hi for lo, hi in body.source.pad)


def _grow_producers(block: _Block, seed: int, taken: set, max_calls: int) -> List[int]:
    """The heavy call and the data-movement producers whose every use is in the region."""
    members = [seed]
    frontier = [seed]
    while frontier and len(members) < max_calls:
        k = frontier.pop()
        if block.bindings[k].value.op.name == "relax.nn.pad" or _is_pad_tir(block, k):
            continue  # the padded value stays an input: its reads are padded tensor reads
        for v in _used_vars(block.bindings[k].value):
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


def _grow_consumers(block: _Block, members: List[int], seed: int, taken: set,
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
        reads = {block.index.get(hash(v)) for v in _used_vars(block.bindings[c].value)}
        if len(reads & set(members)) != 1:
            break
        members.append(c)
        out = c
    return sorted(members)


def _kept(block: _Block, members: List[int]) -> frozenset:
    """Members whose shape is read outside (``shape_of``), with the members they read: they
    stay bound when the region is replaced (TVM folds the static shape and drops them)."""
    keep = {m for m in members if hash(block.bindings[m].var) in block.shape_read}
    frontier = list(keep)
    while frontier:
        k = frontier.pop()
        for v in _used_vars(block.bindings[k].value):
            p = block.index.get(hash(v))
            if p is not None and p in members and p not in keep:
                keep.add(p)
                frontier.append(p)
    return frozenset(hash(block.bindings[m].var) for m in keep)


def _outside_uses(func) -> Dict[int, int]:
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
                for v in _used_vars(getattr(b, "value", None)):
                    if hash(v) in defined:
                        counts[hash(v)] = counts.get(hash(v), 0) + 1
    for v in _used_vars(body.body):
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
    for gv, func in mod.functions_items():
        if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
            continue
        outside = _outside_uses(func)
        for block in func.body.blocks:
            if not isinstance(block, relax.DataflowBlock):
                continue
            blk = _Block(block, outside, mod)
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


def isolated_region_module(region: Region, program=None, names=None,
                           impl: str = "tvm") -> "tvm.IRModule":
    """A module whose ``main`` computes the region alone (or ``program`` in its place).

    Variable inputs become parameters in :meth:`Region.inputs` order; constants stay constants.
    """
    from .emit import emit_program  # pylint: disable=import-outside-toplevel

    bb = relax.BlockBuilder()
    params, values = bind_operands(region.inputs())
    funcs = {}
    for call in region.calls:
        if call.op.name == "relax.call_tir" and region.mod is not None:
            gv = call.args[0]
            funcs[hash(gv)] = bb.add_func(region.mod[gv], gv.name_hint)
    with bb.function("main", params):
        with bb.dataflow():
            if program is None:
                out = bb.emit_output(region.replay(bb, values, funcs))
            else:
                in_names = [n for n, _ in region.inputs()]
                mapping = values if names is None else {
                    pn: values[cn] for pn, cn in zip(names, in_names)}
                out = bb.emit_output(emit_program(bb, program, mapping, region.out_shape,
                                                  impl=impl, name="ollie_region"))
        bb.emit_func_output(out)
    return bb.get()


# --------------------------------------------------------------------------------------------
# Groups: independent heavy operators that read the same input
#
# ``q = x @ Wq; k = x @ Wk; v = x @ Wv`` (or the 1x1 convolutions of an Inception-like block's
# branches) are thin GEMMs over one operand. As one unit of
# decision they can become one GEMM over concatenated weights plus slices
# (:func:`~tvm_ollie.derive.rules.inter.merge_shared_inputs`); the Decider verifies and costs
# that program against the three calls like any other candidate. Projections as importers emit
# them add a bias to each product (``add(b_i, x @ W_i)``): when every call has one, the adds
# join the group and the merge adds one concatenated bias to the merged product
# (:func:`~tvm_ollie.derive.rules.inter.merge_shared_inputs_bias`). On constant weights the
# concatenations are folded when the module is built, and costed as such.

#: Operators grouped by a shared operand. The inter-expression merge handles what lifts to a
#: GEMM (matmuls; 1x1 convolutions, whose filters then concatenate along the output channels);
#: a group that does not merge keeps its calls.
GROUP_OPS = ("relax.matmul", "relax.nn.conv2d")
#: Default bound on the heavy calls of one group.
MAX_GROUP = DEFAULTS.merge_group


@dataclass
class SharedInputGroup:
    """Independent heavy calls of one dataflow block that read the same operand.

    Attributes
    ----------
    function : str
        The Relax function.
    bindings : list of relax.VarBinding
        The grouped calls, in block order (each one call; their outputs are the group's).
    shared : relax.Expr
        The operand every call reads at the same position.
    position : int
        0 when the calls share their left operand, 1 their right one.
    """

    function: str
    bindings: List[object]
    shared: object
    position: int
    mod: Optional[object] = field(default=None, repr=False)
    #: the calls as the module binds them (``bindings`` read the shared operand under one name)
    original_calls: List[object] = field(default_factory=list, repr=False)
    #: the bias add reading each call's result (one per call, in the same order), or none: the
    #: adds are then part of the group and their results are the group's
    epilogues: List[object] = field(default_factory=list, repr=False)
    #: the variable of the group's last binding in block order (where the group is emitted)
    last: Optional[object] = field(default=None, repr=False)
    _region: Optional[Region] = field(default=None, repr=False)

    is_region = True
    is_group = True

    @property
    def members(self) -> List[object]:
        """Every binding the group replaces: each call, then its bias add (if any)."""
        if not self.epilogues:
            return list(self.bindings)
        return [b for pair in zip(self.bindings, self.epilogues) for b in pair]

    @property
    def region(self) -> Region:
        """The group's bindings as one :class:`Region` (input naming, replay)."""
        if self._region is None:
            members = self.members
            self._region = Region(self.function, members, members[-1].var, self.mod)
        return self._region

    @property
    def heavy_calls(self) -> List[object]:
        """The grouped (compute-heavy) calls, without their bias adds."""
        return [b.value for b in self.bindings]

    @property
    def outputs(self) -> List[object]:
        """The group's results, in the calls' order: the bias adds' variables when the group
        has them, else the calls' variables."""
        return [b.var for b in (self.epilogues or self.bindings)]

    @property
    def output(self):
        """The variable of the group's last binding in block order (where the merged program
        is emitted)."""
        return self.last if self.last is not None else self.bindings[-1].var

    @property
    def out_shape(self) -> List[Tuple[int, ...]]:
        """Static shape of each result."""
        return [tuple(int(s) for s in v.ty.shape) for v in self.outputs]

    @property
    def size(self) -> int:
        """The number of grouped calls."""
        return len(self.bindings)

    @property
    def calls(self) -> List[object]:
        """Every call the group replaces (the grouped calls and their bias adds)."""
        return self.region.calls

    @property
    def op_names(self) -> List[str]:
        return self.region.op_names

    def describe(self) -> str:
        """``q=matmul, k=matmul, v=matmul share x``."""
        shared = _name(self.shared) if isinstance(self.shared, relax.Var) else "a constant"
        return self.region.describe() + f" share {shared}"

    def inputs(self) -> List[Tuple[str, object]]:
        """``(name, value)`` of every tensor the calls read (one name for the shared one)."""
        return self.region.inputs()

    def lifts(self) -> List[Scope]:
        """Each call's expression (with its bias add, if any) over the group's input names."""
        out = []
        adds = self.epilogues or [None] * len(self.bindings)
        for b, add in zip(self.bindings, adds):
            part = [b] if add is None else [b, add]
            sub = Region(self.function, part, b.var, self.mod)
            sub._inputs = self.inputs()  # pylint: disable=protected-access
            out.append(sub.lift())
        return out

    def lift(self) -> Scope:
        """The first call's expression (the group as a whole is :meth:`lifts`)."""
        return self.lifts()[0]

    def programs(self) -> list:
        """The merged programs (one GEMM for all calls, with one bias add when the calls have
        bias adds), from the inter-expression rules."""
        # pylint: disable=import-outside-toplevel
        from ..derive.rules.inter import merge_shared_inputs, merge_shared_inputs_bias

        merge = merge_shared_inputs_bias if self.epilogues else merge_shared_inputs
        merged = merge(self.lifts())
        return [] if merged is None else [merged]

    def signature(self) -> str:
        """Equal for groups that compute the same expressions on the same input shapes."""
        ins = inputs_text(self.inputs())
        exprs = " ; ".join(str(e) for e in self.lifts())
        bias = " + bias" if self.epilogues else ""
        return f"group[{len(self.bindings)} x {self.op_names[0].replace('relax.', '')}{bias}] " \
               f"{ins} {exprs}"

    def replay(self, bb: "relax.BlockBuilder", values: Dict[str, object], impl: str = "tvm"):
        """Emit the original calls on ``values`` (each on its native kernel with
        ``impl="native"``); return the tuple of their results."""
        env = {hash(v): values[n] for n, v in self.inputs()}
        heavy = {hash(b.var) for b in self.bindings}
        for b in self.members:
            call = b.value
            args = [_rebind_arg(a, env) for a in call.args]
            new = original_form(call, args, impl) if hash(b.var) in heavy else \
                relax.Call(call.op, args, call.attrs, call.ty_args)
            env[hash(b.var)] = bb.emit(new)
        return relax.Tuple([env[hash(v)] for v in self.outputs])


def _descendants(block: _Block, start: int, stop: int) -> set:
    """Bindings up to index ``stop`` that read binding ``start``, directly or not."""
    out, frontier = set(), [start]
    while frontier:
        k = frontier.pop()
        for u in block.users.get(hash(block.bindings[k].var), []):
            if u <= stop and u not in out:
                out.add(u)
                frontier.append(u)
    return out


def _independent(block: _Block, members: List[int],
                 units: Optional[List[List[int]]] = None) -> bool:
    """No member reaches another, and no input of a member is computed from one: the calls can
    run as one unit emitted at the last member (their readers before it move after it).

    ``units`` (default: each member alone) lists the members that belong together (a call and
    its bias add): a unit may read itself, not another unit."""
    units = units or [[m] for m in members]
    everyone = {k for u in units for k in u}
    last = max(everyone)
    reach = set()
    for unit in units:
        mine = set()
        for m in unit:
            mine |= _descendants(block, m, last)
        mine -= set(unit)
        if mine & everyone:
            return False
        reach |= mine
    if any(not isinstance(block.bindings[k], relax.VarBinding) for k in reach):
        return False  # the readers that move after the group must be plain bindings
    for m in everyone:
        for v in _used_vars(block.bindings[m].value):
            if block.index.get(hash(v)) in reach:
                return False
    return True


def _bias_add(block: _Block, k: int) -> Optional[int]:
    """The binding that adds a bias to call ``k``'s result, when it is that result's only use.

    Guards: ``k``'s result is read once, in the block, not by ``shape_of``, not after the
    block; the reader is ``add(y, b)`` or ``add(b, y)`` of ``y``'s shape and dtype; ``b`` is a
    static tensor of that dtype that varies along the last axis only (shape ``[N]`` or
    ``[1, .., 1, N]``, ``N`` the result's last dimension)."""
    var = block.bindings[k].var
    users = block.users.get(hash(var), [])
    if len(users) != 1 or block.used_outside(var) or hash(var) in block.shape_read:
        return None
    j = users[0]
    b = block.bindings[j]
    add = getattr(b, "value", None)
    if not (isinstance(b, relax.VarBinding) and isinstance(add, relax.Call) and
            isinstance(add.op, tvm.ir.Op) and add.op.name == "relax.add" and
            static_tensor(add)):
        return None
    others = [a for a in add.args if not a.same_as(var)]
    if len(others) != 1 or len(add.args) != 2:
        return None
    bias, out_ty = others[0], var.ty
    if not static_tensor(bias) or str(bias.ty.dtype) != str(out_ty.dtype) or \
            str(add.ty.dtype) != str(out_ty.dtype):
        return None
    shape = [int(d) for d in bias.ty.shape]
    out = [int(d) for d in out_ty.shape]
    if [int(d) for d in add.ty.shape] != out or not shape or len(shape) > len(out) or \
            shape[-1] != out[-1] or any(d != 1 for d in shape[:-1]):
        return None
    return j


def _with_bias(block: _Block, members: List[int], position: int) -> Optional[List[int]]:
    """The bias add of each member (:func:`_bias_add`) when every member of a group sharing
    its left operand has one and the group stays independent with them, else None."""
    if position != 0:
        return None
    adds = [_bias_add(block, m) for m in members]
    if any(a is None for a in adds) or \
            not _independent(block, members, [[m, a] for m, a in zip(members, adds)]):
        return None
    return adds


#: Operators whose results are equal when their operand and attributes are (pure views).
_VIEW_OPS = ("relax.reshape", "relax.permute_dims", "relax.expand_dims", "relax.squeeze",
             "relax.flatten")


def _canonical(block: _Block, expr, depth: int = 0):
    """A key equal for values that are the same tensor: the same variable, or the same view
    (:data:`_VIEW_OPS`, same attributes and result type) of the same tensor. Importers often
    emit one ``reshape`` of an input per reader; those readers share that input."""
    if isinstance(expr, relax.Var):
        k = block.index.get(hash(expr))
        if k is not None and depth < 8:
            b = block.bindings[k]
            v = getattr(b, "value", None)
            if isinstance(b, relax.VarBinding) and isinstance(v, relax.Call) and \
                    isinstance(v.op, tvm.ir.Op) and v.op.name in _VIEW_OPS:
                args = tuple(_canonical(block, a, depth + 1) for a in v.args)
                return (v.op.name, str(v.attrs), args, str(v.ty))
        return ("var", hash(expr))
    if isinstance(expr, relax.ShapeExpr):
        return ("shape", tuple(int(d) for d in expr.values))
    return ("expr", hash(expr))


def _group_key(block: _Block, k: int, position: int):
    call = block.bindings[k].value
    if len(call.args) < 2:
        return None
    arg = call.args[position]
    if not isinstance(arg.ty, relax.TensorType):
        return None
    return _canonical(block, arg), str(call.ty.dtype), str(call.attrs)


def _folded_view(block: _Block, expr, depth: int = 0):
    """The constant that ``expr`` is when it is a ``permute_dims`` or ``reshape`` of a constant
    (what TVM's FoldConstant makes of it in the built module), else None. Folded here so that
    the group's isolated module, measured alone, sees the same constant."""
    if not isinstance(expr, relax.Var) or depth > 4:
        return None
    k = block.index.get(hash(expr))
    b = block.bindings[k] if k is not None else None
    v = getattr(b, "value", None)
    if not (isinstance(b, relax.VarBinding) and isinstance(v, relax.Call) and
            isinstance(v.op, tvm.ir.Op) and v.op.name in ("relax.permute_dims", "relax.reshape")):
        return None
    src = v.args[0]
    arr = src.value.numpy() if isinstance(src, _CONST) else None
    if arr is None:
        inner = _folded_view(block, src, depth + 1)
        arr = None if inner is None else inner.value.numpy()
    if arr is None or not static_tensor(v):
        return None
    if v.op.name == "relax.permute_dims":
        axes = None if v.attrs.axes is None else [int(a) for a in v.attrs.axes]
        arr = np.transpose(arr, axes)
    else:
        arr = arr.reshape([int(d) for d in v.ty.shape])
    return relax.const(np.ascontiguousarray(arr), str(v.ty.dtype))


def _reading(binding, position: int, operand, block: Optional[_Block] = None):
    """``binding`` with its call's operand ``position`` replaced by ``operand`` (the same
    tensor under the group's one name), and other operands that are views of constants by the
    folded constants."""
    call = binding.value
    args = list(call.args)
    args[position] = operand
    if block is not None:
        for k, a in enumerate(args):
            folded = _folded_view(block, a) if k != position else None
            if folded is not None:
                args[k] = folded
    if all(a.same_as(b) for a, b in zip(args, call.args)):
        return binding
    new = relax.Call(call.op, args, call.attrs, call.ty_args)
    return relax.VarBinding(binding.var, relax.BlockBuilder().normalize(new))


def _block_groups(block: _Block, seeds: List[int], max_ops: int) -> List[Tuple[List[int], int]]:
    """``(members, position)`` of each group of ``seeds`` sharing an operand (left operand
    first), at most ``max_ops`` members each, independent of each other."""
    out, used = [], set()
    for position in (0, 1):
        by_key: Dict[object, List[int]] = {}
        for k in seeds:
            key = _group_key(block, k, position)
            if k not in used and key is not None:
                by_key.setdefault(key, []).append(k)
        for members in by_key.values():
            members = [m for m in members if m not in used]
            while len(members) >= 2:
                chunk = members[:max_ops]
                while len(chunk) >= 2 and not _independent(block, chunk):
                    chunk = chunk[:-1]
                if len(chunk) < 2:
                    members = members[1:]
                    continue
                out.append((chunk, position))
                used.update(chunk)
                members = [m for m in members if m not in used]
    return sorted(out)


def find_shared_input_groups(mod: "tvm.IRModule", max_ops: int = MAX_GROUP,
                             ops: Sequence[str] = GROUP_OPS,
                             bias: bool = True) -> List[SharedInputGroup]:
    """Groups of independent calls of ``ops`` that read the same operand, per dataflow block.

    Parameters
    ----------
    mod : IRModule
        The module.
    max_ops : int
        Most calls in one group (a larger set is split into several groups).
    ops : sequence of str
        Operators grouped.
    bias : bool
        Take each call's bias add into the group when every call of a group sharing its left
        operand has one (:func:`_bias_add`): the group's results are then the adds', and the
        merge adds one concatenated bias to the merged product.

    The calls of a group have the same attributes and result dtype, static shapes, results
    that are not read by ``shape_of``, and are independent: no call reads another's result,
    directly or through other bindings (the rewrite emits them as one unit at the last call).
    """
    out: List[SharedInputGroup] = []
    if max_ops < 2:
        return out
    for gv, func in mod.functions_items():
        if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
            continue
        outside = _outside_uses(func)
        for block in func.body.blocks:
            if not isinstance(block, relax.DataflowBlock):
                continue
            blk = _Block(block, outside, mod)
            seeds = [k for k, b in enumerate(blk.bindings) if blk.kind(k) == "heavy" and
                     b.value.op.name in ops and hash(b.var) not in blk.shape_read]
            for members, position in _block_groups(blk, seeds, max_ops):
                out.append(_group(gv.name_hint, blk, members, position, mod, bias))
    return out


def _group(function: str, blk: _Block, members: List[int], position: int, mod,
           bias: bool) -> SharedInputGroup:
    """The group of ``members`` (with their bias adds when ``bias`` and they all have one)."""
    shared = blk.bindings[members[0]].value.args[position]
    adds = (_with_bias(blk, members, position) if bias else None) or []
    last = blk.bindings[max(members + adds)].var
    return SharedInputGroup(
        function, [_reading(blk.bindings[m], position, shared, blk) for m in members], shared,
        position, mod, [blk.bindings[k].value for k in members + adds],
        [_folded_views(blk.bindings[a], blk) for a in adds], last)


def _folded_views(binding, block: _Block):
    """``binding`` with operands that are views of constants replaced by the folded constants
    (as :func:`_reading` does for the calls' operands)."""
    call = binding.value
    args = [_folded_view(block, a) or a for a in call.args]
    if all(a.same_as(b) for a, b in zip(args, call.args)):
        return binding
    new = relax.Call(call.op, args, call.attrs, call.ty_args)
    return relax.VarBinding(binding.var, relax.BlockBuilder().normalize(new))


def isolated_group_module(group: SharedInputGroup, program=None, names=None,
                          impl: str = "tvm") -> "tvm.IRModule":
    """A module whose ``main`` returns the tuple of the group's results, computed by its calls
    (or by ``program``, a multi-output program, in their place). Constant operands stay
    constants (what the program computes from them alone is folded when it is built, as in
    the model); with ``impl="native"`` the library kernels take their bias adds
    (:func:`~.epilogue.fuse_epilogues`)."""
    from .emit import emit_program  # pylint: disable=import-outside-toplevel

    bb = relax.BlockBuilder()
    params, values = bind_operands(group.inputs())
    with bb.function("main", params):
        with bb.dataflow():
            if program is None:
                out = bb.emit_output(group.replay(bb, values, impl))
            else:
                in_names = [n for n, _ in group.inputs()]
                mapping = values if names is None else {
                    pn: values[cn] for pn, cn in zip(names, in_names)}
                out = bb.emit_output(emit_program(bb, program, mapping, group.out_shape,
                                                  impl=impl, name="ollie_merge"))
        bb.emit_func_output(out)
    if impl != "native":
        return bb.get()
    from .epilogue import fuse_epilogues  # pylint: disable=import-outside-toplevel

    # library kernels take their bias adds as epilogues in the model (the pass folds them
    # after rewriting): measured alone, they must too
    return fuse_epilogues(bb.get())[0]
