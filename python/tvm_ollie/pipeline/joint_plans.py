"""The joint build: decisions, the joint selection, and the plans it is guarded against.

:func:`joint_build` decides the module's regions as the sequential build does, offers every
heavy call's verified alternatives (:mod:`.joint`, :mod:`tvm_ollie.orchestrate.joint`), and
builds the joint plan: one binary
program chooses the alternatives and the kernel boundaries together. With the never-worse guard
(:mod:`.guard`) it also builds the plans the joint one competes with, from the same decisions
(:class:`PlanBuilder`): ``refined``, ``sequential``, ``derivation`` (the ``ollie`` build: the
Decider's choices, epilogues folded, chains of library convolutions kept in oneDNN's format,
TVM's greedy fusion), ``library`` (the sequential build's library plan, :func:`~.joint.
library_plan`: the module as given with every heavy call on the library where it has a kernel,
no derivation, so that chains the per-call decisions split stay whole), ``orchestration``
(the module as given, orchestrated with the library kernels as candidates when the library is
on, :mod:`.library_offers`) and ``original`` (the module as given, built
by TVM alone), and keeps the fastest, timed whole. The plans built from decided calls
(``refined``, ``sequential``, ``derivation``) go through the sequential build's layout step
(:func:`layout_step`), as the ``library`` plan does in its own pass.

Tuned (``trials > 0``), one trial budget serves the whole build (:mod:`tvm_ollie.tune.budget`):
the Decider's tuned measurements of the regions and of every call's alternatives draw on it
first (each signature its task), every plan is built with the records they left (kernels
without one get the default CPU schedules), and after the guard chose, what is left of the
budget (the final task) tunes the kept plan's kernels, which are then built again with their
records. Tuning records include each kernel's default schedule (:mod:`tvm_ollie.tune.defaults`),
so the tuned plan is never slower than the untuned one the guard timed.
"""

from __future__ import annotations

import time
from typing import Any, Dict, List, Optional, Tuple

import tvm_ffi

from ..codegen import library as lib
from ..compat import relax, tvm
from ..compile_profile import stage
from ..config import MIN_SEARCH_S, OllieConfig, OrchestrateConfig, resolve_config
from ..orchestrate.cost import AnalyticCost, LinearMeasuredCost, MeasuredCost, sample_args
from ..orchestrate.fission import fission
from ..orchestrate.joint import JointTable, apply_picked, keep_alternatives
from ..orchestrate.pipeline import _split_composites, note_library, ollie_orchestration
from ..orchestrate.profiled import ProfileLedger, make_cost
from ..orchestrate.tuned import tuned_orchestrate_build
from ..target import kind_name, normalize_target
from ..transform.blocked_layout import blocked_layout
from ..transform.decide import DERIVABLE_OPS, Alternative, call_signature
from ..transform.optimize import apply_call_choices, optimize_module, packed_matmuls
from ..transform.decision import Decision
from ..transform.report import OptimizeReport
from ..tune.metaschedule import STATS
from .compile import compile_module
from .guard import WARM_TIMING, GuardReport, PlanSkipped, guard_plans
from .joint import library_plan, make_decider, offer_alternatives, offer_folded, static_call
from .library_offers import library_offer

__all__ = ["GUARD_PREFERENCE", "GUARD_REFERENCE", "GUARD_TIMING", "PLANS", "PlanBuilder",
           "joint_build", "layout_step"]

#: The plans of the guard, in the order they are built (ties: :data:`GUARD_PREFERENCE`).
PLANS = ("joint", "refined", "sequential", "derivation", "library", "orchestration",
         "original")

#: The plans built by orchestration (they share one profiling budget, :class:`PlanBuilder`).
ORCHESTRATED = ("joint", "refined", "sequential", "orchestration")

#: The plan whose outputs the others must match in the guard: TVM's own fusion of the
#: verified rewrite (orchestration is what the guard doubts, not the per-call checks).
GUARD_REFERENCE = "derivation"

