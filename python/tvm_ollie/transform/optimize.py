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

import functools
import logging
import time
from typing import Any, Dict, List, Optional, Set, Tuple, Union

from ..codegen import library as lib
from ..compat import mutate_functions, relax, tvm
from ..compile_profile import profile_scope, stage
from ..config import MIN_SEARCH_S, OllieConfig, resolve_config
from ..lift import LiftError, lift_relax_call
from ..target import is_gpu_target, kind_name, normalize_target
from ..tune import analytic
from ..tune.budget import SearchPayback, SmallUnitGuard, TrialBudget
from ..tune.calibrate import Calibration
from ..tune.metaschedule import STATS, Tuner
from .batched import TOGETHER, BuildGroup
from .blocked_layout import LayoutReport, blocked_layout
from .checking import Checker, CheckFn
from .choosing import Chooser
from .choosing import decided as signature_decision
from .costing import ModuleTiming, Timer, UnitCostModel, region_seconds
from .decide import DERIVABLE_OPS, Decider
from .decision import Decision
from .emit import emit_program
from .epilogue import fuse_epilogues
from .groups import find_shared_input_groups
from .inference_fold import FOLD_RULES, GPU_FOLD_RULES, fold_inference
from .int8_choice import Int8Choice, Int8Report
from .int8_kernels import int8_kernels
from .matmul_pack import PackReport, pack_matmul_weights
from .norm_kernels import instance_norm_kernels
from .resize_kernel import resize_kernels
from .softmax_kernel import softmax_kernels
from .pool_cascade import pool_cascade
from .pool_cover import pool_cover
from .regions import Region, find_regions, static_tensor, used_vars
from .report import OptimizeReport
from .units import (call_signature, is_group, is_region, operand_values, original_form,
                    unit_operands)

