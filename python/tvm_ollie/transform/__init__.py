"""The derivation pass of tvm-ollie: :class:`OllieOptimize`.

::

    from tvm_ollie.transform import OllieOptimize, optimize_module
    mod2 = OllieOptimize(target="llvm")(mod)              # a tvm.transform module pass
    mod2, report = optimize_module(mod, target="llvm")   # same, with the report
    for d in report.regions + report.decisions:           # one Decision per unit decided
        print(d.kind, d.var_name, d.chosen, d.reason)

``build``, ``cuda_source``, ``ollie_pipeline`` and ``PIPELINE_NAME`` moved to
:mod:`tvm_ollie.pipeline` (which registers the ``"ollie"`` Relax pipeline on ``import
tvm_ollie``); ``tvm_ollie.transform.build`` and the others still work for one release, with a
DeprecationWarning (the package's ``__init__`` provides them: this package never imports the
pipeline, which sits a floor above it).
"""

from .decide import DERIVABLE_OPS, call_signature, isolated_module  # noqa: F401
from .emit import EmitError, emit_program  # noqa: F401
from .optimize import OllieOptimize, optimize_module  # noqa: F401
from .decision import Decision  # noqa: F401
from .report import OpDecision, OptimizeReport  # noqa: F401

__all__ = ["OllieOptimize", "optimize_module", "OptimizeReport", "Decision", "OpDecision",
           "DERIVABLE_OPS", "call_signature", "emit_program", "EmitError", "isolated_module"]
