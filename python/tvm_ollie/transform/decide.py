"""Per-unit decisions: candidates -> cost -> check -> choose, cached per signature.

Every unit (a call, a :class:`~.regions.Region` or a :class:`~.groups.SharedInputGroup`) has
*alternatives* (:mod:`.alternatives`): the original built by TVM (the baseline), the original
on a native library kernel, and each derived program on TVM or library kernels. The
:class:`Decider` runs them through small stages, each replaceable by a fake:

1. **candidates** (:class:`~.alternatives.Candidates`): the alternatives of the unit;
2. **cost** (:class:`~.costing.UnitCostModel`): every alternative's analytic estimate
   (:class:`~.costing.AnalyticUnitCost`) shortlists them; when the pass measures (``trials >
   0``, the untuned check on CPUs, or a given cost model) the checked shortlisted ones are
   built, then timed together (:class:`~.costing.UntunedTiming`,
   :class:`~.costing.TunedTiming`; :mod:`.measuring`: interleaved rounds until separated, the
   evidence recorded in ``work_dir`` and reused by a later build);
3. **check** (:class:`~.checking.Checker`): numerically against the original, then exactly over
   a finite field for small polynomial programs;
4. **choose** (:mod:`.choosing`): the cheapest that holds up, if cheaper than the original by
   :data:`~.choosing.MARGIN`; anything else keeps the original and records why.

Units with equal :func:`~.units.unit_signature` (operator, operand shapes/dtypes, attributes,
operand aliasing) are decided once: the chosen program is cached with the operand names of the
first unit and re-bound positionally for the others.

Injection points for tests and tools: ``cost_model`` (a :class:`~.costing.UnitCostModel`) or
``timer`` (module, label) -> seconds replaces the measurement; ``checker`` (a
:class:`~.checking.Checker`, or (reference module, candidate module) -> (ok, why) in place of
the numeric comparison) replaces the check; ``tuner`` replaces the MetaSchedule tuner;
``chooser`` (signature, alternatives) -> alternative forces the choice (differential testing:
every verified alternative can be built in turn).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import tempfile
import time
from typing import Dict, List, Optional, Tuple, Union

from .. import native, native_cuda
from ..codegen import library as lib
from ..compile_profile import stage
from ..config import OllieConfig, resolve_config
from ..derive.cache import DerivationCache
from ..target import gpu_available, is_gpu_target, is_llvm, normalize_target
from ..tune.budget import TrialBudget
from ..tune.calibrate import calibrate
from ..tune.library_timing import library_seconds
from ..tune.metaschedule import Tuner
from ..tune.records import MachineStore
from .alternatives import Alternative, Candidates, UnitAlternatives
from .batched import UnitBuild
from .build_pool import MIN_UNITS, BuildPool, shared_pool
from .checking import RTOL, Checker, CheckFn, VerdictCache, check_exact, checked
from .choosing import (MARGIN, REPRODUCIBLE_MARGIN, Choice, Chooser, Decision, choose_analytic,
                       choose_forced, choose_measured, decided, far_behind, kept_by_estimate,
                       shortlist)
from .costing import (AnalyticUnitCost, CallableTiming, ModuleTiming, Timer, TunedTiming,
                      UnitCostModel, UntunedTiming)
from .emit import EmitError
from .measuring import DecisionRecords, DecisionTiming
from .remembered import RememberedDecisions
from .twins import twins
from .units import (call_signature, constant_inputs, is_group, is_region, isolated_module,
                    unit_module, unit_operands, unit_signature)

__all__ = ["DERIVABLE_OPS", "MARGIN", "RTOL", "Alternative", "Checker", "Choice", "Chooser",
           "Decider", "Decision", "Timer", "call_signature", "check_exact", "constant_inputs",
           "isolated_module", "unit_module", "unit_operands", "unit_signature"]

LOG = logging.getLogger("tvm_ollie.transform")

#: Relax operators the pass tries to derive.
DERIVABLE_OPS = (
    "relax.nn.conv1d", "relax.nn.conv2d", "relax.nn.conv3d",
    "relax.nn.conv1d_transpose", "relax.nn.conv2d_transpose", "relax.nn.conv3d_transpose",
    "relax.matmul",
)


class Decider:
    """Decides (and caches) the implementation of each unit signature (module docstring).

    Parameters
    ----------
    target : Target, optional
        The compilation target (default: the config's, else ``Target.current()``, else llvm).
    config : OllieConfig, optional
        The options (default: the :func:`~tvm_ollie.config.config_scope`'s, else the
        defaults). The decider reads ``trials`` (drawn from ``budget``; 0: the analytic cost,
        plus the untuned check on CPUs), ``work_dir`` (a temporary one when tuning without),
        ``max_depth``, ``search_time_s`` (the derivation time of a signature when
        :meth:`decide` is given none), ``calibration``, ``max_measured``, ``max_states``,
        ``max_candidates``, ``check_untuned``, ``library`` (``True`` asks for the native
        kernels: a missing library is then reported once), ``derive``, ``rpc`` (checked once
        here so an unreachable tracker fails before any work) and ``derivation_cache``.
    **options
        Overrides of the config's fields (:meth:`~tvm_ollie.config.OllieConfig.replace`:
        an unknown name is a :class:`~tvm_ollie.config.ConfigError`).
    timer : Timer, optional
        Replaces the measurement (as a :class:`~.costing.CallableTiming`).
    checker : Checker or CheckFn, optional
        The check; a bare ``(reference, candidate) -> (ok, why)`` replaces its numeric
        comparison (the finite-field check still follows).
    chooser : Chooser, optional
        Forces the choice per signature (for differential tests; see
        :data:`~.choosing.Chooser`).
    tuner : Tuner, optional
        Replaces the MetaSchedule tuner of the default timing (used when ``trials > 0``).
    budget : TrialBudget, optional
        The module's trial budget; each tuned measurement is granted a part of the current
        task's allotment (default: a budget of ``trials`` for this decider alone).
    cost_model : UnitCostModel, optional
        Decides in place of the default measurement (not with ``timer``); one whose seconds
        are not timings (``measured = False``) is the estimator instead, and the decision is
        by its estimate.
    estimator : UnitCostModel, optional
        The cost that ranks and shortlists (default :class:`~.costing.AnalyticUnitCost` of
        the calibration).
    derivations : DerivationCache, optional
        Where search results are reused from and stored (:mod:`tvm_ollie.derive.cache`;
        default: with the config's ``derivation_cache``, the ``work_dir``'s and the per-user
        cache). With the config's ``derivation_cache`` on, the default checker's verdicts are
        kept beside it too (:class:`~.checking.VerdictCache`); off, every candidate is checked.
    """

    def __init__(self, target=None, config: Optional[OllieConfig] = None, *,
                 timer: Optional[Timer] = None, checker: Union[Checker, CheckFn, None] = None,
                 chooser: Optional[Chooser] = None, tuner: Optional[Tuner] = None,
                 budget: Optional[TrialBudget] = None,
                 cost_model: Optional[UnitCostModel] = None,
                 estimator: Optional[UnitCostModel] = None,
                 derivations: Optional[DerivationCache] = None, **options):
        if timer is not None and cost_model is not None:
            raise ValueError("give a timer or a cost_model, not both")
        cfg = resolve_config(config, **options)
        default = all(x is None for x in (timer, checker, chooser, tuner, cost_model, estimator,
                                          derivations))  # (nothing of the caller's own)
        target = target if target is not None else cfg.target
        check_untuned, calibration, work_dir = cfg.check_untuned, cfg.calibration, cfg.work_dir
        self.target = normalize_target(target)
        gpu = is_gpu_target(self.target)
        if check_untuned is None:
            check_untuned = not gpu and calibration is None
        self.check_untuned = bool(check_untuned)
        self.library = _library_enabled(cfg.library, self.target)
        with stage("calibration"):
            self.calib = calibration or calibrate(self.target, cache=cfg.derivation_cache)
        self.trials = int(cfg.trials)
        self.search_time_s = cfg.search_time_s
        self.max_measured = cfg.max_measured
        self.budget = budget if budget is not None else TrialBudget(self.trials)
        self.derive = cfg.derive
        self.can_measure = self.trials > 0 and (not gpu or gpu_available(self.target))
        self.rpc = rpc = cfg.rpc
        if rpc is not None:
            self.can_measure = self.trials > 0  # the remote devices measure, not this machine
            if self.can_measure or self.check_untuned:
                rpc.check()
        self.work_dir = work_dir
        if derivations is None and cfg.derivation_cache:
            derivations = DerivationCache.for_run(work_dir)
        if self.can_measure and not work_dir:
            self.work_dir = tempfile.mkdtemp(prefix="ollie_tune_")
        self.chooser = chooser
        # the stages (on a CPU, a search's gain is at most its original's library time)
        timer_of_library = library_seconds if self.library and is_llvm(self.target) else None
        self.candidates = Candidates(self.library, self.derive, cfg.max_depth, cfg.max_states,
                                     cfg.max_candidates, self.calib.kind,
                                     derivations, self.calib, MARGIN,
                                     cfg.search_payback_runs, timer_of_library)
        if cost_model is not None and not cost_model.measured and estimator is None:
            estimator, cost_model = cost_model, None  # decide by that estimate
        self.estimator: UnitCostModel = estimator or AnalyticUnitCost(self.calib)
        self.cost_model = self._cost_model(cost_model, timer, tuner)
        self.checker = checker if isinstance(checker, Checker) else Checker(
            checker, cache=VerdictCache.for_run(work_dir, self.target)
            if cfg.derivation_cache else None)
        self.measures = self.cost_model is not None and self.cost_model.measured
        if self.measures:
            # the search stops where no program could beat the best found by the deciding
            # margin (CostBound): a measured decision separates by REPRODUCIBLE_MARGIN at
            # least (for the units large enough to be judged by their estimates:
            # Candidates.bound, MEASURED_SEED_FLOPS)
            self.candidates.measured_margin = max(MARGIN, REPRODUCIBLE_MARGIN)
        #: the measured decisions: alternatives timed together, evidence kept in work_dir
        self.timing = DecisionTiming(self.cost_model, DecisionRecords(
            self.work_dir, shared_records(self.cost_model, self.target, cfg))) \
            if self.measures else None
        self.cache: Dict[str, Decision] = {}
        self.verify_s = 0.0
        #: decisions kept per machine (:mod:`.remembered`): only the default decider's
        self.remembered = self._remembered(cfg) if default else None
        self.build_pool = cfg.build_pool
        #: where the merged builds are built (:meth:`plan_builds`; None: in this process)
        self.pool: Optional[BuildPool] = None
        #: decisions prepared (:meth:`prepare`), to finish in :meth:`decide`
        self._pending: Dict[str, Tuple[object, "_Measured"]] = {}

    def plan_builds(self, units: int) -> None:
        """Build the decisions' merged modules in this process's :class:`~.build_pool.
        BuildPool` when the config's ``build_pool`` says so: True, always; None, when
        ``units`` signatures are to be decided, at least :data:`~.build_pool.MIN_UNITS` (the
        workers' start is repaid by that many builds); False (the default), never."""
        wanted = self.build_pool if self.build_pool is not None else units >= MIN_UNITS
        self.pool = shared_pool() if wanted and units > 0 else None

    def _cost_model(self, cost_model, timer, tuner) -> Optional[UnitCostModel]:
        """The deciding cost: given, the timer's, tuned, untuned, or none (the estimate)."""
        if cost_model is not None:
            return cost_model
        if timer is not None:
            return CallableTiming(timer)
        if self.can_measure:
            return TunedTiming(self.target, tuner or Tuner(self.target, self.work_dir,
                                                           rpc=self.rpc),
                               self.trials, self.budget, self.work_dir, self.rpc)
        if self.check_untuned:
            return UntunedTiming(self.target, self.work_dir, self.rpc)
        return None

    def _remembered(self, cfg: OllieConfig) -> Optional[RememberedDecisions]:
        """The remembered decisions of this decider's options (None: off; module docstring
        of :mod:`.remembered`): the analytic decision or this machine's untuned timing."""
        if self.cost_model is not None and shared_records(self.cost_model, self.target,
                                                          cfg) is None:
            return None
        store = MachineStore.for_run(self.target, "unit decisions", cfg.derivation_cache)
        if store is None:
            return None
        calib = self.calib
        options = dict(max_depth=cfg.max_depth, max_states=cfg.max_states,
                       max_candidates=cfg.max_candidates, targets=cfg.targets,
                       search_time_s=cfg.search_time_s, library=self.library,
                       search_payback_runs=cfg.search_payback_runs,
                       derive=self.derive, measures=self.measures,
                       max_measured=self.max_measured, trials=self.trials,
                       cost=self.cost_model.record_key if self.measures else "analytic",
                       calibration=[calib.kind, calib.peak_flops, calib.bandwidth,
                                    sorted(dict(calib.efficiency).items())])
        return RememberedDecisions(store, options)

    @property
    def search_s(self) -> float:
        """Seconds spent in derivation search."""
        return self.candidates.search_s

    # -- public ----------------------------------------------------------------------------

    def decide(self, unit, budget_s: Optional[float] = None) -> Decision:
        """The choice for ``unit`` (computed on the first unit of its signature).

        ``unit`` is a Relax call, or a region (:class:`~tvm_ollie.transform.regions.Region`:
        several calls lifted as one expression, with inputs and one output) or group decided
        and replaced as a whole.
        """
        sig = unit_signature(unit)
        hit = self.cache.get(sig)
        if hit is None and sig in self._pending:
            key, step = self._pending.pop(sig)
            hit = self._safely(sig, lambda: self._finish(unit, sig, step))
            self._keep(sig, key, hit)
        elif hit is None:
            key = self.remembered.key(unit, sig) if self.remembered is not None else None
            hit = self.remembered.get(key) if key is not None else None
            if hit is None:
                hit = self._decide_safely(unit, sig, budget_s)
                self._keep(sig, key, hit)
            self.cache[sig] = hit
        return hit

    def prepare(self, unit, budget_s: Optional[float] = None) -> Optional[UnitBuild]:
        """The first half of :meth:`decide` for ``unit``, so that several decisions' merged
        builds can be built together (:class:`~.batched.BuildGroup`): its candidates, their
        estimates, the shortlist, and its merged build, not built yet, which is returned;
        :meth:`decide` of a unit of the same signature then checks, times and chooses. A
        decision that builds nothing to time (known, remembered, by the estimate, forced) is
        made here in full (None returned).

        Why the decisions are the same as :meth:`decide`'s one after the other: the first
        half times nothing that a later unit's reads (the searches use their own unit's
        measured original only), the searches run in the same order with the same budgets,
        and the second half times each alternative as its own function of the merged build,
        one at a time, as before."""
        sig = unit_signature(unit)
        if sig in self.cache or sig in self._pending:
            return None
        key = self.remembered.key(unit, sig) if self.remembered is not None else None
        hit = self.remembered.get(key) if key is not None else None
        if hit is not None:
            self.cache[sig] = hit
            return None
        step = self._safely(sig, lambda: self._prepare(unit, sig,
                                                        budget_s or self.search_time_s))
        if not isinstance(step, _Measured):
            self._keep(sig, key, step)
            return None
        self._pending[sig] = (key, step)
        return step.build

    def _keep(self, sig: str, key, decision: Decision) -> None:
        """Cache ``decision`` for ``sig`` (and per machine under ``key``)."""
        if key is not None:
            self.remembered.put(key, decision)
        self.cache[sig] = decision

    def _decide_safely(self, unit, sig: str, budget_s: Optional[float]) -> Decision:
        """:meth:`_decide`, an unexpected error keeping the original."""
        return self._safely(sig, lambda: self._decide(unit, sig,
                                                       budget_s or self.search_time_s))

    def _safely(self, sig: str, step):
        """``step()`` on the target's kernel device, an unexpected error keeping the
        original."""
        try:
            with lib.kernel_device(lib.device_of(self.target)):
                return step()
        except Exception as err:  # pylint: disable=broad-except
            LOG.warning("ollie: %s kept: unexpected %s: %s", sig, type(err).__name__, err)
            return decided(None, [], f"internal error: {type(err).__name__}: {err}")

    def alternatives(self, unit, budget_s: float) -> Tuple[List[Alternative], int, str]:
        """Candidates, then cost: the baseline first, then every other alternative, each with
        its estimate; the number of derived candidates and a note on the search."""
        found = self.candidates(unit, budget_s)
        return self.estimated(unit, found), found.candidates, found.note

    def estimated(self, unit, found: UnitAlternatives) -> List[Alternative]:
        """The alternatives with the estimator's seconds (0 for a unit that does not lift)."""
        if not found.liftable:
            return list(found.alternatives)
        return [dataclasses.replace(a, estimate=self.estimator.seconds(unit, a))
                for a in found.alternatives]

    def check(self, unit, alt: Alternative,
              build: Optional[UnitBuild] = None) -> Tuple[bool, str]:
        """The check stage: ``(ok, why)`` of ``alt`` against ``unit`` (failures reject;
        ``build``: the decision's merged build, :meth:`unit_build`)."""
        t0 = time.perf_counter()
        try:
            with stage("verify"):
                return checked(self.checker, unit, alt, build)
        finally:
            self.verify_s += time.perf_counter() - t0

    def cost(self, unit, alt: Alternative) -> Optional[float]:
        """The deciding cost of ``alt`` (None: failed, or the decider does not measure): its
        median in its unit's decision when that timed it, else one measurement."""
        if self.cost_model is None:
            return None
        if self.timing is not None and self.timing.seconds:
            known = self.timing.seconds.get((unit_signature(unit), alt.label))
            if known is not None:
                return known
        return self.cost_model.seconds(unit, alt)

    # -- the pipeline -----------------------------------------------------------------------

    def _decide(self, unit, sig: str, budget_s: float) -> Decision:
        step = self._prepare(unit, sig, budget_s)
        return self._finish(unit, sig, step) if isinstance(step, _Measured) else step

    def _prepare(self, unit, sig: str, budget_s: float) -> Union[Decision, "_Measured"]:
        """Candidates, cost (estimates), the shortlist and its merged build (not built yet):
        a measured decision still to check and time, or the decision itself."""
        names, _ = unit_operands(unit)
        alts, n_cand, note = self.alternatives(unit, budget_s)  # candidates -> cost (estimate)
        base = alts[0]
        others = sorted(alts[1:], key=lambda a: (a.estimate, a.label))
        if self.chooser is not None:
            forced = self.chooser(sig, others)
            if forced is not None:  # its check from one build of both modules (.batched)
                build = None if forced.is_baseline else self.unit_build(unit, [base, forced])
                return choose_forced(base, forced, names, n_cand,
                                     functools.partial(self.check, unit, build=build))
        better = shortlist(base, others, is_region(unit), self.measures,
                           is_region(unit) and not is_group(unit))
        if self.measures:  # (estimated 10x behind the library kernel: never built or timed)
            behind = far_behind(better)
            better = [a for a in better if a not in behind]
        if not better:
            return kept_by_estimate(base, others, names, n_cand, note)
        if not self.measures:  # check -> choose by the estimate
            build = self.unit_build(unit, [base] + self._to_check(better))
            check = functools.partial(self.check, unit, build=build)
            return choose_analytic(base, better, names, n_cand, check)
        # what the choose stage checks and times, less the copies of an earlier one (.twins)
        better = self._to_check(better)
        modules = self.unit_modules(unit, [base] + better)
        same = twins(modules)
        better = [a for a in better if a.label not in same]
        build = self._merged({k: m for k, m in modules.items() if k not in same})
        return _Measured(base, better, names, n_cand, same, build)

    def _finish(self, unit, sig: str, step: "_Measured") -> Decision:
        """Check, time and choose among a prepared decision's alternatives."""
        base, better, build = step.base, step.better, step.build
        check = functools.partial(self.check, unit, build=build)
        mode = "measured" if self.can_measure else "untuned, measured"
        timed = build is not None and is_llvm(self.target) and \
            isinstance(self.cost_model, ModuleTiming) and self.cost_model.shares_builds
        if timed:
            self.cost_model.use_build(unit, build)
        try:
            dec = choose_measured(base, better, step.names, step.n_cand, check,
                                  functools.partial(self.cost, unit), self.max_measured, mode,
                                  self.timing.step(unit, sig))  # check -> cost -> choose
        finally:
            if timed:
                self.cost_model.use_build(None, None)
        if step.same:
            dec.reason += "; not built, checked or timed (the same module as " + \
                "; ".join(f"{b}: {a}" for a, b in step.same.items()) + ")"
        return dec

    def _to_check(self, better: List[Alternative]) -> List[Alternative]:
        """The shortlisted alternatives the choose stage checks and times: measured,
        :func:`~.choosing.choose_measured`'s natives and first ``max_measured`` programs (each
        is checked, then timed); by the estimate, the first only
        (:func:`~.choosing.choose_analytic` stops at the first that holds up, and TVM's build
        costs per kernel: merging the next ones in would build them for nothing when the first
        passes; a later one is built alone)."""
        if not self.measures:
            return better[:1]
        programs = [a for a in better if a.program is not None][:self.max_measured]
        return [a for a in better if a.program is None] + programs

    def unit_build(self, unit, alts: List[Alternative]) -> Optional[UnitBuild]:
        """One merged build of ``alts`` (the original first) computing ``unit``
        (:mod:`.batched`), for the checker and, on a CPU target, the untuned timing; built on
        first use. On a CPU target it is built for the target (what the timing builds), else
        for llvm (what the checker runs on). None: fewer than two modules to merge."""
        return self._merged(self.unit_modules(unit, alts))

    @staticmethod
    def unit_modules(unit, alts: List[Alternative]) -> Dict[str, "tvm.IRModule"]:
        """The isolated module of each of ``alts`` computing ``unit``, by label, in order
        (one that has no Relax form is left out: its check says why)."""
        modules: Dict[str, "tvm.IRModule"] = {}
        with lib.kernel_device("cpu"):
            for alt in alts:
                try:
                    modules.setdefault(alt.label, unit_module(unit, alt.program, None, alt.impl))
                except EmitError:
                    continue  # (its check says why)
        return modules

    def _merged(self, modules: Dict[str, "tvm.IRModule"]) -> Optional[UnitBuild]:
        """:meth:`unit_build` of ``modules`` already made (None: fewer than two)."""
        target = self.target if is_llvm(self.target) else "llvm"
        return UnitBuild(modules, target, self.pool) if len(modules) > 1 else None


@dataclasses.dataclass
class _Measured:
    """A measured decision prepared (:meth:`Decider.prepare`): what remains to check and time
    (``better``, after the twins ``same`` were dropped) and its merged build."""

    base: Alternative
    better: List[Alternative]
    names: list
    n_cand: int
    same: Dict[str, str]
    build: Optional[UnitBuild]


def shared_records(model: Optional[UnitCostModel], target,
                   cfg: OllieConfig) -> Optional[MachineStore]:
    """The per-user cache of the timed decisions' evidence (:class:`~.measuring.DecisionRecords`)
    for ``model``: only the untuned timing of this machine (not the tuned one, whose timings
    depend on the work dir's tuning records; not a caller's timer; not through ``rpc``, whose
    devices are not this machine), with the config's ``derivation_cache`` on."""
    untuned = isinstance(model, UntunedTiming) and not isinstance(model, TunedTiming)
    if not untuned or model.rpc is not None:
        return None
    return MachineStore.for_run(target, "decisions", cfg.derivation_cache)


def _library_enabled(library: Optional[bool], target) -> bool:
    """Whether native kernels are alternatives: on CPU targets when the CPU library is loaded;
    on CUDA targets when the CUDA library is loaded and a device is here to run (and time)
    them (:func:`_cuda_library`)."""
    if library is False:
        return False
    if is_gpu_target(target):
        return _cuda_library(library, target)
    ok = native.load()
    if library and not ok:
        LOG.warning("ollie: native kernels requested but unavailable (%s); using TVM kernels",
                    native.unavailable_reason())
    return ok


def _cuda_library(library: Optional[bool], target) -> bool:
    """The CUDA kernels are offered when the CUDA library loads, a GPU is present and cuBLAS
    or cuDNN opens (each kernel is then offered only where its own vendor library does:
    :func:`tvm_ollie.codegen.library.call_form`). Without a GPU the pass keeps TVM's kernels
    (nothing could time or run the library's), unless they are assumed to run where the build
    goes (:func:`tvm_ollie.native_cuda.assumed`: a device bundle)."""

    if not gpu_available(target) and not native_cuda.assumed():
        why = "no CUDA device here"
    else:
        errors = [native_cuda.kernel_error(k) for k in native_cuda.KERNELS]
        why = "" if any(not e for e in errors) else "; ".join(dict.fromkeys(errors))
    if why and library:
        LOG.warning("ollie: CUDA library kernels requested but unavailable (%s); using TVM "
                    "kernels", why)
    return not why
