"""The orchestration pass and the TVM pipeline that uses it in place of ``FuseOps``.

TVM 0.27's default Relax pipeline for a target (``relax.backend.<target>.get_default_pipeline``)
is ``library_dispatch_passes + legalize_passes + dataflow_lower_passes + finalize_passes``,
where ``legalize_passes`` is ``LegalizeOps, AnnotateTIROpPattern, FoldConstant, FuseOps,
FuseTIR`` (plus dlight's default schedules on GPUs). :func:`orchestrate_pipeline` is that same
list with ``FuseOps`` replaced by :class:`Orchestrate` (and an optional fission pass before
``LegalizeOps``), so everything around the grouping decision is TVM's own.

:class:`Orchestrate` works on a legalized module (primitives are ``call_tir`` bindings): per
dataflow block it builds the primitive graph, partitions it, enumerates candidates, costs them
(profiled by default, :mod:`.profiled`; a candidate that fails to build or run while profiled
is banned), selects kernels by the binary program, checks each multi-primitive kernel
(``FuseTIR`` on it alone, or a full build), and emits the plan. A failing kernel is banned and
the program solved again (at most ``max_rounds`` times); after that, or when the solver has no
solution, the partition keeps its primitives as single kernels, and the report says why.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Callable, List, Optional, Sequence, Tuple
import importlib

import tvm_ffi

from ..codegen.cached_alloc import finalize_passes
from ..compat import relax, tvm
from ..compile_profile import stage
from ..config import OrchestrateConfig
from ..target import is_llvm, kind_name, normalize_target, target_kind
from ..tune.cpu_schedule import cpu_pipeline
from ..tune.gather_pattern import mark_gathers_injective, with_gathers_injective
from .blp import BLPProblem, BLPResult, solve_blp
from .candidates import (Candidate, enumerate_candidates, is_library_kernel,
                         make_candidate)
from .cost import CostModel
from .emit import KernelCycle, emit_bindings, kernel_module, plan_kernels
from .fission import fission
from .graph import PrimitiveGraph, build_graph
from .joint import (Group, JointCost, JointTable, alt_nodes, banned_for, canon_map,
                    chosen_alternative, find_groups, keep_alternatives)
from .partition import partition, split_in_two
from .profiled import ProfiledCost, make_cost
from .report import KernelReport, OrchestrationReport, PartitionReport

__all__ = ["Orchestrate", "OrchestrateConfig", "orchestrate_legalized", "orchestrate_module",
           "orchestrate_pipeline", "fuse_check", "build_check", "default_check",
           "note_library", "schedule_check"]

LOG = logging.getLogger("tvm_ollie.orchestrate")

#: ``check(kernel_module) -> None``; raises when the kernel cannot be built as one PrimFunc.
KernelCheck = Callable[["tvm.IRModule"], None]

#: ``offer(mod) -> (mod, table)``: emits alternatives of calls before legalization and
#: describes them (:class:`~.joint.JointTable`); the selection chooses among them.
Offer = Callable[["tvm.IRModule"], Tuple["tvm.IRModule", JointTable]]


def fuse_check(mod: "tvm.IRModule") -> None:
    """The kernel merges into one PrimFunc with ``FuseTIR`` (cheap default check); a library
    kernel's module (:func:`~.emit.library_module`) calls a registered global function."""
    fused = relax.transform.FuseTIR()(mod)
    main = fused["main"]
    calls = [b.value for blk in main.body.blocks for b in blk.bindings
             if isinstance(b.value, relax.Call)]
    if len(calls) == 1 and calls[0].op.name == "relax.call_dps_packed":
        name = str(getattr(calls[0].args[0], "global_symbol", ""))
        if tvm_ffi.get_global_func(name, allow_missing=True) is None:
            raise ValueError(f"library kernel {name} is not registered")
        return
    if len(calls) != 1 or calls[0].op.name != "relax.call_tir":
        raise ValueError("FuseTIR did not produce one call_tir")


