"""Units of decision: a Relax call, a :class:`~.regions.Region` or a
:class:`~.groups.SharedInputGroup`, and what every stage of the decision needs of one.

A unit is decided as a whole: its *signature* (equal units are decided once), its *operands*
(the names its lifted expression uses, and their Relax values) and its *isolated module*
(``main`` computes the unit alone, or a program in its place), which the cost models time and
the checker compares. Every isolated module is made by :func:`build_isolated_module`.

This module sits below :mod:`.regions` and :mod:`.groups` and never imports them: a region or
a group is recognized by its ``is_region`` / ``is_group`` flags and answers for itself
(``signature()``, ``inputs()``, ``isolated_module(...)``).
"""

from __future__ import annotations

from typing import Callable, Dict, FrozenSet, List, Optional, Sequence, Tuple

import numpy as np

from ..codegen import library as lib
from ..compat import relax, tvm
from ..derive.program import Program
from ..lift.registry import Operands
from .emit import EmitError, emit_program

__all__ = ["bind_operands", "build_isolated_module", "call_signature", "constant_inputs",
           "is_group", "is_region", "isolated_module", "operand_values", "original_form",
           "unit_module", "unit_operands", "unit_signature"]

_CONST = tvm.ir.expr.Constant


def _shape(expr) -> Tuple[int, ...]:
    return tuple(int(s) for s in expr.ty.shape)


def _tensor_args(call) -> list:
    return [a for a in call.args if isinstance(a.ty, relax.TensorType)]


def is_region(unit) -> bool:
    """Whether ``unit`` is a region (or a group) rather than one call."""
    return bool(getattr(unit, "is_region", False))


def is_group(unit) -> bool:
    """Whether ``unit`` is a group of calls sharing an operand."""
    return bool(getattr(unit, "is_group", False))


def call_signature(call) -> str:
    """Operator, operands (shape, dtype, constness, aliasing) and attributes of a call."""
    parts = [call.op.name]
    seen: Dict[int, int] = {}
    for a in _tensor_args(call):
        key = hash(a)
        alias = seen.setdefault(key, len(seen))
        kind = "c" if isinstance(a, _CONST) else "v"
        text = f"{'x'.join(str(s) for s in _shape(a))}:{a.ty.dtype}:{kind}{alias}"
        if kind == "c" and int(np.prod(_shape(a))) == 1:
            text += f"={a.value.numpy().reshape(()).item()!r}"
        parts.append(text)
    if call.attrs is not None:
        parts.append(str(call.attrs).replace("relax.attrs.", ""))
    return " ".join(parts)


def operand_values(call) -> Tuple[List[str], List[object]]:
    """Names (as the lift names them) and Relax values of the distinct tensor operands."""
    names = Operands(call)
    out_names, values = [], []
    for a in _tensor_args(call):
        n = names.name(a)
        if n not in out_names:
            out_names.append(n)
            values.append(a)
    return out_names, values


def bind_operands(operands) -> Tuple[List["relax.Var"], Dict[str, object]]:
    """Parameters for the variable operands of ``(name, value)`` pairs (in order) and the value
    every name stands for in an isolated module: its parameter, or the constant itself."""
    params, inputs = [], {}
    for n, v in operands:
        if isinstance(v, _CONST):
            inputs[n] = v
        else:
            inputs[n] = relax.Var(n, v.ty)
            params.append(inputs[n])
    return params, inputs


def original_form(call, args, impl: str = "tvm") -> "relax.Expr":
    """The call on ``args``: the Relax operator itself, or its native kernel (``impl="native"``)."""
    if impl == "native":
        form = lib.call_form(call)
        if form is None:
            raise EmitError(f"no native kernel for {call.op.name}")
        return lib.emit_call(form, args[:2], _shape(call))
    return relax.Call(call.op, args, call.attrs, call.ty_args)