#: Who wins when the guard's timing does not separate the leaders: the simplest plan first
#: (TVM alone, then the library plan, then derivation only, what the ``ollie`` system builds),
#: so that a rewrite is kept only when it is separated faster than TVM's build of the module
#: as given. The library plan before derivation, as in the sequential build's whole-model
#: guard (:data:`~.build.MODEL_PREFERENCE`): it is fixed by a rule and the same in every
#: build, the derivation plan follows every unit's timed decision.
GUARD_PREFERENCE = ("original", "library", "derivation", "sequential", "refined", "joint",
                    "orchestration")

#: How the guard times the plans (:func:`~.guard.alternating`): at least 15 rounds, judged on
#: the first quartile. With the defaults (7 rounds and 2 s, the median) seven plans got 12
#: rounds at load 7, whose median intervals span the slowed samples: Segformer quick's
#: sequential plan (16 ms) tied with TVM alone (54 ms), and the tie kept TVM alone, 3.4x
#: slower. The machine only slows a sample down, so the low quartile is the plan's own time
#: (as the Decider judges, :mod:`tvm_ollie.tune.compare`); its interval over 15 samples is
#: ``[x_2, x_8]``, which ignores seven slowed samples. Each sample is warm
#: (:data:`~.guard.WARM_TIMING`), so that the kept plan's timing is what the finished
#: executable runs in a loop.
GUARD_TIMING = {"min_rounds": 15, "quantile": 0.25, **WARM_TIMING}


