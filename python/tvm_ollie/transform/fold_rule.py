"""The shape of an inference fold rule, and the guards the rules share.

A fold rule (:class:`FoldRule`) is data: a name, a TVM dataflow pattern, and a rewrite that
returns the replacement or ``None`` when a guard fails. The batch-norm folds
(:mod:`.inference_fold`) and the activation patterns (:mod:`.activations`) are both written
this way and applied by :func:`~.inference_fold.fold_inference`.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Callable, Dict, Optional

import numpy as np

from ..compat import tirx, tvm

__all__ = ["FoldRule", "Matches", "Rewrite", "const_value", "scalar_value", "used_once"]

Matches = Dict[object, object]
#: ``rewrite(matches, uses, binding_of) -> replacement or None``; ``uses`` counts reads per
#: Relax variable, ``binding_of`` maps a bound value to its variable.
Rewrite = Callable[[Matches, Counter, Dict[object, object]], Optional[object]]


@dataclass(frozen=True)
class FoldRule:
    """One inference fold: ``pattern`` found in a Relax function becomes ``rewrite``'s result.

    Attributes
    ----------
    name : str
        Reported in the fold counts.
    pattern : DFPattern
        The TVM dataflow pattern (it sees through variable bindings).
    rewrite : callable
        ``rewrite(matches, uses, binding_of)``: the replacement expression, or None when a
        guard fails.
    """

    name: str
    pattern: object
    rewrite: Rewrite


def const_value(expr) -> Optional[np.ndarray]:
    """The value of a Relax tensor constant, else None (a scalar ``IntImm``/``FloatImm`` is a
    ``Constant`` too in TVM 0.27, but holds a Python number)."""
    if isinstance(expr, (tirx.IntImm, tirx.FloatImm)):
        return None
    return expr.value.numpy() if isinstance(expr, tvm.ir.expr.Constant) else None


def scalar_value(expr) -> Optional[float]:
    """The one value of a Relax constant with one element (any rank) or of a scalar ``PrimExpr``
    (a clip bound), else None."""
    if isinstance(expr, (tirx.IntImm, tirx.FloatImm)):
        return float(expr.value)
    value = const_value(expr)
    if value is not None and value.size == 1:
        return float(value.reshape(-1)[0])
    return None


def used_once(expr, uses: Counter, binding_of: Dict[object, object]) -> bool:
    """The value of ``expr`` is read by one consumer only (else the fold would compute it
    twice)."""
    var = binding_of.get(expr)
    return var is None or uses[var] <= 1