def schedule_check(target) -> KernelCheck:
    """For GPU targets: the kernel merges (:func:`fuse_check`) and the passes TVM runs after
    ``FuseTIR`` for ``target`` (dlight's default schedules) schedule its PrimFunc; an
    unscheduled GPU kernel would not build (no thread binding)."""
    tgt = _normalize(target)

    def _check(mod):
        fuse_check(mod)
        after = _after_fuse_tir(tgt)
        with tgt:
            fused = tvm.transform.Sequential(after)(relax.transform.FuseTIR()(mod))
        for gvar, func in fused.functions_items():
            if isinstance(func, tvm.tirx.PrimFunc) and not (
                    func.attrs is not None and "tirx.is_scheduled" in func.attrs):
                raise ValueError(f"{gvar.name} is not scheduled for {kind_name(tgt)}")

    return _check


def default_check(target) -> KernelCheck:
    """:func:`fuse_check` on CPUs, :func:`schedule_check` on GPUs."""
    return fuse_check if is_llvm(_normalize(target)) else schedule_check(target)


def _after_fuse_tir(target) -> list:
    passes = _backend(target).legalize_passes(target)
    names = [p.info.name for p in passes]
    return passes[names.index("FuseTIR") + 1:] if "FuseTIR" in names else []


def build_check(target) -> KernelCheck:
    """A check that also compiles the kernel with TVM's default pipeline for ``target``
    (slower than :func:`default_check`: one compilation per fused kernel)."""
    tgt = _normalize(target)

    def _check(mod):
        fuse_check(mod)
        tvm.compile(relax.transform.FuseTIR()(mod), target=tgt,
                    relax_pipeline=relax.get_default_pipeline(tgt))

    return _check


def _produced_in(graph: PrimitiveGraph, nodes: List[int]):
    inside = set(nodes)

    def produced_here(var) -> bool:
        return graph.producer.get(var) in inside

    return produced_here


def _required(graph: PrimitiveGraph, nodes: List[int]) -> List[object]:
    """Values of the partition read by later nodes or visible after the block."""
    inside = set(nodes)
    out = []
    for i in nodes:
        for var in graph.nodes[i].outputs:
            readers = graph.consumers.get(var, ())
            if graph.is_output(var) or any(r not in inside for r in readers):
                out.append(var)
    return out


def _live(graph: PrimitiveGraph, nodes: List[int], required: List[object]) -> List[int]:
    """Nodes of the partition with a path (inside it) to a required value."""
    inside = set(nodes)
    needed = set(required)
    live = set()
    for i in reversed(nodes):
        node = graph.nodes[i]
        if any(v in needed for v in node.outputs) or any(
                j in live for j in graph.members(graph.succ[i]) if j in inside):
            live.add(i)
    return sorted(live)


def _singletons(graph: PrimitiveGraph, nodes: List[int]) -> List[Candidate]:
    return [make_candidate(graph, 1 << i) for i in nodes]


def _solve(config: OrchestrateConfig, problem: BLPProblem) -> BLPResult:
    """The configured solver's result; a solver that raises is a result with no solution
    (status ``error``), which the selection falls back from like any other."""
    start = time.perf_counter()
    try:
        return (config.solver or solve_blp)(problem, config.time_limit_s)
    except Exception as err:  # pylint: disable=broad-except
        return BLPResult([], float("nan"), "error", float("nan"), time.perf_counter() - start,
                         len(problem.costs), 0, f"solver raised {type(err).__name__}: {err}")


def _ban_failed(costs: List[float]) -> Tuple[List[float], List[int]]:
    """Costs without ``inf`` (a candidate that failed to build or run while profiled) and the
    positions of those candidates, which the selection bans; a banned candidate's cost is
    irrelevant (never chosen) and set to the largest finite one, which keeps the solver's
    scaling."""
    banned = [j for j, c in enumerate(costs) if not math.isfinite(c)]
    if not banned:
        return list(costs), []
    finite = [c for c in costs if math.isfinite(c)]
    top = max(finite) if finite else 1.0
    return [c if math.isfinite(c) else top for c in costs], banned


