"""tvm-ollie: derivation-based tensor-program optimization for Apache TVM.

The public entry points (see the README):

* :func:`lift` turns an operator (a PrimFunc, a ``te.Tensor``, or a Relax call) into an
  expression of the tensor-algebra IR (:mod:`tvm_ollie.ir`);
* :func:`evaluate` runs an expression on numpy arrays (the reference interpreter);
* :func:`lower` turns an expression back into a TVM PrimFunc.

``import tvm_ollie`` does not import TVM; the functions import what they need on first use.
"""

from __future__ import annotations

from typing import Any, Mapping

from . import ir  # noqa: F401

__version__ = "0.1.0"


def lift(op: Any, mod: Any = None) -> "ir.Scope":
    """Lift an operator into an expression. See :func:`tvm_ollie.lift.lift`."""
    from .lift import lift as _lift  # pylint: disable=import-outside-toplevel

    return _lift(op, mod)


def evaluate(expr: "ir.Node", inputs: Mapping[str, Any], **kwargs: Any):
    """Evaluate an expression on numpy inputs. See :func:`tvm_ollie.ir.interp.evaluate`."""
    from .ir.interp import evaluate as _evaluate  # pylint: disable=import-outside-toplevel

    return _evaluate(expr, inputs, **kwargs)


def lower(expr: "ir.Scope", name: str = "main", **kwargs: Any):
    """Lower an expression to a TVM PrimFunc. See :func:`tvm_ollie.codegen.lower.lower`."""
    from .codegen.lower import lower as _lower  # pylint: disable=import-outside-toplevel

    return _lower(expr, name=name, **kwargs)
