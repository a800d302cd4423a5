"""Shared-input groups: independent heavy operators of a dataflow block that read the same input.

``q = x @ Wq; k = x @ Wk; v = x @ Wv`` (or the 1x1 convolutions of an Inception-like block's
branches) are thin GEMMs over one operand. As one unit of decision they can become one GEMM over
concatenated weights plus slices (:func:`~tvm_ollie.derive.rules.inter.merge_shared_inputs`);
the Decider verifies and costs that program against the three calls like any other candidate.
Projections as importers emit them add a bias to each product (``add(b_i, x @ W_i)``): when every
call has one, the adds join the group and the merge adds one concatenated bias to the merged
product (:func:`~tvm_ollie.derive.rules.inter.merge_shared_inputs_bias`). On constant weights
the concatenations are folded when the module is built, and costed as such.

A group is built on :mod:`.regions`: its bindings as one :class:`~.regions.Region` name its
inputs and lift each call, and the block's def-use facts (:class:`~.regions.BlockFacts`) say
which calls are independent.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..compat import relax, tvm
from ..config import DEFAULTS
from ..derive.program import Program
from ..derive.rules.inter import merge_shared_inputs, merge_shared_inputs_bias
from ..ir.nodes import Scope
from .epilogue import fuse_epilogues
from .regions import (BlockFacts, Region, dataflow_blocks, inputs_text, rebind_arg,
                      static_tensor, used_vars, var_name)
from .units import build_isolated_module, original_form

__all__ = ["GROUP_OPS", "MAX_GROUP", "MAX_ROW_GROUP", "SharedInputGroup",
           "find_shared_input_groups", "isolated_group_module"]

_CONST = tvm.ir.expr.Constant

#: Operators grouped by a shared operand. The inter-expression merge handles what lifts to a
#: GEMM (matmuls; 1x1 convolutions, whose filters then concatenate along the output channels);
#: a group that does not merge keeps its calls.
GROUP_OPS = ("relax.matmul", "relax.nn.conv2d")
#: Default bound on the heavy calls of one group.
MAX_GROUP = DEFAULTS.merge_group
#: Bound on a group whose calls share their right operand (a weight) and read slices of one
#: tensor as their left operand: the unrolled steps of a recurrence (``X[t] @ W`` for every
#: step ``t``). Their merged GEMM reads the stacked rows once, so a long sequence gains from one
#: large group; any group still stays within this bound (the merge and its check grow with it).
MAX_ROW_GROUP = 64


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
        shared = var_name(self.shared) if isinstance(self.shared, relax.Var) else "a constant"
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
            out.append(sub.with_input_names(self.inputs()).lift())
        return out

    def lift(self) -> Scope:
        """The first call's expression (the group as a whole is :meth:`lifts`)."""
        return self.lifts()[0]

    def programs(self) -> list:
        """The merged programs (one GEMM for all calls, with one bias add when the calls have
        bias adds), from the inter-expression rules."""
        merge = merge_shared_inputs_bias if self.epilogues else merge_shared_inputs
        merged = merge(self.lifts(), max_pairs=self.size - 1)
        return [] if merged is None else [merged]

    def signature(self) -> str:
        """Equal for groups that compute the same expressions on the same input shapes."""
        ins = inputs_text(self.inputs())
        exprs = " ; ".join(str(e) for e in self.lifts())
        bias = " + bias" if self.epilogues else ""
        return f"group[{len(self.bindings)} x {self.op_names[0].replace('relax.', '')}{bias}] " \
               f"{ins} {exprs}"

    def isolated_module(self, program: Optional[Program] = None,
                        names: Optional[Sequence[str]] = None,
                        impl: str = "tvm") -> "tvm.IRModule":
        """:func:`isolated_group_module` of this group."""
        return isolated_group_module(self, program, names, impl)

    def replay(self, bb: "relax.BlockBuilder", values: Dict[str, object], impl: str = "tvm"):
        """Emit the original calls on ``values`` (each on its native kernel with
        ``impl="native"``); return the tuple of their results."""
        env = {hash(v): values[n] for n, v in self.inputs()}
        heavy = {hash(b.var) for b in self.bindings}
        for b in self.members:
            call = b.value
            args = [rebind_arg(a, env) for a in call.args]
            new = original_form(call, args, impl) if hash(b.var) in heavy else \
                relax.Call(call.op, args, call.attrs, call.ty_args)
            env[hash(b.var)] = bb.emit(new)
        return relax.Tuple([env[hash(v)] for v in self.outputs])


