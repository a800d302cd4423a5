"""Relax passes of tvm-ollie: :class:`OllieOptimize` and the registered ``"ollie"`` pipeline.

::

    from tvm_ollie.transform import OllieOptimize, optimize_module, build
    mod2 = OllieOptimize(target="llvm")(mod)              # a tvm.transform module pass
    mod2, report = optimize_module(mod, target="llvm")   # same, with the report
    ex, report = build(mod, target="llvm", trials=0)     # rewrite + compile (+ tuning records)
    ex = tvm.compile(mod, "llvm", relax_pipeline="ollie")  # registered on import

Importing this package registers the ``"ollie"`` Relax pipeline.
"""

from .build import PIPELINE_NAME, build, cuda_source, ollie_pipeline  # noqa: F401
from .decide import DERIVABLE_OPS, call_signature, isolated_module  # noqa: F401
from .emit import EmitError, emit_program  # noqa: F401
from .optimize import OllieOptimize, optimize_module  # noqa: F401
from .report import OpDecision, OptimizeReport  # noqa: F401

__all__ = ["OllieOptimize", "optimize_module", "build", "OptimizeReport", "OpDecision",
           "ollie_pipeline", "PIPELINE_NAME", "cuda_source", "DERIVABLE_OPS", "call_signature",
           "emit_program", "EmitError", "isolated_module"]