class _Selector:
    """Selection of one partition, with the fallback loop of the module docstring."""

    def __init__(self, graph, nodes, cost: CostModel, config: OrchestrateConfig,
                 check: Optional[KernelCheck], rep: PartitionReport,
                 groups: Optional[List[Group]] = None):
        self.graph, self.nodes, self.cost, self.config = graph, nodes, cost, config
        self.check, self.rep = check, rep
        inside = set(nodes)
        self.groups = [g for g in groups or [] if g.lasts[0] in inside]
        self.canon = canon_map(self.groups, graph)
        # an alternative's result is a block output only to survive FoldConstant
        self.required = [v for v in _required(graph, nodes) if v not in self.canon]
        self.produced_here = _produced_in(graph, nodes)
        self.chosen: List[Candidate] = []

    def _problem(self, cands, costs) -> BLPProblem:
        """Korch's program; with alternatives (:mod:`.joint`) an alternative's result counts
        as the value it stands for, and the cover row of a node that an alternative makes
        unnecessary (the original call; a folded epilogue's consumers) also accepts the
        candidates holding that alternative's last node."""
        canon = self.canon

        def c(var):
            return canon.get(var, var)

        problem = BLPProblem(
            costs, [frozenset(c(v) for v in k.outputs) for k in cands],
            [frozenset(c(v) for v in k.inputs if self.produced_here(v)) for k in cands],
            set(self.required), set())
        containing: dict = {}
        for k, cand in enumerate(cands):
            for i in cand.nodes:
                containing.setdefault(i, []).append(k)
        problem.covers = [frozenset(containing.get(i, [])).union(*(
            containing.get(g.lasts[a], []) for g in self.groups for a in g.covering(i)))
            for i in _live(self.graph, self.nodes, self.required)]
        return problem

    def _guard(self, problem: BLPProblem, cands) -> None:
        """Never worse: solve again with every group held to the Decider's choice (the
        sequential plan) and to the original (TVM's operators); keep the joint program only
        when neither is predicted cheaper, else add that plan's bans (reason in the report)."""
        plans = {"joint": []}
        plans["sequential"] = banned_for(self.groups, cands, lambda g: g.sequential)
        plans["original"] = banned_for(self.groups, cands, lambda g: 0)
        if plans["sequential"] == plans["original"]:  # no Decider (library candidates alone)
            del plans["sequential"]
        found = {}
        for name, bans in plans.items():
            trial = BLPProblem(problem.costs, problem.produces, problem.needs, problem.required,
                               problem.available, list(problem.extra_cuts)
                               + [frozenset([j]) for j in bans], problem.covers)
            res = solve_blp(trial, self.config.time_limit_s)
            self.rep.solve_s += res.solve_s
            if res.ok:
                found[name] = res.objective
        text = ", ".join(f"{n} {v * 1e3:.3f}ms" for n, v in found.items())
        self.rep.joint = f"predicted: {text}"
        if not found:
            return
        best = min(found, key=lambda n: (found[n] * (1 - 1e-9) if n == "joint" else found[n]))
        if best != "joint":
            problem.extra_cuts.extend(frozenset([j]) for j in plans[best])
            self.rep.fallbacks.append(f"joint selection predicted worse than the {best} plan "
                                      f"({text}); {best} plan kept")

    def run(self, enum=None, can_split: bool = False):
        """The plan and its kernels' costs; None when the solver found nothing in time and
        ``can_split`` (the caller then solves the two halves of the partition)."""
        graph, rep, config = self.graph, self.rep, self.config
        if enum is None:
            enum = enumerate_candidates(graph, config.max_kernel_size, config.max_candidates,
                                        nodes=self.nodes)
        cands = enum.candidates
        rep.candidates, rep.enumeration = len(cands), enum.stop_reason
        costs, banned = _ban_failed(self.cost.costs(graph, cands))
        skip = alt_nodes(self.groups)
        rep.singleton_cost_s = sum(c for c, k in zip(costs, cands)
                                   if k.size == 1 and k.nodes[0] not in skip)
        problem = self._problem(cands, costs)
        if banned:
            problem.extra_cuts.extend(frozenset([j]) for j in banned)
            rep.fallbacks.append(f"{len(banned)} candidate kernel(s) failed to build or run "
                                 f"while profiled; banned")
        if self.groups:
            self._guard(problem, cands)
        for _ in range(config.max_rounds):
            rep.rounds += 1
            res = _solve(config, problem)
            rep.variables, rep.constraints = res.n_vars, res.n_constraints
            rep.solve_s += res.solve_s
            rep.gap, rep.status, rep.objective_s = res.gap, res.status, res.objective
            if not res.ok:
                if can_split and res.status == "time_limit_no_incumbent":
                    return None
                rep.fallbacks.append(f"solver: {res.status} {res.message}".strip())
                LOG.warning("orchestration: %s block %d, %d primitives: %s; kept as single "
                            "kernels", rep.function, rep.block, rep.primitives,
                            rep.fallbacks[-1])
                break
            chosen = [cands[i] for i in res.chosen]
            try:
                plan = plan_kernels(graph, chosen, self.required, self.produced_here,
                                    self.canon)
            except KernelCycle as cyc:
                rep.fallbacks.append(f"round {rep.rounds}: {cyc}; cut added")
                problem.extra_cuts.append(frozenset(res.chosen[m] for m in cyc.members))
                continue
            failed = self._failures(plan)
            if not failed:
                self.chosen = [p.cand for p in plan]
                return plan, [costs[res.chosen[p.position]] for p in plan]
            for p in failed:
                problem.extra_cuts.append(frozenset([res.chosen[p.position]]))
        else:
            rep.fallbacks.append(f"no buildable plan after {config.max_rounds} rounds")
        rep.status += "+singletons"
        single = _singletons(graph, [i for i in self.nodes if i not in skip])
        self.chosen = single
        plan = plan_kernels(graph, single, self.required, self.produced_here)
        return plan, [self.cost.kernel_seconds(graph, p.cand) for p in plan]

    def _failures(self, plan):
        failed = []
        for p in plan:
            if self.check is None or p.cand.size == 1 and not is_library_kernel(self.graph,
                                                                                   p.cand):
                continue  # a single primitive is every plan's fallback; a library call is not
            try:
                self.check(kernel_module(self.graph, p.cand, p.exports))
            except Exception as err:  # pylint: disable=broad-except
                names = "+".join(self.graph.nodes[i].name for i in p.cand.nodes)
                self.rep.fallbacks.append(
                    f"round {self.rep.rounds}: kernel {names} failed ({type(err).__name__}: "
                    f"{str(err).splitlines()[0][:120] if str(err) else ''}); banned")
                failed.append(p)
        return failed


