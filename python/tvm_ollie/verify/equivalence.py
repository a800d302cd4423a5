"""Numeric equivalence of two expressions, the gate every rewrite must pass before it is applied.

Both expressions are evaluated by the reference interpreter in float64 on the same inputs. The
first trial uses small integer inputs: sums of products of integers are exact in float64, so an
equivalent rewrite (whatever order it sums in) must reproduce the original to rounding, and an
off-by-one index or a dropped term shows up as an error of at least one unit instead of hiding in
float noise. The remaining trials use uniform random floats and the caller's tolerances.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Tuple

import numpy as np

from ..ir.interp import OutOfBoundsError, evaluate, random_arrays
from ..ir.nodes import IterVar, Node, Scope, Tensor, iter_nodes

__all__ = ["EquivalenceResult", "check_equivalent"]

# Relative tolerance of the integer trial: only float64 rounding (non-polynomial functions,
# reassociated sums of large values) may separate two equivalent expressions there.
EXACT_RTOL = 1e-9


@dataclass(frozen=True)
class EquivalenceResult:
    """Outcome of :func:`check_equivalent`.

    Attributes
    ----------
    ok : bool
        True when every trial agreed within tolerance.
    max_abs_err, max_rel_err : float
        Largest absolute and relative difference over all trials that ran (``inf`` where a
        non-finite value differed, an expression could not be evaluated, or shapes differ).
    reason : str
        Why the check failed (empty when ``ok``).
    """

    ok: bool
    max_abs_err: float
    max_rel_err: float
    reason: str = ""

    def __bool__(self) -> bool:
        return self.ok


def check_equivalent(
    a: Node,
    b: Node,
    seed: int = 0,
    trials: int = 2,
    rtol: float = 1e-5,
    atol: float = 1e-6,
    inputs: Optional[Mapping[str, np.ndarray]] = None,
) -> EquivalenceResult:
    """Check numerically that ``b`` computes the same tensor as ``a``.

    Parameters
    ----------
    a : Node
        The reference expression (usually a :class:`Scope`).
    b : Node
        The candidate; it reads the same input tensors as ``a`` or a subset of them.
    seed : int
        Seed of the generated inputs; trial ``k`` uses ``seed + k``.
    trials : int
        Number of trials: the first with small integer inputs (must match to float64 rounding),
        the others with uniform floats in ``[-1, 1)`` (must match within ``rtol``/``atol``).
    rtol, atol : float
        Tolerances of the float trials, relative to ``a``'s values: ``|b - a| <= atol + rtol*|a|``.
    inputs : Mapping[str, np.ndarray], optional
        Fixed arrays to check on instead of the generated trials (one float-tolerance trial);
        tensors missing from the mapping get random floats.

    Returns
    -------
    EquivalenceResult
        ``ok`` is False, with a reason, on an output shape mismatch, a tensor declared with two
        shapes, an out-of-bounds read or an integer division by zero in either expression, or a
        numeric difference.
    """
    if trials < 1:
        raise ValueError("check_equivalent needs at least one trial")
    shape_a, shape_b = _shape(a), _shape(b)
    if shape_a != shape_b:
        return _fail(f"output shapes differ: {list(shape_a)} vs {list(shape_b)}")
    tensors, conflict = _union_tensors(a, b)
    if conflict:
        return _fail(conflict)

    plan: List[Tuple[str, Dict[str, np.ndarray], float, float]] = []
    if inputs is not None:
        arrays = random_arrays(tensors, seed, integer=False, dtype="float64")
        arrays.update({k: np.asarray(v, dtype=np.float64) for k, v in inputs.items()})
        plan.append(("given inputs", arrays, rtol, atol))
    else:
        plan.append((f"integer inputs (seed {seed})",
                     random_arrays(tensors, seed, integer=True, dtype="float64"), EXACT_RTOL, None))
        for k in range(1, trials):
            plan.append((f"random inputs (seed {seed + k})",
                         random_arrays(tensors, seed + k, dtype="float64"), rtol, atol))

    worst_abs = worst_rel = 0.0
    for label, arrays, t_rtol, t_atol in plan:
        ref, err = _run(a, arrays, "first")
        if err is None:
            got, err = _run(b, arrays, "second")
        if err is not None:
            return _fail(f"{label}: {err}")
        if t_atol is None:  # exact trial: rounding scaled by the magnitude of the result
            finite = np.abs(ref[np.isfinite(ref)])
            t_atol = EXACT_RTOL * max(1.0, float(finite.max()) if finite.size else 1.0)
        abs_err, rel_err, mismatch = _compare(ref, got, t_rtol, t_atol)
        worst_abs, worst_rel = max(worst_abs, abs_err), max(worst_rel, rel_err)
        if mismatch:
            return EquivalenceResult(False, worst_abs, worst_rel, f"{label}: {mismatch}")
    return EquivalenceResult(True, worst_abs, worst_rel, "")


def _fail(reason: str) -> EquivalenceResult:
    return EquivalenceResult(False, float("inf"), float("inf"), reason)


def _shape(expr: Node) -> Tuple[int, ...]:
    if isinstance(expr, (Scope, Tensor)):
        return tuple(expr.shape)
    if isinstance(expr, IterVar):
        raise TypeError("an IterVar is not an expression")
    return ()


def _union_tensors(a: Node, b: Node) -> Tuple[List[Tensor], str]:
    """Input tensors of both expressions, one per name, or a reason they disagree."""
    found: Dict[str, Tensor] = {}
    for expr in (a, b):
        for node in iter_nodes(expr):
            if isinstance(node, Tensor):
                prev = found.setdefault(node.name, node)
                if prev.shape != node.shape:
                    return [], (f"tensor {node.name!r} is declared with two shapes: "
                                f"{list(prev.shape)} and {list(node.shape)}")
    return list(found.values()), ""


def _run(expr: Node, arrays: Dict[str, np.ndarray], which: str):
    try:
        return evaluate(expr, arrays, dtype=np.float64), None
    except OutOfBoundsError as exc:
        return None, f"the {which} expression reads out of bounds: {exc}"
    except ZeroDivisionError as exc:
        return None, f"the {which} expression divides by zero: {exc}"


def _compare(ref: np.ndarray, got: np.ndarray, rtol: float, atol: float):
    """``(max_abs_err, max_rel_err, mismatch description or "")``."""
    both_finite = np.isfinite(ref) & np.isfinite(got)
    # Non-finite values must agree exactly (nan with nan, inf with the same inf).
    same_special = (np.isnan(ref) & np.isnan(got)) | (~both_finite & (ref == got))
    bad_special = ~both_finite & ~same_special
    with np.errstate(invalid="ignore"):
        diff = np.where(both_finite, np.abs(got - ref), 0.0)
    rel = diff / np.maximum(np.abs(ref), max(atol, np.finfo(np.float64).tiny))
    abs_err = float(diff.max()) if diff.size else 0.0
    rel_err = float(rel.max()) if rel.size else 0.0
    if bad_special.any():
        abs_err = rel_err = float("inf")
    bad = bad_special | (diff > atol + rtol * np.abs(np.where(both_finite, ref, 0.0)))
    if not bad.any():
        return abs_err, rel_err, ""
    count = int(bad.sum())
    where = tuple(int(i) for i in np.argwhere(bad)[0])
    return abs_err, rel_err, (
        f"{count} of {bad.size} elements differ (max abs err {abs_err:.3g}, max rel err "
        f"{rel_err:.3g}); first at {list(where)}: {ref[where]!r} vs {got[where]!r}"
    )
