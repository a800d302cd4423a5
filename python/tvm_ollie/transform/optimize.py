"""The ``OllieOptimize`` Relax pass: replace operators by cheaper derived programs.

For every call of a derivable operator (:data:`.decide.DERIVABLE_OPS`) in every Relax function,
the pass lifts the call, derives equivalent programs, costs them and the original's native
library kernel against the original (calibrated roofline with ``trials=0``, plus untuned
timings on CPUs; MetaSchedule-tuned measurements with ``trials>0``), verifies the winner
numerically, and emits it as Relax (:mod:`.emit`). Calls whose signature repeats are decided
once. Library kernels then take their bias, activation and residual consumers
(:mod:`.epilogue`). Everything that does not win, or fails anywhere, stays exactly as it was;
the report says why.
"""

from __future__ import annotations

import logging
import time
from typing import Dict, List, Optional, Tuple

from ..compat import relax, tvm
from ..tune.calibrate import Calibration
from ..tune.metaschedule import STATS, Tuner, normalize_target
from ..tune.rpc import RPCConfig
from .decide import DERIVABLE_OPS, Checker, Chooser, Decider, Timer, call_signature, \
    original_form
from .emit import emit_program
from .epilogue import fuse_epilogues
from .regions import MAX_CALLS, MAX_GROUP, Region, _used_vars, find_regions, \
    find_shared_input_groups, static_tensor
from .report import OpDecision, OptimizeReport, RegionDecision

__all__ = ["OllieOptimize", "optimize_module"]

LOG = logging.getLogger("tvm_ollie.transform")


def _var_name(var) -> str:
    return str(getattr(var, "name", None) or getattr(var, "name_hint", ""))


def _derivable_calls(mod: "tvm.IRModule") -> List[Tuple[str, str, "relax.Call"]]:
    """``(function, variable, call)`` of every derivable call bound in a Relax function."""
    out = []
    for gv, func in mod.functions_items():
        if not isinstance(func, relax.Function):
            continue
        body = func.body
        if not isinstance(body, relax.SeqExpr):
            continue
        for block in body.blocks:
            for binding in block.bindings:
                value = getattr(binding, "value", None)
                if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op) and \
                        value.op.name in DERIVABLE_OPS and _static(value):
                    out.append((gv.name_hint, _var_name(binding.var), value))
    return out


def _static(call) -> bool:
    return all(static_tensor(e) for e in [call] + list(call.args))


@relax.expr_functor.mutator
class _RegionRewriter(relax.PyExprMutator):
    """Replaces each rewritten region: its output binding becomes the program, its other
    bindings go away (nothing outside the region uses them).

    A rewritten group (:class:`~.regions.SharedInputGroup`) is emitted at its last call; the
    bindings between its first and last call that read a group result (directly or not) move
    after it, in their order (the group's calls are independent, so nothing they read moves).
    """

    def __init__(self, mod, regions: List[Tuple[Region, object]], groups=()):
        super().__init__(mod)
        self.outputs = {hash(r.output): (r, ch) for r, ch in regions}
        self.drop = {hash(b.var) for r, _ in regions for b in r.bindings[:-1]
                     if hash(b.var) not in r.keep}
        self.groups = {hash(g.output): (g, ch) for g, ch in groups}
        self.members = {hash(b.var): g for g, _ in groups for b in g.bindings}
        self.waiting: Dict[int, List[object]] = {}  # open group -> deferred bindings
        self.moved: Dict[int, int] = {}  # deferred variable -> its group

    def _open_group(self, binding) -> Optional[int]:
        """The open group a binding must wait for (it reads one of its results), or None."""
        for v in _used_vars(binding.value):
            g = self.members.get(hash(v))
            if g is not None and hash(g.output) in self.waiting:
                return hash(g.output)
            if hash(v) in self.moved:
                return self.moved[hash(v)]
        return None

    def visit_var_binding_(self, binding):  # pylint: disable=arguments-renamed
        key = hash(binding.var)
        group = self.members.get(key)
        if group is not None:
            gkey = hash(group.output)
            if key != gkey:
                self.waiting.setdefault(gkey, [])
                return
            self._emit_group(*self.groups[gkey])
            for b in self.waiting.pop(gkey, []):
                self.moved.pop(hash(b.var), None)
                self.visit_var_binding_(b)
            return
        wait = self._open_group(binding)
        if wait is not None:
            self.waiting[wait].append(binding)
            self.moved[key] = wait
            return
        if key in self.drop:
            return
        hit = self.outputs.get(key)
        if hit is None:
            super().visit_var_binding_(binding)
            return
        region, choice = hit
        values = {n: self.visit_expr(v) for n, v in region.inputs()}
        in_names = [n for n, _ in region.inputs()]
        mapping = {pn: values[cn] for pn, cn in zip(choice.names, in_names)}
        out = emit_program(self.builder_, choice.program, mapping, region.out_shape,
                           impl=choice.impl, name="ollie_region")
        if isinstance(binding.var, relax.DataflowVar):
            new_var = self.builder_.emit(out)
        else:
            new_var = self.builder_.emit_output(out)
        self.set_var_remap(binding.var, new_var)

    def _emit_group(self, group, choice):
        values = {n: self.visit_expr(v) for n, v in group.inputs()}
        in_names = [n for n, _ in group.inputs()]
        mapping = {pn: values[cn] for pn, cn in zip(choice.names, in_names)}
        out = emit_program(self.builder_, choice.program, mapping, group.out_shape,
                           impl=choice.impl, name="ollie_merge")
        for var, field in zip(group.outputs, out.fields):
            new_var = field if isinstance(var, relax.DataflowVar) else \
                self.builder_.emit_output(field)
            self.set_var_remap(var, new_var)