__all__ = ["OllieOptimize", "apply_call_choices", "optimize_module"]

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

    A rewritten group (:class:`~.groups.SharedInputGroup`) is emitted at its last call; the
    bindings between its first and last call that read a group result (directly or not) move
    after it, in their order (the group's calls are independent, so nothing they read moves).
    """

    def __init__(self, mod, regions: List[Tuple[Region, object]], groups=()):
        super().__init__(mod)
        self.outputs = {hash(r.output): (r, ch) for r, ch in regions}
        self.drop = {hash(b.var) for r, _ in regions for b in r.bindings[:-1]
                     if hash(b.var) not in r.keep}
        self.groups = {hash(g.output): (g, ch) for g, ch in groups}
        self.members = {hash(b.var): g for g, _ in groups for b in g.members}
        self.waiting: Dict[int, List[object]] = {}  # open group -> deferred bindings
        self.moved: Dict[int, int] = {}  # deferred variable -> its group

    def _open_group(self, binding) -> Optional[int]:
        """The open group a binding must wait for (it reads one of its results), or None."""
        for v in used_vars(binding.value):
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
        if choice.program is None:  # its library form (:meth:`Region.library_form`)
            out = region.replay(self.builder_, values, impl=choice.impl)
        else:
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
        names, values = operand_values(call)
        mapping = {pn: v for pn, v in zip(choice.names, values)}
        short = call.op.name.rsplit(".", 1)[-1]
        return emit_program(self.builder_, choice.program, mapping,
                            tuple(int(s) for s in call.ty.shape), impl=choice.impl,
                            name=f"ollie_{short}")


def optimize_module(mod: "tvm.IRModule", target=None, config: Optional[OllieConfig] = None, *,
                    budget: Optional[TrialBudget] = None, timer: Optional[Timer] = None,
                    checker: Union[Checker, CheckFn, None] = None,
                    chooser: Optional[Chooser] = None, tuner: Optional[Tuner] = None,
                    cost_model: Optional[UnitCostModel] = None, native_regions: bool = False,
                    **options: Any) -> Tuple["tvm.IRModule", OptimizeReport]:
    """Run the derivation rewrite on ``mod``; return the new module and the report.

    The options are one :class:`~tvm_ollie.config.OllieConfig` (``config``, default: the
    :func:`~tvm_ollie.config.config_scope`'s, else the defaults); ``target`` and every other
    keyword that is not None override the field of the same name
    (:meth:`~tvm_ollie.config.OllieConfig.replace`: an unknown name is a
    :class:`~tvm_ollie.config.ConfigError`). ``trials`` is the budget of the whole module: the
    tuned measurements of the decisions share it by expected gain (:mod:`tvm_ollie.tune.budget`).
    ``region_calls`` bounds the calls of one region (:mod:`.regions`; 1 decides every call
    alone): a region of several calls is lifted, derived, verified and replaced as a whole, and
    when it is kept its heavy call is still decided alone. ``merge_group`` bounds the
    independent matmuls reading one operand decided as one group
    (:func:`~.groups.find_shared_input_groups`): the merged program (one GEMM over concatenated
    operands, then slices) competes with the calls as they are; when the group is kept, its
    calls are decided as usual.

    Parameters
    ----------
    mod : IRModule
        A Relax module with static shapes (dynamic-shape calls are left alone).
    target : str | dict | Target, optional
        Overrides the config's target.
    config : OllieConfig, optional
        The options.
    budget : TrialBudget, optional
        The module's trial budget when a caller spends part of it after the pass (``build``
        keeps a share for the rewritten module's kernels); default: one of ``trials``.
    timer, checker, cost_model : optional
        Replace the measurement (a ``timer(module, label) -> seconds`` or a
        :class:`~.costing.UnitCostModel`) and the check (a :class:`~.checking.Checker`, or a
        ``(reference, candidate) -> (ok, why)`` numeric comparison); see :mod:`.decide`.
    chooser : Chooser, optional
        Forces the choice per signature, still verified (differential tests; see
        :mod:`.decide`).
    tuner : Tuner, optional
        Replaces the pass's MetaSchedule tuner (``trials > 0``; fault-injection tests).
    native_regions : bool
        Find the regions of several calls without ``derive`` too, so that a chooser can take
        their native forms (:mod:`.layout_absorb`: one channels-last library call in place of a
        region's transposes, conv and epilogue): the whole-model guard's library plan
        (:func:`tvm_ollie.pipeline.joint.library_plan`).
    **options
        Overrides of the config's fields (``trials``, ``max_depth``, ``search_time_s``...).
    """
    cfg = resolve_config(config, target=target, **options)
    tgt = normalize_target(cfg.target)
    # the library kernels of the target's device; the stages timed into the open profile
    with lib.kernel_device(lib.device_of(tgt)), profile_scope() as prof:
        new_mod, report = _optimize(mod, cfg, tgt, budget, native_regions=native_regions,
                                    timer=timer, checker=checker, chooser=chooser, tuner=tuner,
                                    cost_model=cost_model)
    report.compile_profile = prof
    return new_mod, report


def _optimize(mod: "tvm.IRModule", cfg: OllieConfig, tgt, budget: Optional[TrialBudget], *,
              native_regions: bool = False, **hooks) -> Tuple["tvm.IRModule", OptimizeReport]:
    """:func:`optimize_module` once the options are resolved (``hooks``: the timer, checker,
    chooser, tuner and cost model)."""
    t_start = time.perf_counter()
    with stage("inference fold"):
        rules = GPU_FOLD_RULES if is_gpu_target(tgt) else FOLD_RULES
        mod, folds = fold_inference(mod, rules) if cfg.fold_inference else (mod, {})
    if budget is None:
        budget = TrialBudget(cfg.trials)
    decider = Decider(tgt, cfg, budget=budget, **hooks)
    int8_report = None
    if decider.library and lib.current_device() == "cpu":
        choice = _int8_choice(decider)
        with stage("int8 kernels"):
            mod, int8 = int8_kernels(mod, choice=choice)
        folds = {**folds, **int8}
        int8_report = choice.report() if choice is not None else Int8Report(False)
    if cfg.norm_kernels and decider.library and lib.current_device() == "cpu":
        with stage("norm kernels"):
            mod, norms = instance_norm_kernels(mod)
            # orchestration owns the softmax: Korch's fission splits it into primitives the
            # BLP places (docs/orchestration.md); the native row kernel is derivation's
            mod, softmaxes = (mod, {}) if cfg.orchestrate else softmax_kernels(mod)
        folds = {**folds, **norms, **softmaxes}
    with stage("regions"):
        calls, regions, groups = _find_units(mod, cfg, native_regions)
    report = OptimizeReport(target=kind_name(tgt),
                            budget=budget, calibration=decider.calib.describe())
    tuning0, calls0 = STATS.seconds, STATS.calls
    sigs = list(dict.fromkeys([call_signature(c) for _, _, c in calls] +
                              [r.signature() for r in regions] +
                              [g.signature() for g in groups]))
    weights = _signature_weights(decider.calib, regions, calls)
    small = SmallUnitGuard(weights, _module_seconds(decider.calib, calls, decider.library),
                           cfg.min_share)
    if decider.can_measure:
        _plan_budget(budget, {s: weights[s] for s in small.kept(weights)}, cfg.max_measured)
    elif cfg.trials > 0 and not budget.notes:
        budget.notes.append(f"no {kind_name(tgt)} device here to measure on: the pass decided "
                            "by the analytic cost")
    kept = small.kept(sigs)
    decider.plan_builds(len(kept))
    gains = _signature_gains(decider.calib, regions, calls, decider.library, weights)
    # at least each signature's floor: below it the forms the rule tests expect go unfound
    payback = SearchPayback({s: gains[s] for s in kept if s in gains}, cfg.search_payback_runs,
                            MIN_SEARCH_S * max(len(kept), 1))
    search = _SearchShare(payback.total(cfg.search_time_s), {s: weights.get(s, 0.0) for s in kept})
    if cfg.derive:
        report.search_note = payback.note(cfg.search_time_s) or ""
    choices: Dict[str, object] = {}

    def choose(unit, sig: str):
        """The choice for ``unit``, decided on the first unit of signature ``sig``."""
        if sig not in choices:
            skip = small.skip(sig)
            choices[sig] = _decide(decider, unit, sig, search, budget) if skip is None else \
                signature_decision(None, unit_operands(unit)[0], skip, weights[sig], weights[sig])
        return choices[sig]

    def prepare(run: list):
        """The measured decisions of a run of units prepared in order (the search of each,
        as :func:`choose` would run it), their builds grouped by :data:`~.batched.TOGETHER`
        (:class:`~.batched.BuildGroup`)."""
        together = BuildGroup()
        for unit, sig in run:
            if sig in choices or small.skip(sig) is not None:
                continue
            with budget.task(sig, ends=False):  # the trials are spent when it is timed
                build = decider.prepare(unit, search.next(sig, decider.search_s))
            if build is not None and len(together.members) >= TOGETHER:
                together = BuildGroup()
            together.add(build)

    decided = _decide_units(groups + regions + calls, choose, cfg.verbose,
                            prepare if cfg.build_together else None)
    with stage("emit"):
        new_mod, report.epilogues = _rewritten(mod, decided)
    if cfg.blocked_layout and decider.library and lib.current_device() == "cpu":
        with stage("layouts"):
            new_mod, report.layouts = _laid_out(new_mod, cfg.pack_weights)
        if cfg.pack_weights:
            with stage("matmul packs"):
                new_mod, report.matmul_packs = packed_matmuls(new_mod, cfg.work_dir)
    if cfg.norm_kernels and decider.library and lib.current_device() == "cpu" \
            and not cfg.orchestrate:
        # after the layouts: the transform into a chain's format after a concatenation of
        # resizes is written by the kernel (orchestration, as for the softmax, owns the resize)
        with stage("resize kernels"):
            new_mod, resizes = resize_kernels(new_mod)
        folds = {**folds, **resizes}
    if cfg.fold_inference:  # after the layouts: a pool in a channels-last chain stays in it
        new_mod, pools = pool_cover(new_mod)
        new_mod, cascaded = pool_cascade(new_mod)
        counts = {"pool_covers_input": pools, "pool_cascade": cascaded}
        folds = {**folds, **{k: v for k, v in counts.items() if v}}
    report.decisions = [d for _, d in decided if d.kind == "call"]
    report.regions = [d for _, d in decided if d.kind != "call"]
    report.inference_folds = folds
    if int8_report is not None and (int8_report.verdicts or any(
            k.startswith("int8_") for k in folds)):
        report.int8 = int8_report
    report.search_s = decider.search_s
    report.derivations = {"cached": decider.candidates.cached,
                          "searched": decider.candidates.searched}
    if decider.remembered is not None and decider.remembered.hits:
        report.derivations["decided before"] = decider.remembered.hits
    report.verify_s = decider.verify_s
    report.tuning_s = STATS.seconds - tuning0
    report.tuning_calls = STATS.calls - calls0
    report.total_s = time.perf_counter() - t_start
    if cfg.verbose:
        LOG.info("%s", report.to_text())
    return new_mod, report


def _int8_choice(decider: Decider) -> Optional[Int8Choice]:
    """The int8 units' timing (:mod:`.int8_choice`): the decider's deciding cost and records
    when it measures; None (the oneDNN form wherever exact) when it does not."""
    timing = decider.timing
    if timing is None or not isinstance(timing.model, ModuleTiming):
        return None
    return Int8Choice(timing.model, timing.records)


def _find_units(mod: "tvm.IRModule", cfg: OllieConfig, native_regions: bool = False):
    """The units to decide: ``(function, variable, call)`` of every derivable call, the regions
    of more than one call (only when deriving, or with ``native_regions``) and the shared-input
    groups (only when deriving), all of the operators ``cfg.targets`` names (when it names
    any)."""
    calls = _derivable_calls(mod)
    regions = [r for r in (find_regions(mod, cfg.region_calls)
                           if cfg.region_calls > 1 and (cfg.derive or native_regions) else [])
               if r.size > 1]
    groups = find_shared_input_groups(mod, cfg.merge_group) if cfg.derive else []
    if cfg.targets:
        wanted = {t if t.startswith("relax.") else f"relax.{t}" for t in cfg.targets}
        calls = [c for c in calls if c[2].op.name in wanted]
        regions = [r for r in regions if r.heavy_call.op.name in wanted]
        groups = [g for g in groups if g.calls[0].op.name in wanted]
    return calls, regions, groups


def _rewritten(mod: "tvm.IRModule", decided: List[Tuple[object, Decision]]):
    """``mod`` with the rewritten regions and groups of ``decided`` (``(unit, decision)``)
    replaced and each call's decision applied (:func:`apply_call_choices`); also the epilogue
    counts."""
    regions = [(u, d) for u, d in decided if d.kind == "region" and d.rewritten]
    groups = [(u, d) for u, d in decided if d.kind == "group" and d.rewritten]
    if regions or groups:
        rewriter = _RegionRewriter(mod, regions, groups)
        mod = mutate_functions(rewriter, mod)
    calls = {d.signature: d for _, d in decided if d.kind == "call"}
    # (a merged group on a library GEMM takes its one bias add as the kernel's epilogue)
    return apply_call_choices(mod, calls, any(d.impl == "native" for _, d in groups))


#: The reason of a group whose calls apart on native kernels won: the group is kept and its
#: calls are decided alone (each then on its native kernel).
_APART = "the calls apart on native kernels win, each decided alone; "


def _failure(err: Exception) -> str:
    """An optional step's failure in one line: the exception's type and its last line."""
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[-1][:200] if text else ''}"


def _laid_out(mod: "tvm.IRModule", pack_weights: bool) -> Tuple["tvm.IRModule", LayoutReport]:
    """``mod`` after :func:`~.blocked_layout.blocked_layout`, or as it is when the layout step
    fails (an optional step never fails the build; the report says why)."""
    try:
        return blocked_layout(mod, pack_weights=pack_weights)
    except Exception as err:  # pylint: disable=broad-except
        why = _failure(err)
        LOG.warning("ollie: the layout step failed (%s); activations stay NCHW", why)
        return mod, LayoutReport(skipped=[f"the layout step failed: {why}"])


def packed_matmuls(mod: "tvm.IRModule", work_dir: Optional[str] = None
                   ) -> Tuple["tvm.IRModule", PackReport]:
    """``mod`` after :func:`~.matmul_pack.pack_matmul_weights` (its times kept in
    ``work_dir``), or as it is when the step fails (an optional step never fails the build;
    the report says why)."""
    try:
        return pack_matmul_weights(mod, work_dir=work_dir)
    except Exception as err:  # pylint: disable=broad-except
        why = _failure(err)
        LOG.warning("ollie: packing the matmul weights failed (%s); they stay plain", why)
        return mod, PackReport(kept=[f"the step failed: {why}"])


def _decide_units(units: list, choose, verbose: bool,
                  prepare=None) -> List[Tuple[object, Decision]]:
    """Decide each unit in order (groups, regions, then ``(function, variable, call)``
    entries), skipping a unit that overlaps one rewritten before it: ``(unit, decision)``
    pairs, each decision its signature's bound to the unit (:meth:`Decision.for_unit`).

    ``prepare(run)``, when given, is called with the ``(unit, signature)`` of each *run*, in
    order: the units from the next one to decide up to the first that overlaps the rewritten
    units or an earlier unit of the run. No decision in a run can make a later unit of it
    skipped, so the run is what would be decided one after the other, and its decisions'
    builds can be prepared together (:meth:`~.decide.Decider.prepare`)."""
    decided: List[Tuple[object, Decision]] = []
    inside: Set[int] = set()  # the calls (and region bindings) rewritten units replace
    identities = [None] * len(units)

    def identity_of(at):
        if identities[at] is None:
            unit, ident = _identity(units[at])
            identities[at] = (unit, ident, _replaced(unit))
        return identities[at]

    prepared_to = 0
    for at in range(len(units)):
        unit, identity, replaced = identity_of(at)
        if replaced & inside:
            continue
        if prepare is not None and at >= prepared_to:
            run, taken = [], set(inside)
            for k in range(at, len(units)):
                if identity_of(k)[2] & taken:
                    break
                taken |= identity_of(k)[2]
                run.append((identity_of(k)[0], identity_of(k)[1]["signature"]))
            prepared_to = at + len(run)
            prepare(run)
        d = choose(unit, identity["signature"]).for_unit(**identity)
        if d.kind == "group" and d.program is None and d.rewritten:
            d = d.kept(_APART)
        decided.append((unit, d))
        log = LOG.info if (verbose or d.rewritten) else LOG.debug
        if d.kind == "call":
            log("ollie: %s.%s %s -> %s (%s)", d.function, d.var_name, d.signature, d.chosen,
                d.reason)
        else:
            log("ollie: %s %s.%s [%s] -> %s (%s)", d.kind, d.function, d.var_name, d.contents,
                d.chosen, d.reason)
        if d.rewritten:
            inside |= replaced
    return decided


def _identity(entry) -> Tuple[object, Dict[str, str]]:
    """The unit of an entry (a region, a group, or a ``(function, variable, call)``) and the
    fields that name it in its :class:`~.decision.Decision`."""
    if isinstance(entry, tuple):
        fname, vname, call = entry
        return call, dict(kind="call", function=fname, var_name=vname, op_name=call.op.name,
                          signature=call_signature(call))
    if is_group(entry):
        return entry, dict(kind="group", function=entry.function,
                           var_name=", ".join(_var_name(v) for v in entry.outputs),
                           signature=entry.signature(), contents=entry.describe(),
                           expression=" ; ".join(str(e) for e in entry.lifts()))
    return entry, dict(kind="region", function=entry.function,
                       var_name=_var_name(entry.output), signature=entry.signature(),
                       contents=entry.describe(), expression=str(entry.lift()))


def _replaced(unit) -> Set[int]:
    """Hashes of the expressions ``unit`` replaces when rewritten: a group's calls, a region's
    bindings (its calls and what lies between them), a call itself."""
    if is_group(unit):
        return {hash(c) for c in unit.original_calls}
    if is_region(unit):
        return {hash(b.value) for b in unit.bindings}
    return {hash(unit)}


def apply_call_choices(mod: "tvm.IRModule", choices: Dict[str, object],
                       fold: bool = False) -> Tuple["tvm.IRModule", Dict[str, int]]:
    """Replace every static derivable call whose signature has a rewriting choice in
    ``choices`` (``{call_signature: Decision}``) by its program, then fold the consumers of
    library kernels into them (:func:`~.epilogue.fuse_epilogues`; also when ``fold``).

    The last step of :func:`optimize_module`, apart so that a caller holding the decisions
    already (the joint build's never-worse guard) rebuilds the sequential module without
    deciding again. Returns the module and the epilogues folded per kernel kind.
    """
    rewrites = any(ch.rewritten for ch in choices.values())
    if rewrites:
        rewriter = _Rewriter(mod, choices)
        mod = mutate_functions(rewriter, mod)
    if rewrites or fold:
        return fuse_epilogues(mod)
    return mod, {}


class _SearchShare:
    """The module's derivation time shared by the signatures still to decide, by their
    estimated time (``weights``: the seconds their calls take), each at least ``floor_s``.

    Of the time left ``R`` (the total less what the searches so far spent), a signature of
    weight ``w`` among the pending ones ``P`` (itself included) gets::

        share = floor_s + max(0, R - floor_s * |P|) * w / sum(w_p for p in P)

    (equal parts when no pending signature has a weight). A 1 MFLOP convolution thus gets the
    floor while a 1 GFLOP one gets the rest; what a search leaves unspent (it stopped early)
    flows on to the signatures after it.
    """

    def __init__(self, total_s: float, weights: Dict[str, float],
                 floor_s: float = MIN_SEARCH_S):
        self.total_s, self.floor_s = float(total_s), float(floor_s)
        self.pending = {sig: max(float(w), 0.0) for sig, w in weights.items()}

    def next(self, sig: str, spent_s: float) -> float:
        """The search seconds of ``sig`` (decided now), given ``spent_s`` spent so far."""
        weight = self.pending.pop(sig, 0.0)
        count = len(self.pending) + 1
        total_w = sum(self.pending.values()) + weight
        spare = max(0.0, self.total_s - spent_s - self.floor_s * count)
        part = weight / total_w if total_w > 0 else 1.0 / count
        return self.floor_s + spare * part


def _decide(decider: Decider, unit, sig: str, search: _SearchShare, budget: TrialBudget):
    """The decider's choice for a unit, its trials drawn from the unit's task of ``budget``."""
    with budget.task(sig):
        return decider.decide(unit, search.next(sig, decider.search_s))


def _unit_seconds(unit, calib: Calibration) -> float:
    """Analytic seconds of a call or region as TVM builds it (its share of the module)."""
    if getattr(unit, "is_region", False):
        return region_seconds(unit, calib)
    try:
        return analytic.original_seconds(lift_relax_call(unit), unit.op.name, calib)
    except LiftError:
        return 0.0


def _signature_weights(calib: Calibration, regions, calls) -> Dict[str, float]:
    """Per signature, its calls' estimated seconds (the time at stake in its choice)."""
    weights: Dict[str, float] = {}
    for unit in list(regions) + [c for _, _, c in calls]:
        sig = unit.signature() if getattr(unit, "is_region", False) else call_signature(unit)
        weights[sig] = weights.get(sig, 0.0) + _unit_seconds(unit, calib)
    return weights


def _signature_gains(calib: Calibration, regions, calls, library: bool,
                     weights: Dict[str, float]) -> Dict[str, float]:
    """Per signature, the most its search could gain (:class:`~tvm_ollie.tune.budget.
    SearchPayback`): a call's best known estimate (:func:`_known_seconds`) less its
    roofline bound, summed over its calls; a region's, the sum of its calls' best known
    estimates less the bound of its expression (its whole weight where it does not lift)."""
    gains: Dict[str, float] = {}
    units = [(r.signature(), r, r.lift, r.calls) for r in regions]
    units += [(call_signature(c), c, functools.partial(lift_relax_call, c), [c])
              for _, _, c in calls]
    for sig, unit, lift, members in units:
        try:
            gain = sum(_known_seconds(c, calib, library) for c in members) - \
                analytic.least_seconds(lift(), calib, library)
        except LiftError:
            gain = weights.get(sig, 0.0)
        gains[sig] = gains.get(sig, 0.0) + max(gain, 0.0)
    return gains


def _known_seconds(call, calib: Calibration, library: bool) -> float:
    """A call's estimate on the cheaper of TVM's kernel and the native library's."""
    seconds = _unit_seconds(call, calib)
    if library and lib.call_form(call) is not None:
        try:
            native = analytic.original_seconds(lift_relax_call(call), call.op.name, calib,
                                               "native")
        except LiftError:
            native = seconds
        seconds = min(seconds, native)
    return seconds


def _module_seconds(calib: Calibration, calls, library: bool) -> float:
    """The module's estimated time as :class:`~tvm_ollie.tune.budget.SmallUnitGuard` weighs
    it: its derivable calls', each once, each on the cheaper of TVM's kernel and the native
    library's (with ``library``). The lower of the two: an operator TVM's default schedule
    runs badly (the demo's transposed convolution, estimated 10x its library kernel) must
    not make the others look small."""
    return sum(_known_seconds(call, calib, library) for _, _, call in calls)


def _plan_budget(budget: TrialBudget, weights: Dict[str, float], max_measured: int) -> None:
    """One task per signature, weighted by its calls' estimated time (``weights``), split
    among the original and up to ``max_measured`` measured alternatives."""
    for sig, weight in weights.items():
        budget.add_task(sig, weight, parts=1 + max_measured)


@tvm.transform.module_pass(opt_level=0, name="OllieOptimize")
class OllieOptimize:
    """The derivation rewrite as a module pass (see :func:`optimize_module`).

    ``OllieOptimize(config=OllieConfig(...))``, or overrides of the config's fields as keywords
    (``OllieOptimize(target="llvm", trials=0)``, validated here by
    :meth:`~tvm_ollie.config.OllieConfig.replace`); without ``config`` the pass reads
    :func:`~tvm_ollie.config.current_config` when it runs, so ``with config_scope(cfg):``
    configures it inside ``tvm.compile``. The target defaults to ``Target.current()`` when the
    pass runs (llvm if none). ``timer``, ``checker``, ``chooser`` and ``cost_model`` are the
    test hooks of :func:`optimize_module`. The report of the last run is ``.last_report``.
    """

    def __init__(self, target=None, config: Optional[OllieConfig] = None, *,
                 timer: Optional[Timer] = None, checker: Union[Checker, CheckFn, None] = None,
                 chooser: Optional[Chooser] = None,
                 cost_model: Optional[UnitCostModel] = None, **options: Any):
        self.config = config
        self.overrides = dict(target=target, **options)
        resolve_config(config, **self.overrides)  # invalid options fail here, not mid-compile
        self.hooks = dict(timer=timer, checker=checker, chooser=chooser, cost_model=cost_model)
        self.last_report: Optional[OptimizeReport] = None

    def transform_module(self, mod: "tvm.IRModule", ctx) -> "tvm.IRModule":  # noqa: ARG002
        cfg = resolve_config(self.config, **self.overrides)
        if cfg.target is None:
            cfg = cfg.replace(target=tvm.target.Target.current(allow_none=True) or "llvm")
        new_mod, report = optimize_module(mod, config=cfg, **self.hooks)
        self.last_report = report
        return new_mod
