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

With a :class:`~.build_pool.BuildPool` (a module with many units to decide), the modules are
dealt into one merged part per worker process and the parts built at once there
(:mod:`.build_pool`): the same functions, the same kernels, built by the same code for the same
target, in another process.

A :class:`BuildGroup` goes one step further: the merged modules of several decisions (a run
of units that overlap nothing decided before them nor each other, prepared one after the
other before any is timed, :meth:`~.decide.Decider.prepare`) are merged again and built once,
when the first of them is needed. Each module keeps its own renamed function, so each
alternative is still checked and timed as its own function; TVM's per-build cost (the
pipeline's set-up, LLVM's, the linking, the JIT's) is paid once per group instead of once per
decision (docs/compile-time.md, cold15).
Should the group's build fail, each decision builds its own as before, so one alternative TVM
cannot build fails its own decision's build only.
"""

from __future__ import annotations

import logging
from typing import Dict, List, Optional, Sequence, Tuple

from ..compat import relax, tvm
from ..compile_profile import stage
from ..target import normalize_target
from ..tune.measure import compile_module
from .build_pool import BuildPool

__all__ = ["BuildGroup", "TOGETHER", "UnitBuild", "merged_module"]

#: Decisions whose merged builds a :class:`BuildGroup` builds together at most: one failing
#: alternative then costs the group's build once (each decision builds its own after), and
#: the group's JIT stays the size of a few decisions'.
TOGETHER = 8

LOG = logging.getLogger("tvm_ollie.transform")


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
    pool : BuildPool, optional
        Worker processes to build in (:mod:`.build_pool`): the modules are then dealt
        round-robin into one part per worker (the first module, the original, in the first
        part), each part merged and built in a worker, all at once, and loaded here. Should a
        part fail there, it is built here; should that fail too, every module is built alone
        (:attr:`failed`), as when the one merged build fails.
    """

    def __init__(self, modules: Dict[str, "tvm.IRModule"], target,
                 pool: Optional[BuildPool] = None):
        self.modules = dict(modules)
        self.target = normalize_target(target)
        self.pool = pool
        self._where: Dict[str, Tuple["tvm.runtime.Executable", str]] = {}
        self._done = False
        #: the merged build was tried and failed (each module is then built alone)
        self.failed = False
        #: how many TVM builds this object ran here and in the pool (one per part)
        self.builds = 0
        #: results its users keep per build (the checker's reference outputs)
        self.memo: Dict[object, object] = {}
        #: the decisions' builds this one is built together with (:class:`BuildGroup`)
        self.group: Optional["BuildGroup"] = None

    def __contains__(self, key: str) -> bool:
        return key in self.modules

    def parts(self) -> List[List[str]]:
        """The keys of each part built together: one part, or one per worker of the pool
        (never more parts than modules)."""
        keys = list(self.modules)
        count = max(1, min(len(keys), self.pool.workers if self.pool is not None else 1))
        return [keys[i::count] for i in range(count)]

    def _build(self) -> None:
        """Build every part (module docstring); on failure, :attr:`failed`."""
        self._done = True
        parts = self.parts()
        try:
            merged = [merged_module([self.modules[k] for k in part]) for part in parts]
            built = [None] * len(parts)
            if self.pool is not None and len(parts) > 1:
                self.builds += len(parts)
                built = self.pool.build([m for m, _ in merged], self.target)
            for i, (mod, _) in enumerate(merged):
                if built[i] is None:
                    self.builds += 1
                    built[i] = compile_module(mod, self.target)
        except Exception as err:  # pylint: disable=broad-except
            LOG.info("ollie: the merged build of %d modules failed (%s: %s); building "
                     "them one at a time", len(self.modules), type(err).__name__, err)
            self.failed = True
            return
        for part, (_, mains), ex in zip(parts, merged, built):
            self._where.update({k: (ex, name) for k, name in zip(part, mains)})

    def function(self, key: str) -> Optional[Tuple["tvm.runtime.Executable", str]]:
        """``(executable, function name)`` computing module ``key`` (None: not in this build,
        or the merged build failed)."""
        if key not in self.modules:
            return None
        if not self._done:
            with stage("candidate builds"):
                if self.group is None or not self.group.build(self):
                    self._build()
        return None if self.failed else self._where[key]


class BuildGroup:
    """The :class:`UnitBuild` of several decisions, built as one module when the first of them
    is needed (module docstring).

    Only the members not built yet when the first is asked for join that build (a decision
    whose check and timing were read back never asks, and its modules are built with the
    others' only when another member asks first); members built in a pool
    (:class:`~.build_pool.BuildPool`) or for another target build alone. The group builds once:
    after it, each member that it did not build builds alone on first use.
    """

    def __init__(self):
        self.members: List[UnitBuild] = []
        #: how many TVM builds the group ran (0 or 1), and how many decisions it built
        self.builds = 0
        self.built: List[UnitBuild] = []

    def add(self, build: Optional[UnitBuild]) -> None:
        """Build ``build`` (None: the decision builds nothing) with the others."""
        if build is not None and build.pool is None and not build._done:
            build.group = self
            self.members.append(build)

    def build(self, first: UnitBuild) -> bool:
        """Build ``first`` and every other member not built yet as one module; False when
        nothing was built for ``first`` (it builds alone)."""
        members = [first] + [b for b in self.members if b is not first and not b._done and
                             str(b.target) == str(first.target)]
        for b in self.members:
            b.group = None  # (the group builds once)
        self.members = []
        if len(members) < 2:
            return False
        keys = [(i, k) for i, b in enumerate(members) for k in b.modules]
        try:
            merged, mains = merged_module([members[i].modules[k] for i, k in keys])
            self.builds += 1
            ex = compile_module(merged, first.target)
        except Exception as err:  # pylint: disable=broad-except
            LOG.info("ollie: the build of %d decisions' modules together failed (%s: %s); "
                     "each decision builds its own", len(members), type(err).__name__, err)
            return False
        for (i, k), name in zip(keys, mains):
            members[i]._where[k] = (ex, name)
        for b in members:
            b._done = True
        first.builds += 1
        self.built = members
        return True
