"""One TVM build for a unit's original and the alternatives it checks and times.

TVM's build costs about 0.3-1 s per module whatever its size (the pipeline's passes, LLVM's
set-up, the linking), and a decision used to pay it again and again for modules of a few
kernels: the checker built the original and each alternative alone (two builds per check),
then the untuned timing built each alternative again (docs/compile-time.md: verify and
candidate builds were 35-48 % and 20-30 % of a cold build). A :class:`UnitBuild` merges the
isolated modules of one decision (:func:`~.units.unit_module` of the original and of every
alternative the decision may check or time) into one IRModule, each ``main`` renamed
(:func:`merged_module`), builds it once with the default pipeline of the target the timing
uses, and serves both stages from that executable: the checker runs each function on the same
inputs as before, the timing samples each function alone (timings still run one at a time).

Why one executable can stand for the separate builds: TVM lowers, fuses and schedules each
Relax function on its own (the passes are per function; the PrimFuncs of different functions
are only renamed apart), so a function of the merged module computes what the module alone
computed, with the same kernels. Should the merged build fail (one alternative TVM cannot
build), nothing is lost but that build: every stage then builds its modules one at a time as
before (:attr:`UnitBuild.failed`), so a failing alternative fails its own check only.

The modules are merged into up to :data:`MAX_PARALLEL_BUILDS` parts (the original in the
first), each built in a thread of its own at the same time, and each executable's code loaded
there (the first virtual machine of an executable loads its LLVM code: 0.1-1 s that the
checker paid before). TVM's build releases the GIL in its C++ passes and code generation, and
it is most of a cold build of a small model (a cProfile of InfoGAN's: 15 of 51 s in
``tvm.compile``, 7 s more in the first virtual machine of each executable), so on two cores
the parts build about twice as fast. A timing never overlaps them: an executable is returned
only once every part is built.
"""

from __future__ import annotations

import logging
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, List, Optional, Sequence, Tuple

from ..compat import relax, tvm
from ..compile_profile import stage
from ..target import normalize_target
from ..tune.measure import compile_module

__all__ = ["MAX_PARALLEL_BUILDS", "UnitBuild", "build_parts", "merged_module"]

LOG = logging.getLogger("tvm_ollie.transform")

#: The most builds one decision's modules are split into, built at once. Why two: each part
#: builds its own copy of the pipeline's work (a part holds at least one module), and the
#: machines this runs on for the benchmark have two cores.
MAX_PARALLEL_BUILDS = 2


def build_parts(count: int) -> int:
    """How many parallel builds ``count`` modules are split into: at most
    :data:`MAX_PARALLEL_BUILDS`, the CPUs this process may run on, and ``count``."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # (not on Linux)
        cpus = os.cpu_count() or 1
    return max(1, min(MAX_PARALLEL_BUILDS, cpus, int(count)))


def _loaded(mod: "tvm.IRModule", target) -> "tvm.runtime.Executable":
    """``mod`` built for the CPU ``target``, its code loaded (a first virtual machine)."""
    ex = compile_module(mod, target)
    relax.VirtualMachine(ex, tvm.cpu())
    return ex


@relax.expr_functor.mutator
class _RenameGlobals(relax.PyExprMutator):
    """Replaces the global variables of a Relax function by those of ``mapping``."""

    def __init__(self, mapping: Dict["tvm.ir.GlobalVar", "tvm.ir.GlobalVar"]):
        super().__init__()
        self.mapping = mapping

    def visit_global_var_(self, op):  # noqa: N802 (TVM's visitor name)
        return self.mapping.get(op, op)


def merged_module(modules: Sequence["tvm.IRModule"]) -> Tuple["tvm.IRModule", List[str]]:
    """``modules`` as one IRModule: every function of module ``k`` renamed ``m<k>_<name>``
    (its callers follow; the block builder types the new global variables and merges equal
    PrimFuncs), each public function's symbol with it; and the new name of each module's
    ``main``, in order. A Relax function calling another Relax function is not supported
    (none of the isolated modules does): the merged build then fails and the modules are
    built alone."""
    bb = relax.BlockBuilder()
    mains = []
    for k, mod in enumerate(modules):
        mapping = {}
        gvs = sorted(mod.get_global_vars(), key=lambda gv: (
            isinstance(mod[gv], relax.Function), gv.name_hint))
        for old in gvs:  # the PrimFuncs first: the Relax functions call them
            func = mod[old]
            name = f"m{k}_{old.name_hint}"
            if isinstance(func, relax.Function):
                func = _RenameGlobals(mapping).visit_expr(func)
            if func.attrs is not None and "global_symbol" in func.attrs:
                func = func.with_attr("global_symbol", name)
            mapping[old] = bb.add_func(func, name)
        mains.append(mapping[mod.get_global_var("main")].name_hint)
    return bb.get(), mains


class UnitBuild:
    """The isolated modules of one decision, built together once, on first use.

    Parameters
    ----------
    modules : dict
        Each module by the key its users ask for it with (the checker and the timing use the
        alternative's label).
    target : str | Target
        What the executable is built for (a CPU target: the checker runs it here).
    """

    def __init__(self, modules: Dict[str, "tvm.IRModule"], target):
        self.modules = dict(modules)
        self.target = normalize_target(target)
        #: per key, the executable holding its module and the function computing it
        self._built: Dict[str, Tuple["tvm.runtime.Executable", str]] = {}
        #: the merged build was tried and failed (each module is then built alone)
        self.failed = False
        #: how many TVM builds this object ran (0, or the parts it was split into)
        self.builds = 0
        #: results its users keep per build (the checker's reference outputs)
        self.memo: Dict[object, object] = {}

    def __contains__(self, key: str) -> bool:
        return key in self.modules

    def built(self) -> bool:
        """Build every part now if not yet (at once, :data:`MAX_PARALLEL_BUILDS`); False:
        a build failed."""
        if not self._built and not self.failed:
            keys = list(self.modules)
            parts = build_parts(len(keys))
            groups = [keys[j::parts] for j in range(parts)]
            try:
                merged = [merged_module([self.modules[k] for k in g]) for g in groups]
                self.builds += len(groups)
                if len(groups) == 1:
                    exes = [_loaded(merged[0][0], self.target)]
                else:
                    with ThreadPoolExecutor(len(groups)) as pool:
                        exes = list(pool.map(lambda m: _loaded(m[0], self.target), merged))
            except Exception as err:  # pylint: disable=broad-except
                LOG.info("ollie: the merged build of %d modules failed (%s: %s); building "
                         "them one at a time", len(keys), type(err).__name__, err)
                self.failed = True
                return False
            for group, (_, mains), ex in zip(groups, merged, exes):
                self._built.update({k: (ex, name) for k, name in zip(group, mains)})
        return not self.failed

    def function(self, key: str) -> Optional[Tuple["tvm.runtime.Executable", str]]:
        """``(executable, function name)`` computing module ``key`` (None: not in this build,
        or the merged build failed)."""
        if key not in self.modules:
            return None
        with stage("candidate builds"):
            ok = self.built()
        return self._built[key] if ok else None
