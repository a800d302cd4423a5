"""Reduced-precision builds: a model converted by TVM's own ``ToMixedPrecision`` before the pass.

``relax.transform.ToMixedPrecision(out_dtype="float32")`` runs convolutions and matmuls on float16
operands that accumulate in float32 (``out_dtype``), and the elementwise operators that follow
them in float16; the model's parameters and result keep their types (casts are inserted at the
edges), so a float16 build is called exactly like the float32 one. The ollie pass then sees
float16 operators whose bodies cast their reads to float32, which the lifts, the derivation (see
:mod:`tvm_ollie.derive.casts`) and the checks (:func:`tvm_ollie.verify.tolerance.tolerance`)
handle. TVM's pass only produces float16: bfloat16 is not offered here.
"""

from __future__ import annotations

from typing import Optional

from ..compat import relax, tvm

__all__ = ["DTYPES", "to_precision"]

#: Values of the ``dtype`` option: the model as given, or converted to float16.
DTYPES = ("float32", "float16")


def to_precision(mod: "tvm.IRModule", dtype: Optional[str]) -> "tvm.IRModule":
    """``mod`` computing in ``dtype`` (``None`` or ``"float32"``: unchanged).

    Raises
    ------
    ValueError
        For a ``dtype`` other than :data:`DTYPES`.
    """
    if dtype is None or dtype == "float32":
        return mod
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, not {dtype!r} (TVM's ToMixedPrecision "
                         "converts to float16 only)")
    seq = tvm.transform.Sequential([
        relax.transform.ConvertToDataflow(),
        relax.transform.ToMixedPrecision(out_dtype="float32"),
        relax.transform.FoldConstant(),  # float16 copies of the weights, made once
    ])
    return seq(mod)