class PlanBuilder:
    """Builds each plan of :data:`PLANS` from one set of decisions, untuned (``tuner`` None)
    or with a tuner's records (``build(plan, trials)`` tunes the plan's kernels first).

    Parameters
    ----------
    target : Target
        The target.
    cost : CostModel or None
        The orchestration's kernel costs (None: analytic).
    tuner : Tuner or None
        Tuning database of the build (``tune(fused, trials)``, ``apply(fused)``).
    modules : dict
        ``"given"``: the module as given (the ``original`` plan: TVM alone, and the
        ``orchestration`` plan); ``"regions"``: with its regions rewritten;
        ``"folded"``: with the alternatives offered (:func:`~.joint.offer_folded`);
        ``"offered"``: the same after fission.
    decided : list
        ``(var, signature, choice)`` of every heavy call (the Decider's sequential choices).
    table : JointTable
        The offered alternatives; the joint selection fills in what it picked.
    layouts : callable, optional
        ``module -> (module, LayoutReport)``: the sequential build's last step, the chains of
        library convolutions kept in oneDNN's format (:func:`layout_step`), applied to every
        plan whose calls are decided before it is built (``refined``, ``sequential``,
        ``derivation``, ``library``), so that the ``derivation`` plan is the module the
        ``ollie`` system builds. None: no layout step (the build's config or target has none).
    library : tuple, optional
        ``(module, OptimizeReport)`` of the ``library`` plan (:func:`~.joint.library_plan`,
        the sequential build's); None, or the ``derivation`` plan's module: it is skipped.
    offer : callable, optional
        ``module -> (module, JointTable)``: the library candidates of the untuned
        ``orchestration`` plan (:func:`~.library_offers.library_offer`); None: TVM's kernels
        only.
    config : OrchestrateConfig, optional
        The run's orchestration settings (:meth:`~tvm_ollie.config.OllieConfig.
        orchestrate_config`: the kernel costs it names, their profiling budget, the
        ``work_dir`` the profiled costs are cached in, ``rpc``); None: the defaults, cached in
        this process only.
    """

    def __init__(self, target, cost, tuner, modules: dict, decided: list, table: JointTable,
                 layouts=None, library: Optional[dict] = None, offer=None,
                 config: Optional[OrchestrateConfig] = None):
        self.target, self.cost, self.tuner, self.modules = target, cost, tuner, modules
        self.config = config or OrchestrateConfig()
        #: one profiling budget for the plans' orchestrations (the config's, shared)
        self.ledger = ProfileLedger(self.config.profile_budget_s,
                                    self.config.profile_max_kernels)
        self.table, self.layout_step, self.offer = table, layouts, offer
        choices = {sig: ch for _, sig, ch in decided}
        self.sequential_module, self.epilogues = apply_call_choices(
            modules["regions"], choices)
        #: each plan's layout report (the plans the layout step ran on)
        self.layouts: Dict[str, object] = {}
        self.sequential_module = self._laid_out(self.sequential_module, "sequential")
        self.layouts["derivation"] = self.layouts.get("sequential")
        self.library = library if library is not None and not tvm_ffi.structural_equal(
            library[0], self.sequential_module) else None
        self.library_module = self.library[0] if self.library is not None else None
        self.layouts["library"] = self.library[1].layouts if self.library is not None else None
        self.reports: Dict[str, list] = {name: [] for name in PLANS}

    def _laid_out(self, module, plan: str):
        """``module`` after the layout step (its report kept under ``plan``)."""
        if self.layout_step is None:
            return module
        module, self.layouts[plan] = self.layout_step(module)
        return module

    def build(self, plan: str, trials: int = 0) -> "tvm.runtime.Executable":
        """The executable of ``plan`` (its kernels tuned with ``trials`` first); raises
        :class:`~.guard.PlanSkipped` when the plan would repeat another."""
        if plan == "joint":
            return self._joint(trials)
        if plan == "refined":
            if not self.table.picked:
                raise PlanSkipped("the joint plan picked nothing")
            if self.table.agrees_with_sequential():
                raise PlanSkipped("the joint selection picked the sequential choices")
            picked = self._laid_out(apply_picked(self.modules["folded"], self.table), plan)
            return self._orchestrated(picked, plan, trials)
        if plan == "sequential":
            return self._orchestrated(self.sequential_module, plan, trials)
        if plan == "derivation":
            return compile_module(self.sequential_module, self.target, self.tuner, trials)
        if plan == "library":
            if self.library_module is None:
                raise PlanSkipped("no call has a library kernel the derivation plan lacks"
                                  if self.library is None else "it is the derivation plan")
            return compile_module(self.library_module, self.target, self.tuner, trials)
        if plan == "orchestration":
            if self.offer is not None and self.tuner is None:
                return self._offered(self.modules["given"], plan)
            return self._orchestrated(self.modules["given"], plan, trials)
        if plan == "original":  # TVM alone: its greedy fusion of the module as given
            return compile_module(self.modules["given"], self.target, self.tuner, trials)
        raise ValueError(f"unknown plan {plan!r}; plans: {', '.join(PLANS)}")

    def _cost(self, plan: str):
        """The kernel costs of ``plan``'s orchestration: the builder's cost model, else the
        config's with its share of the build's profiling budget (:class:`~tvm_ollie.
        orchestrate.profiled.ProfileLedger`: what is left, split evenly between this plan and
        the orchestrated plans after it; kernels an earlier plan measured are free)."""
        if self.cost is not None:
            return self.cost
        left = ORCHESTRATED[ORCHESTRATED.index(plan):]
        if plan != "joint" and "refined" in left and (
                not self.table.picked or self.table.agrees_with_sequential()):
            left = tuple(p for p in left if p != "refined")  # (skipped: no share)
        return make_cost(self.target, self.config,
                         account=self.ledger.account(plan, len(left)))

    def _joint(self, trials: int):
        tgt, reports = self.target, self.reports["joint"]
        cost = self._cost("joint")
        if self.tuner is None:
            return tvm.compile(self.modules["offered"], target=tgt, relax_pipeline=(
                ollie_orchestration(tgt, cost=cost, config=self.config, reports=reports,
                                    joint=self.table)))
        # the offered module is fissioned already (fission drops the unused alternatives)
        return tuned_orchestrate_build(self.modules["offered"], tgt, self.tuner, trials,
                                       cost=cost, config=self.config, reports=reports,
                                       joint=self.table)

    def _offered(self, module, plan: str):
        """``module`` orchestrated with the library kernels as candidates (``self.offer``,
        :func:`~.library_offers.offer_library`): vendor kernels weighed against TVM's in the
        binary program, as Korch does."""
        offered, table = self.offer(module)
        with self.target:
            offered = keep_alternatives(lambda m: fission(m)[0])(offered)
        reports = self.reports[plan]
        ex = tvm.compile(offered, target=self.target, relax_pipeline=ollie_orchestration(
            self.target, cost=self._cost(plan), config=self.config, reports=reports,
            joint=table))
        note_library(reports[-1] if reports else None, table)
        return ex

    def _orchestrated(self, module, plan: str, trials: int):
        tgt, reports, cost = self.target, self.reports[plan], self._cost(plan)
        if self.tuner is None:
            return tvm.compile(module, target=tgt, relax_pipeline=ollie_orchestration(
                tgt, cost=cost, config=self.config, reports=reports))
        return tuned_orchestrate_build(module, tgt, self.tuner, trials, cost=cost,
                                       config=self.config, fission=_split_composites,
                                       reports=reports)


