"""Per-operator decisions: lift, derive, cost (analytic or measured), verify, choose.

Every call has *alternatives*: the original operator built by TVM (the baseline), the original
operator on a native library kernel (:mod:`tvm_ollie.codegen.library`), and each derived
program with its matched operators either as Relax operators built by TVM or as library
kernels. They are ranked by the calibrated analytic cost; the cheapest are verified and, when
the pass measures (``trials > 0``, or the untuned check on CPUs), timed by the decision's
:data:`Timer`, and the fastest measured one wins.

Calls with equal :func:`call_signature` (operator, operand shapes/dtypes, attributes, operand
aliasing) are decided once: the chosen program is cached with the operand names of the first
call and re-bound positionally for the others.

Never worse: an alternative is accepted only when it is cheaper than the original under the
chosen cost by :data:`MARGIN`, built, (tuned,) and matched the original numerically on random
inputs (relative error :data:`RTOL` of the output's largest magnitude for float32, scaled with
the dtype by :func:`~tvm_ollie.verify.tolerance.tolerance`, on llvm) and, for
small polynomial programs, exactly over a finite field (:func:`check_exact`).
Anything else keeps the original call and records why.

Injection points for tests and tools: ``timer`` (module, label) -> seconds and ``checker``
(reference module, candidate module) -> (ok, why) replace the measurement and the numeric check;
``tuner`` replaces the MetaSchedule tuner; ``chooser`` (signature, alternatives) -> alternative
forces the choice (differential testing: every verified alternative can be built in turn).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from dataclasses import dataclass
from typing import Callable, Dict, FrozenSet, List, Optional, Tuple, Union

import numpy as np

from .. import native
from ..codegen import library as lib
from ..compat import relax, tvm
from ..config import DEFAULTS
from ..derive.program import Program
from ..lift import LiftError, lift_relax_call
from ..lift.registry import Operands
from ..tune import analytic
from ..tune.budget import TrialBudget
from ..tune.calibrate import Calibration, calibrate
from ..tune.measure import compile_module, random_args, time_main
from ..tune.metaschedule import STATS, Tuner, gpu_available, is_gpu_target, normalize_target
from ..tune.rpc import RPCConfig
from ..verify.tolerance import narrowest_float, tolerance
from .emit import EmitError, emit_program

__all__ = ["DERIVABLE_OPS", "MARGIN", "RTOL", "Alternative", "Checker", "Choice", "Chooser",
           "Decider", "Timer", "call_signature", "check_exact", "constant_inputs",
           "isolated_module", "unit_module", "unit_operands", "unit_signature"]

LOG = logging.getLogger("tvm_ollie.transform")

_CONST = tvm.ir.expr.Constant

#: Relax operators the pass tries to derive.
DERIVABLE_OPS = (
    "relax.nn.conv1d", "relax.nn.conv2d", "relax.nn.conv3d",
    "relax.nn.conv1d_transpose", "relax.nn.conv2d_transpose", "relax.nn.conv3d_transpose",
    "relax.matmul",
)

#: A candidate must be at least this much cheaper than the original (relative).
MARGIN = 0.03
#: Numerical tolerance of the acceptance check (relative to the largest output magnitude).
RTOL = tolerance("float32")
#: Candidates verified before giving up (cheapest first).
MAX_VERIFY = 3

#: ``timer(module, label) -> seconds`` (None: failed to build or run). ``label`` names the
#: alternative (:attr:`Alternative.label`); ``module`` computes the call alone.
Timer = Callable[["tvm.IRModule", str], Optional[float]]
#: ``checker(reference, candidate) -> (ok, why)``: both modules compute the call alone.
Checker = Callable[["tvm.IRModule", "tvm.IRModule"], Tuple[bool, str]]
#: ``chooser(signature, alternatives) -> alternative or None``: forces the choice for a call
#: signature among its non-baseline alternatives (cheapest estimate first, then by label); the
#: forced one is still verified (a failure keeps the original), but neither pruned by cost nor
#: timed. ``None`` leaves the decision to the cost model.
Chooser = Callable[[str, List["Alternative"]], Optional["Alternative"]]


def _shape(expr) -> Tuple[int, ...]:
    return tuple(int(s) for s in expr.ty.shape)


def _tensor_args(call) -> list:
    return [a for a in call.args if isinstance(a.ty, relax.TensorType)]


def call_signature(call) -> str:
    """Operator, operands (shape, dtype, constness, aliasing) and attributes of a call."""
    parts = [call.op.name]
    seen: Dict[int, int] = {}
    for a in _tensor_args(call):
        key = hash(a)
        alias = seen.setdefault(key, len(seen))
        kind = "c" if isinstance(a, _CONST) else "v"
        text = f"{'x'.join(str(s) for s in _shape(a))}:{a.ty.dtype}:{kind}{alias}"
        if kind == "c" and int(np.prod(_shape(a))) == 1:
            text += f"={a.value.numpy().reshape(()).item()!r}"
        parts.append(text)
    if call.attrs is not None:
        parts.append(str(call.attrs).replace("relax.attrs.", ""))
    return " ".join(parts)


def _operand_values(call) -> Tuple[List[str], List[object]]:
    """Names (as the lift names them) and Relax values of the distinct tensor operands."""
    names = Operands(call)
    out_names, values = [], []
    for a in _tensor_args(call):
        n = names.name(a)
        if n not in out_names:
            out_names.append(n)
            values.append(a)
    return out_names, values


def bind_operands(operands) -> Tuple[List["relax.Var"], Dict[str, object]]:
    """Parameters for the variable operands of ``(name, value)`` pairs (in order) and the value
    every name stands for in an isolated module: its parameter, or the constant itself."""
    params, inputs = [], {}
    for n, v in operands:
        if isinstance(v, _CONST):
            inputs[n] = v
        else:
            inputs[n] = relax.Var(n, v.ty)
            params.append(inputs[n])
    return params, inputs


def isolated_module(call, program: Optional[Program] = None, names=None,
                    impl: str = "tvm") -> "tvm.IRModule":
    """A module whose ``main`` computes the call alone (or ``program`` in its place).

    Variable operands become parameters (in operand order); constant operands stay constants.
    With ``program=None`` and ``impl="native"`` the call runs on its native library kernel.
    """
    op_names, values = _operand_values(call)
    bb = relax.BlockBuilder()
    params, inputs = bind_operands(zip(op_names, values))
    with bb.function("main", params):
        with bb.dataflow():
            new_args = [inputs[Operands(call).name(a)] if isinstance(
                a.ty, relax.TensorType) else a for a in call.args]
            if program is None:
                out = bb.emit_output(original_form(call, new_args, impl))
            else:
                mapping = inputs if names is None else {
                    pn: inputs[cn] for pn, cn in zip(names, op_names)}
                out = bb.emit_output(emit_program(bb, program, mapping, _shape(call),
                                                  impl=impl))
        bb.emit_func_output(out)
    return bb.get()


def original_form(call, args, impl: str = "tvm") -> "relax.Expr":
    """The call on ``args``: the Relax operator itself, or its native kernel (``impl="native"``)."""
    if impl == "native":
        form = lib.call_form(call)
        if form is None:
            raise EmitError(f"no native kernel for {call.op.name}")
        return lib.emit_call(form, args[:2], _shape(call))
    return relax.Call(call.op, args, call.attrs, call.ty_args)


@dataclass(frozen=True)
class Alternative:
    """One way to compute a call: the original operator or a derived program, implemented with
    TVM-built kernels (``impl="tvm"``) or with native library kernels (``impl="native"``)."""

    program: Optional[Program]
    impl: str
    estimate: float

    @property
    def label(self) -> str:
        """``original``, ``original [native]``, ``<program>`` or ``<program> [native]``."""
        text = "original" if self.program is None else repr(self.program)
        return text if self.impl == "tvm" else f"{text} [{self.impl}]"

    @property
    def is_baseline(self) -> bool:
        """The original operator as TVM builds it."""
        return self.program is None and self.impl == "tvm"


@dataclass
class Choice:
    """The decision for one signature (shared by every call with it)."""

    program: Optional[Program]
    names: List[str]
    reason: str
    before_s: float = 0.0
    after_s: float = 0.0
    measured: bool = False
    candidates: int = 0
    explain: str = ""
    impl: str = "tvm"

    @property
    def rewritten(self) -> bool:
        """Whether the call is replaced (by a program, or by its native kernel)."""
        return self.program is not None or self.impl != "tvm"

    @property
    def label(self) -> str:
        """What runs in place of the call (``"original"`` when it is kept)."""
        return Alternative(self.program, self.impl, 0.0).label


class _MeasureCache:
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
        return hashlib.sha1("|".join(parts).encode()).hexdigest()

    def get(self, key: str) -> Optional[float]:
        return self.data.get(key)

    def put(self, key: str, seconds: float) -> None:
        self.data[key] = float(seconds)
        if self.path:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            tmp = f"{self.path}.{os.getpid()}.tmp"
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(self.data, f, indent=1, sort_keys=True)
            os.replace(tmp, self.path)


def check_numerics(ref_mod: "tvm.IRModule", cand_mod: "tvm.IRModule") -> Tuple[bool, str]:
    """The default :data:`Checker`: both built on llvm, compared on random inputs (the
    :func:`~tvm_ollie.verify.tolerance.tolerance` of the narrowest float type of the inputs and
    outputs, :data:`RTOL` for float32, of the reference's largest magnitude); every result of a
    tuple-valued ``main``."""
    args = random_args(ref_mod["main"], seed=1)
    refs, dtypes = _run_llvm(ref_mod, args)
    gots, _ = _run_llvm(cand_mod, args)
    rtol = tolerance(narrowest_float(dtypes + [str(a.dtype) for a in args]))
    if isinstance(refs, list) or isinstance(gots, list):
        if not (isinstance(refs, list) and isinstance(gots, list)) or len(refs) != len(gots):
            return False, "the candidate returns another number of results"
        for k, (ref, got) in enumerate(zip(refs, gots)):
            ok, why = _compare(ref, got, rtol)
            if not ok:
                return False, f"result {k}: {why}"
        return True, ""
    return _compare(refs, gots, rtol)


def _compare(ref: np.ndarray, got: np.ndarray, rtol: float) -> Tuple[bool, str]:
    if got.shape != ref.shape:
        return False, f"shape {got.shape} != {ref.shape}"
    err = float(np.max(np.abs(got - ref))) if ref.size else 0.0
    scale = float(np.max(np.abs(ref))) if ref.size else 0.0
    if not np.isfinite(err) or err > rtol * max(scale, 1e-6):
        return False, f"numerics differ: max abs err {err:.3g} (scale {scale:.3g})"
    return True, ""


class Decider:
    """Decides (and caches) the implementation of each operator signature.

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
        Replaces the measurement (compile + time on this machine, cached in ``work_dir``).
    checker : Checker, optional
        Replaces the numeric check (:func:`check_numerics`).
    rpc : RPCConfig, optional
        Run every measurement (tuning trials, untuned and tuned timings) on the devices behind
        this RPC tracker; checked once here so an unreachable tracker fails before any work.
    chooser : Chooser, optional
        Forces the choice per signature (for differential tests; see :data:`Chooser`).
    tuner : Tuner, optional
        Replaces the MetaSchedule tuner of the default timer (used when ``trials > 0``).
    max_candidates : int, optional
        Derived programs kept per signature (None: all).
    budget : TrialBudget, optional
        The module's trial budget; each tuned measurement is granted a part of the current
        task's allotment (default: a budget of ``trials`` for this decider alone).

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
                 checker: Optional[Checker] = None, rpc: Optional[RPCConfig] = None,
                 chooser: Optional[Chooser] = None, tuner: Optional[Tuner] = None,
                 max_candidates: Optional[int] = DEFAULTS.max_candidates,
                 budget: Optional[TrialBudget] = None):
        self.target = normalize_target(target)
        gpu = is_gpu_target(self.target)
        if check_untuned is None:
            check_untuned = not gpu and calibration is None
        self.check_untuned = bool(check_untuned)
        self.library = _library_enabled(library, gpu)
        self.calib = calibration or calibrate(self.target)
        self.trials = int(trials)
        self.max_depth = max_depth
        self.search_budget_s = search_budget_s
        self.max_measured = max_measured
        self.max_states = max_states
        self.max_candidates = max_candidates
        self.budget = budget if budget is not None else TrialBudget(self.trials)
        self.derive = bool(derive)
        self.can_measure = self.trials > 0 and (not gpu or gpu_available(self.target))
        self.rpc = rpc
        if rpc is not None:
            self.can_measure = self.trials > 0  # the remote devices measure, not this machine
            if self.can_measure or self.check_untuned:
                rpc.check()
        self.work_dir = work_dir
        if self.can_measure and not work_dir:
            import tempfile  # pylint: disable=import-outside-toplevel

            self.work_dir = tempfile.mkdtemp(prefix="ollie_tune_")
        self.tuner = tuner or (Tuner(self.target, self.work_dir, rpc=rpc)
                               if self.can_measure else None)
        self.chooser = chooser
        self.measure_cache = _MeasureCache(self.work_dir)
        self.timer: Timer = timer or self._time
        self.checker: Checker = checker or check_numerics
        self.measures = timer is not None or self.can_measure or self.check_untuned
        self.cache: Dict[str, Choice] = {}
        self.search_s = 0.0
        self.tuning_s = 0.0
        self.verify_s = 0.0

    # -- public ----------------------------------------------------------------------------

    def decide(self, call, budget_s: Optional[float] = None) -> Choice:
        """The choice for ``call`` (computed on the first call of its signature).

        ``call`` is a unit of decision: a Relax call, or a region
        (:class:`~tvm_ollie.transform.regions.Region`: several calls lifted as one expression,
        with inputs and one output) decided and replaced as a whole.
        """
        sig = unit_signature(call)
        hit = self.cache.get(sig)
        if hit is None:
            try:
                hit = self._decide(call, sig, budget_s or self.search_budget_s)
            except Exception as err:  # pylint: disable=broad-except
                LOG.warning("ollie: %s kept: unexpected %s: %s", sig, type(err).__name__, err)
                hit = Choice(None, [], f"internal error: {type(err).__name__}: {err}")
            self.cache[sig] = hit
        return hit

    # -- stages: alternatives -> cost -> check -> choose --------------------------------------

    def _decide(self, call, sig: str, budget_s: float) -> Choice:
        names, _ = unit_operands(call)
        alts, n_cand, note = self.alternatives(call, budget_s)
        base = alts[0]
        others = sorted(alts[1:], key=lambda a: (a.estimate, a.label))
        if self.chooser is not None:
            forced = self.chooser(sig, others)
            if forced is not None:
                return self._choose_forced(call, names, base, forced, n_cand)
        # The analytic cost prunes: to choose by it, an alternative must beat the original by
        # MARGIN; to be measured, it must be no worse than the original within MARGIN (ties
        # are common where both sides are memory-bound, e.g. a small matmul on TVM or a library).
        bound = base.estimate * ((1 + MARGIN) if self.measures else (1 - MARGIN))
        better = [a for a in others if a.estimate < bound]
        if _is_region(call) and self.measures:
            # the analytic cost of a region's original (several kernels) is rough: the cheapest
            # program of every operator kind is measured whatever its estimate
            firsts = _kind_leaders(others)
            better = firsts + [a for a in better if a not in firsts]
        if not better:
            best = _t(others[0].estimate) if others else "none"
            return Choice(None, names, f"no candidate beats the original by the analytic cost "
                          f"({_t(base.estimate)} vs best {best}; {n_cand} candidates{note})",
                          base.estimate, base.estimate, False, n_cand)
        if _is_region(call):
            better = _kind_leaders(better) + [a for a in better if a not in _kind_leaders(better)]
        if self.measures:
            return self._choose_measured(call, sig, names, base, better, n_cand)
        return self._choose_analytic(call, names, base, better, n_cand)

    def alternatives(self, call, budget_s: float) -> Tuple[List[Alternative], int, str]:
        """The baseline first, then every other alternative with its analytic estimate;
        the number of derived candidates and a note on the search."""
        region = _is_region(call)
        if _is_group(call):
            return self._group_alternatives(call)
        try:
            expr = call.lift() if region else lift_relax_call(call)
        except LiftError as err:
            expr, note = None, f"; not liftable: {err}"
        if region:
            base_est = _region_seconds(call, self.calib) if expr is not None else 0.0
        else:
            base_est = analytic.original_seconds(expr, call.op.name, self.calib) \
                if expr is not None else 0.0
        alts = [Alternative(None, "tvm", base_est)]
        if not region and self.library and lib.call_form(call) is not None and expr is not None:
            alts.append(Alternative(None, "native", analytic.original_seconds(
                expr, call.op.name, self.calib, "native")))
        if expr is None or not self.derive:
            return alts, 0, "" if expr is not None else note
        from ..derive.search import derive  # pylint: disable=import-outside-toplevel

        t0 = time.perf_counter()
        res = derive(expr, max_depth=self.max_depth, time_budget_s=budget_s,
                     max_states=self.max_states, verify=False,
                     max_candidates=self.max_candidates,
                     cost_target=self.calib.kind)
        self.search_s += time.perf_counter() - t0
        seen, constants = set(), constant_inputs(call)
        for prog in res.candidates:
            if prog.multi or repr(prog) in seen:
                continue
            seen.add(repr(prog))
            alts.extend(self._program_alternatives(prog, constants))
        return alts, len(seen), f", search stop={res.stats.stop_reason.value}"

    def _group_alternatives(self, group) -> Tuple[List[Alternative], int, str]:
        """A group of calls sharing an operand: the calls as they are, and the merged programs
        of the inter-expression rules (no search: the merge is the rewrite being decided)."""
        try:
            progs = group.programs() if self.derive else []
        except LiftError as err:
            return [Alternative(None, "tvm", 0.0)], 0, f"; not liftable: {err}"
        alts = [Alternative(None, "tvm", _region_seconds(group, self.calib))]
        if self.library and all(lib.call_form(c) is not None for c in group.heavy_calls):
            # the calls apart on their native kernels: what the merge must beat where the
            # library would take each call anyway (with its bias add as the kernel's epilogue)
            alts.append(Alternative(None, "native", sum(analytic.original_seconds(
                lift_relax_call(c), c.op.name, self.calib, "native")
                for c in group.heavy_calls)))
        constants = constant_inputs(group)
        for prog in progs:
            alts.extend(self._program_alternatives(prog, constants))
        note = "" if progs else "; the calls do not merge into one GEMM"
        return alts, len(progs), note

    def _program_alternatives(self, prog: Program,
                              constants: FrozenSet[str] = frozenset()) -> List[Alternative]:
        """A derived program on TVM kernels, and on the native library when it implements one
        of its stages, each with its analytic estimate (its stages over the unit's
        ``constants`` alone folded at compile time: they cost nothing)."""
        impls = ["tvm"]
        if self.library and any(lib.stage_form(s) is not None for s in prog.stages):
            impls.append("native")
        return [Alternative(prog, impl, analytic.program_seconds(prog, self.calib, impl,
                                                                 constants))
                for impl in impls]

    def _choose_analytic(self, call, names, base, better, n_cand) -> Choice:
        failures = []
        for alt in better[:MAX_VERIFY]:
            ok, why = self._verify(call, alt, names)
            if ok:
                return _chosen(alt, names, f"analytic {_t(base.estimate)} -> {_t(alt.estimate)}",
                               base.estimate, alt.estimate, False, n_cand)
            failures.append(f"{alt.label}: {why}")
            LOG.warning("ollie: candidate rejected: %s: %s", alt.label, why)
        return Choice(None, names, "no cheaper candidate held up: " + "; ".join(failures),
                      base.estimate, base.estimate, False, n_cand)

    def _choose_forced(self, call, names, base, alt: Alternative, n_cand) -> Choice:
        """The chooser's alternative if it verifies (the original otherwise)."""
        if alt.is_baseline:
            return Choice(None, names, "forced: original", base.estimate, base.estimate,
                          False, n_cand)
        ok, why = self._verify(call, alt, names)
        if not ok:
            return Choice(None, names, f"forced {alt.label} rejected: {why}", base.estimate,
                          base.estimate, False, n_cand)
        return _chosen(alt, names, "forced by the chooser", base.estimate, alt.estimate, False,
                       n_cand)

    def _choose_measured(self, call, sig, names, base, better, n_cand) -> Choice:
        t_base = self._timed(call, sig, base, names)
        if t_base is None:
            return Choice(None, names, "the original operator failed to build or run",
                          base.estimate, base.estimate, False, n_cand)
        mode = "measured" if self.can_measure else "untuned, measured"
        times, failures, best = [f"original {_t(t_base)}"], [], None
        for alt in better[:self.max_measured]:
            ok, why = self._verify(call, alt, names)
            if not ok:
                failures.append(f"{alt.label}: {why}")
                LOG.warning("ollie: candidate rejected: %s: %s", alt.label, why)
                continue
            t = self._timed(call, sig, alt, names)
            if t is None:
                failures.append(f"{alt.label}: failed to build, tune or run")
                continue
            times.append(f"{alt.label} {_t(t)}")
            if best is None or t < best[0]:
                best = (t, alt)
        tail = ("; rejected: " + "; ".join(failures)) if failures else ""
        summary = f"{mode}: " + ", ".join(times) + tail
        if best is None or best[0] >= t_base * (1 - MARGIN):
            return Choice(None, names, summary, t_base, t_base, True, n_cand)
        return _chosen(best[1], names, summary, t_base, best[0], True, n_cand)

    # -- cost and check -------------------------------------------------------------------

    def _timed(self, call, sig: str, alt: Alternative, names) -> Optional[float]:
        try:
            mod = unit_module(call, alt.program, names, alt.impl)
        except EmitError as err:
            LOG.warning("ollie: %s has no Relax form: %s", alt.label, err)
            return None
        key = (sig, alt.label)
        try:
            return self.timer(mod, "|".join(key))
        except Exception as err:  # pylint: disable=broad-except
            LOG.warning("ollie: measuring %s failed: %s: %s", alt.label, type(err).__name__, err)
            return None

    def _time(self, mod: "tvm.IRModule", label: str) -> Optional[float]:
        """The default timer: build (tuned with ``trials`` when measuring) and time here (or
        on the RPC devices); cached in ``work_dir`` by target, device, label and mode."""
        mode = f"tuned{self.trials}" if self.can_measure else "untuned"
        where = f"@rpc:{self.rpc.key}" if self.rpc is not None else ""
        key = self.measure_cache.key(str(self.target) + where, label, mode)
        cached = self.measure_cache.get(key)
        if cached is not None:
            return cached
        t0 = time.perf_counter()
        calls = STATS.calls
        try:
            tuner = self.budget.metered(self.tuner)
            trials = self.budget.grant(label) if tuner is not None else 0
            ex = compile_module(mod, self.target, tuner, trials)
            # the fastest of several short runs: ranks implementations robustly on a machine
            # that other processes share (a descheduled OpenMP thread inflates a median)
            seconds = time_main(ex, random_args(mod["main"]), number=2, repeat=8,
                                rpc=self.rpc, target=self.target, stat="min")
        except Exception as err:  # pylint: disable=broad-except
            LOG.warning("ollie: measuring %s failed: %s: %s", label, type(err).__name__, err)
            return None
        finally:
            if STATS.calls != calls:
                self.tuning_s += time.perf_counter() - t0
        self.measure_cache.put(key, seconds)
        return seconds

    def _verify(self, call, alt: Alternative, names) -> Tuple[bool, str]:
        """The checker on the original and the alternative, each alone (then
        :func:`check_exact` on a derived program)."""
        t0 = time.perf_counter()
        try:
            ok, why = self.checker(unit_module(call),
                                   unit_module(call, alt.program, names, alt.impl))
            if ok and alt.program is not None and not alt.program.multi:
                # (a multi-output program: the numeric check above compared every result)
                ok, why = check_exact(alt.program)
            return ok, why
        except EmitError as err:
            return False, f"no Relax form: {err}"
        except Exception as err:  # pylint: disable=broad-except
            return False, f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
        finally:
            self.verify_s += time.perf_counter() - t0