@relax.expr_functor.mutator
class _Rewriter(relax.PyExprMutator):
    """Replaces each decided call by its program (bindings emitted in place)."""

    def __init__(self, mod, choices: Dict[str, object]):
        super().__init__(mod)
        self.choices = choices

    def visit_call_(self, call):  # pylint: disable=arguments-renamed
        call = self.visit_expr_post_order(call)
        if not (isinstance(call.op, tvm.ir.Op) and call.op.name in DERIVABLE_OPS):
            return call
        if not _static(call):
            return call
        choice = self.choices.get(call_signature(call))
        if choice is None or not choice.rewritten:
            return call
        if choice.program is None:
            return original_form(call, list(call.args), choice.impl)
        from .decide import _operand_values  # pylint: disable=import-outside-toplevel

        names, values = _operand_values(call)
        mapping = {pn: v for pn, v in zip(choice.names, values)}
        short = call.op.name.rsplit(".", 1)[-1]
        return emit_program(self.builder_, choice.program, mapping,
                            tuple(int(s) for s in call.ty.shape), impl=choice.impl,
                            name=f"ollie_{short}")


def optimize_module(mod: "tvm.IRModule", target=None, trials: int = 0,
                    work_dir: Optional[str] = None, max_depth: int = 7,
                    time_budget_s: float = 20.0, targets=None, verbose: bool = False,
                    calibration: Optional[Calibration] = None, max_measured: int = 3,
                    check_untuned: Optional[bool] = None, library: Optional[bool] = None,
                    derive: bool = True, timer: Optional[Timer] = None,
                    checker: Optional[Checker] = None, rpc: Optional[RPCConfig] = None,
                    chooser: Optional[Chooser] = None, tuner: Optional[Tuner] = None,
                    region_calls: int = MAX_CALLS, merge_group: int = MAX_GROUP,
                    ) -> Tuple["tvm.IRModule", OptimizeReport]:
    """Run the derivation rewrite on ``mod``; return the new module and the report.

    Parameters
    ----------
    mod : IRModule
        A Relax module with static shapes (dynamic-shape calls are left alone).
    target : str | dict | Target, optional
        The target (``Target.current()`` or llvm when None).
    trials : int
        0: decide by the calibrated analytic cost. >0: tune (MetaSchedule, XGBoost) the
        original and the ``max_measured`` cheapest candidates with ``trials`` trials each
        and decide by measured time (GPU targets without a GPU here fall back to analytic).
    work_dir : str, optional
        MetaSchedule JSON database and measurement cache (reused by later compiles).
    max_depth : int
        Derivation depth.
    time_budget_s : float
        Derivation time for the whole module, shared by the distinct operator signatures.
    targets : sequence of str, optional
        Only consider these Relax operators (e.g. ``["relax.nn.conv2d"]``); default all.
    verbose : bool
        Log the report at INFO level (and each decision's rule path at DEBUG).
    calibration : Calibration, optional
        Override the analytic cost calibration (reproducible decisions).
    max_measured : int
        Alternatives (cheapest first) verified and measured per signature when measuring.
    check_untuned : bool, optional
        With ``trials=0``, also time the original and each accepted candidate untuned and keep
        the candidate only if it is faster (default: on for CPU targets, whose untuned kernels
        the analytic cost ranks poorly, unless ``calibration`` is given for reproducible
        decisions; off for GPU targets, which may have no device here).
    library : bool, optional
        Native library kernels as alternatives (default: on CPU targets when the native
        library is loaded; ``False``: TVM kernels only).
    derive : bool
        Derived programs as alternatives (``False``: only the original's implementations,
        the ``ollie-lib`` ablation).
    timer, checker : callable, optional
        Replace the measurement and the numeric check (see :mod:`.decide`).
    rpc : RPCConfig, optional
        Measure on the devices behind this RPC tracker instead of this machine (tuning trials,
        untuned and tuned timings); builds stay local, records go to ``work_dir``.
    chooser : Chooser, optional
        Forces the choice per signature, still verified (differential tests; see
        :mod:`.decide`).
    tuner : Tuner, optional
        Replaces the pass's MetaSchedule tuner (``trials > 0``; fault-injection tests).
    region_calls : int
        Most calls in one region (:mod:`.regions`); 1 decides every call alone. A region of
        several calls is lifted, derived, verified and replaced as a whole; when it is kept,
        its heavy call is still decided alone.
    merge_group : int
        Most independent matmuls that read the same operand decided as one group
        (:func:`~.regions.find_shared_input_groups`): the merged program (one GEMM over
        concatenated operands, then slices) competes with the calls as they are; when the
        group is kept, its calls are decided as usual. Below 2: no groups.
    """
    t_start = time.perf_counter()
    tgt = normalize_target(target)
    calls = _derivable_calls(mod)
    if targets:
        wanted = {t if t.startswith("relax.") else f"relax.{t}" for t in targets}
        calls = [c for c in calls if c[2].op.name in wanted]
    decider = Decider(tgt, trials=trials, work_dir=work_dir, max_depth=max_depth,
                      calibration=calibration, max_measured=max_measured,
                      check_untuned=check_untuned, library=library, derive=derive,
                      timer=timer, checker=checker, rpc=rpc, chooser=chooser, tuner=tuner)
    report = OptimizeReport(target=str(tgt.kind.name if tgt.kind.name != "llvm" else "llvm"))
    tuning0, calls0 = STATS.seconds, STATS.calls
    regions = [r for r in (find_regions(mod, region_calls) if region_calls > 1 and derive
                           else []) if r.size > 1]
    groups = find_shared_input_groups(mod, merge_group) if derive else []
    if targets:
        regions = [r for r in regions if r.heavy_call.op.name in wanted]
        groups = [g for g in groups if g.calls[0].op.name in wanted]
    sigs = list(dict.fromkeys([call_signature(c) for _, _, c in calls] +
                              [r.signature() for r in regions] +
                              [g.signature() for g in groups]))
    choices: Dict[str, object] = {}
    rewritten_regions, region_decisions, inside = [], [], set()
    rewritten_groups = []
    for group in groups:
        sig = group.signature()
        if sig not in choices:
            choices[sig] = decider.decide(group, max(0.5, time_budget_s / max(len(sigs), 1)))
        ch = choices[sig]
        apart = ch.program is None and ch.rewritten
        region_decisions.append(RegionDecision(
            group.function, ", ".join(_var_name(v) for v in group.outputs), group.describe(),
            " ; ".join(str(e) for e in group.lifts()),
            chosen="original" if apart else ch.label,
            reason=("the calls apart on native kernels win, each decided alone; " if apart
                    else "") + ch.reason,
            explain=ch.explain, before_s=ch.before_s, after_s=ch.after_s, measured=ch.measured,
            candidates=ch.candidates))
        log = LOG.info if (verbose or ch.rewritten) else LOG.debug
        log("ollie: group %s.%s [%s] -> %s (%s)", group.function, _var_name(group.output),
            group.describe(), region_decisions[-1].chosen, region_decisions[-1].reason)
        if ch.program is not None:  # (the calls apart on native kernels: decided alone)
            rewritten_groups.append((group, ch))
            inside.update(hash(c) for c in group.original_calls)
    regions = [r for r in regions if not any(hash(c) in inside for c in r.calls)]
    for region in regions:
        sig = region.signature()
        if sig not in choices:
            pending = len(sigs) - len(choices)
            budget = max(0.5, (time_budget_s - decider.search_s) / max(pending, 1))
            choices[sig] = decider.decide(region, budget)
        ch = choices[sig]
        region_decisions.append(RegionDecision(
            region.function, _var_name(region.output), region.describe(), str(region.lift()),
            chosen=ch.label, reason=ch.reason, explain=ch.explain, before_s=ch.before_s,
            after_s=ch.after_s, measured=ch.measured, candidates=ch.candidates))
        log = LOG.info if (verbose or ch.rewritten) else LOG.debug
        log("ollie: region %s.%s [%s] -> %s (%s)", region.function, _var_name(region.output),
            region.describe(), ch.label, ch.reason)
        if ch.rewritten:
            rewritten_regions.append((region, ch))
            inside.update(hash(b.value) for b in region.bindings)
    calls = [c for c in calls if hash(c[2]) not in inside]
    decisions = []
    for fname, vname, call in calls:
        sig = call_signature(call)
        if sig not in choices:
            pending = len(sigs) - len(choices)
            spent = decider.search_s
            budget = max(0.5, (time_budget_s - spent) / max(pending, 1))
            choices[sig] = decider.decide(call, budget)
        ch = choices[sig]
        d = OpDecision(fname, vname, call.op.name, sig,
                       chosen=ch.label,
                       reason=ch.reason, explain=ch.explain, before_s=ch.before_s,
                       after_s=ch.after_s, measured=ch.measured, candidates=ch.candidates)
        decisions.append(d)
        log = LOG.info if (verbose or d.rewritten) else LOG.debug
        log("ollie: %s.%s %s -> %s (%s)", fname, vname, sig, d.chosen, d.reason)
    new_mod = mod
    if rewritten_regions or rewritten_groups:
        region_rewriter = _RegionRewriter(mod, rewritten_regions, rewritten_groups)
        for gv, func in mod.functions_items():
            if isinstance(func, relax.Function):
                region_rewriter.builder_.update_func(gv, region_rewriter.visit_expr(func))
        mod = new_mod = region_rewriter.builder_.get()
    call_choices = {call_signature(c): choices[call_signature(c)] for _, _, c in calls}
    if any(ch.rewritten for ch in call_choices.values()):
        rewriter = _Rewriter(mod, call_choices)
        for gv, func in mod.functions_items():
            if isinstance(func, relax.Function):
                rewriter.builder_.update_func(gv, rewriter.visit_expr(func))
        new_mod, report.epilogues = fuse_epilogues(rewriter.builder_.get())
    report.decisions = decisions
    report.regions = region_decisions
    report.search_s = decider.search_s
    report.verify_s = decider.verify_s
    report.tuning_s = STATS.seconds - tuning0
    report.tuning_calls = STATS.calls - calls0
    report.total_s = time.perf_counter() - t_start
    if verbose:
        LOG.info("%s", report.to_text())
    return new_mod, report


