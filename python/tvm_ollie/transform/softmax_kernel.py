"""Softmax over the last axis as one native library call (``tvm_ollie.cpu.softmax``).

TVM builds an untuned softmax as serial loop nests over the whole tensor (the max, the
exponentials, their sum and the division, each a pass): at paper-size Segformer its eight
softmaxes took 40.0 ms against ONNX Runtime's 3.4 ms (docs/benchmarks.md). The native kernel
normalizes each row in the cache, rows in parallel (``tvm_ollie/softmax.cc``). One rule, by name
with its equation (``K`` the kernel)::

    softmax_last_axis:    nn.softmax(x, axis) = K(x)      where axis = rank(x) - 1 (or -1)

Guards: ``x`` a float32 tensor of static shape and rank >= 1; the native library provides the
kernel (an older build keeps TVM's kernel). Exact up to rounding: the kernel sums the
exponentials in double. Run with the norm kernels (``OllieConfig.norm_kernels``), on CPU targets
with the library, before the units are found, so that no unit's decision weighs the softmax TVM
would have built.
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple

from .. import native
from ..codegen import library as lib
from ..compat import relax, tvm
from .epilogue import is_f32, rewrite_dataflow_blocks, static_shape

__all__ = ["SOFTMAX_LAST_AXIS", "softmax_kernels"]

#: The rule, by name with its equation (module docstring).
SOFTMAX_LAST_AXIS = ("softmax_last_axis", "nn.softmax(x, axis = rank(x) - 1) = K(x)")


def _last_axis_softmax(value) -> Optional["relax.Expr"]:
    """``x`` when ``value`` is ``nn.softmax(x)`` over the last axis of a static float32 ``x``,
    else None."""
    if not (isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op)
            and value.op.name == "relax.nn.softmax"):
        return None
    x = value.args[0]
    shape = static_shape(x)
    if shape is None or len(shape) < 1 or not is_f32(x):
        return None
    if int(value.attrs.axis) not in (-1, len(shape) - 1):
        return None
    return x


def _kernel_call(x: "relax.Expr") -> "relax.Call":
    """``R.call_dps_packed("tvm_ollie.cpu.softmax", (x,), x's type)``."""
    return relax.call_dps_packed(lib.SOFTMAX, [x], relax.TensorType(static_shape(x), "float32"))


def _rewrite(bindings, counts: Dict[str, int]):
    out = []
    for binding in bindings:
        x = _last_axis_softmax(getattr(binding, "value", None))
        if x is None:
            out.append(binding)
            continue
        out.append(relax.VarBinding(binding.var,
                                    relax.BlockBuilder().normalize(_kernel_call(x))))
        counts[SOFTMAX_LAST_AXIS[0]] = counts.get(SOFTMAX_LAST_AXIS[0], 0) + 1
    return out


def softmax_kernels(mod: "tvm.IRModule") -> Tuple["tvm.IRModule", Dict[str, int]]:
    """``mod`` with every last-axis softmax as a native call; and how many the rule rewrote
    (empty when the library lacks the kernel or nothing matched)."""
    if not native.provides(lib.SOFTMAX):
        return mod, {}
    counts: Dict[str, int] = {}
    new_mod = rewrite_dataflow_blocks(mod, lambda bindings, _: _rewrite(bindings, counts))
    return (new_mod, counts) if counts else (mod, {})
