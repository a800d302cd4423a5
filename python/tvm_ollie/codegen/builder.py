"""Tiny helpers to write a one-function Relax module in code (tests, benchmarks, demos)."""

from __future__ import annotations

from typing import Callable, Sequence, Tuple

from ..compat import relax, tvm


def tensor_var(name: str, shape: Tuple[int, ...], dtype: str = "float32") -> "relax.Var":
    """A Relax parameter of a static tensor type."""
    return relax.Var(name, relax.TensorType(shape, dtype))


def single_function_module(params: Sequence["relax.Var"],
                           body: Callable[..., "relax.Expr"]) -> "tvm.IRModule":
    """``main(*params)`` whose dataflow block is ``body(bb, *params)`` (its value is the output).

    ``body`` may emit intermediate bindings with ``bb.emit`` and returns the output expression.
    """
    bb = relax.BlockBuilder()
    with bb.function("main", list(params)):
        with bb.dataflow():
            out = bb.emit_output(body(bb, *params))
        bb.emit_func_output(out)
    return bb.get()
