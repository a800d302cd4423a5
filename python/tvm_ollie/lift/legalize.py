"""Fallback lift of a Relax call through TVM's own legalization (opt-in).

``FLegalize`` of most Relax ops is ``bb.call_te(topi_function, *args)``. Calling it with a
stand-in builder that records the TE graph instead of emitting a PrimFunc gives the op's TOPI
compute, which :func:`~.te_lift.lift_te` then lifts with the operands named as
:class:`~.registry.Operands` names them. The result is exact whenever it is returned (the TE
lift refuses what it cannot express), but it has TOPI's stage structure rather than the
hand-written forms of the registry, so :func:`~.lift` only uses it when asked to.
"""

from __future__ import annotations

from typing import Dict

from ..compat import Op, relax, te, tvm
from ..ir.nodes import Scope
from .common import op_name, static_shape, tensor_dtype
from .errors import LiftError
from .registry import Operands
from .te_lift import lift_te


class _CaptureBuilder:
    """Stands in for ``relax.BlockBuilder`` inside a legalization function."""

    def __init__(self, names: Operands):
        self.names = names
        self.holders: Dict[int, object] = {}
        self.result = None

    def call_te(self, func, *args, **kwargs):
        """Run the TE function on placeholders; remember its result."""
        kwargs.pop("primfunc_name_hint", None)
        self.result = func(*[self._convert(a) for a in args],
                           **{k: self._convert(v) for k, v in kwargs.items()})
        return self.result

    def _convert(self, value):
        if isinstance(value, relax.Tuple):
            return [self._convert(f) for f in value.fields]
        if isinstance(value, (tvm.ir.Array, list, tuple)):
            return [self._convert(v) for v in value]
        if isinstance(value, relax.Expr) and not tvm.ir.is_prim_expr(value) and \
                isinstance(getattr(value, "ty", None), relax.TensorType):
            key = hash(value)
            if key not in self.holders:
                what = f"{self.names.op} operand"
                self.holders[key] = te.placeholder(static_shape(value.ty, what),
                                                   tensor_dtype(value.ty, what),
                                                   self.names.name(value))
            return self.holders[key]
        return value

    def __getattr__(self, name):
        raise LiftError(f"the legalizer uses BlockBuilder.{name}, which the capture lacks")


def lift_via_legalize(call, mod=None) -> Scope:
    """Lift ``call`` by lifting the TE compute that TVM's legalizer builds for it.

    Raises
    ------
    LiftError
        When the op has no ``FLegalize``, the legalizer does more than one ``call_te`` or
        refuses the call, produces several outputs, or the TE graph does not lift.
    """
    name = op_name(call)
    try:
        legalize = Op.get(name).get_attr("FLegalize")
    except Exception as err:  # pylint: disable=broad-except
        raise LiftError(f"{name} has no legalization") from err
    if legalize is None:
        raise LiftError(f"{name} has no legalization")
    names = Operands(call, mod)
    capture = _CaptureBuilder(names)
    try:
        legalize(capture, call)
    except LiftError:
        raise
    except Exception as err:  # pylint: disable=broad-except
        raise LiftError(f"{name}: capturing the legalization failed: {err}") from err
    out = capture.result
    if not isinstance(out, te.Tensor):
        raise LiftError(f"{name}: the legalizer did not produce a single TE tensor")
    expected = names.out_shape()
    scope = lift_te(out, names={t: t.op.name for t in capture.holders.values()})
    if tuple(scope.shape) != tuple(expected):
        raise LiftError(f"{name}: legalized shape {scope.shape} differs from {expected}")
    return scope
