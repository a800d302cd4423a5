"""Lift of ``relax.call_tir``: the PrimFunc it calls, with its inputs named after the call's."""

from __future__ import annotations

from ..compat import relax, tirx
from ..ir.nodes import Scope
from .errors import LiftError
from .primfunc_lift import lift_primfunc
from .registry import Operands, register_lift


@register_lift("relax.call_tir")
def lift_call_tir(call, names: Operands) -> Scope:
    """Lift the PrimFunc of a ``call_tir`` found in ``names.mod``."""
    if names.mod is None:
        raise LiftError("relax.call_tir: the IRModule holding the PrimFunc is needed (mod=...)")
    gv = call.args[0]
    try:
        func = names.mod[gv]
    except Exception as err:  # pylint: disable=broad-except
        raise LiftError(f"relax.call_tir: {gv} is not in the module") from err
    if not isinstance(func, tirx.PrimFunc):
        raise LiftError(f"relax.call_tir: {gv} is not a PrimFunc")
    if len(call.args) > 2:
        raise LiftError("relax.call_tir: calls with symbolic shape arguments are unsupported")
    args = call.args[1]
    fields = list(args.fields) if isinstance(args, relax.Tuple) else [args]
    for a in fields:
        if not isinstance(a.ty, relax.TensorType):
            raise LiftError("relax.call_tir: non-tensor arguments are unsupported")
    if not isinstance(call.ty, relax.TensorType):
        raise LiftError("relax.call_tir: only single-output calls are supported")
    return lift_primfunc(func, names=[names.name(a) for a in fields])
