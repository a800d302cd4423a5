"""tvm-ollie: derivation-based tensor-program optimization for Apache TVM.

The public entry points (see the README):

* :func:`lift` turns an operator (a PrimFunc, a ``te.Tensor``, or a Relax call) into an
  expression of the tensor-algebra IR (:mod:`tvm_ollie.ir`);
* :func:`evaluate` runs an expression on numpy arrays (the reference interpreter);
* :func:`lower` turns an expression back into a TVM PrimFunc;
* :func:`derive` searches equivalent programs: target operators plus memory-bound eOperators;
* :mod:`tvm_ollie.transform` holds the Relax pass ``OllieOptimize``; importing ``tvm_ollie``
  registers the ``"ollie"`` Relax pipeline, so ``tvm.compile(mod, target,
  relax_pipeline="ollie")`` works.

``tvm_ollie.lift`` and ``tvm_ollie.derive`` are subpackages that can be called like functions.
"""

from __future__ import annotations

from typing import Any, Mapping

from . import native
from . import ir  # noqa: F401
from . import derive, lift  # noqa: F401  (callable subpackages: ollie.lift(x), ollie.derive(e))
from . import transform  # noqa: F401  (registers the "ollie" pipeline)

__version__ = "0.1.0"

# Register the native kernels (tvm_ollie.cpu.*) as tvm-ffi globals; on failure this logs one
# warning and the package works without them (native.available() is then False).
native.load()


def evaluate(expr: "ir.Node", inputs: Mapping[str, Any], **kwargs: Any):
    """Evaluate an expression on numpy inputs. See :func:`tvm_ollie.ir.interp.evaluate`."""
    from .ir.interp import evaluate as _evaluate  # pylint: disable=import-outside-toplevel

    return _evaluate(expr, inputs, **kwargs)


def lower(expr: "ir.Scope", name: str = "main", **kwargs: Any):
    """Lower an expression to a TVM PrimFunc. See :func:`tvm_ollie.codegen.lower.lower`."""
    from .codegen.lower import lower as _lower  # pylint: disable=import-outside-toplevel

    return _lower(expr, name=name, **kwargs)