def _rewrite_regions(mod, cfg: OllieConfig, budget, hooks: dict):
    """The sequential pass with every single call held to the original: regions of several
    calls and groups of matmuls sharing an operand (:mod:`tvm_ollie.transform.regions`) are
    decided and rewritten as in the sequential build; the heavy calls are left for the joint
    selection."""
    def regions_only(sig: str, _alts):
        return None if sig.startswith(("region[", "group[")) else Alternative(None, "tvm", 0.0)

    hooks = {k: v for k, v in hooks.items() if k != "chooser"}
    # the layout step runs once the calls are decided too (:func:`layout_step`): here, with
    # every call held original, it would find no chain and leave the regions' convs NCHW
    return optimize_module(mod, config=cfg.replace(blocked_layout=False), budget=budget,
                           chooser=regions_only, **hooks)


def layout_step(cfg: OllieConfig, decider, target):
    """The sequential build's layout step (:func:`~tvm_ollie.transform.optimize.optimize_module`
    runs :func:`~tvm_ollie.transform.blocked_layout.blocked_layout` after the rewrite when
    ``cfg.blocked_layout``, the Decider may use the library and the kernels run on the CPU),
    as ``module -> (module, LayoutReport)``; None where that build has none.

    Why the joint build needs it: its plans are built from decisions made call by call, after
    the regions pass; without this step its ``derivation`` plan was the ``ollie`` build less
    its chains of convolutions kept channels-last, and YOLOX's one chain of 101 convolutions
    ran 1.4x slower in every plan the guard could keep.
    """
    if not (cfg.blocked_layout and decider.library and lib.device_of(target) == "cpu"):
        return None

    def step(module):
        module, layouts = blocked_layout(module, pack_weights=cfg.pack_weights)
        if cfg.pack_weights:  # the matmuls' constant weights too, as the sequential build
            module = packed_matmuls(module, cfg.work_dir)[0]
        return module, layouts

    return step


def _heavy_calls(mod: "tvm.IRModule") -> Dict[str, str]:
    """``{variable name: signature}`` of the static derivable calls bound in ``mod``."""
    calls: Dict[str, str] = {}
    for _, func in mod.functions_items():
        if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
            continue
        for block in func.body.blocks:
            for b in block.bindings:
                e = b.value
                if isinstance(e, relax.Call) and isinstance(e.op, tvm.ir.Op) \
                        and e.op.name in DERIVABLE_OPS and static_call(e):
                    calls[b.var.name] = call_signature(e)
    return calls


