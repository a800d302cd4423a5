"""The candidates stage of a decision: every way to compute a unit (a call, a region, a group).

A unit's alternatives are the baseline (the original as TVM builds it), the original on its
native library kernel (:mod:`tvm_ollie.codegen.library`, when it has one; for a region, one
library convolution with the region's layout permutations, bias and activation absorbed:
:mod:`.layout_absorb`), and each derived
program with its matched operators either built by TVM or run as library kernels. This stage
only enumerates them; their cost is the next stage's (:mod:`.costing`).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import AbstractSet, Callable, List, Optional, Tuple

from ..codegen import library as lib
from ..compile_profile import stage
from ..derive.cache import DerivationCache
from ..derive.cost import least_work
from ..derive.program import Program
from ..derive.search import DEFAULT_TARGETS, CostBound, derive
from ..lift import LiftError, lift_relax_call
from ..tune import analytic
from ..tune.calibrate import Calibration, kernel_threads
from .units import constant_inputs, is_group, is_region

__all__ = ["MEASURED_SEED_FLOPS", "SEARCH_PATIENCE", "Alternative", "Candidates",
           "UnitAlternatives", "measured_original"]

#: Under a measured decision, the original's estimate seeds the search's bound only for a unit
#: of this many flops or more (the products that can be nonzero, :meth:`Candidates.bound`):
#: below it the roofline misjudges the library's kernels by 2-4x (FSRCNN's 16x16
#: convolutions, 0.7 MFLOP, estimated 60-150 us, measured 14-16 us; InfoGAN's 1x56x2x2
#: transposed convolution, 0.23 MFLOP, 65 us, measured 27 us, and EinNet's form, estimated 68
#: us, measured 15 us), and every decision a seeded search changed on the quick zoo was such a
#: unit (0.1-0.5 MFLOP; docs/compile-time.md). In flops, not seconds: the measured roofline
#: moved by 40x between processes on the loaded machine (docs/compile-time.md), the work does
#: not.
MEASURED_SEED_FLOPS = 1e6

#: Whole depth levels without a better program after which a unit's search stops
#: (:class:`~tvm_ollie.derive.search.CostBound`'s ``patience``: why two, there).
SEARCH_PATIENCE = 3


@dataclass(frozen=True)
class Alternative:
    """One way to compute a unit: the original or a derived program (``program=None``: the
    original), implemented with TVM-built kernels (``impl="tvm"``) or with native library
    kernels (``impl="native"``); ``estimate`` is its analytic seconds once costed."""

    program: Optional[Program]
    impl: str
    estimate: float = 0.0

    @property
    def label(self) -> str:
        """``original``, ``original [native]``, ``<program>`` or ``<program> [native]``."""
        text = "original" if self.program is None else repr(self.program)
        return text if self.impl == "tvm" else f"{text} [{self.impl}]"

    @property
    def is_baseline(self) -> bool:
        """The original as TVM builds it."""
        return self.program is None and self.impl == "tvm"


@dataclass
class UnitAlternatives:
    """The candidates of one unit: the baseline first; ``candidates`` derived programs;
    ``note`` on the search (or why the unit does not lift); ``liftable`` whether it lifted
    (an unliftable unit has only its baseline, and nothing to estimate)."""

    alternatives: List[Alternative] = field(default_factory=list)
    candidates: int = 0
    note: str = ""
    liftable: bool = True


def measured_original(gain_cap: Optional[Callable[[], Optional[float]]],
                      threads: Optional[int] = None
                      ) -> Optional[Callable[[], Optional[float]]]:
    """``measured_s() -> seconds or None`` of the search's bound: the original's seconds
    timed on its library kernel (``gain_cap()``: one thread, the calling thread's CPU
    seconds, :func:`~tvm_ollie.tune.library_timing.library_seconds`) over ``threads``
    (default :func:`~tvm_ollie.tune.calibrate.kernel_threads`). Why divided: the roof and
    the efficiencies the bound's ``lower_s`` is made of are one thread's times the threads
    (:func:`~tvm_ollie.tune.calibrate.measure_cpu_roofline`), so the measured original is
    put on the same scale (:class:`~tvm_ollie.derive.search.CostBound`'s
    ``measured_s``). None without a ``gain_cap``."""
    if gain_cap is None:
        return None
    count = max(1, int(threads or kernel_threads()))

    def measured_s() -> Optional[float]:
        seconds = gain_cap()
        return None if seconds is None else seconds / count

    return measured_s


class Candidates:
    """The alternatives of a unit (the candidates stage).

    Parameters
    ----------
    library : bool
        Offer native library kernels (the original's, and a program's matched stages).
    derive : bool
        Offer derived programs (``False``: only the original's implementations).
    max_depth, max_states, max_candidates :
        Derivation depth, states and programs kept per unit
        (:func:`~tvm_ollie.derive.search.derive`).
    cost_target : str
        Target kind the derivation ranks its programs for (``"llvm"``, ``"cuda"``).
    cache : DerivationCache, optional
        Where search results are looked up before searching and stored after
        (:mod:`tvm_ollie.derive.cache`); None: always search.
    calibration : Calibration, optional
        With ``margin``, the search of a unit stops once its best program's estimate is
        within what a measurement resolves of the roofline lower bound
        (:class:`~tvm_ollie.derive.search.CostBound`,
        :func:`~tvm_ollie.tune.analytic.least_seconds`); None: no such stop.
    margin : float
        The relative margin of a measured decision (the choose stage's).
    payback_runs : float, optional
        With ``calibration``, a search also stops once its seconds reach what is left to gain
        over this many runs of the model (``OllieConfig.search_payback_runs``; the bound's
        ``paid_back``); None: no such stop.
    library_timer : callable, optional
        ``library_timer(call) -> seconds or None``: the call timed on its library kernel
        (:func:`~tvm_ollie.tune.library_timing.library_seconds`). With ``payback_runs``, a
        unit whose original has a library form is timed so when its search first checks the
        payback, and what the search could gain is at most that (the bound's ``gain_cap``);
        None: the estimates alone.
    """

    def __init__(self, library: bool, derive: bool, max_depth: int, max_states=None,
                 max_candidates=None, cost_target: str = "llvm",
                 cache: Optional[DerivationCache] = None,
                 calibration: Optional[Calibration] = None, margin: float = 0.0,
                 payback_runs: Optional[float] = None,
                 library_timer: Optional[Callable[[object], Optional[float]]] = None):
        self.library = bool(library)
        self.derive = bool(derive)
        self.max_depth = max_depth
        self.max_states = max_states
        self.max_candidates = max_candidates
        self.cost_target = cost_target
        self.cache = cache
        self.calibration = calibration
        self.margin = margin
        self.payback_runs = None if payback_runs is None or math.isinf(payback_runs) \
            else float(payback_runs)
        self.library_timer = library_timer
        #: under a measured decision, its margin (the search's slack from
        #: :data:`MEASURED_SEED_FLOPS` on, :meth:`bound`); None: decided by the estimate
        self.measured_margin: Optional[float] = None
        #: seconds spent in derivation search
        self.search_s = 0.0
        #: expressions whose programs came from the cache / from a search
        self.cached = self.searched = 0

    def __call__(self, unit, budget_s: float) -> UnitAlternatives:
        """The alternatives of ``unit`` (derivation limited to ``budget_s`` seconds)."""
        if is_group(unit):
            return self._group(unit)
        region = is_region(unit)
        try:
            with stage("lift"):
                expr = unit.lift() if region else lift_relax_call(unit)
        except LiftError as err:
            return UnitAlternatives([Alternative(None, "tvm")], 0, f"; not liftable: {err}",
                                    False)
        alts = [Alternative(None, "tvm")]
        native_form = self.library and self._native_form(unit, region)
        if native_form:
            alts.append(Alternative(None, "native"))
        if not self.derive:
            return UnitAlternatives(alts)
        known = self.original_seconds(unit, expr)
        cap = self.measured_cap(unit) if native_form and not region else None
        programs, note = self.search(expr, budget_s, constant_inputs(unit), known, cap,
                                     measured_original(cap))
        seen = set()
        for prog in programs:
            if repr(prog) in seen:
                continue
            seen.add(repr(prog))
            alts.extend(self.program_alternatives(prog))
        return UnitAlternatives(alts, len(seen), note)

    @staticmethod
    def _native_form(unit, region: bool) -> bool:
        """Whether the original has a library form: a call's native kernel, or a region as one
        library convolution with a layout permutation absorbed
        (:func:`~.layout_absorb.absorbed_conv`). A region whose form absorbs no permutation
        (only the conv's bias and activation) is not offered: kept, its conv is decided alone
        with the same epilogue fold, and its derived forms too (a region ``concat -> conv 1x1
        -> add -> relu`` took its native form at 175 us where the conv alone chose a derived
        GEMM at 85 us)."""
        if not region:
            return lib.call_form(unit) is not None
        form = getattr(unit, "library_form", None)
        absorbed = form() if form is not None else None
        return absorbed is not None and absorbed.absorbs_layout

    def measured_cap(self, call) -> Optional[Callable[[], Optional[float]]]:
        """``gain_cap() -> seconds or None``: ``call`` timed on its library kernel by
        ``library_timer`` on the first call, the same seconds after (None without a timer or
        without the payback stop; ``gain_cap()`` None when the timing fails)."""
        if self.library_timer is None or self.payback_runs is None:
            return None
        timer, kept = self.library_timer, []

        def gain_cap() -> Optional[float]:
            if not kept:
                with stage("timing"):
                    kept.append(timer(call))
            return kept[0]

        return gain_cap

    def search(self, expr, budget_s: float, constants: AbstractSet[str] = frozenset(),
               known_s: Optional[float] = None,
               gain_cap: Optional[Callable[[], Optional[float]]] = None,
               measured_s: Optional[Callable[[], Optional[float]]] = None
               ) -> Tuple[List[Program], str]:
        """The derived programs of ``expr`` (from the cache when it holds them, else searched
        within ``budget_s`` seconds and stored) and a note on where they came from
        (``constants``: the inputs that are constants, for the estimates of the bound;
        ``known_s``: the original's estimate, ``gain_cap``: its measured seconds on its
        library kernel, ``measured_s``: the same in the units of the bound,
        :class:`~tvm_ollie.derive.search.CostBound`)."""

        limits = dict(max_depth=self.max_depth, targets=tuple(DEFAULT_TARGETS),
                      max_states=self.max_states, max_candidates=self.max_candidates,
                      cost_target=self.cost_target)
        if self.cache is not None:
            with stage("derivation cache"):
                hit = self.cache.get(expr, limits)
            if hit is not None:
                self.cached += 1
                return hit.programs, f", search cached (stop={hit.stop})"
        t0 = time.perf_counter()
        with stage("search"):
            res = derive(expr, max_depth=self.max_depth, search_time_s=budget_s,
                         max_states=self.max_states, verify=False,
                         max_candidates=self.max_candidates, cost_target=self.cost_target,
                         bound=self.bound(expr, constants, known_s, gain_cap, measured_s))
        self.search_s += time.perf_counter() - t0
        self.searched += 1
        programs = [p for p in res.candidates if not p.multi]
        stop = res.stats.stop_reason.value
        if self.cache is not None:
            with stage("derivation cache"):
                self.cache.put(expr, limits, programs, stop, budget_s)
        return programs, f", search stop={stop}"

    def bound(self, expr, constants: AbstractSet[str] = frozenset(),
              known_s: Optional[float] = None,
              gain_cap: Optional[Callable[[], Optional[float]]] = None,
              measured_s: Optional[Callable[[], Optional[float]]] = None
              ) -> Optional[CostBound]:
        """The early stop of the search of ``expr``: a program's estimate on its cheaper
        implementation (:meth:`program_alternatives`), or ``known_s`` when lower (the
        original's), against the roofline lower bound; the payback's gain at most
        ``gain_cap()`` (the original's measured seconds); ``measured_s()`` (the same in the
        bound's units, :func:`measured_original`) within the bound's slack stops it too."""
        calib = self.calibration
        if calib is None or self.margin <= 0:
            return None
        impls = ("tvm", "native") if self.library else ("tvm",)

        def seconds(prog: Program) -> float:
            return min(analytic.program_seconds(prog, calib, impl, constants) for impl in impls)

        margin, known = self._margin(known_s, least_work(expr)[0])
        return CostBound(seconds, analytic.least_seconds(expr, calib, self.library),
                         margin, SEARCH_PATIENCE, known, self.payback_runs, gain_cap,
                         measured_s)

    def _margin(self, known_s: Optional[float],
                flops: float) -> Tuple[float, Optional[float]]:
        """The bound's margin and known best: by the estimate, the estimate's margin and the
        original's estimate; under a measured decision, its margin and the original's
        estimate for a unit of :data:`MEASURED_SEED_FLOPS` or more (``flops``: its least
        work), else (a small unit, whose estimates do not predict its timings: the library's
        transposed convolution measured 1.8x and 3x slower than EinNet's matmul + offset-add
        form on InfoGAN's 1x56x2x2 and 1x28x1x1 inputs) the estimate's margin alone, as
        before."""
        if self.measured_margin is None:
            return self.margin, known_s
        if known_s is None or flops < MEASURED_SEED_FLOPS:
            return self.margin, None
        return max(self.margin, self.measured_margin), known_s

    def original_seconds(self, unit, expr) -> Optional[float]:
        """The estimate of the original call ``unit`` (lifted to ``expr``) on its cheaper
        kernel: TVM's, or the native library's where it has one; of a region, the sum of its
        calls' (what deciding them one by one reaches); None without a calibration."""
        if self.calibration is None:
            return None
        if is_region(unit):
            try:
                return sum(self.original_seconds(c, lift_relax_call(c)) for c in unit.calls)
            except LiftError:
                return None
        impls = ["tvm"]
        if self.library and lib.call_form(unit) is not None:
            impls.append("native")
        return min(analytic.original_seconds(expr, unit.op.name, self.calibration, impl)
                   for impl in impls)

    def _group(self, group) -> UnitAlternatives:
        """A group of calls sharing an operand: the calls as they are, and the merged programs
        of the inter-expression rules (no search: the merge is the rewrite being decided)."""
        try:
            progs = group.programs() if self.derive else []
        except LiftError as err:
            return UnitAlternatives([Alternative(None, "tvm")], 0, f"; not liftable: {err}",
                                    False)
        alts = [Alternative(None, "tvm")]
        if self.library and all(lib.call_form(c) is not None for c in group.heavy_calls):
            # the calls apart on their native kernels: what the merge must beat where the
            # library would take each call anyway (with its bias add as the kernel's epilogue)
            alts.append(Alternative(None, "native"))
        for prog in progs:
            alts.extend(self.program_alternatives(prog))
        note = "" if progs else "; the calls do not merge into one GEMM"
        return UnitAlternatives(alts, len(progs), note)

    def program_alternatives(self, prog: Program) -> List[Alternative]:
        """A derived program on TVM kernels, and on the native library when it implements one
        of its stages."""
        impls = ["tvm"]
        if self.library and any(lib.stage_form(s) is not None for s in prog.stages):
            impls.append("native")
        return [Alternative(prog, impl) for impl in impls]
