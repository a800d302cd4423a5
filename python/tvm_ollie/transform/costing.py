"""The cost stage of a decision: seconds of one alternative of a unit.

One interface, :class:`UnitCostModel` (``seconds(unit, alternative) -> seconds or None``),
and its implementations:

* :class:`AnalyticUnitCost`: the calibrated roofline of :mod:`tvm_ollie.tune.analytic`, an
  original as one kernel of its kind, ``max(flops / (peak * eff), bytes / bandwidth)``, a
  program as the sum of its stages; it ranks and prunes every alternative.
* :class:`UntunedTiming`: the unit alone (:func:`~.units.unit_module`) built with TVM's default
  pipeline and timed here or on RPC devices, cached in ``work_dir``; a decision builds every
  alternative once and samples them together (:meth:`ModuleTiming.sampler`, :mod:`.measuring`).
* :class:`TunedTiming`: the same, tuned by MetaSchedule with the trials the module's
  :class:`~tvm_ollie.tune.budget.TrialBudget` grants it.
* :class:`CallableTiming`: a bare ``timer(module, label) -> seconds`` (tools and tests).

Library kernels are costed by the same models: an alternative with ``impl="native"`` is its
native kernels' roofline at the library's calibrated efficiency, or their timing.

These are not :class:`tvm_ollie.orchestrate.cost.CostModel`: that one costs a *kernel* (a convex
group of primitives of a primitive graph), this one a *rewrite of a Relax unit*; their inputs
share nothing a common protocol could type, so the names differ.
"""

from __future__ import annotations

import hashlib
import logging
import time
from abc import ABC, abstractmethod
from typing import Callable, Dict, Optional, Tuple

from ..compat import tvm
from ..compile_profile import stage
from ..lift import LiftError, lift_relax_call
from ..target import normalize_target
from ..tune import analytic
from ..tune.budget import TrialBudget
from ..tune.calibrate import Calibration
from ..tune.compare import Sampler
from ..tune.measure import compile_module, main_sampler, random_args, time_main
from ..tune.metaschedule import STATS, Tuner
from ..tune.rpc import RPCConfig
from ..tune.workdir import MEASURE_FILE, JsonRecords
from .alternatives import Alternative
from .batched import UnitBuild
from .emit import EmitError
from .units import constant_inputs, is_group, is_region, unit_module, unit_signature

__all__ = ["AnalyticUnitCost", "CallableTiming", "MeasureCache", "ModuleTiming", "Timer",
           "TunedTiming", "UnitCostModel", "UntunedTiming", "region_seconds"]

LOG = logging.getLogger("tvm_ollie.transform")

#: ``timer(module, label) -> seconds`` (None: failed to build or run). ``label`` is
#: ``"<unit signature>|<alternative label>"``; ``module`` computes the unit alone.
Timer = Callable[["tvm.IRModule", str], Optional[float]]


class UnitCostModel(ABC):
    """Seconds of one alternative of a unit (None: it failed to build, tune or run)."""

    #: short name for reports
    name = "abstract"
    #: whether the seconds are timings (the decision then says "measured")
    measured = True

    @abstractmethod
    def seconds(self, unit, alt: Alternative) -> Optional[float]:
        """Estimated or measured seconds of ``alt`` computing ``unit``."""


def region_seconds(region, calib: Calibration) -> float:
    """Analytic estimate of a region (or group) as TVM builds it: one kernel per call."""
    total = 0.0
    for call in region.calls:
        try:
            expr = lift_relax_call(call)
        except LiftError:
            continue
        total += analytic.original_seconds(expr, call.op.name, calib)
    return total


class AnalyticUnitCost(UnitCostModel):
    """The calibrated roofline of :mod:`tvm_ollie.tune.analytic` (see the module docstring):
    a region's original is one kernel per call; a group's original on the library is each call
    on its native kernel."""

    name = "analytic"
    measured = False

    def __init__(self, calibration: Calibration):
        self.calib = calibration

    def seconds(self, unit, alt: Alternative) -> float:
        if alt.program is not None:
            # stages over the unit's constants alone are folded at compile time: free
            return analytic.program_seconds(alt.program, self.calib, alt.impl,
                                            constant_inputs(unit))
        if is_group(unit) and alt.impl != "tvm":
            return sum(analytic.original_seconds(lift_relax_call(c), c.op.name, self.calib,
                                                 alt.impl) for c in unit.heavy_calls)
        if is_region(unit) and alt.impl != "tvm":
            # the region as one library call (:mod:`.layout_absorb`): its convolution's kernel
            heavy = unit.heavy_call
            return analytic.original_seconds(lift_relax_call(heavy), heavy.op.name, self.calib,
                                             alt.impl)
        if is_region(unit):
            return region_seconds(unit, self.calib)
        return analytic.original_seconds(lift_relax_call(unit), unit.op.name, self.calib,
                                         alt.impl)


