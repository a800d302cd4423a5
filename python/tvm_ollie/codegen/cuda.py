"""Compile-only CUDA path: dlight default GPU schedules, CUDA C source, optional PTX via nvcc.

This works on a machine without a GPU: with no CUDA driver TVM's codegen returns a module that
just holds the CUDA source (it is compiled when loaded on a GPU box), and ``nvcc`` can still turn
that source into PTX. Running the kernels needs a GPU and is not done here.
"""

from __future__ import annotations

from typing import Tuple, Union

from tvm.support import nvcc

from ..compat import cuda_target, dlight, tirx, tvm
from ..ir.nodes import Scope
from .lower import lower


class CudaBuildError(RuntimeError):
    """No dlight rule produced a schedule of a function that compiles for CUDA."""

def _gpu_rules() -> list:
    """dlight's GPU rules in TVM's own order (matmul-like first, the generic fallback last)."""
    dl = dlight
    return [dl.gpu.Matmul(), dl.gpu.GEMV(), dl.gpu.Reduction(), dl.gpu.GeneralReduction(),
            dl.gpu.Fallback()]


def _schedule_and_compile(
    func: "tirx.PrimFunc", target: "tvm.target.Target"
) -> Tuple["tirx.PrimFunc", "tvm.runtime.Executable"]:
    """The first dlight schedule of ``func`` that compiles, with its executable.

    ``dl.ApplyDefaultSchedule`` takes the first rule that claims a function, but on unusual
    functions (extent-1 axes, padded stages, max reductions with a -inf identity that the
    cross-thread lowering does not recognise) a rule can claim it and then crash, or produce a
    schedule that fails to lower. Trying the rules in the same order and keeping the first
    schedule that compiles gives the same kernel whenever dlight's choice works.
    """
    failures = []
    for rule in _gpu_rules():
        try:
            with target:
                space = rule.apply(func, target, False)
                if space is None:
                    continue
                sch = space[0] if isinstance(space, list) else space
                scheduled = sch.mod["main"].with_attr("tirx.is_scheduled", True)
                name = _symbol(scheduled)
                executable = tvm.compile(tvm.IRModule({name: scheduled}), target=target)
            return scheduled, executable
        except Exception as err:  # pylint: disable=broad-except
            # dlight rules are heuristics: any failure only means "not this rule".
            failures.append(f"{type(rule).__name__}: {_summary(err)}")
    raise CudaBuildError(f"no dlight rule schedules {_symbol(func)}: " + "; ".join(failures))


def _summary(err: Exception) -> str:
    """The last line of an error message (TVM puts the reason there), or the error's type."""
    lines = [line for line in str(err).splitlines() if line.strip()]
    return f"{type(err).__name__}: {lines[-1].strip()[:200]}" if lines else type(err).__name__


def _is_scheduled(func: "tirx.PrimFunc") -> bool:
    attrs = func.attrs
    return attrs is not None and "tirx.is_scheduled" in attrs and bool(attrs["tirx.is_scheduled"])


def _symbol(func: "tirx.PrimFunc") -> str:
    attrs = func.attrs
    return str(attrs["global_symbol"]) if attrs is not None and "global_symbol" in attrs \
        else "main"


def _as_module(expr: Union[Scope, "tirx.PrimFunc", "tvm.IRModule"]) -> "tvm.IRModule":
    if isinstance(expr, tvm.IRModule):
        return expr
    if isinstance(expr, Scope):
        expr = lower(expr, name="main")
    if not isinstance(expr, tirx.PrimFunc):
        raise TypeError(
            f"build_cuda takes a Scope, PrimFunc or IRModule, not {type(expr).__name__}"
        )
    return tvm.IRModule({_symbol(expr): expr})


def _cuda_modules(module: "tvm.runtime.Module") -> list:
    """Every module of kind ``cuda`` in the import tree of ``module``."""
    found, stack = [], [module]
    while stack:
        cur = stack.pop()
        if cur.kind == "cuda":
            found.append(cur)
        stack.extend(cur.imports)
    return found


def build_cuda(
    expr: Union[Scope, "tirx.PrimFunc", "tvm.IRModule"], arch: str = "sm_90"
) -> Tuple["tvm.runtime.Executable", str]:
    """Schedule with dlight's default GPU rules and compile for CUDA ``arch``; no GPU needed.

    Parameters
    ----------
    expr : Scope, PrimFunc or IRModule
        What to compile; a Scope is lowered first (function name "main").
    arch : str
        The ``sm_XX`` architecture the code is generated for.

    Raises
    ------
    CudaBuildError
        When no dlight rule gives a schedule of some function that compiles.

    Returns
    -------
    executable : tvm.runtime.Executable
        The compiled module (its kernels are JIT-compiled when loaded on a GPU).
    source : str
        The generated CUDA C source of all kernels.
    """
    target = cuda_target(arch)
    functions = dict(_as_module(expr).functions_items())
    to_schedule = [g for g, f in functions.items() if isinstance(f, tirx.PrimFunc)
                   and not _is_scheduled(f)]
    executable = None
    for g_var in to_schedule:
        functions[g_var], executable = _schedule_and_compile(functions[g_var], target)
    if len(functions) != 1 or executable is None:  # compile the functions together
        executable = tvm.compile(tvm.IRModule(functions), target=target)
    sources = [m.inspect_source() for m in _cuda_modules(executable.mod)]
    if not sources:
        raise CudaBuildError("the CUDA build produced no CUDA module")
    return executable, "\n".join(sources)


def compile_ptx(source: str, arch: str = "sm_90") -> bytes:
    """PTX of CUDA ``source`` from ``nvcc`` (must be on PATH); no GPU needed."""

    # nvcc.compile_cuda reads the compute version from the current target even when
    # ``arch`` is given, so the target scope is required.
    with cuda_target(arch):
        ptx = nvcc.compile_cuda(source, target_format="ptx", arch=arch, compiler="nvcc")
    return bytes(ptx)