def joint_build(mod: "tvm.IRModule", target=None, config: Optional[OllieConfig] = None, *,
                max_alternatives: int = 2, guard: bool = False, plan_timer=None, budget=None,
                plan_tuner=None, measure_kernels: bool = False, timer=None, checker=None,
                chooser=None, cost_model=None, tuner=None, **options: Any):
    """Build ``mod`` with joint selection; return ``(executable, OptimizeReport,
    OrchestrationReport)``.

    The options are ``config`` with ``target`` and ``options`` overriding its fields (as in
    :func:`~tvm_ollie.transform.optimize.optimize_module`; ``timer``, ``checker``,
    ``chooser``, ``cost_model`` and ``tuner`` are its test hooks). Its Decider
    (``search_time_s`` shared by the call signatures) offers the alternatives, the
    orchestration chooses among them and the kernel boundaries at once. Regions of several
    calls are decided first, as in the sequential build (:func:`_rewrite_regions`). Kernel
    candidates are costed analytically; with ``measure_kernels`` and a ``work_dir`` those
    holding a linear primitive are timed untuned
    (:class:`~tvm_ollie.orchestrate.cost.LinearMeasuredCost`, cached
    there): about 0.4 s a candidate here, thousands of them in a model of a few dozen convs,
    so not the default.

    With ``guard`` (a target that runs here), the refined, sequential, derivation-only and
    orchestration-only plans are built from the same decisions, and the module as given by
    TVM alone; the fastest of them and the joint plan, timed whole, is returned (:mod:`.guard`;
    ``plan_timer`` replaces the timing); ``OptimizeReport.plans`` says which and why, and the
    orchestration report is the winner's (None for derivation only and TVM alone).

    Tuned (the config's ``trials > 0`` with a ``budget``
    (:class:`~tvm_ollie.tune.budget.TrialBudget`) and a ``plan_tuner`` metered by it, which
    builds and tunes the plans; the Decider tunes with its own, or with ``tuner``): as in the
    module docstring. Otherwise nothing is tuned (the decisions take ``trials=0``).
    """
    start, tuning0, calls0 = time.perf_counter(), STATS.seconds, STATS.calls
    cfg = resolve_config(config, target=target, **options)
    tgt = normalize_target(cfg.target)
    work_dir = cfg.work_dir
    tuned = cfg.trials > 0 and budget is not None and plan_tuner is not None
    cfg = cfg.replace(target=tgt, trials=cfg.trials if tuned else 0)
    budget = budget if tuned else None
    hooks = dict(timer=timer, checker=checker, chooser=chooser, cost_model=cost_model,
                 tuner=tuner)
    given = mod
    mod, regions = _rewrite_regions(mod, cfg, budget, hooks)
    decider = make_decider(tgt, config=cfg, budget=budget, **hooks)
    # the signatures of the module as given (as the sequential build decides them) share the
    # search time; by signature, since the regions pass renames the bindings it re-emits
    calls = _heavy_calls(given)
    search_s = max(MIN_SEARCH_S, cfg.search_time_s / max(len(set(calls.values())), 1))
    offered, table, decided = offer_alternatives(mod, decider, max_alternatives, search_s,
                                                 only=set(calls.values()))
    # epilogues fold before fission splits activations (as in the sequential build); fission
    # drops unused bindings, which the alternatives are until the selection
    folded = offer_folded(offered, table)
    with tgt:
        offered = keep_alternatives(lambda m: fission(m)[0])(folded)
    cost = None
    if measure_kernels and work_dir:  # cached by structural hash in work_dir
        cost = LinearMeasuredCost(MeasuredCost(tgt, work_dir), AnalyticCost(tgt))
    plans = PlanBuilder(tgt, cost, plan_tuner if tuned else None,
                        {"given": given, "regions": mod, "folded": folded, "offered": offered},
                        decided, table, layouts=layout_step(cfg, decider, tgt),
                        library=library_plan(given, cfg, checker) if decider.library else None,
                        offer=library_offer(tgt) if decider.library else None,
                        config=cfg.orchestrate_config())
    report = OptimizeReport(target=kind_name(tgt), budget=budget)
    final = budget.final() if tuned else 0  # what is left of the budget: the kept plan's
    if guard:
        ex, winner, report.plans = _guarded(plans, plan_timer)
        if final > 0:
            ex = plans.build(winner, final)
            report.plans.notes.append(f"{winner} rebuilt with {final} trials after the guard "
                                      "timed it untuned")
    else:
        ex, winner = plans.build("joint", final), "joint"
    report.epilogues = dict(plans.epilogues) if winner in ("sequential", "derivation") else {}
    report.layouts = plans.layouts.get(winner)
    report.regions = regions.regions
    if winner == "library":  # the sequential build's library plan: its decisions
        lib_report = plans.library[1]
        report.decisions, report.regions = lib_report.decisions, lib_report.regions
        report.epilogues, report.inference_folds = lib_report.epilogues, \
            lib_report.inference_folds
    else:
        _report_decisions(report, decided, table, winner)
    report.search_s = decider.search_s + regions.search_s
    report.verify_s = decider.verify_s + regions.verify_s
    report.tuning_s, report.tuning_calls = STATS.seconds - tuning0, STATS.calls - calls0
    report.total_s = time.perf_counter() - start
    reports = plans.reports.get(winner, [])
    orch = reports[-1] if reports else None
    if orch is not None and report.plans is not None:
        orch.notes.append(report.plans.to_text().splitlines()[0])
    joint_reports = plans.reports["joint"]  # the joint selection's statistics, kept or not
    report.orchestration = joint_reports[-1] if joint_reports else None
    return ex, report, orch