#: multiply-adds up to which a polynomial candidate is also checked exactly over Z_p
EXACT_CHECK_MAX_WORK = 1 << 22


def check_exact(prog: Program) -> Tuple[bool, str]:
    """The finite-field check of a small polynomial program (``(True, "")`` when it does not
    apply): exact where floats compare with a tolerance (:mod:`tvm_ollie.verify.finite_field`)."""
    from ..verify.finite_field import check_program_mod_p  # pylint: disable=import-outside-toplevel

    orig = prog.original
    if int(np.prod([iv.extent for iv in orig.loops + orig.reduce], dtype=np.int64)) > \
            EXACT_CHECK_MAX_WORK:
        return True, ""
    res = check_program_mod_p(prog, trials=2)
    if res.applicable and not res.ok:
        return False, f"differs over Z_{res.p}: {res.reason}"
    return True, ""


def _is_region(unit) -> bool:
    return bool(getattr(unit, "is_region", False))


def _is_group(unit) -> bool:
    return bool(getattr(unit, "is_group", False))


def unit_signature(unit) -> str:
    """:func:`call_signature` of a call; a region's own signature."""
    return unit.signature() if _is_region(unit) else call_signature(unit)


def unit_operands(unit) -> Tuple[List[str], List[object]]:
    """Names and Relax values of a unit's inputs (the names its lifted expression uses)."""
    if _is_region(unit):
        ins = unit.inputs()
        return [n for n, _ in ins], [v for _, v in ins]
    return _operand_values(unit)