def _descendants(block: BlockFacts, start: int, stop: int) -> set:
    """Bindings up to index ``stop`` that read binding ``start``, directly or not."""
    out, frontier = set(), [start]
    while frontier:
        k = frontier.pop()
        for u in block.users.get(hash(block.bindings[k].var), []):
            if u <= stop and u not in out:
                out.add(u)
                frontier.append(u)
    return out


def _independent(block: BlockFacts, members: List[int],
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
        for v in used_vars(block.bindings[m].value):
            if block.index.get(hash(v)) in reach:
                return False
    return True


def _bias_add(block: BlockFacts, k: int) -> Optional[int]:
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


def _with_bias(block: BlockFacts, members: List[int], position: int) -> Optional[List[int]]:
    """The bias add of each member (:func:`_bias_add`) when every member has one and the group
    stays independent with them, else None. Members sharing their right operand (their rows
    stack in the merged product) must add the same bias (one add covers them all)."""
    adds = [_bias_add(block, m) for m in members]
    if any(a is None for a in adds) or \
            not _independent(block, members, [[m, a] for m, a in zip(members, adds)]):
        return None
    if position == 1 and len({_canonical(block, _bias_of(block, m, a))
                              for m, a in zip(members, adds)}) != 1:  # fmt: skip
        return None
    return adds


def _bias_of(block: BlockFacts, call: int, add: int):
    """The operand of bias add ``add`` that is not call ``call``'s result."""
    var = block.bindings[call].var
    return next(a for a in block.bindings[add].value.args if not a.same_as(var))


#: Operators whose results are equal when their operand and attributes are (pure views).
_VIEW_OPS = ("relax.reshape", "relax.permute_dims", "relax.expand_dims", "relax.squeeze",
             "relax.flatten")


def _canonical(block: BlockFacts, expr, depth: int = 0):
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


#: Operators whose result is a part of their first operand (slices), followed with the views
#: by :func:`_row_source`.
_SLICE_OPS = ("relax.strided_slice",)


def _row_source(block: BlockFacts, expr, depth: int = 0):
    """The tensor ``expr`` is a slice (or a view of a slice) of, through :data:`_SLICE_OPS` and
    :data:`_VIEW_OPS` bindings of the block; None when ``expr`` is no such part."""
    if not isinstance(expr, relax.Var) or depth > 8:
        return None
    k = block.index.get(hash(expr))
    b = block.bindings[k] if k is not None else None
    v = getattr(b, "value", None)
    if not (isinstance(b, relax.VarBinding) and isinstance(v, relax.Call) and
            isinstance(v.op, tvm.ir.Op) and v.op.name in _SLICE_OPS + _VIEW_OPS):
        return None
    inner = _row_source(block, v.args[0], depth + 1)
    if inner is not None:
        return inner
    return hash(v.args[0]) if v.op.name in _SLICE_OPS else None


def _row_key(block: BlockFacts, k: int):
    """Guard ``rows-of-one-tensor``: the tensor that call ``k``'s left operand is a slice of
    (:func:`_row_source`), or None. Calls with one such key and one right operand are the
    unrolled steps of a recurrence reading one weight: they group first (before calls that
    share their left operand, such as two directions reading one step's input), up to
    :data:`MAX_ROW_GROUP` of them."""
    return _row_source(block, block.bindings[k].value.args[0])


def _group_key(block: BlockFacts, k: int, position: int):
    call = block.bindings[k].value
    if len(call.args) < 2:
        return None
    arg = call.args[position]
    if not isinstance(arg.ty, relax.TensorType):
        return None
    return _canonical(block, arg), str(call.ty.dtype), str(call.attrs)


def _folded_view(block: BlockFacts, expr, depth: int = 0):
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


def _reading(binding, position: int, operand, block: Optional[BlockFacts] = None):
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


def _block_groups(block: BlockFacts, seeds: List[int], max_ops: int) -> List[Tuple[List[int], int]]:
    """``(members, position)`` of each group of ``seeds`` sharing an operand, independent of
    each other: first the rows of one tensor sharing their right operand (:func:`_row_key`,
    at most :data:`MAX_ROW_GROUP` members), then a shared left operand, then a shared right
    one (at most ``max_ops`` members)."""
    out, used = [], set()
    for position, rows in ((1, True), (0, False), (1, False)):
        bound = max(max_ops, MAX_ROW_GROUP) if rows else max_ops
        by_key: Dict[object, List[int]] = {}
        for k in seeds:
            key = _group_key(block, k, position)
            row = _row_key(block, k) if rows else None
            if k in used or key is None or (rows and row is None):
                continue
            by_key.setdefault((key, row), []).append(k)
        for members in by_key.values():
            members = [m for m in members if m not in used]
            while len(members) >= 2:
                chunk = members[:bound]
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
    for gv, blk in dataflow_blocks(mod):
        seeds = [k for k, b in enumerate(blk.bindings) if blk.kind(k) == "heavy" and
                 b.value.op.name in ops and hash(b.var) not in blk.shape_read]
        for members, position in _block_groups(blk, seeds, max_ops):
            out.append(_group(gv.name_hint, blk, members, position, mod, bias))
    return out


def _group(function: str, blk: BlockFacts, members: List[int], position: int, mod,
           bias: bool) -> SharedInputGroup:
    """The group of ``members`` (with their bias adds when ``bias`` and they all have one)."""
    shared = blk.bindings[members[0]].value.args[position]
    adds = (_with_bias(blk, members, position) if bias else None) or []
    last = blk.bindings[max(members + adds)].var
    return SharedInputGroup(
        function, [_reading(blk.bindings[m], position, shared, blk) for m in members], shared,
        position, mod, [blk.bindings[k].value for k in members + adds],
        [_folded_views(blk.bindings[a], blk) for a in adds], last)


def _folded_views(binding, block: BlockFacts):
    """``binding`` with operands that are views of constants replaced by the folded constants
    (as :func:`_reading` does for the calls' operands)."""
    call = binding.value
    args = [_folded_view(block, a) or a for a in call.args]
    if all(a.same_as(b) for a, b in zip(args, call.args)):
        return binding
    new = relax.Call(call.op, args, call.attrs, call.ty_args)
    return relax.VarBinding(binding.var, relax.BlockBuilder().normalize(new))


def isolated_group_module(group: SharedInputGroup, program: Optional[Program] = None,
                          names: Optional[Sequence[str]] = None,
                          impl: str = "tvm") -> "tvm.IRModule":
    """A module whose ``main`` returns the tuple of the group's results, computed by its calls
    (or by ``program``, a multi-output program, in their place). Constant operands stay
    constants (what the program computes from them alone is folded when it is built, as in
    the model); with ``impl="native"`` the library kernels take their bias adds
    (:func:`~.epilogue.fuse_epilogues`)."""
    mod = build_isolated_module(group.inputs(),
                                lambda bb, values: group.replay(bb, values, impl),
                                group.out_shape, program, names, impl, "ollie_merge")
    if impl != "native":
        return mod
    # library kernels take their bias adds as epilogues in the model (the pass folds them
    # after rewriting): measured alone, they must too
    return fuse_epilogues(mod)[0]