def _keep_groups(parts: List[List[int]], groups: List[Group],
                 dead: Sequence[int] = ()) -> List[List[int]]:
    """Move every alternative's nodes into the partition of its original call (they read
    only the call's operands, produced there or earlier, and for a folded epilogue values its
    consumers read); leave the ``dead`` nodes out."""
    if not groups and not dead:
        return parts
    gone = set(dead)
    where = {i: pi for pi, part in enumerate(parts) for i in part}
    move = {i: where[g.lasts[0]] for g in groups if g.lasts[0] in where
            for nodes in g.nodes[1:] for i in nodes}
    out: List[List[int]] = [[] for _ in parts]
    for pi, part in enumerate(parts):
        for i in part:
            if i not in gone:
                out[move.get(i, pi)].append(i)
    return [sorted(p) for p in out if p]


def _drop_crossing(parts: List[List[int]], groups: List[Group],
                   dead: List[int]) -> List[List[int]]:
    """Drop every folded epilogue whose consumers are not all in its original call's
    partition (a kernel never crosses partitions); its own nodes join ``dead`` and leave
    ``parts`` (the original's partition keeps the original call, so none empties)."""
    where = {i: pi for pi, part in enumerate(parts) for i in part}
    gone: set = set()
    for g in groups:
        home = where.get(g.lasts[0])
        for k in reversed(range(1, len(g.nodes))):
            if any(where.get(i) != home for i in g.absorbed[k]):
                gone.update(g.drop(k))
    dead.extend(sorted(gone))
    return [[i for i in p if i not in gone] for p in parts] if gone else parts