class ModuleTiming(UnitCostModel):
    """Times the unit's isolated module (:func:`~.units.unit_module`) of an alternative under
    the label ``"<signature>|<alternative>"``; subclasses implement :meth:`measure`."""

    name = "timing"

    def __init__(self):
        self._sig = (None, "")
        #: the current decision's merged build (:meth:`use_build`)
        self._build: Tuple[object, Optional[UnitBuild]] = (None, None)

    #: whether :meth:`sampler` takes an alternative from the decision's merged build
    #: (:mod:`.batched`); only the untuned timing on this machine does
    shares_builds = False

    def use_build(self, unit, build: Optional[UnitBuild]) -> None:
        """Time ``unit``'s alternatives from ``build`` (its merged executable, keyed by
        alternative label) where it holds them; ``None`` ends it."""
        self._build = (unit, build)

    def build_of(self, unit) -> Optional[UnitBuild]:
        """The merged build this model times ``unit``'s alternatives from (None: none)."""
        owner, build = self._build
        return build if self.shares_builds and owner is unit else None

    def seconds(self, unit, alt: Alternative) -> Optional[float]:
        module = self._module(unit, alt)
        if module is None:
            return None
        try:
            return self.measure(*module)
        except Exception as err:  # pylint: disable=broad-except
            LOG.warning("ollie: measuring %s failed: %s: %s", alt.label, type(err).__name__, err)
            return None

    def sampler(self, unit, alt: Alternative) -> Optional[Sampler]:
        """A :data:`~tvm_ollie.tune.compare.Sampler` of ``alt`` (its module built once), for
        timing a decision's alternatives together; None: it failed to build."""
        build = self.build_of(unit)
        built = build.function(alt.label) if build is not None else None
        if built is not None:
            module = (build.modules[alt.label], f"{unit_signature(unit)}|{alt.label}")
        else:
            module = self._module(unit, alt)
        if module is None:
            return None
        try:
            if built is not None:
                return self.sample_built(built[0], built[1], module[0])
            return self.sample(*module)
        except Exception as err:  # pylint: disable=broad-except
            LOG.warning("ollie: building %s failed: %s: %s", alt.label, type(err).__name__, err)
            return None

    def _module(self, unit, alt: Alternative):
        """``(module, label)`` of ``alt`` (None: it has no Relax form)."""
        try:
            mod = unit_module(unit, alt.program, None, alt.impl)
        except EmitError as err:
            LOG.warning("ollie: %s has no Relax form: %s", alt.label, err)
            return None
        if self._sig[0] is not unit:  # (a group's signature lifts its calls again)
            self._sig = (unit, unit_signature(unit))
        return mod, f"{self._sig[1]}|{alt.label}"

    @abstractmethod
    def measure(self, module: "tvm.IRModule", label: str) -> Optional[float]:
        """Seconds of ``module``'s ``main`` (None: it failed to build or run)."""

    def sample(self, module: "tvm.IRModule", label: str) -> Sampler:
        """One sample per call: by default a whole :meth:`measure` (a timer's number)."""
        return lambda: self.measure(module, label)

    def sample_built(self, ex, function: str, module: "tvm.IRModule") -> Sampler:
        """One sample per call of ``function`` of the merged executable ``ex`` (``module``:
        the alternative's own module, for its inputs); only where :attr:`shares_builds`."""
        raise NotImplementedError(f"{type(self).__name__} does not time merged builds")

    @property
    def record_key(self) -> str:
        """What the recorded decisions of this model are keyed by besides the unit
        (:class:`~.measuring.DecisionRecords`)."""
        return self.name


class CallableTiming(ModuleTiming):
    """A bare :data:`Timer` as a cost model."""

    name = "timer"

    def __init__(self, timer: Timer):
        super().__init__()
        self.timer = timer

    def measure(self, module: "tvm.IRModule", label: str) -> Optional[float]:
        return self.timer(module, label)


