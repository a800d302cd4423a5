"""Every version-sensitive TVM import, in one place (TVM 0.27 renamed tir, StructInfo, ...).

Upgrading TVM should touch this module only: the rest of the package imports TVM names from here.
"""

# pylint: disable=unused-import
import tvm  # noqa: F401
from tvm import relax, te, topi  # noqa: F401
from tvm import tirx  # noqa: F401  (was tvm.tir before 0.27)
from tvm import sym  # noqa: F401  (was tvm.arith before 0.27: Analyzer, ConstIntBound)
from tvm.ir import Op  # noqa: F401
from tvm.s_tir import dlight  # noqa: F401  (was tvm.dlight)
from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock  # noqa: F401  (was tvm.tir)

#: The op of a tensor read inside a ``te.compute`` body (0.27 has no ProducerLoad).
TENSOR_LOAD = Op.get("te.tensor_load")

#: Class of a buffer read inside a PrimFunc (``tirx.BufferLoad`` is only a constructor in 0.27).
BufferLoadNode = tvm.ir.expr.TensorLoad


def meta_schedule():
    """``tvm.s_tir.meta_schedule``, imported lazily (its import pulls in heavy modules)."""
    # lazy: MetaSchedule is slow to import (compat keeps it lazy)
    from tvm.s_tir import meta_schedule  # pylint: disable=import-outside-toplevel

    return meta_schedule


def rpc_module():
    """``tvm.rpc`` (client, server and the tracker protocol in ``.base``), imported lazily."""
    # lazy: tvm.rpc loads only for remote tuning
    from tvm import rpc  # pylint: disable=import-outside-toplevel

    return rpc


def cpu_target(num_cores: int = None) -> "tvm.target.Target":
    """An llvm target; with ``num_cores`` the JSON form 0.27 requires for options."""
    if num_cores is None:
        return tvm.target.Target("llvm")
    return tvm.target.Target({"kind": "llvm", "num-cores": int(num_cores)})


def cuda_target(arch: str = "sm_90") -> "tvm.target.Target":
    """A CUDA target with an llvm host that builds without a GPU (``nvcc`` compiles)."""
    return tvm.target.Target({"kind": "cuda", "arch": arch}, host={"kind": "llvm"})


def mutate_functions(mutator: "relax.PyExprMutator", mod: "tvm.IRModule") -> "tvm.IRModule":
    """``mod`` with every Relax function replaced by ``mutator``'s visit of it; PrimFuncs pass
    through unchanged. ``mutator`` must have been made from ``mod``.

    Every module-level rewrite of the package drives its mutator this way: the mutator's block
    builder holds the module, and ``builder_.get()`` returns it with the updated functions and
    any PrimFunc the mutator added.
    """
    for gv, func in mod.functions_items():
        if isinstance(func, relax.Function):
            mutator.builder_.update_func(gv, mutator.visit_expr(func))
    return mutator.builder_.get()
