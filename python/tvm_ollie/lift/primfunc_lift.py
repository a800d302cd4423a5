"""Lift of a PrimFunc whose body is a sequence of blocks (what ``te.create_prim_func`` makes).

Each block ``out[v_spatial] = value`` (or, with reduce iterators and an init,
``out[v] = out[v] + value`` / ``max(out[v], value)``) is one :class:`~.stages.Stage`; the block
writing the last parameter is the result, buffers written by other blocks become nested scopes
(or padded tensors, for constant-padding blocks), and the other parameters are the inputs.

Requirements, each checked (LiftError otherwise): the root block holds only loop nests around
single blocks; bindings are plain loop variables with the loop's range; the store writes
``out[v_0, ..., v_k]`` with the spatial iterators in order over the whole buffer; a reduction's
init stores the reducer's identity (0 for sums, ``-inf`` or the lowest finite value for max);
each buffer is written by one block; the last parameter is the only output.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence

from ..compat import BufferLoadNode, tirx
from ..ir.nodes import Scope, Tensor
from .common import is_identifier, lowest_float
from .errors import LiftError
from .stages import Axis, Stage, StageLifter

_DATA_PAR = 0
_COMM_REDUCE = 2


def _int(value, what: str) -> int:
    if isinstance(value, tirx.IntImm):
        return int(value.value)
    raise LiftError(f"{what} is not static: {value}")


def _blocks(stmt, loops: List, out: List) -> None:
    """Collect ``(enclosing For loops, SBlockRealize)`` pairs below ``stmt``."""
    kind = type(stmt).__name__
    if kind == "SeqStmt":
        for s in stmt.seq:
            _blocks(s, loops, out)
    elif kind == "For":
        _blocks(stmt.body, loops + [stmt], out)
    elif kind == "SBlockRealize":
        out.append((loops, stmt))
    else:
        raise LiftError(f"PrimFunc: unsupported statement {kind} (only loop nests of blocks)")


def _root_block(func):
    body = func.body
    if type(body).__name__ != "SBlockRealize":
        raise LiftError("PrimFunc: the body is not a root block")
    return body.block


def _check_binding(loops: List, realize, what: str) -> None:
    pred = realize.predicate
    if not (isinstance(pred, tirx.IntImm) and int(pred.value) == 1):
        raise LiftError(f"{what}: predicated blocks are unsupported")
    by_var = {hash(f.loop_var): f for f in loops}
    used = set()
    for iv, value in zip(realize.block.iter_vars, realize.iter_values):
        loop = by_var.get(hash(value)) if isinstance(value, tirx.Var) else None
        if loop is None or hash(value) in used:
            raise LiftError(f"{what}: iterator {iv.var.name} is bound to {value}, not to a loop")
        used.add(hash(value))
        step = getattr(loop, "step", None)
        if step is not None and not (isinstance(step, tirx.IntImm) and int(step.value) == 1):
            raise LiftError(f"{what}: strided loops are unsupported")
        if _int(loop.min, what) != _int(iv.dom.min, what) or \
                _int(loop.extent, what) != _int(iv.dom.extent, what):
            raise LiftError(f"{what}: loop range differs from iterator {iv.var.name}'s domain")
    if len(used) != len(loops) or len(realize.iter_values) != len(realize.block.iter_vars):
        raise LiftError(f"{what}: loops not bound one-to-one to block iterators")


def _is_self_load(expr, buffer, store_indices) -> bool:
    if not isinstance(expr, BufferLoadNode) or not expr.source.same_as(buffer):
        return False
    return len(expr.indices) == len(store_indices) and all(
        a.same_as(b) for a, b in zip(expr.indices, store_indices))


def _block_stage(realize, loops: List) -> Stage:
    block = realize.block
    what = f"block {block.name_hint}"
    _check_binding(loops, realize, what)
    store = block.body
    if type(store).__name__ != "BufferStore":
        raise LiftError(f"{what}: the body is not a single store")
    axes, reduce_axes = [], []
    for iv in block.iter_vars:
        axis = Axis(iv.var, _int(iv.dom.min, what), _int(iv.dom.extent, what))
        kind = int(iv.iter_type)
        if kind == _DATA_PAR:
            axes.append(axis)
        elif kind == _COMM_REDUCE:
            reduce_axes.append(axis)
        else:
            raise LiftError(f"{what}: iterator {iv.var.name} is neither spatial nor reduce")
    buffer = store.buffer
    shape = [_int(s, f"{what} buffer shape") for s in buffer.shape]
    idx = list(store.indices)
    if len(idx) != len(axes) or not all(
            isinstance(i, tirx.Var) and i.same_as(a.var) for i, a in zip(idx, axes)) or \
            shape != [a.extent for a in axes] or any(a.begin != 0 for a in axes):
        raise LiftError(f"{what}: the store must write the whole buffer at its spatial "
                        "iterators in order")
    value = store.value
    if not reduce_axes:
        if block.init is not None:
            raise LiftError(f"{what}: an init without reduce iterators")
        return Stage(block.name_hint, axes, value)
    reducer, source = None, None
    if isinstance(value, (tirx.Add, tirx.Max)):
        for mine, other in ((value.a, value.b), (value.b, value.a)):
            if _is_self_load(mine, buffer, idx):
                reducer = "sum" if isinstance(value, tirx.Add) else "max"
                source = other
                break
    if reducer is None:
        raise LiftError(f"{what}: the update is not out + value or max(out, value)")
    init = block.init
    if init is None or type(init).__name__ != "BufferStore" or not init.buffer.same_as(buffer):
        raise LiftError(f"{what}: a reduction needs an init of its own buffer")
    ok_init = isinstance(init.value, (tirx.IntImm, tirx.FloatImm)) and (
        float(init.value.value) == 0.0 if reducer == "sum"
        else float(init.value.value) <= lowest_float(str(buffer.dtype)))
    if not ok_init:
        raise LiftError(f"{what}: the init {init.value} is not the identity of {reducer}")
    return Stage(block.name_hint, axes, source, reduce_axes, reducer)


def lift_primfunc(func, names: Optional[Sequence[str]] = None) -> Scope:
    """Lift a PrimFunc (single block, or blocks that are stages) into a scope.

    Parameters
    ----------
    func : tirx.PrimFunc
        Parameters are the input buffers followed by one output buffer.
    names : sequence of str, optional
        Names of the input tensors, one per input parameter; by default the parameter names
        (``in<k>`` where a name is not an identifier or is used twice).

    Returns
    -------
    Scope
        The output buffer's value as an expression.

    Raises
    ------
    LiftError
        For any PrimFunc outside the shape described in the module docstring.
    """
    if not isinstance(func, tirx.PrimFunc):
        raise LiftError(f"expected a PrimFunc, got {type(func).__name__}")
    params = list(func.params)
    for p in params:
        if type(p.ty).__name__ != "BufferType":
            raise LiftError(f"PrimFunc: parameter {p.name} is not a buffer")
    if not params:
        raise LiftError("PrimFunc: no parameters")
    inputs, output = params[:-1], params[-1]
    if names is not None and len(names) != len(inputs):
        raise LiftError(f"PrimFunc: {len(names)} names for {len(inputs)} inputs")
    tensors: Dict[int, Tensor] = {}
    raw = [str(p.name) for p in inputs]
    taken = set(names or ()) | {n for n in raw if raw.count(n) == 1 and is_identifier(n)}
    for pos, p in enumerate(inputs):
        if names is not None:
            name = names[pos]
        elif raw.count(p.name) == 1 and is_identifier(str(p.name)):
            name = str(p.name)
        else:
            name, k = f"in{pos}", 0
            while name in taken:
                name, k = f"in{pos}_{k}", k + 1
            taken.add(name)
        shape = [_int(s, f"shape of {p.name}") for s in p.shape]
        tensors[hash(p)] = Tensor(name, shape, str(p.dtype))

    root = _root_block(func)
    if root.init is not None or len(root.iter_vars):
        raise LiftError("PrimFunc: unexpected root block iterators or init")
    found: List = []
    _blocks(root.body, [], found)
    if not found:
        raise LiftError("PrimFunc: no blocks")
    stages: Dict[int, Stage] = {}
    for loops, realize in found:
        stage = _block_stage(realize, loops)
        buf = realize.block.body.buffer
        if hash(buf) in tensors:
            raise LiftError(f"PrimFunc: block {stage.name} writes the input {buf.name}")
        if hash(buf) in stages:
            raise LiftError(f"PrimFunc: buffer {buf.name} is written by two blocks")
        if any(p.same_as(buf) for p in params[:-1]):
            raise LiftError(f"PrimFunc: block {stage.name} writes a parameter")
        stages[hash(buf)] = stage
    if hash(output) not in stages:
        raise LiftError(f"PrimFunc: no block writes the output {output.name}")

    def resolve(buf):
        key = hash(buf)
        if key in tensors:
            return tensors[key]
        if key in stages:
            return stages[key]
        raise LiftError(f"PrimFunc: buffer {buf.name} is read but never written")

    lifter = StageLifter(resolve, [t.name for t in tensors.values()])
    return lifter.lift(stages[hash(output)])
