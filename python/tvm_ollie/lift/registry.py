"""The registry of Relax-op lifts and the naming of a call's operands.

A lift is a function ``(call, names) -> Scope`` registered under a Relax op name with
:func:`register_lift`. ``names`` (an :class:`Operands`) turns the call's arguments into IR
tensors with stable names, so that the lifted expression can be evaluated with the arrays that
the Relax function receives:

* a ``relax.Var`` argument is named after its name (``name_hint``) when that is an identifier
  that no other argument uses; otherwise (and for any other expression) ``in<k>``, ``k`` being
  the operand's position among the call's tensor operands;
* a constant tensor is named ``const0``, ``const1``, ... in order; a constant with a single
  element (0-d or all-ones shape) used as a scalar operand is inlined as a :class:`Const`.
"""

from __future__ import annotations

from typing import Callable, Dict, List, Optional

import numpy as np

from ..compat import relax, tirx, tvm
from ..ir.nodes import Scope, Tensor
from .common import is_identifier, op_name, static_shape, tensor_dtype
from .errors import LiftError

LiftFunc = Callable[["tvm.ir.Call", "Operands"], Scope]

_REGISTRY: Dict[str, LiftFunc] = {}

_ConstantNode = tvm.ir.expr.Constant


def register_lift(op_name_: str, func: Optional[LiftFunc] = None, override: bool = False):
    """Register ``func(call, names) -> Scope`` as the lift of Relax op ``op_name_``.

    Usable as a decorator (``@register_lift("relax.nn.conv2d")``). Registering a name twice
    raises ``ValueError`` unless ``override`` is set.
    """

    def wrap(f: LiftFunc) -> LiftFunc:
        if op_name_ in _REGISTRY and not override:
            raise ValueError(f"a lift for {op_name_} is already registered")
        _REGISTRY[op_name_] = f
        return f

    return wrap if func is None else wrap(func)


def get_lift(name: str) -> Optional[LiftFunc]:
    """The lift registered for op ``name``, or ``None``."""
    _load_builtin_lifts()
    return _REGISTRY.get(name)


def registered_ops() -> List[str]:
    """Names of every Relax op with a registered lift, sorted."""
    _load_builtin_lifts()
    return sorted(_REGISTRY)


def _load_builtin_lifts() -> None:
    # lazy: cycle (relax_ops imports every lift module, and they register here)
    from . import relax_ops  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import


def _flatten_args(args) -> list:
    out = []
    for a in args:
        if isinstance(a, relax.Tuple):
            out.extend(_flatten_args(a.fields))
        else:
            out.append(a)
    return out


def _var_name(var) -> str:
    """A Relax variable's name (``name`` in TVM 0.27, ``name_hint`` before)."""
    return str(getattr(var, "name", None) or getattr(var, "name_hint", ""))