def _orchestrate_block(block, mod, builder, fname: str, bi: int, cost: CostModel,
                       config: OrchestrateConfig, check, report: OrchestrationReport,
                       joint: Optional[JointTable] = None):
    graph = build_graph(block, mod)
    dead: List[int] = []
    groups = find_groups(graph, joint, dead)
    bindings = []
    todo = _drop_crossing(_keep_groups(partition(graph, config.max_partition_nodes,
                                                 config.min_partition_nodes), groups, dead),
                          groups, dead)
    if groups:
        cost = JointCost(cost, groups, graph, joint.margin)
    pi = 0
    while todo:
        nodes = todo.pop(0)
        enum = enumerate_candidates(graph, config.max_kernel_size, config.max_candidates,
                                    nodes=nodes)
        halves = _keep_groups(split_in_two(graph, nodes), groups) if len(nodes) > 4 \
            else [nodes]
        if len(enum.candidates) > config.max_partition_candidates and len(halves) == 2:
            todo[:0] = _drop_crossing(halves, groups, dead)
            continue
        rep = PartitionReport(fname, bi, pi, len(nodes), 0, "")
        selector = _Selector(graph, nodes, cost, config, check, rep, groups)
        found = selector.run(enum, len(halves) == 2)
        if found is None:  # no solution within the time limit: solve the halves instead
            report.notes.append(f"{fname} block {bi}: {len(nodes)} primitives, "
                                f"{rep.candidates} candidates: no solution in "
                                f"{rep.solve_s:.1f} s, split in two")
            todo[:0] = _drop_crossing(halves, groups, dead)
            continue
        pi += 1
        plan, plan_costs = found
        for g in selector.groups:
            k = chosen_alternative(g, selector.chosen)
            joint.chosen[g.var.name] = g.infos[k].label
            joint.picked[g.var.name] = next(j for j, a in enumerate(joint.alts[g.var.name])
                                            if a is g.infos[k])
            rep.choices.append(f"{g.var.name}: {g.infos[k].label}"
                               + (" (sequential)" if k == g.sequential else
                                  f" (sequential: {g.infos[g.sequential].label})"))
        bindings.extend(emit_bindings(graph, plan, builder))
        for p, c in zip(plan, plan_costs):
            rep.kernels.append(KernelReport([graph.nodes[i].name for i in p.cand.nodes],
                                            [graph.nodes[i].kind for i in p.cand.nodes],
                                            float(c), len(p.exports)))
        report.partitions.append(rep)
    return relax.DataflowBlock(bindings)


def orchestrate_legalized(mod: "tvm.IRModule", cost: CostModel,
                          config: OrchestrateConfig = OrchestrateConfig(),
                          check: Optional[KernelCheck] = fuse_check,
                          report: Optional[OrchestrationReport] = None,
                          joint: Optional[JointTable] = None,
                          ) -> Tuple["tvm.IRModule", OrchestrationReport]:
    """Orchestrate every dataflow block of every (non-primitive) Relax function of a
    legalized module; the result has ``Primitive`` functions for ``FuseTIR``. ``joint``: the
    alternatives offered before legalization (:func:`.joint.offer_alternatives`)."""
    start = time.perf_counter()
    report = report or OrchestrationReport(cost_model=getattr(cost, "name", "custom"))
    if isinstance(cost, ProfiledCost):  # the profiling budget is shared by the primitives
        cost.expect(_primitive_count(mod))
        report.profile = cost.stats
    builder = relax.BlockBuilder(mod)
    updates = {}
    for gv, func in mod.functions_items():
        if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
            continue
        attrs = func.attrs
        if attrs is not None and ("Primitive" in attrs or "Codegen" in attrs):
            continue
        blocks = list(func.body.blocks)
        changed = False
        for bi, block in enumerate(blocks):
            if isinstance(block, relax.DataflowBlock) and block.bindings:
                blocks[bi] = _orchestrate_block(block, mod, builder, gv.name_hint, bi, cost,
                                                config, check, report, joint)
                changed = True
        if changed:
            updates[gv] = relax.Function(func.params, relax.SeqExpr(blocks, func.body.body),
                                         func.ret_ty, func.is_pure, func.attrs)
    new_mod = builder.get()
    for gv, func in updates.items():
        new_mod[gv] = func
    report.total_s += time.perf_counter() - start
    return new_mod, report


def _primitive_count(mod: "tvm.IRModule") -> int:
    """Bindings in the dataflow blocks orchestration will see (about its primitives)."""
    count = 0
    for _, func in mod.functions_items():
        if isinstance(func, relax.Function) and isinstance(func.body, relax.SeqExpr) and not (
                func.attrs is not None and ("Primitive" in func.attrs
                                            or "Codegen" in func.attrs)):
            count += sum(len(b.bindings) for b in func.body.blocks
                         if isinstance(b, relax.DataflowBlock))
    return count


def _cost_for(cost, target, config: Optional[OrchestrateConfig] = None,
              notes: Optional[list] = None) -> CostModel:
    """``cost``, or the model ``config.costs`` names (:func:`.profiled.make_cost`)."""
    if isinstance(cost, CostModel):
        return cost
    return make_cost(target, config or OrchestrateConfig(), notes)


