"""The cost stage of a decision: seconds of one alternative of a unit.

One interface, :class:`UnitCostModel` (``seconds(unit, alternative) -> seconds or None``),
and its implementations:

* :class:`AnalyticUnitCost`: the calibrated roofline of :mod:`tvm_ollie.tune.analytic`, an
  original as one kernel of its kind, ``max(flops / (peak * eff), bytes / bandwidth)``, a
  program as the sum of its stages; it ranks and prunes every alternative.
* :class:`UntunedTiming`: the unit alone (:func:`~.units.unit_module`) built with TVM's default
  pipeline and timed here or on RPC devices, cached in ``work_dir``.
* :class:`TunedTiming`: the same, tuned by MetaSchedule with the trials the module's
  :class:`~tvm_ollie.tune.budget.TrialBudget` grants it.
* :class:`CallableTiming`: a bare ``timer(module, label) -> seconds`` (tools and tests).

A decision between timed alternatives asks for :class:`Rounds` (:meth:`UnitCostModel.rounds`):
each round times every alternative once more and returns the median so far, so the choose stage
can stop when two consecutive rounds agree. The timings (:class:`UntunedTiming`,
:class:`TunedTiming`) time the alternatives *interleaved* (:mod:`tvm_ollie.tune.interleave`):
a change of the machine's load then hits all of them alike. Other models give their seconds
once (:class:`FixedRounds`).

Library kernels are costed by the same models: an alternative with ``impl="native"`` is its
native kernels' roofline at the library's calibrated efficiency, or their timing.

These are not :class:`tvm_ollie.orchestrate.cost.CostModel`: that one costs a *kernel* (a convex
group of primitives of a primitive graph), this one a *rewrite of a Relax unit*; their inputs
share nothing a common protocol could type, so the names differ.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from abc import ABC, abstractmethod
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from ..compat import tvm
from ..lift import LiftError, lift_relax_call
from ..tune import analytic
from ..tune.budget import TrialBudget
from ..tune.calibrate import Calibration
from ..tune.interleave import InterleavedTimer, vm_runner
from ..tune.measure import compile_module, device_kind, random_args, time_main
from ..tune.metaschedule import STATS, Tuner, normalize_target
from ..tune.rpc import RPCConfig
from .alternatives import Alternative
from .emit import EmitError
from .units import constant_inputs, is_group, is_region, unit_module, unit_signature

__all__ = ["AnalyticUnitCost", "CallableTiming", "FixedRounds", "InterleavedRounds",
           "MeasureCache", "ModuleTiming", "Rounds", "Timer", "TunedTiming", "UnitCostModel",
           "UntunedTiming", "region_seconds"]

LOG = logging.getLogger("tvm_ollie.transform")

#: ``timer(module, label) -> seconds`` (None: failed to build or run). ``label`` is
#: ``"<unit signature>|<alternative label>"``; ``module`` computes the unit alone.
Timer = Callable[["tvm.IRModule", str], Optional[float]]


class Rounds(ABC):
    """Timing rounds of several alternatives of one unit (in the order given).

    :meth:`round` times each alternative once more and returns its median seconds over the
    rounds so far (None: it failed); :meth:`spreads` their relative spreads; ``varies`` says
    whether another round can change anything; :meth:`finish` records the final seconds.
    """

    #: whether another round can give other seconds
    varies = True

    @abstractmethod
    def round(self) -> List[Optional[float]]:
        """One more round: each alternative's median seconds so far."""

    def spreads(self) -> List[float]:
        """Each alternative's relative spread (``MAD / median``; 0 when not timed apart)."""
        return []

    def finish(self, seconds: Sequence[Optional[float]]) -> None:  # noqa: ARG002
        """The decision is made on ``seconds`` (a cache keeps them)."""