class Operands:
    """Names and IR tensors of one Relax call's tensor operands (see the module docstring).

    Parameters
    ----------
    call : relax.Call
        The call being lifted.
    mod : IRModule, optional
        The module holding the call's callees (needed for ``call_tir``).
    """

    def __init__(self, call, mod=None):
        self.call = call
        self.mod = mod
        self.op = op_name(call)
        self._names: Dict[int, str] = {}
        self._assign_names(_flatten_args(call.args))

    def _assign_names(self, leaves: list) -> None:
        tensors = [a for a in leaves if isinstance(a.ty, relax.TensorType)]
        hints: Dict[str, set] = {}
        for a in tensors:
            if isinstance(a, relax.Var) and is_identifier(_var_name(a)):
                hints.setdefault(_var_name(a), set()).add(self._key(a))
        unique = {name for name, ids in hints.items() if len(ids) == 1}
        taken = set(unique)
        n_const = 0
        for pos, a in enumerate(tensors):
            key = self._key(a)
            if key in self._names:
                continue
            if isinstance(a, relax.Var) and _var_name(a) in unique:
                self._names[key] = _var_name(a)
                continue
            if isinstance(a, _ConstantNode):
                base, n_const = f"const{n_const}", n_const + 1
            else:
                base = f"in{pos}"
            name, k = base, 0
            while name in taken:
                name, k = f"{base}_{k}", k + 1
            taken.add(name)
            self._names[key] = name

    @staticmethod
    def _key(expr) -> int:
        # Object handles are interned by tvm-ffi: the same Var is the same Python object.
        return id(expr) if not hasattr(expr, "same_as") else hash(expr)

    @property
    def names(self) -> List[str]:
        """Every tensor name handed out, in operand order."""
        return list(dict.fromkeys(self._names.values()))

    def name(self, expr) -> str:
        """The name of a tensor operand."""
        key = self._key(expr)
        if key not in self._names:
            raise LiftError(f"{self.op}: {expr} is not a tensor operand of the call")
        return self._names[key]

    def tensor(self, expr, what: str = "operand") -> Tensor:
        """The IR tensor (no padding) of a tensor operand; static shapes only."""
        label = f"{self.op}: {what}"
        shape = static_shape(expr.ty, label)
        if any(s <= 0 for s in shape):
            raise LiftError(f"{label} has an empty dimension: {shape}")
        return Tensor(self.name(expr), shape, tensor_dtype(expr.ty, label))

    def shape(self, expr, what: str = "operand") -> tuple:
        """Static shape of an operand."""
        return static_shape(expr.ty, f"{self.op}: {what}")

    def dtype(self, expr, what: str = "operand") -> str:
        """Element type of an operand."""
        return tensor_dtype(expr.ty, f"{self.op}: {what}")

    def out_shape(self) -> tuple:
        """Static shape of the call's result."""
        return static_shape(self.call.ty, f"{self.op}: result")

    def out_dtype(self) -> str:
        """Element type of the call's result."""
        return tensor_dtype(self.call.ty, f"{self.op}: result")

    def scalar(self, expr) -> Optional[float]:
        """The value of a scalar operand (a prim value or a one-element constant), else None."""
        if isinstance(expr, (tirx.IntImm, tirx.FloatImm)):
            return expr.value
        if isinstance(expr, _ConstantNode):
            data = expr.value.numpy()
            if data.size == 1:
                return data.reshape(()).item()
        return None

    def tensors(self) -> List[Tensor]:
        """IR tensors of every tensor operand, in order, each once."""
        seen: Dict[str, Tensor] = {}
        for a in _flatten_args(self.call.args):
            if isinstance(a.ty, relax.TensorType):
                t = self.tensor(a)
                seen.setdefault(t.name, t)
        return list(seen.values())


def constant_arrays(call) -> Dict[str, np.ndarray]:
    """The arrays of a call's constant tensor operands, keyed by the names a lift gives them.

    Pass them (merged with the arrays of the variable operands) to the interpreter.
    """
    ops = Operands(call)
    out = {}
    for a in _flatten_args(call.args):
        if isinstance(a, _ConstantNode) and isinstance(a.ty, relax.TensorType):
            out[ops.name(a)] = a.value.numpy()
    return out


def lift_relax_call(call, mod=None) -> Scope:
    """Lift one Relax call into an expression.

    Parameters
    ----------
    call : relax.Call
        A call of a registered Relax op (see :func:`registered_ops`), or ``relax.call_tir`` of a
        PrimFunc in ``mod``.
    mod : IRModule, optional
        The module of the call; required for ``call_tir``.

    Returns
    -------
    Scope
        An expression whose value is the call's result; its input tensors are named as the
        module docstring says.

    Raises
    ------
    LiftError
        When the op has no lift, or an attribute, shape or dtype is unsupported.
    """
    if not isinstance(call, relax.Call):
        raise LiftError(f"expected a relax.Call, got {type(call).__name__}")
    name = op_name(call)
    func = get_lift(name)
    if func is None:
        raise LiftError(f"no lift is registered for {name} (registered: "
                        f"{', '.join(registered_ops())})")
    names = Operands(call, mod)
    scope = func(call, names)
    if not isinstance(scope, Scope):
        raise LiftError(f"{name}: the lift returned {type(scope).__name__}, not a Scope")
    expected = names.out_shape()
    if tuple(scope.shape) != tuple(expected):
        raise LiftError(f"{name}: lifted shape {scope.shape} differs from the result type "
                        f"{expected} (an unsupported attribute combination)")
    return scope
