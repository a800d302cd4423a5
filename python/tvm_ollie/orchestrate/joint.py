"""Joint selection: derivation alternatives enter the primitive graph next to the original.

The sequential build decides each heavy call first (:class:`~tvm_ollie.transform.decide.Decider`:
original, native library kernel or derived program) and orchestrates what is left. Here every
verified alternative of a heavy call ``v = conv2d(x, w)`` is emitted into the block right
after it, its result bound to ``v__alt<k>`` (:func:`offer_alternatives`); nothing reads it.
After legalization the orchestration finds these *groups* (:func:`find_groups`) and selects
with one binary program in which

* an alternative's result is an *alias* of ``v``: its candidates produce the value ``v`` for
  the "outputs produced" and "inputs available" rows (:attr:`Group.canon`), so a reader of
  ``v`` is satisfied by whichever alternative is chosen, and the cheapest combination of
  derivation and kernel boundaries wins;
* the "cover" row of the original call is replaced by one row over the candidates holding the
  last node of any alternative (some alternative computes ``v``); an unchosen alternative's
  nodes are not emitted;
* an alternative's nodes read only the call's operands, so they fuse with the operands'
  producers but not with ``v``'s readers: an alternative's epilogue stays its own kernel
  (the original call keeps its usual epilogue fusion). A library call is an opaque kernel.

Costs: a library node costs its calibrated analytic estimate (``Alternative.estimate``). When
the Decider timed the alternatives (untuned check on CPUs, or tuned), each alternative's
candidates holding its last node pay a constant *correction* so that the alternatives' costs
alone (sum of their singleton kernels) differ as the measured times do; fusion gains stay
analytic (:class:`JointCost`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from ..compat import relax, tvm
from .candidates import Candidate, make_candidate
from .cost import AnalyticCost, CostModel, LinearMeasuredCost, MeasuredCost
from .graph import PrimitiveGraph

__all__ = ["AltInfo", "Group", "JointCost", "JointTable", "find_groups", "offer_alternatives",
           "ALT_TAG"]

#: Suffix of an alternative's result variable: ``<original>__alt<k>``.
ALT_TAG = "__alt"
_ALT_RE = re.compile(r"^(.*)__alt(\d+)$")


@dataclass
class AltInfo:
    """One offered alternative of a heavy call (``k=0`` is the original)."""

    label: str
    estimate_s: float
    measured_s: Optional[float] = None
    sequential: bool = False  # the Decider's own choice
    native: bool = False  # runs library kernels (costed by the estimate, see JointCost)


@dataclass
class JointTable:
    """Alternatives offered per original variable name (``alts[name][k]``), filled by
    :func:`offer_alternatives` and read by the orchestration (names survive legalization)."""

    alts: Dict[str, List[AltInfo]] = field(default_factory=dict)
    notes: List[str] = field(default_factory=list)
    chosen: Dict[str, str] = field(default_factory=dict)  # filled by the orchestration

    def __bool__(self) -> bool:
        return bool(self.alts)


@dataclass
class Group:
    """The alternatives of one heavy call found in a primitive graph.

    Attributes
    ----------
    var : relax.Var
        The original call's result (the logical value).
    nodes : list of list of int
        Node indices of each alternative (``[0]``: the original call's node).
    lasts : list of int
        The node producing each alternative's result.
    infos : list of AltInfo
        What each alternative is.
    """

    var: object
    nodes: List[List[int]]
    lasts: List[int]
    infos: List[AltInfo]

    @property
    def sequential(self) -> int:
        """Index of the Decider's choice (0 when it kept the original)."""
        return next((k for k, a in enumerate(self.infos) if a.sequential), 0)


def find_groups(graph: PrimitiveGraph, table: Optional[JointTable]) -> List[Group]:
    """The groups of ``table`` present in ``graph``; adds each alternative's result to
    ``graph.graph_outputs`` (so that its candidates output it)."""
    if not table:
        return []
    by_name: Dict[str, int] = {}
    groups: Dict[int, Group] = {}
    for node in graph.nodes:
        name = node.var.name
        hit = _ALT_RE.match(name)
        if hit is None:
            by_name[name] = node.index
            continue
        base, k = hit.group(1), int(hit.group(2))
        infos = table.alts.get(base)
        orig = by_name.get(base)
        if infos is None or orig is None or k >= len(infos) or node.kind == "opaque" and \
                not isinstance(node.binding.value, relax.Call):
            continue
        group = groups.setdefault(orig, Group(graph.nodes[orig].var, [[orig]], [orig],
                                              [infos[0]]))
        start = group.lasts[-1]
        members = [i for i in graph.members(graph.anc[node.index]) if i > start]
        group.nodes.append(members + [node.index])
        group.lasts.append(node.index)
        group.infos.append(infos[k])
        graph.graph_outputs.append(node.var)
    return [g for g in groups.values() if len(g.nodes) > 1]


def _is_library(node) -> bool:
    """A native library call (``call_dps_packed`` of a ``tvm_ollie.`` kernel)."""
    return node.name.startswith("tvm_ollie.")


def canon_map(groups: List[Group], graph: PrimitiveGraph) -> Dict[object, object]:
    """Alternative result -> the original value it stands for."""
    return {graph.nodes[last].var: g.var for g in groups for last in g.lasts[1:]}


def alt_nodes(groups: List[Group]) -> set:
    """Nodes of every non-original alternative."""
    return {i for g in groups for nodes in g.nodes[1:] for i in nodes}


def banned_for(groups: List[Group], cands: List[Candidate], keep) -> List[int]:
    """Candidates holding a node of an alternative other than ``keep(group)``'s."""
    banned_nodes = 0
    for g in groups:
        for k, nodes in enumerate(g.nodes):
            if k != keep(g):
                for i in nodes:
                    banned_nodes |= 1 << i
    return [j for j, c in enumerate(cands) if c.mask & banned_nodes]


def chosen_alternative(group: Group, chosen: List[Candidate]) -> int:
    """Index of the alternative whose last node a chosen kernel holds (0 if none)."""
    for k, last in enumerate(group.lasts):
        if any(c.mask >> last & 1 for c in chosen):
            return k
    return 0


class JointCost(CostModel):
    """An inner cost model plus the library estimates and measured corrections of the
    module docstring."""

    def __init__(self, inner: CostModel, groups: List[Group], graph: PrimitiveGraph):
        self.inner, self.name = inner, f"{inner.name}+joint"
        self.fixed: Dict[int, float] = {}
        for g in groups:
            for k, info in enumerate(g.infos):
                calls = [i for i in g.nodes[k] if _is_library(graph.nodes[i])]
                for i in calls if info.native else []:
                    self.fixed[i] = info.estimate_s / len(calls)
        self.correction: Dict[int, float] = {}
        for g in groups:
            if any(info.measured_s is None for info in g.infos):
                continue
            alone = [sum(self._seconds(graph, make_candidate(graph, 1 << i)) for i in nodes)
                     for nodes in g.nodes]
            raw = [(info.measured_s - g.infos[0].measured_s) - (a - alone[0])
                   for info, a in zip(g.infos, alone)]
            low = min(raw)
            for last, r in zip(g.lasts, raw):
                self.correction[last] = r - low

    def _seconds(self, graph: PrimitiveGraph, cand: Candidate) -> float:
        if cand.size == 1 and cand.nodes[0] in self.fixed:
            return self.fixed[cand.nodes[0]]
        return self.inner.kernel_seconds(graph, cand)

    def kernel_seconds(self, graph: PrimitiveGraph, cand: Candidate) -> float:
        extra = sum(c for last, c in self.correction.items() if cand.mask >> last & 1)
        return self._seconds(graph, cand) + extra


# -- offering alternatives (before legalization) ---------------------------------------------


def offer_alternatives(mod: "tvm.IRModule", decider, max_alternatives: int = 2,
                       budget_s: float = 2.0) -> Tuple["tvm.IRModule", JointTable, list]:
    """Emit the verified alternatives of every static heavy call after it (module docstring).

    For each call signature the ``decider`` decides (its choice is the *sequential* one and
    is always offered when it rewrites) and up to ``max_alternatives`` alternatives in all
    (cheapest analytic estimate first, each verified by the Decider's check) are offered.
    Returns the module, the table, and ``(function, var, signature, choice)`` per call.
    """
    # pylint: disable=import-outside-toplevel
    from ..transform.decide import DERIVABLE_OPS, call_signature

    offers: Dict[str, list] = {}
    table = JointTable()
    decided = []

    @relax.expr_functor.mutator
    class _Offer(relax.PyExprMutator):
        def visit_var_binding_(self, binding):  # pylint: disable=arguments-renamed
            super().visit_var_binding_(binding)
            call = binding.value
            if not isinstance(call, relax.Call) or not isinstance(call.op, tvm.ir.Op) \
                    or call.op.name not in DERIVABLE_OPS or not _static(call) \
                    or not self.builder_.current_block_is_dataflow():
                return
            sig = call_signature(call)
            if sig not in offers:
                offers[sig] = _offers_of(decider, call, max_alternatives, budget_s)
            choice, alts = offers[sig]
            name = binding.var.name
            decided.append((name, sig, choice))
            if len(alts) < 2 or _ALT_RE.match(name) or name in table.alts:
                return
            from ..transform.emit import emit_program
            from ..transform.units import operand_values, original_form

            names, values = operand_values(call)
            values = [self.visit_expr(v) for v in values]
            infos = [alts[0][1]]
            k, emitted = 0, []
            for alt, info in alts[1:]:
                try:
                    if alt.program is None:
                        args = [self.visit_expr(a) for a in call.args]
                        expr = original_form(call, args, alt.impl)
                    else:
                        mapping = {pn: v for pn, v in zip(choice.names or names, values)}
                        expr = emit_program(self.builder_, alt.program, mapping,
                                            tuple(int(s) for s in call.ty.shape),
                                            impl=alt.impl, name="ollie_alt")
                    if any(tvm.ir.structural_equal(expr, e) for e in emitted):
                        continue  # e.g. a one-stage program on the library = original [native]
                    emitted.append(expr)
                    k += 1
                    # a block output: FoldConstant drops unused dataflow bindings
                    self.builder_.emit_output(expr, name_hint=f"{name}{ALT_TAG}{k}")
                    infos.append(info)
                except Exception as err:  # pylint: disable=broad-except
                    table.notes.append(f"{name}: {info.label} not emitted: "
                                       f"{type(err).__name__}: {str(err)[:100]}")
            if k:
                table.alts[name] = infos

    offer = _Offer(mod)
    for gv, func in mod.functions_items():
        if isinstance(func, relax.Function):
            offer.builder_.update_func(gv, offer.visit_expr(func))
    return offer.builder_.get(), table, decided


def make_decider(target, **opts):
    """A :class:`~tvm_ollie.transform.decide.Decider` that derives each signature once
    (``decide`` and :func:`offer_alternatives` both ask for the alternatives)."""
    from ..transform.decide import Decider, unit_signature  # pylint: disable=C0415

    class _Memo(Decider):
        def __init__(self, *args, **kw):
            super().__init__(*args, **kw)
            self._alts: Dict[str, tuple] = {}

        def alternatives(self, call, budget_s):
            sig = unit_signature(call)
            if sig not in self._alts:
                self._alts[sig] = super().alternatives(call, budget_s)
            return self._alts[sig]

    return _Memo(target, **opts)


def _static(call) -> bool:
    from ..transform.regions import static_tensor  # pylint: disable=import-outside-toplevel

    return all(static_tensor(e) for e in [call] + list(call.args))


def _offers_of(decider, call, max_alternatives: int, budget_s: float):
    """``(choice, [(alternative, AltInfo)...])``: the original first, then the sequential
    choice, then the cheapest verified others."""
    choice = decider.decide(call, budget_s)
    alts, _, _ = decider.alternatives(call, budget_s)
    base = alts[0]
    measured = decider.measures

    def info(alt, sequential):
        seconds = decider.cost(call, alt) if measured else None
        return AltInfo(alt.label, alt.estimate, seconds, sequential, alt.impl != "tvm")

    out = [(base, info(base, not choice.rewritten))]
    others = sorted(alts[1:], key=lambda a: (a.estimate, a.label))
    if choice.rewritten:
        first = [a for a in others if a.label == choice.label]
        others = first + [a for a in others if a.label != choice.label]
    tries = 0
    for alt in others:
        if len(out) > max_alternatives or tries >= max_alternatives + 1:
            break
        sequential = choice.rewritten and alt.label == choice.label
        if not sequential:
            tries += 1
            ok, _ = decider.check(call, alt)
            if not ok:
                continue
        item = info(alt, sequential)
        if measured and item.measured_s is None:
            continue
        out.append((alt, item))
    return choice, out


def keep_alternatives(inner: "tvm.transform.Pass") -> "tvm.transform.Pass":
    """``inner`` (``FoldConstant``, which drops unused bindings) with every function's
    alternative results returned alongside its result meanwhile, so that they survive."""

    @tvm.transform.module_pass(opt_level=0, name="KeepAlternatives")
    def _keep(mod: "tvm.IRModule", _ctx) -> "tvm.IRModule":
        saved = {}
        for gv, func in mod.functions_items():
            if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
                continue
            alts = [b.var for blk in func.body.blocks for b in blk.bindings
                    if _ALT_RE.match(b.var.name) and not isinstance(b.var, relax.DataflowVar)]
            if alts:
                saved[gv.name_hint] = func
                ret = relax.Tuple([func.body.body] + alts)
                ret_ty = relax.TupleType([func.ret_ty] + [a.ty for a in alts])
                body = relax.BlockBuilder().normalize(relax.SeqExpr(func.body.blocks, ret))
                mod[gv] = relax.Function(func.params, body, ret_ty, func.is_pure, func.attrs)
        out = inner(mod)
        for name, old in saved.items():
            gv = out.get_global_var(name)
            new = out[gv]
            body = relax.SeqExpr(new.body.blocks, new.body.body.fields[0])
            out[gv] = relax.Function(new.params, body, old.ret_ty, old.is_pure, old.attrs)
        return out

    return _keep


# -- the joint build --------------------------------------------------------------------------

#: :class:`~tvm_ollie.transform.decide.Decider` options that :func:`joint_build` passes on.
_DECIDER_OPTS = ("max_depth", "calibration", "max_measured", "max_states", "check_untuned",
                 "library", "derive", "timer", "checker", "chooser", "cost_model")


def _rewrite_regions(mod, tgt, work_dir, opts):
    """The sequential pass with every single call held to the original: regions of several
    calls (:mod:`tvm_ollie.transform.regions`) are decided and rewritten as in the sequential
    build; the heavy calls are left for the joint selection."""
    # pylint: disable=import-outside-toplevel
    from ..transform.decide import Alternative
    from ..transform.optimize import optimize_module

    def regions_only(sig: str, _alts):
        return None if sig.startswith("region[") else Alternative(None, "tvm", 0.0)

    ropts = {k: v for k, v in opts.items() if k != "chooser"}
    return optimize_module(mod, tgt, work_dir=work_dir, chooser=regions_only, **ropts)


def joint_build(mod: "tvm.IRModule", target, work_dir: Optional[str] = None,
                max_alternatives: int = 2, **opts):
    """Build ``mod`` untuned with joint selection; return ``(executable, OptimizeReport,
    OrchestrationReport)``.

    The Decider of ``opts`` (``time_budget_s`` shared by the call signatures, as in
    :func:`~tvm_ollie.transform.optimize.optimize_module`) offers the alternatives, the
    orchestration chooses among them and the kernel boundaries at once. Regions of several
    calls are decided first, as in the sequential build (:func:`_rewrite_regions`). With a
    ``work_dir``
    the candidates holding a linear primitive are timed (:class:`~.cost.LinearMeasuredCost`,
    cached there), the others costed analytically.
    """
    # pylint: disable=import-outside-toplevel
    import time

    from ..transform.decide import DERIVABLE_OPS, call_signature
    from ..transform.report import OpDecision, OptimizeReport
    from ..tune.metaschedule import normalize_target
    from .fission import fission
    from .pipeline import ollie_orchestration

    start = time.perf_counter()
    tgt = normalize_target(target)
    mod, regions = _rewrite_regions(mod, tgt, work_dir, opts)
    with tgt:
        mod = fission(mod)[0]
    dopts = {k: opts[k] for k in _DECIDER_OPTS if k in opts}
    decider = make_decider(tgt, work_dir=work_dir, **dopts)
    sigs = set()
    for _, func in mod.functions_items():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, lambda e: sigs.add(call_signature(e)) if (
                isinstance(e, relax.Call) and isinstance(e.op, tvm.ir.Op)
                and e.op.name in DERIVABLE_OPS and _static(e)) else None)
    budget = max(0.5, float(opts.get("time_budget_s", 20.0)) / max(len(sigs), 1))
    offered, table, decided = offer_alternatives(mod, decider, max_alternatives, budget)
    cost = None
    if work_dir:  # measured linear kernels, cached by structural hash in work_dir
        cost = LinearMeasuredCost(MeasuredCost(tgt, work_dir), AnalyticCost(tgt))
    reports: list = []
    ex = tvm.compile(offered, target=tgt, relax_pipeline=ollie_orchestration(
        tgt, cost=cost, reports=reports, joint=table))
    report = OptimizeReport(target=tgt.kind.name)
    report.regions = regions.regions
    for name, sig, choice in decided:
        infos = {a.label: a for a in table.alts.get(name, [])}
        label = table.chosen.get(name, "original")
        base, got = infos.get("original"), infos.get(label)
        before = (base.measured_s or base.estimate_s) if base else choice.before_s
        after = (got.measured_s or got.estimate_s) if got else before
        report.decisions.append(OpDecision(
            "main", name, sig.split(" ", 1)[0], sig, chosen=label,
            reason=f"joint selection among {len(infos) or 1} alternatives "
                   f"(sequential: {choice.label}; {choice.reason})",
            explain=choice.explain if label == choice.label else "", before_s=before,
            after_s=after, measured=bool(got and got.measured_s is not None),
            candidates=choice.candidates))
    report.search_s = decider.search_s + regions.search_s
    report.verify_s = decider.verify_s + regions.verify_s
    report.total_s = time.perf_counter() - start
    return ex, report, (reports[-1] if reports else None)
