"""Numerical tolerances of the float checks, scaled with the element type checked.

A rewrite regroups sums and moves casts, so its float result differs from the original's by
rounding: a few units in the last place of the narrowest type involved, times the growth of
rounding over a reduction. The relative tolerances below are that bound for the reductions of
the model zoo (a few thousand terms) with a margin: float32 keeps the check the project has
always used (``1e-4``), float16 (10-bit mantissa) and bfloat16 (7-bit mantissa) scale it by the
ratio of their machine epsilons, capped where a wrong rewrite would still stand out (errors of a
wrong rewrite are of the order of the values themselves).
"""

from __future__ import annotations

from typing import Iterable

from ..ir.nodes import Node, Scope, Tensor, is_cast, is_float_dtype, iter_nodes

__all__ = ["RELATIVE", "tolerance", "expr_tolerance", "narrowest_float"]

#: Relative tolerance per element type (of the largest output magnitude, or elementwise).
RELATIVE = {"float64": 1e-7, "float32": 1e-4, "float16": 1e-2, "bfloat16": 5e-2}


def tolerance(dtype: str) -> float:
    """The relative tolerance of a float check on values of ``dtype`` (float32's for
    non-float types, whose checks compare float results)."""
    return RELATIVE.get(str(dtype), RELATIVE["float32"])


def narrowest_float(dtypes: Iterable[str]) -> str:
    """The float type of ``dtypes`` with the largest tolerance (float32 without any)."""
    floats = [str(d) for d in dtypes if is_float_dtype(str(d))]
    return max(floats, key=tolerance, default="float32")


def expr_tolerance(expr: Node) -> float:
    """The tolerance of a check of ``expr``: that of the narrowest float type it reads, casts
    to, or stores a stage in (a float16 input rounds the result even when summed in float32)."""
    dtypes = set()
    for node in iter_nodes(expr):
        if isinstance(node, (Tensor, Scope)):
            dtypes.add(node.dtype)
        elif is_cast(node):
            dtypes.add(node.func)
    return tolerance(narrowest_float(dtypes))