def build_isolated_module(inputs: Sequence[Tuple[str, object]],
                          original: Callable[["relax.BlockBuilder", Dict[str, object]], object],
                          out_shape, program: Optional[Program] = None,
                          names: Optional[Sequence[str]] = None, impl: str = "tvm",
                          prefix: str = "ollie",
                          bb: Optional["relax.BlockBuilder"] = None) -> "tvm.IRModule":
    """The isolated module of a unit: ``main`` computes the unit alone, or ``program`` in its
    place, on the unit's inputs. Calls, regions and groups differ only in what they replay.

    Parameters
    ----------
    inputs : sequence of (str, relax.Expr)
        The unit's inputs by name, in order: variables become parameters (in that order),
        constants stay constants (:func:`bind_operands`).
    original : callable
        ``(bb, values) -> relax.Expr``: emits the unit's own computation on ``values`` (each
        input name's Relax value) and returns its (not bound) result.
    out_shape : tuple of int, or list of them
        The unit's result shape (one per result for a group), for :func:`~.emit.emit_program`.
    program : Program, optional
        Computed in the unit's place (None: the unit itself).
    names : sequence of str, optional
        The program's names of the inputs, in ``inputs`` order; None when they are the same.
    impl : str
        How the program's matched operators are emitted (:func:`~.emit.emit_program`).
    prefix : str
        Prefix of the program's PrimFunc names.
    bb : relax.BlockBuilder, optional
        A builder that already holds functions ``original`` calls (a region's ``call_tir``
        callees); a new one by default.
    """
    bb = relax.BlockBuilder() if bb is None else bb
    inputs = list(inputs)
    params, values = bind_operands(inputs)
    with bb.function("main", params):
        with bb.dataflow():
            if program is None:
                out = bb.emit_output(original(bb, values))
            else:
                in_names = [n for n, _ in inputs]
                mapping = values if names is None else {
                    pn: values[cn] for pn, cn in zip(names, in_names)}
                out = bb.emit_output(emit_program(bb, program, mapping, out_shape, impl=impl,
                                                  name=prefix))
        bb.emit_func_output(out)
    return bb.get()


def isolated_module(call, program: Optional[Program] = None, names=None,
                    impl: str = "tvm") -> "tvm.IRModule":
    """A module whose ``main`` computes the call alone (or ``program`` in its place).

    Variable operands become parameters (in operand order); constant operands stay constants.
    With ``program=None`` and ``impl="native"`` the call runs on its native library kernel.
    """
    op_names, values = operand_values(call)
    operands = Operands(call)

    def original(_bb, inputs):
        args = [inputs[operands.name(a)] if isinstance(a.ty, relax.TensorType) else a
                for a in call.args]
        return original_form(call, args, impl)

    return build_isolated_module(list(zip(op_names, values)), original, _shape(call), program,
                                 names, impl)


def unit_signature(unit) -> str:
    """:func:`call_signature` of a call; a region's own signature."""
    return unit.signature() if is_region(unit) else call_signature(unit)


def unit_operands(unit) -> Tuple[List[str], List[object]]:
    """Names and Relax values of a unit's inputs (the names its lifted expression uses)."""
    if is_region(unit):
        ins = unit.inputs()
        return [n for n, _ in ins], [v for _, v in ins]
    return operand_values(unit)


def constant_inputs(unit) -> FrozenSet[str]:
    """Names of a unit's inputs that are constants (weights bound into the module): what a
    program computes from them alone is folded when the module is built."""
    names, values = unit_operands(unit)
    return frozenset(n for n, v in zip(names, values) if isinstance(v, _CONST))


def unit_module(unit, program: Optional[Program] = None, names=None,
                impl: str = "tvm") -> "tvm.IRModule":
    """:func:`isolated_module` of a call, or of a region or group (its own ``isolated_module``
    method; ``names``: the program's names of the unit's operands, in :func:`unit_operands`
    order; None when they are the same)."""
    if is_region(unit):
        return unit.isolated_module(program, names, impl)
    return isolated_module(unit, program, names, impl)