@tvm.transform.module_pass(opt_level=0, name="Orchestrate")
class Orchestrate:
    """Kernel orchestration in place of ``FuseOps`` (input: legalized, pattern-annotated).

    ``Orchestrate(target=None, cost=None, config=OrchestrateConfig(), check=None)``;
    the cost defaults to what ``config.costs`` names for the target (``Target.current()`` or
    llvm): :class:`~.profiled.ProfiledCost` (a new one per run, so each run has its own
    budget and statistics) or :class:`~.cost.AnalyticCost`; the per-kernel check to
    :func:`default_check`. The last report is ``.last_report``.
    """

    def __init__(self, target=None, cost: Optional[CostModel] = None,
                 config: OrchestrateConfig = OrchestrateConfig(),
                 check: Optional[KernelCheck] = None, joint: Optional[JointTable] = None):
        self.target, self.cost, self.config, self.check = target, cost, config, check
        self.joint = joint
        self.last_report: Optional[OrchestrationReport] = None

    def use_alternatives(self, table: Optional[JointTable]) -> None:
        """The alternatives of the next run (offered by the pipeline before legalization)."""
        self.joint = table or None

    def transform_module(self, mod: "tvm.IRModule", ctx) -> "tvm.IRModule":  # noqa: ARG002
        target = self.target or tvm.target.Target.current(allow_none=True) or "llvm"
        notes: List[str] = []
        cost = _cost_for(self.cost, target, self.config, notes)
        report = OrchestrationReport(target=target_kind(target), cost_model=cost.name,
                                     notes=notes)
        check = self.check if self.check is not None else default_check(target)
        with stage("orchestration"):
            new_mod, self.last_report = orchestrate_legalized(mod, cost, self.config,
                                                              check, report, self.joint)
        return new_mod


def _normalize(target) -> "tvm.target.Target":
    return normalize_target(target)


def _backend(target: "tvm.target.Target"):
    name = {"llvm": "cpu_generic", "cuda": "cuda"}.get(kind_name(target), "gpu_generic")
    return importlib.import_module(f"tvm.relax.backend.{name}.pipeline")


def _fission_pass(fission):
    @tvm.transform.module_pass(opt_level=0, name="OrchestrateFission")
    def _fission(mod, _ctx):
        return fission(mod)

    return _fission


def orchestrate_module(mod: "tvm.IRModule", target="llvm", cost: Optional[CostModel] = None,
                       fission: Optional[Callable[["tvm.IRModule"], "tvm.IRModule"]] = None,
                       time_limit_s: float = 10.0, max_kernel_size: int = 8,
                       config: Optional[OrchestrateConfig] = None,
                       check: Optional[KernelCheck] = None, offer: Optional[Offer] = None,
                       ) -> Tuple["tvm.IRModule", OrchestrationReport]:
    """Orchestrate a Relax module of standard operators; return it fused and the report.

    Runs ``offer`` and ``fission`` (when given), TVM's ``LegalizeOps, AnnotateTIROpPattern``
    (gathers then marked injective, :mod:`tvm_ollie.tune.gather_pattern`), ``FoldConstant``,
    :class:`Orchestrate` and ``FuseTIR`` under ``target``: the result holds
    one PrimFunc per chosen kernel (and the chosen library calls). Finish it with
    :func:`orchestrate_pipeline`'s remaining passes, e.g. ``tvm.compile(mod, target,
    relax_pipeline=orchestrate_pipeline(target))`` on the original module does everything at
    once.
    """
    tgt = _normalize(target)
    if config is None:
        config = OrchestrateConfig(max_kernel_size=max_kernel_size, time_limit_s=time_limit_s)
    notes: List[str] = []
    cost = _cost_for(cost, tgt, config, notes)
    with tgt:
        table = None
        if offer is not None:
            mod, table = offer(mod)
        if fission is not None:
            mod = _keep_if(table, _fission_pass(fission))(mod)
        mod = tvm.transform.Sequential([
            relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern(),
            mark_gathers_injective, _keep_if(table, relax.transform.FoldConstant())])(mod)
        report = OrchestrationReport(target=target_kind(tgt), cost_model=cost.name,
                                     notes=notes)
        mod, report = orchestrate_legalized(mod, cost, config,
                                            check if check is not None else default_check(tgt),
                                            report, table or None)
        note_library(report, table)
        mod = relax.transform.FuseTIR()(mod)
    return mod, report


def _keep_if(table, inner: "tvm.transform.Pass") -> "tvm.transform.Pass":
    """``inner``, keeping the offered alternatives alive through it when there are some."""
    return keep_alternatives(inner) if table else inner


