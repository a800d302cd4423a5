"""Lifting operators into the tensor-algebra IR.

:func:`lift` accepts a Relax call (a registered op, or ``call_tir`` with its module), a
``te.Tensor`` computed by a ``te.ComputeOp``, or a PrimFunc, and returns a :class:`Scope` whose
value is the operator's result. Anything that cannot be expressed exactly raises
:class:`LiftError`; a lift never returns an approximate expression.
"""

from __future__ import annotations

from .._callable import make_callable
from ..compat import Op, relax, te, tirx
from ..ir.nodes import Scope
from .errors import LiftError
from .legalize import lift_via_legalize
from .primfunc_lift import lift_primfunc
from .registry import (
    Operands,
    constant_arrays,
    get_lift,
    lift_relax_call,
    register_lift,
    registered_ops,
)
from .te_lift import lift_te

__all__ = [
    "LiftError",
    "Operands",
    "constant_arrays",
    "get_lift",
    "lift",
    "lift_primfunc",
    "lift_relax_call",
    "lift_te",
    "lift_via_legalize",
    "register_lift",
    "registered_ops",
]


def lift(x, mod=None, legalize_fallback: bool = False) -> Scope:
    """Lift an operator into an expression of the IR.

    Parameters
    ----------
    x : relax.Call | te.Tensor | tirx.PrimFunc
        The operator. A Relax call must be of an op with a registered lift (see
        :func:`registered_ops`) or a ``relax.call_tir``.
    mod : IRModule, optional
        The module of a Relax call; required for ``call_tir`` (its PrimFunc lives there).
    legalize_fallback : bool
        For a Relax op without a registered lift, lift the TE compute of TVM's legalization
        instead (:func:`lift_via_legalize`; exact, but in TOPI's stage structure).

    Returns
    -------
    Scope
        The operator's result as an expression; :func:`tvm_ollie.evaluate` runs it on arrays
        named like the operator's inputs.

    Raises
    ------
    LiftError
        When ``x`` (an op, attribute, shape or dtype of it) is not supported.
    """

    if isinstance(x, tirx.PrimFunc):
        return lift_primfunc(x)
    if isinstance(x, te.Tensor):
        return lift_te(x)
    if isinstance(x, relax.Call):
        name = getattr(x.op, "name", "")
        if not (isinstance(x.op, Op) and name.startswith("relax.")):
            raise LiftError(f"{x.op} is not a Relax operator call")
        if legalize_fallback and get_lift(name) is None:
            return lift_via_legalize(x, mod)
        return lift_relax_call(x, mod)
    raise LiftError(f"cannot lift a {type(x).__name__}: expected a relax.Call, te.Tensor or "
                    "PrimFunc")


make_callable(__name__, lift)