class MeasureCache(JsonRecords):
    """Measured seconds per (target, signature, implementation, mode), kept in ``work_dir``."""

    FILE = MEASURE_FILE

    @staticmethod
    def key(*parts: str) -> str:
        """One key of several parts."""
        return hashlib.sha1("|".join(parts).encode()).hexdigest()

    def get(self, key: str) -> Optional[float]:
        """The cached seconds (None: not measured yet)."""
        return self.data.get(key)

    def put(self, key: str, seconds: float) -> None:
        """Record and save."""
        self.data[key] = float(seconds)
        self.save()


class UntunedTiming(ModuleTiming):
    """Build with TVM's default pipeline and time here (or on the devices behind ``rpc``);
    cached in ``work_dir`` (:class:`MeasureCache`) by target, device, label and mode.

    The time is the fastest of several short runs: it ranks implementations robustly on a
    machine that other processes share (a descheduled OpenMP thread inflates a median).
    """

    name = "untuned"

    def __init__(self, target, work_dir: Optional[str] = None, rpc: Optional[RPCConfig] = None):
        super().__init__()
        self.target = normalize_target(target)
        self.rpc = rpc
        self.cache = MeasureCache(work_dir)

    @property
    def mode(self) -> str:
        """The build mode in the cache key."""
        return "untuned"

    def measure(self, module: "tvm.IRModule", label: str) -> Optional[float]:
        where = f"@rpc:{self.rpc.key}" if self.rpc is not None else ""
        key = self.cache.key(str(self.target) + where, label, self.mode)
        cached = self.cache.get(key)
        if cached is not None:
            return cached
        try:
            with stage("candidate builds"):
                ex = self.compile(module, label)
            with stage("timing"):
                seconds = time_main(ex, random_args(module["main"]), number=2, repeat=8,
                                    rpc=self.rpc, target=self.target, stat="min")
        except Exception as err:  # pylint: disable=broad-except
            LOG.warning("ollie: measuring %s failed: %s: %s", label, type(err).__name__, err)
            return None
        self.cache.put(key, seconds)
        return seconds

    @property
    def shares_builds(self) -> bool:
        """The untuned build of the decision's merged module is what this model would build
        alone, here (not behind ``rpc``: the remote device loads an exported ``main``)."""
        return self.rpc is None and type(self).compile is UntunedTiming.compile

    def sample_built(self, ex, function: str, module: "tvm.IRModule") -> Sampler:
        return main_sampler(ex, random_args(module["main"]), self.target, function=function)

    def sample(self, module: "tvm.IRModule", label: str) -> Sampler:
        """Built once, then one sample per call (:func:`~tvm_ollie.tune.measure.main_sampler`);
        not cached: the decision's evidence is (:mod:`.measuring`). Behind ``rpc`` every
        remote timing exports and uploads the executable: it is timed there once (the median
        of 8 x 2 runs) and that median is every sample (not interleaved)."""
        ex = self.compile(module, label)
        args = random_args(module["main"])
        if self.rpc is not None:
            seconds = time_main(ex, args, number=2, repeat=8, rpc=self.rpc, target=self.target)
            return lambda: seconds
        return main_sampler(ex, args, self.target)

    @property
    def record_key(self) -> str:
        where = f"@rpc:{self.rpc.key}" if self.rpc is not None else ""
        return f"{self.target}{where}|{self.mode}"

    def compile(self, module: "tvm.IRModule", label: str):  # noqa: ARG002
        """The executable to time."""
        return compile_module(module, self.target)


class TunedTiming(UntunedTiming):
    """:class:`UntunedTiming` tuned first: MetaSchedule (``tuner``) runs the trials that
    ``budget`` grants each measurement of the current task (RPC capable through the tuner)."""

    name = "tuned"

    def __init__(self, target, tuner: Tuner, trials: int, budget: TrialBudget,
                 work_dir: Optional[str] = None, rpc: Optional[RPCConfig] = None):
        super().__init__(target, work_dir, rpc)
        self.tuner = tuner
        self.trials = int(trials)
        self.budget = budget
        #: seconds spent in builds that tuned
        self.tuning_s = 0.0

    @property
    def mode(self) -> str:
        return f"tuned{self.trials}"

    def compile(self, module: "tvm.IRModule", label: str):
        t0, calls = time.perf_counter(), STATS.calls
        try:
            tuner = self.budget.metered(self.tuner)
            trials = self.budget.grant(label) if tuner is not None else 0
            return compile_module(module, self.target, tuner, trials)
        finally:
            if STATS.calls != calls:
                self.tuning_s += time.perf_counter() - t0
