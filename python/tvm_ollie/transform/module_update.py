"""The one way the function-level rewrites of this package hand back a module.

A rewrite (epilogue folding, inference folding, any walk over dataflow blocks) computes new
functions for some global vars; the module it returns must be a copy (the caller's module is
shared: the joint build keeps it for another plan), carry the old module's attributes, and be
normalized (rewritten bindings may need their struct info deduced again). Done in one place so
every rewrite gets all three.
"""

from __future__ import annotations

from typing import Mapping

from ..compat import relax, tvm


def with_functions(mod: "tvm.IRModule",
                   updates: Mapping["tvm.ir.GlobalVar", "relax.Function"]) -> "tvm.IRModule":
    """A normalized copy of ``mod`` with ``updates`` replacing its functions; ``mod`` itself
    when there is nothing to update."""
    if not updates:
        return mod
    new_mod = tvm.IRModule(dict(mod.functions_items()), attrs=mod.attrs)
    for gv, func in updates.items():
        new_mod[gv] = func
    return relax.transform.Normalize()(new_mod)
