"""Per-operator decisions: lift, derive, cost (analytic or measured), verify, choose.

Calls with equal :func:`call_signature` (operator, operand shapes/dtypes, attributes, operand
aliasing) are decided once: the chosen program is cached with the operand names of the first
call and re-bound positionally for the others.

Never worse: a candidate is accepted only when it is cheaper than the original under the chosen
cost by :data:`MARGIN`, built, (tuned,) and matched the original numerically on random inputs
(relative error :data:`RTOL` of the output's largest magnitude, float32 on llvm). Anything else
keeps the original call and records why.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import numpy as np

from ..compat import relax, tvm
from ..derive.program import Program
from ..lift import LiftError, lift_relax_call
from ..lift.registry import Operands
from ..tune import analytic
from ..tune.calibrate import Calibration, calibrate
from ..tune.measure import compile_module, random_args, time_main
from ..tune.metaschedule import STATS, Tuner, gpu_available, is_gpu_target, normalize_target
from ..tune.rpc import RPCConfig
from .emit import EmitError, emit_program

__all__ = ["DERIVABLE_OPS", "MARGIN", "RTOL", "Choice", "Decider", "call_signature",
           "isolated_module"]

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
RTOL = 1e-4
#: Candidates verified before giving up (cheapest first).
MAX_VERIFY = 3


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


def isolated_module(call, program: Optional[Program] = None, names=None,
                    library: bool = True) -> "tvm.IRModule":
    """A module whose ``main`` computes the call alone (or ``program`` in its place).

    Variable operands become parameters (in operand order); constant operands stay constants.
    """
    op_names, values = _operand_values(call)
    bb = relax.BlockBuilder()
    params, inputs = [], {}
    for n, v in zip(op_names, values):
        if isinstance(v, _CONST):
            inputs[n] = v
        else:
            p = relax.Var(n, v.ty)
            params.append(p)
            inputs[n] = p
    with bb.function("main", params):
        with bb.dataflow():
            if program is None:
                new_args = [inputs[Operands(call).name(a)] if isinstance(
                    a.ty, relax.TensorType) else a for a in call.args]
                out = bb.emit_output(relax.Call(call.op, new_args, call.attrs, call.ty_args))
            else:
                mapping = inputs if names is None else {
                    pn: inputs[cn] for pn, cn in zip(names, op_names)}
                out = bb.emit_output(emit_program(bb, program, mapping, _shape(call),
                                                  library=library))
        bb.emit_func_output(out)
    return bb.get()


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


class _MeasureCache:
    """Measured seconds per (target, signature, implementation), kept in ``work_dir``."""

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
            tmp = self.path + ".tmp"
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(self.data, f, indent=1, sort_keys=True)
            os.replace(tmp, self.path)


class Decider:
    """Decides (and caches) the implementation of each operator signature.

    Parameters
    ----------
    target : Target
        The compilation target.
    trials : int
        MetaSchedule trials per measured implementation (0: analytic cost only).
    work_dir : str, optional
        Tuning database and measurement cache directory (a temporary one when tuning without).
    max_depth : int
        Derivation depth.
    search_budget_s : float
        Derivation time per signature.
    calibration : Calibration, optional
        Analytic cost calibration (measured/default for the target when None).
    max_measured : int
        Candidates (cheapest by the analytic cost) tuned and measured per signature.
    rpc : RPCConfig, optional
        Run every measurement (tuning trials, untuned and tuned timings) on the devices behind
        this RPC tracker; checked once here so an unreachable tracker fails before any work.
    """

    def __init__(self, target, trials: int = 0, work_dir: Optional[str] = None,
                 max_depth: int = 5, search_budget_s: float = 5.0,
                 calibration: Optional[Calibration] = None, max_measured: int = 2,
                 max_states: Optional[int] = 2000, check_untuned: Optional[bool] = None,
                 rpc: Optional[RPCConfig] = None):
        self.target = normalize_target(target)
        #: with trials=0 on a CPU, time the original and the candidate untuned before choosing
        #: (not when a fixed calibration asks for reproducible, cost-model-only decisions)
        if check_untuned is None:
            check_untuned = not is_gpu_target(self.target) and calibration is None
        self.check_untuned = bool(check_untuned)
        self.calib = calibration or calibrate(self.target)
        self.trials = int(trials)
        self.max_depth = max_depth
        self.search_budget_s = search_budget_s
        self.max_measured = max_measured
        self.max_states = max_states
        self.can_measure = self.trials > 0 and (
            not is_gpu_target(self.target) or gpu_available(self.target))
        self.rpc = rpc
        if rpc is not None:
            self.can_measure = self.trials > 0  # the remote devices measure, not this machine
            if self.can_measure or self.check_untuned:
                rpc.check()
        self.work_dir = work_dir
        if self.can_measure and not work_dir:
            import tempfile  # pylint: disable=import-outside-toplevel

            self.work_dir = tempfile.mkdtemp(prefix="ollie_tune_")
        self.tuner = Tuner(self.target, self.work_dir, rpc=rpc) if self.can_measure else None
        self.measure_cache = _MeasureCache(self.work_dir if self.can_measure else None)
        self.cache: Dict[str, Choice] = {}
        self.search_s = 0.0
        self.tuning_s = 0.0
        self.verify_s = 0.0

    # -- public ----------------------------------------------------------------------------

    def decide(self, call, budget_s: Optional[float] = None) -> Choice:
        """The choice for ``call`` (computed on the first call of its signature)."""
        sig = call_signature(call)
        hit = self.cache.get(sig)
        if hit is None:
            try:
                hit = self._decide(call, sig, budget_s or self.search_budget_s)
            except Exception as err:  # pylint: disable=broad-except
                LOG.warning("ollie: %s kept: unexpected %s: %s", sig, type(err).__name__, err)
                hit = Choice(None, [], f"internal error: {type(err).__name__}: {err}")
            self.cache[sig] = hit
        return hit

    # -- steps -----------------------------------------------------------------------------

    def _decide(self, call, sig: str, budget_s: float) -> Choice:
        names, _ = _operand_values(call)
        try:
            expr = lift_relax_call(call)
        except LiftError as err:
            return Choice(None, names, f"not liftable: {err}")
        from ..derive.search import derive  # pylint: disable=import-outside-toplevel

        t0 = time.perf_counter()
        res = derive(expr, max_depth=self.max_depth, time_budget_s=budget_s,
                     max_states=self.max_states, verify=False, max_candidates=None,
                     cost_target=self.calib.kind)
        self.search_s += time.perf_counter() - t0
        before = analytic.original_seconds(expr, call.op.name, self.calib)
        ranked, seen = [], set()
        for prog in res.candidates:
            if prog.multi or repr(prog) in seen:
                continue
            seen.add(repr(prog))
            ranked.append((analytic.program_seconds(prog, self.calib), repr(prog), prog))
        ranked.sort(key=lambda t: (t[0], t[1]))
        n_cand = len(ranked)
        better = [r for r in ranked if r[0] < before * (1 - MARGIN)]
        stop = res.stats.stop_reason.value
        if not better:
            best = _t(ranked[0][0]) if ranked else "none"
            return Choice(None, names, f"no candidate beats the original by the analytic cost "
                          f"({_t(before)} vs best {best}; {n_cand} candidates, "
                          f"search stop={stop})", before, before, False, n_cand)
        if self.can_measure:
            return self._choose_measured(call, sig, names, better, before, n_cand)
        return self._choose_analytic(call, names, better, before, n_cand)

    def _choose_analytic(self, call, names, better, before, n_cand) -> Choice:
        failures = []
        t_orig = None
        for est, text, prog in better[:MAX_VERIFY]:
            ok, why = self._verify(call, prog, names)
            if not ok:
                failures.append(f"{text}: {why}")
                LOG.warning("ollie: candidate rejected: %s: %s", text, why)
                continue
            if not self.check_untuned:
                return Choice(prog, names, f"analytic {_t(before)} -> {_t(est)}",
                              before, est, False, n_cand, _explain(prog))
            # Untuned kernels on a CPU are far from the roofline, so the analytic ranking is
            # checked against what will actually run: both builds untuned, timed here.
            if t_orig is None:
                t_orig = self._untuned_seconds(isolated_module(call))
            t_cand = self._untuned_seconds(isolated_module(call, prog, names))
            if t_orig is not None and t_cand is not None and t_cand < t_orig * (1 - MARGIN):
                return Choice(prog, names, f"untuned, measured {_t(t_orig)} -> {_t(t_cand)} "
                              f"(analytic {_t(before)} -> {_t(est)})", t_orig, t_cand, True,
                              n_cand, _explain(prog))
            failures.append(f"{text}: untuned {_t(t_cand) if t_cand else 'failed'} vs original "
                            f"{_t(t_orig) if t_orig else 'failed'}")
        return Choice(None, names, "no cheaper candidate held up: " + "; ".join(failures),
                      before, before, t_orig is not None, n_cand)

    def _untuned_seconds(self, mod) -> Optional[float]:
        """Median seconds of ``mod`` built with TVM's default pipeline (no tuning) on the CPU."""
        try:
            return time_main(compile_module(mod, self.target), random_args(mod["main"]),
                             rpc=self.rpc, target=self.target)
        except Exception as err:  # pylint: disable=broad-except
            LOG.warning("ollie: untuned timing failed: %s: %s", type(err).__name__, err)
            return None

    def _choose_measured(self, call, sig, names, better, before_est, n_cand) -> Choice:
        tkey = str(self.target) + (f"@rpc:{self.rpc.key}" if self.rpc is not None else "")
        t_orig = self._measured(tkey, sig, "original", isolated_module(call))
        if t_orig is None:
            return Choice(None, names, "the original operator failed to build or run",
                          before_est, before_est, False, n_cand)
        best, failures = None, []
        for _est, text, prog in better[:self.max_measured]:
            ok, why = self._verify(call, prog, names)
            if not ok:
                failures.append(f"{text}: {why}")
                LOG.warning("ollie: candidate rejected: %s: %s", text, why)
                continue
            try:
                t = self._measured(tkey, sig, text, isolated_module(call, prog, names))
            except Exception as err:  # pylint: disable=broad-except
                t, why = None, f"{type(err).__name__}: {err}"
            if t is None:
                failures.append(f"{text}: failed to build, tune or run ({why})")
                continue
            if best is None or t < best[0]:
                best = (t, text, prog)
        tail = ("; rejected: " + "; ".join(failures)) if failures else ""
        if best is None or best[0] >= t_orig * (1 - MARGIN):
            got = f"best {_t(best[0])}" if best else "no candidate measured"
            return Choice(None, names, f"measured: original {_t(t_orig)}, {got}{tail}",
                          t_orig, t_orig, True, n_cand)
        return Choice(best[2], names, f"measured {_t(t_orig)} -> {_t(best[0])}"
                      f"{tail}", t_orig, best[0], True, n_cand, _explain(best[2]))

    def _measured(self, tkey: str, sig: str, impl: str, mod) -> Optional[float]:
        key = self.measure_cache.key(tkey, sig, impl)
        cached = self.measure_cache.get(key)
        if cached is not None:
            return cached
        t0 = time.perf_counter()
        calls = STATS.calls
        try:
            ex = compile_module(mod, self.target, self.tuner, self.trials)
            seconds = time_main(ex, random_args(mod["main"]), rpc=self.rpc, target=self.target)
        except Exception as err:  # pylint: disable=broad-except
            LOG.warning("ollie: measuring %s failed: %s: %s", impl, type(err).__name__, err)
            return None
        finally:
            if STATS.calls != calls:
                self.tuning_s += time.perf_counter() - t0
        self.measure_cache.put(key, seconds)
        return seconds

    def _verify(self, call, prog: Program, names) -> Tuple[bool, str]:
        """Build the original and the candidate alone on llvm and compare on random inputs."""
        t0 = time.perf_counter()
        try:
            ref_mod = isolated_module(call)
            cand_mod = isolated_module(call, prog, names)
            args = random_args(ref_mod["main"], seed=1)
            ref = _run_llvm(ref_mod, args)
            got = _run_llvm(cand_mod, args)
            if got.shape != ref.shape:
                return False, f"shape {got.shape} != {ref.shape}"
            err = float(np.max(np.abs(got.astype(np.float64) - ref))) if ref.size else 0.0
            scale = float(np.max(np.abs(ref))) if ref.size else 0.0
            if not np.isfinite(err) or err > RTOL * max(scale, 1e-6):
                return False, f"numerics differ: max abs err {err:.3g} (scale {scale:.3g})"
            return True, ""
        except EmitError as err:
            return False, f"no Relax form: {err}"
        except Exception as err:  # pylint: disable=broad-except
            return False, f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
        finally:
            self.verify_s += time.perf_counter() - t0


def _run_llvm(mod, args) -> np.ndarray:
    ex = tvm.compile(mod, target="llvm")
    vm = relax.VirtualMachine(ex, tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(a) for a in args])
    return out.numpy().astype(np.float64)


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
