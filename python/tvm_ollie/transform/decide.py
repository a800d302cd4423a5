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
from ..config import DEFAULTS
from ..derive.cache import DerivationCache
from ..target import gpu_available, is_gpu_target, normalize_target
from ..tune.budget import TrialBudget
from ..tune.calibrate import Calibration, calibrate
from ..tune.metaschedule import Tuner
from ..tune.rpc import RPCConfig
from .alternatives import Alternative, Candidates, UnitAlternatives
from .checking import RTOL, Checker, CheckFn, VerdictCache, check_exact, checked
from .choosing import (MARGIN, Choice, Chooser, choose_analytic, choose_forced,
                       choose_measured, kept_by_estimate, shortlist)
from .costing import (AnalyticUnitCost, CallableTiming, Timer, TunedTiming, UnitCostModel,
                      UntunedTiming)
from .measuring import DecisionRecords, DecisionTiming
from .units import (call_signature, constant_inputs, is_region, isolated_module, unit_module,
                    unit_operands, unit_signature)

__all__ = ["DERIVABLE_OPS", "MARGIN", "RTOL", "Alternative", "Checker", "Choice", "Chooser",
           "Decider", "Timer", "call_signature", "check_exact", "constant_inputs",
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
    target : Target
        The compilation target.
    trials : int
        MetaSchedule trials for everything this decider tunes (0: analytic cost, plus the
        untuned check on CPUs), drawn from ``budget``.
    work_dir : str, optional
        Tuning database and measurement cache directory (a temporary one when tuning without).
    max_depth : int
        Derivation depth.
    search_budget_s : float
        Derivation time of a signature when :meth:`decide` is given none.
    calibration : Calibration, optional
        Analytic cost calibration (measured for the target when None).
    max_measured : int
        Alternatives (cheapest by the analytic cost) verified and measured per signature.
    max_states : int, optional
        Derivation states per signature.
    check_untuned : bool, optional
        With ``trials=0``, time the original and the alternatives untuned before choosing
        (default: on for CPU targets unless ``calibration`` is given).
    library : bool, optional
        Consider native library kernels (default: when the native library is loaded and the
        target is a CPU). ``True`` asks for them: a missing library is then reported once.
    derive : bool
        Consider derived programs (``False``: only the original operator's implementations).
    timer : Timer, optional
        Replaces the measurement (as a :class:`~.costing.CallableTiming`).
    checker : Checker or CheckFn, optional
        The check; a bare ``(reference, candidate) -> (ok, why)`` replaces its numeric
        comparison (the finite-field check still follows).
    rpc : RPCConfig, optional
        Run every measurement (tuning trials, untuned and tuned timings) on the devices behind
        this RPC tracker; checked once here so an unreachable tracker fails before any work.
    chooser : Chooser, optional
        Forces the choice per signature (for differential tests; see
        :data:`~.choosing.Chooser`).
    tuner : Tuner, optional
        Replaces the MetaSchedule tuner of the default timing (used when ``trials > 0``).
    max_candidates : int, optional
        Derived programs kept per signature (None: all).
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
    derivation_cache : bool or DerivationCache
        Where search results are reused from and stored (:mod:`tvm_ollie.derive.cache`):
        True, the ``work_dir``'s and the per-user cache; False, search every signature. When
        on, the default checker's verdicts are kept beside it too
        (:class:`~.checking.VerdictCache`); False checks every candidate.

    The defaults are :data:`tvm_ollie.config.DEFAULTS`.
    """

    def __init__(self, target, trials: int = DEFAULTS.trials, work_dir: Optional[str] = None,
                 max_depth: int = DEFAULTS.max_depth,
                 search_budget_s: float = DEFAULTS.search_time_s,
                 calibration: Optional[Calibration] = None,
                 max_measured: int = DEFAULTS.max_measured,
                 max_states: Optional[int] = DEFAULTS.max_states,
                 check_untuned: Optional[bool] = None, library: Optional[bool] = None,
                 derive: bool = DEFAULTS.derive, timer: Optional[Timer] = None,
                 checker: Union[Checker, CheckFn, None] = None, rpc: Optional[RPCConfig] = None,
                 chooser: Optional[Chooser] = None, tuner: Optional[Tuner] = None,
                 max_candidates: Optional[int] = DEFAULTS.max_candidates,
                 budget: Optional[TrialBudget] = None,
                 cost_model: Optional[UnitCostModel] = None,
                 estimator: Optional[UnitCostModel] = None,
                 derivation_cache: Union[bool, DerivationCache] = True):
        if timer is not None and cost_model is not None:
            raise ValueError("give a timer or a cost_model, not both")
        self.target = normalize_target(target)
        gpu = is_gpu_target(self.target)
        if check_untuned is None:
            check_untuned = not gpu and calibration is None
        self.check_untuned = bool(check_untuned)
        self.library = _library_enabled(library, self.target)
        with stage("calibration"):
            self.calib = calibration or calibrate(self.target)
        self.trials = int(trials)
        self.search_budget_s = search_budget_s
        self.max_measured = max_measured
        self.budget = budget if budget is not None else TrialBudget(self.trials)
        self.derive = bool(derive)
        self.can_measure = self.trials > 0 and (not gpu or gpu_available(self.target))
        self.rpc = rpc
        if rpc is not None:
            self.can_measure = self.trials > 0  # the remote devices measure, not this machine
            if self.can_measure or self.check_untuned:
                rpc.check()
        self.work_dir = work_dir
        if derivation_cache is True:
            derivation_cache = DerivationCache.for_run(work_dir)
        if self.can_measure and not work_dir:
            self.work_dir = tempfile.mkdtemp(prefix="ollie_tune_")
        self.chooser = chooser
        # the stages
        self.candidates = Candidates(self.library, self.derive, max_depth, max_states,
                                     max_candidates, self.calib.kind,
                                     derivation_cache or None, self.calib, MARGIN)
        if cost_model is not None and not cost_model.measured and estimator is None:
            estimator, cost_model = cost_model, None  # decide by that estimate
        self.estimator: UnitCostModel = estimator or AnalyticUnitCost(self.calib)
        self.cost_model = self._cost_model(cost_model, timer, tuner)
        self.checker = checker if isinstance(checker, Checker) else Checker(
            checker, cache=VerdictCache.for_run(work_dir, self.target)
            if derivation_cache else None)
        self.measures = self.cost_model is not None and self.cost_model.measured
        #: the measured decisions: alternatives timed together, evidence kept in work_dir
        self.timing = DecisionTiming(self.cost_model, DecisionRecords(self.work_dir)) \
            if self.measures else None
        self.cache: Dict[str, Choice] = {}
        self.verify_s = 0.0

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

    @property
    def search_s(self) -> float:
        """Seconds spent in derivation search."""
        return self.candidates.search_s

    # -- public ----------------------------------------------------------------------------

    def decide(self, unit, budget_s: Optional[float] = None) -> Choice:
        """The choice for ``unit`` (computed on the first unit of its signature).

        ``unit`` is a Relax call, or a region (:class:`~tvm_ollie.transform.regions.Region`:
        several calls lifted as one expression, with inputs and one output) or group decided
        and replaced as a whole.
        """
        sig = unit_signature(unit)
        hit = self.cache.get(sig)
        if hit is None:
            try:
                with lib.kernel_device(lib.device_of(self.target)):
                    hit = self._decide(unit, sig, budget_s or self.search_budget_s)
            except Exception as err:  # pylint: disable=broad-except
                LOG.warning("ollie: %s kept: unexpected %s: %s", sig, type(err).__name__, err)
                hit = Choice(None, [], f"internal error: {type(err).__name__}: {err}")
            self.cache[sig] = hit
        return hit

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

    def check(self, unit, alt: Alternative) -> Tuple[bool, str]:
        """The check stage: ``(ok, why)`` of ``alt`` against ``unit`` (failures reject)."""
        t0 = time.perf_counter()
        try:
            with stage("verify"):
                return checked(self.checker, unit, alt)
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

    def _decide(self, unit, sig: str, budget_s: float) -> Choice:
        names, _ = unit_operands(unit)
        alts, n_cand, note = self.alternatives(unit, budget_s)  # candidates -> cost (estimate)
        base = alts[0]
        others = sorted(alts[1:], key=lambda a: (a.estimate, a.label))
        check = functools.partial(self.check, unit)
        if self.chooser is not None:
            forced = self.chooser(sig, others)
            if forced is not None:
                return choose_forced(base, forced, names, n_cand, check)
        better = shortlist(base, others, is_region(unit), self.measures)
        if not better:
            return kept_by_estimate(base, others, names, n_cand, note)
        if not self.measures:  # check -> choose by the estimate
            return choose_analytic(base, better, names, n_cand, check)
        mode = "measured" if self.can_measure else "untuned, measured"
        return choose_measured(base, better, names, n_cand, check,  # check -> cost -> choose
                               functools.partial(self.cost, unit), self.max_measured, mode,
                               self.timing.step(unit, sig))


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
    (nothing could time or run the library's)."""

    if not gpu_available(target):
        why = "no CUDA device here"
    else:
        errors = [native_cuda.kernel_error(k) for k in native_cuda.KERNELS]
        why = "" if any(not e for e in errors) else "; ".join(dict.fromkeys(errors))
    if why and library:
        LOG.warning("ollie: CUDA library kernels requested but unavailable (%s); using TVM "
                    "kernels", why)
    return not why