def constant_inputs(unit) -> FrozenSet[str]:
    """Names of a unit's inputs that are constants (weights bound into the module): what a
    program computes from them alone is folded when the module is built."""
    names, values = unit_operands(unit)
    return frozenset(n for n, v in zip(names, values) if isinstance(v, _CONST))


def unit_module(unit, program: Optional[Program] = None, names=None,
                impl: str = "tvm") -> "tvm.IRModule":
    """:func:`isolated_module` of a call or of a region."""
    if _is_group(unit):
        from .regions import isolated_group_module  # pylint: disable=import-outside-toplevel

        return isolated_group_module(unit, program, names, impl)
    if _is_region(unit):
        from .regions import isolated_region_module  # pylint: disable=import-outside-toplevel

        return isolated_region_module(unit, program, names, impl)
    return isolated_module(unit, program, names, impl)


def _kind_leaders(alts: List[Alternative]) -> List[Alternative]:
    """The cheapest alternative of each operator kind (g2bmm, gbmm, matmul, ...) among ``alts``
    (cheapest first): a region's few measured slots then try every kind of rewrite."""
    leaders, kinds = [], set()
    for alt in alts:
        new = set() if alt.program is None else \
            {s.kind for s in alt.program.stages if s.is_operator} - kinds
        if new:
            kinds |= new
            leaders.append(alt)
    return leaders


