"""Derivation: rewrite an expression into target operators plus memory-bound eOperators.

``derive(expr, targets=..., max_depth=...)`` searches rule applications
(:mod:`tvm_ollie.derive.rules`) and instantiates target operators at every state
(:mod:`tvm_ollie.derive.match`, :mod:`tvm_ollie.derive.program`); see :mod:`.search`. The
target operators are the rows of :data:`TARGET_OPS` (:mod:`tvm_ollie.derive.targets`).
"""

from .._callable import make_callable
from .program import Program, Stage  # noqa: F401
from .search import DEFAULT_TARGETS, DeriveResult, SearchStats, StopReason, derive  # noqa: F401
from .targets import TARGET_OPS, TargetOp  # noqa: F401

__all__ = ["derive", "DeriveResult", "Program", "Stage", "StopReason", "SearchStats",
           "DEFAULT_TARGETS", "TARGET_OPS", "TargetOp"]

make_callable(__name__, derive)