def note_library(report: Optional[OrchestrationReport], table) -> None:
    """A report line: how many calls had library candidates and how many chose one."""
    if report is None or table is None:
        return
    report.notes.extend(table.notes)
    chosen = sum(1 for name in table.alts if table.picked.get(name, 0))
    report.library = (len(table.alts), chosen)
    report.notes.append(f"library candidates: {len(table.alts)} calls offered, {chosen} "
                        f"chose a library kernel")


def _offer_pass(offer: "Offer", orch: "Orchestrate") -> "tvm.transform.Pass":
    """Runs ``offer`` and hands its table to ``orch`` (a new table per compilation)."""

    @tvm.transform.module_pass(opt_level=0, name="OrchestrateOffer")
    def _offer(mod, _ctx):
        mod, table = offer(mod)
        orch.use_alternatives(table)  # a method: the pass object forwards reads only
        return mod

    return _offer


def orchestrate_pipeline(target="llvm", cost: Optional[CostModel] = None,
                         fission: Optional[Callable[["tvm.IRModule"], "tvm.IRModule"]] = None,
                         config: OrchestrateConfig = OrchestrateConfig(),
                         check: Optional[KernelCheck] = None,
                         reports: Optional[list] = None,
                         offer: Optional[Offer] = None) -> "tvm.transform.Pass":
    """TVM's default Relax pipeline for ``target`` with :class:`Orchestrate` instead of
    ``FuseOps`` (see the module docstring); each run's report is appended to ``reports``.
    ``offer(mod) -> (mod, JointTable)`` runs first (before ``fission``): alternatives the
    selection chooses between, e.g. the library candidates of
    :func:`tvm_ollie.pipeline.library_offers.library_offer`."""
    tgt = _normalize(target)
    backend = _backend(tgt)
    orch = Orchestrate(tgt, cost, config, check)
    offered = offer is not None
    legalize = [orch if p.info.name == "FuseOps" else
                _keep_if(offered and p.info.name == "FoldConstant", p)
                for p in with_gathers_injective(backend.legalize_passes(tgt))]
    pre = [_keep_if(offered, _fission_pass(fission))] if fission is not None else []
    if offered:
        pre.insert(0, _offer_pass(offer, orch))

    @tvm.transform.module_pass(opt_level=0, name="OrchestratePipeline")
    def _pipeline(mod: "tvm.IRModule", _ctx) -> "tvm.IRModule":
        with tgt:
            seq = tvm.transform.Sequential(
                backend.library_dispatch_passes(tgt) + pre + legalize
                + backend.dataflow_lower_passes(tgt) + finalize_passes(tgt, backend))
            out = seq(mod)
        if offered:
            note_library(orch.last_report, orch.joint)
        if reports is not None:
            reports.append(getattr(orch, "last_report", None))
        return out

    return _pipeline


def _split_composites(mod: "tvm.IRModule") -> "tvm.IRModule":
    return fission(mod)[0]


def ollie_orchestration(target="llvm", cost: Optional[CostModel] = None,
                        config: OrchestrateConfig = OrchestrateConfig(),
                        reports: Optional[list] = None,
                        joint: Optional[JointTable] = None) -> "tvm.transform.Pass":
    """The build pipeline of ``orchestrate=True``: fission, then orchestration in place of
    ``FuseOps``; on llvm inside the project's CPU pipeline (default CPU schedules after
    FuseTIR), elsewhere inside :func:`orchestrate_pipeline` (``joint`` is llvm only)."""
    tgt = _normalize(target)
    if not is_llvm(tgt):
        return orchestrate_pipeline(tgt, cost, _split_composites, config, reports=reports)

    orch = Orchestrate(tgt, cost, config, joint=joint)
    # with alternatives the caller fissions first: fission drops unused bindings, which the
    # offered alternatives are until the selection
    pre = [] if joint else [_fission_pass(_split_composites)]
    wrap = {"FoldConstant": keep_alternatives} if joint else None
    inner = cpu_pipeline(tgt, fuse=orch, pre=pre, wrap=wrap)

    @tvm.transform.module_pass(opt_level=0, name="OllieOrchestration")
    def _pipeline(mod: "tvm.IRModule", _ctx) -> "tvm.IRModule":
        out = inner(mod)
        if reports is not None:
            reports.append(orch.last_report)
        return out

    return _pipeline