def _region_seconds(region, calib: Calibration) -> float:
    """Analytic estimate of a region as TVM builds it: one kernel per call."""
    total = 0.0
    for call in region.calls:
        try:
            expr = lift_relax_call(call)
        except LiftError:
            continue
        total += analytic.original_seconds(expr, call.op.name, calib)
    return total


def _library_enabled(library: Optional[bool], gpu: bool) -> bool:
    """Whether native kernels are alternatives (CPU targets with the library loaded)."""
    if library is False or gpu:
        return False
    ok = native.load()
    if library and not ok:
        LOG.warning("ollie: native kernels requested but unavailable (%s); using TVM kernels",
                    native.unavailable_reason())
    return ok


def _chosen(alt: Alternative, names, reason: str, before: float, after: float, measured: bool,
            n_cand: int) -> Choice:
    explain = _explain(alt.program) if alt.program is not None else \
        f"original operator on the native {alt.impl} kernel"
    return Choice(alt.program, names, reason, before, after, measured, n_cand, explain, alt.impl)


def _run_llvm(mod, args) -> Tuple[Union[np.ndarray, List[np.ndarray]], List[str]]:
    """The output of ``mod`` on llvm as float64 (a list for a tuple), and its element types."""
    ex = tvm.compile(mod, target="llvm")
    vm = relax.VirtualMachine(ex, tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(a) for a in args])
    if not hasattr(out, "numpy"):  # a tuple of results
        return [o.numpy().astype(np.float64) for o in out], [str(o.dtype) for o in out]
    return out.numpy().astype(np.float64), [str(out.dtype)]


def _explain(prog: Program) -> str:
    try:
        return prog.explain()
    except Exception:  # pylint: disable=broad-except
        return repr(prog)


def _t(seconds: float) -> str:
    """Seconds as a short human string (ns/us/ms)."""
    if seconds < 1e-6:
        return f"{seconds * 1e9:.1f}ns"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f}us"
    return f"{seconds * 1e3:.2f}ms"