class FixedRounds(Rounds):
    """Seconds known once (an estimate, a cache, a fake): every round returns them."""

    varies = False

    def __init__(self, seconds: Sequence[Optional[float]]):
        self.seconds = list(seconds)

    def round(self) -> List[Optional[float]]:
        return list(self.seconds)


class InterleavedRounds(Rounds):
    """Rounds of an :class:`~tvm_ollie.tune.interleave.InterleavedTimer`; ``on_finish``
    receives the final seconds."""

    def __init__(self, timer: InterleavedTimer,
                 on_finish: Optional[Callable[[Sequence[Optional[float]]], None]] = None):
        self.timer = timer
        self.on_finish = on_finish

    def round(self) -> List[Optional[float]]:
        return self.timer.round()

    def spreads(self) -> List[float]:
        return self.timer.spreads()

    def finish(self, seconds: Sequence[Optional[float]]) -> None:
        if self.on_finish is not None:
            self.on_finish(seconds)


class UnitCostModel(ABC):
    """Seconds of one alternative of a unit (None: it failed to build, tune or run)."""

    #: short name for reports
    name = "abstract"
    #: whether the seconds are timings (the decision then says "measured")
    measured = True

    @abstractmethod
    def seconds(self, unit, alt: Alternative) -> Optional[float]:
        """Estimated or measured seconds of ``alt`` computing ``unit``."""

    def rounds(self, unit, alts: Sequence[Alternative]) -> Rounds:
        """Timing rounds of ``alts`` (:class:`Rounds`); by default each alternative's
        :meth:`seconds`, once (timings override this to time them interleaved)."""
        return FixedRounds([self.seconds(unit, a) for a in alts])


def region_seconds(region, calib: Calibration, impl: str = "tvm") -> float:
    """Analytic estimate of a region (or group) as TVM builds it: one kernel per call (with
    ``impl="native"``, a region's heavy call on its native kernel)."""
    heavy = region.heavy_call if impl != "tvm" and is_region(region) else None
    total = 0.0
    for call in region.calls:
        try:
            expr = lift_relax_call(call)
        except LiftError:
            continue
        total += analytic.original_seconds(expr, call.op.name, calib,
                                           impl if heavy is not None and call.same_as(heavy)
                                           else "tvm")
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
        if is_region(unit):
            return region_seconds(unit, self.calib, alt.impl)
        return analytic.original_seconds(lift_relax_call(unit), unit.op.name, self.calib,
                                         alt.impl)


class ModuleTiming(UnitCostModel):
    """Times the unit's isolated module (:func:`~.units.unit_module`) of an alternative under
    the label ``"<signature>|<alternative>"``; subclasses implement :meth:`measure`."""

    name = "timing"

    def __init__(self):
        self._sig = (None, "")

    def seconds(self, unit, alt: Alternative) -> Optional[float]:
        mod, label = self.labelled_module(unit, alt)
        if mod is None:
            return None
        try:
            return self.measure(mod, label)
        except Exception as err:  # pylint: disable=broad-except
            LOG.warning("ollie: measuring %s failed: %s: %s", alt.label, type(err).__name__, err)
            return None

    def labelled_module(self, unit, alt: Alternative) -> Tuple[Optional["tvm.IRModule"], str]:
        """The unit's isolated module computed by ``alt`` (None: it has no Relax form) and its
        label ``"<signature>|<alternative>"``."""
        if self._sig[0] is not unit:  # (a group's signature lifts its calls again)
            self._sig = (unit, unit_signature(unit))
        label = f"{self._sig[1]}|{alt.label}"
        try:
            return unit_module(unit, alt.program, None, alt.impl), label
        except EmitError as err:
            LOG.warning("ollie: %s has no Relax form: %s", alt.label, err)
            return None, label

    @abstractmethod
    def measure(self, module: "tvm.IRModule", label: str) -> Optional[float]:
        """Seconds of ``module``'s ``main`` (None: it failed to build or run)."""