def _report_decisions(report, decided: list, table: JointTable, winner: str) -> None:
    """One decision per heavy call (and the regions) as the kept plan has them."""
    as_given = winner in ("orchestration", "original")
    if as_given:  # the module as given: no region rewritten either
        for r in report.regions:
            if r.rewritten:
                r.chosen, r.after_s = "original", r.before_s
                r.reason = f"the {winner} plan, kept by the never-worse guard"
    for name, sig, choice in decided:
        infos = {a.label: a for a in table.alts.get(name, [])}
        label = table.chosen.get(name, "original") if winner in ("joint", "refined") \
            else "original" if as_given else choice.label
        base, got = infos.get("original"), infos.get(label)
        before = (base.measured_s or base.estimate_s) if base else choice.before_s
        after = (got.measured_s or got.estimate_s) if got else before
        how = f"joint selection among {len(infos) or 1} alternatives" if winner == "joint" \
            else f"the {winner} plan, kept by the never-worse guard"
        report.decisions.append(Decision(
            "main", name, sig.split(" ", 1)[0], sig, chosen=label,
            reason=f"{how} (sequential: {choice.label}; {choice.reason})",
            explain=choice.explain if label == choice.label else "", before_s=before,
            after_s=after, measured=bool(got and got.measured_s is not None),
            candidates=choice.candidates))


def _guarded(plans: PlanBuilder, plan_timer) -> Tuple[object, str, object]:
    """``(executable, winner, GuardReport)``: every plan of :data:`PLANS` built from the same
    decisions (with the records the decisions left, when tuned), the fastest kept."""
    try:
        args = sample_args(plans.modules["regions"]["main"])
    except Exception as err:  # pylint: disable=broad-except
        why = f"not timed: no main with static shapes ({type(err).__name__})"
        return plans.build("joint"), "joint", GuardReport(winner="joint", notes=[why])
    built_s: Dict[str, float] = {}

    def timed_build(name: str):
        start = time.perf_counter()
        try:
            with stage(f"plan {name}"):
                return plans.build(name)
        finally:
            built_s[name] = time.perf_counter() - start

    builds: List[Tuple[str, object]] = [(name, lambda n=name: timed_build(n)) for name in PLANS]
    ex, winner, report = guard_plans(builds, args, reference=GUARD_REFERENCE,
                                     timer=plan_timer, target=plans.target,
                                     prefer=GUARD_PREFERENCE, timing=GUARD_TIMING)
    report.notes.append("built in " + ", ".join(
        f"{n} {s:.1f} s{_profiled(plans.reports.get(n))}" for n, s in built_s.items()))
    return ex, winner, report


def _profiled(reports: Optional[list]) -> str:
    """`` (profiling P s: M measured, C cached, budget reached)`` of a plan's orchestration
    (``""``: none, or not profiled): where the plan's build time went."""
    prof = reports[-1].profile if reports and reports[-1] is not None else None
    if prof is None:
        return ""
    stop = ", budget reached" if prof.stopped == "budget" else ""
    return f" (profiling {prof.profile_s:.1f} s: {prof.profiled} measured, " \
           f"{prof.cached} cached of {prof.eligible}{stop})"