@tvm.transform.module_pass(opt_level=0, name="OllieOptimize")
class OllieOptimize:
    """The derivation rewrite as a module pass (see :func:`optimize_module`).

    ``OllieOptimize(target=None, trials=0, work_dir=None, max_depth=7, time_budget_s=20.0)``;
    the target defaults to ``tvm.target.Target.current()`` when the pass runs (llvm if none).
    The report of the last run is ``.last_report``.
    """

    def __init__(self, target=None, trials: int = 0, work_dir: Optional[str] = None,
                 max_depth: int = 7, time_budget_s: float = 20.0, targets=None,
                 verbose: bool = False, calibration: Optional[Calibration] = None,
                 max_measured: int = 3, check_untuned: Optional[bool] = None,
                 library: Optional[bool] = None, derive: bool = True,
                 timer: Optional[Timer] = None, checker: Optional[Checker] = None,
                 rpc: Optional[RPCConfig] = None, chooser: Optional[Chooser] = None,
                 region_calls: int = MAX_CALLS, merge_group: int = MAX_GROUP):
        self.target = target
        self.merge_group = merge_group
        self.chooser = chooser
        self.region_calls = region_calls
        self.library = library
        self.derive = derive
        self.timer = timer
        self.checker = checker
        self.rpc = rpc
        self.check_untuned = check_untuned
        self.trials = trials
        self.work_dir = work_dir
        self.max_depth = max_depth
        self.time_budget_s = time_budget_s
        self.targets = targets
        self.verbose = verbose
        self.calibration = calibration
        self.max_measured = max_measured
        self.last_report: Optional[OptimizeReport] = None

    def transform_module(self, mod: "tvm.IRModule", ctx) -> "tvm.IRModule":  # noqa: ARG002
        target = self.target
        if target is None:
            target = tvm.target.Target.current(allow_none=True) or "llvm"
        new_mod, report = optimize_module(
            mod, target, trials=self.trials, work_dir=self.work_dir, max_depth=self.max_depth,
            time_budget_s=self.time_budget_s, targets=self.targets, verbose=self.verbose,
            calibration=self.calibration, max_measured=self.max_measured,
            check_untuned=self.check_untuned, library=self.library, derive=self.derive,
            timer=self.timer, checker=self.checker, rpc=self.rpc, chooser=self.chooser,
            region_calls=self.region_calls, merge_group=self.merge_group)
        self.last_report = report
        return new_mod