class CallableTiming(ModuleTiming):
    """A bare :data:`Timer` as a cost model."""

    name = "timer"

    def __init__(self, timer: Timer):
        super().__init__()
        self.timer = timer

    def measure(self, module: "tvm.IRModule", label: str) -> Optional[float]:
        return self.timer(module, label)


class MeasureCache:
    """Measured seconds per (target, signature, implementation, mode), kept in ``work_dir``."""

    FILE = "ollie_measurements.json"

    def __init__(self, work_dir: Optional[str]):
        self.path = os.path.join(work_dir, self.FILE) if work_dir else None
        self.data: Dict[str, float] = {}
        if self.path and os.path.exists(self.path):
            try:
                with open(self.path, encoding="utf-8") as f:
                    self.data = json.load(f)
            except (OSError, ValueError):
                self.data = {}

    @staticmethod
    def key(*parts: str) -> str:
        """One key of several parts."""
        return hashlib.sha1("|".join(parts).encode()).hexdigest()

    def get(self, key: str) -> Optional[float]:
        """The cached seconds (None: not measured yet)."""
        return self.data.get(key)

    def put(self, key: str, seconds: float) -> None:
        """Record and save (atomically: other processes may read the file)."""
        self.data[key] = float(seconds)
        if self.path:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            tmp = f"{self.path}.{os.getpid()}.tmp"
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(self.data, f, indent=1, sort_keys=True)
            os.replace(tmp, self.path)


class UntunedTiming(ModuleTiming):
    """Build with TVM's default pipeline and time here (or on the devices behind ``rpc``);
    cached in ``work_dir`` (:class:`MeasureCache`) by target, device, label and mode.

    One alternative alone (:meth:`measure`) is the fastest of several short runs. The
    alternatives of a decision (:meth:`rounds`) are timed interleaved, in rounds of blocks
    (:class:`~tvm_ollie.tune.interleave.InterleavedTimer`): on a machine other processes share,
    timing one after the other lets a change of load decide.
    """

    #: timed seconds of one block of one alternative (after an untimed call)
    BLOCK_S = 0.01

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
            ex = self.compile(module, label)
            seconds = time_main(ex, random_args(module["main"]), number=2, repeat=8,
                                rpc=self.rpc, target=self.target, stat="min")
        except Exception as err:  # pylint: disable=broad-except
            LOG.warning("ollie: measuring %s failed: %s: %s", label, type(err).__name__, err)
            return None
        self.cache.put(key, seconds)
        return seconds

    def rounds(self, unit, alts: Sequence[Alternative]) -> Rounds:
        """Interleaved rounds of ``alts`` (cached seconds when every one is cached: timings of
        other sessions are not comparable with new ones, so a partly cached set is timed
        again; on RPC devices each alternative is timed alone, :meth:`measure`)."""
        where = f"@rpc:{self.rpc.key}" if self.rpc is not None else ""
        labelled = [self.labelled_module(unit, a) for a in alts]
        keys = [self.cache.key(str(self.target) + where, label, self.mode)
                for _, label in labelled]
        cached = [self.cache.get(k) for k in keys]
        if self.rpc is not None or all(c is not None for c in cached):
            return super().rounds(unit, alts)
        runners = [self._runner(mod, label) for mod, label in labelled]

        def record(seconds: Sequence[Optional[float]]) -> None:
            for key, sec in zip(keys, seconds):
                if sec is not None:
                    self.cache.put(key, sec)

        return InterleavedRounds(InterleavedTimer(runners, self.BLOCK_S), record)

    def _runner(self, module: Optional["tvm.IRModule"], label: str):
        """A runner of the module's build (None: no module, or it failed to build)."""
        if module is None:
            return None
        try:
            return vm_runner(self.compile(module, label), random_args(module["main"]),
                             tvm.device(device_kind(self.target), 0))
        except Exception as err:  # pylint: disable=broad-except
            LOG.warning("ollie: building %s failed: %s: %s", label, type(err).__name__, err)
            return None

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
