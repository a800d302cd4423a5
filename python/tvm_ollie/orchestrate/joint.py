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
  producers but not with ``v``'s readers (the original call keeps its usual epilogue fusion).
  A library call is an opaque kernel, so a library alternative is also offered with its
  *epilogue folded*: when ``v``'s consumers (``z = add(v, bias)``, ``add(z, residual)``, an
  activation) are what :func:`~tvm_ollie.transform.epilogue.fuse_epilogues` folds in the
  sequential build (same guards: :func:`~tvm_ollie.transform.epilogue.fold_chain`), the folded
  call ``K(attrs + bias/res/act, ...)`` is emitted after the last consumer ``c`` as one more
  alternative (:func:`offer_folded`). Its result stands for ``c``, not ``v``: it covers ``v``
  and every node on the paths from ``v`` to ``c`` (:attr:`Group.absorbed`), whose cover rows
  accept it, and it shares the nodes before the library call with the alternative it extends.

Costs: a library node costs its calibrated analytic estimate (``Alternative.estimate``), folded
epilogue or not (the kernel applies it in its output pass). When the Decider timed the
alternatives (untuned check on CPUs, or tuned), each alternative's candidates holding its last
node pay a constant *correction* so that the alternatives' costs alone (sum of their singleton
kernels) differ as the measured times do, plus the Decider's acceptance margin on every
alternative but the original (the Decider takes an alternative only when it is ``MARGIN``
faster); fusion gains stay analytic (:class:`JointCost`). A folded alternative is timed as the
alternative it extends.
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
           "offer_folded", "ALT_TAG"]

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
    base: Optional[int] = None  # a folded epilogue: the alternative whose library call it extends
    stands_for: str = ""  # a folded epilogue: the last folded consumer (its result's value)


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
    values : list of relax.Var
        The value each alternative's result stands for (``var``, or for a folded epilogue the
        last folded consumer's result).
    absorbed : list of list of int
        Nodes besides the original call that each alternative makes unnecessary (a folded
        epilogue: the nodes from ``var`` to its value; otherwise none).
    extends : list of int or None
        For a folded epilogue, the index of the alternative it extends.
    """

    var: object
    nodes: List[List[int]]
    lasts: List[int]
    infos: List[AltInfo]
    values: List[object] = field(default_factory=list)
    absorbed: List[List[int]] = field(default_factory=list)
    extends: List[Optional[int]] = field(default_factory=list)

    def add(self, nodes: List[int], info: AltInfo, value, absorbed: List[int],
            extends: Optional[int] = None) -> None:
        """Append an alternative (its last node is ``nodes[-1]``)."""
        self.nodes.append(nodes)
        self.lasts.append(nodes[-1])
        self.infos.append(info)
        self.values.append(value)
        self.absorbed.append(absorbed)
        self.extends.append(extends)

    def drop(self, k: int) -> List[int]:
        """Remove alternative ``k`` (a folded epilogue: nothing extends it); return its nodes
        that no other alternative holds."""
        nodes = self.nodes[k]
        for items in (self.nodes, self.lasts, self.infos, self.values, self.absorbed,
                      self.extends):
            del items[k]
        self.extends = [None if e is None else e - (e > k) for e in self.extends]
        held = {i for other in self.nodes for i in other}
        return [i for i in nodes if i not in held]

    @property
    def sequential(self) -> int:
        """Index of the Decider's choice (0 when it kept the original); the choice with its
        epilogue folded when offered, as the sequential build folds it."""
        return max((k for k, a in enumerate(self.infos) if a.sequential), default=0)

    def covering(self, node: int) -> List[int]:
        """Alternatives whose chosen last node makes ``node`` unnecessary (for the original
        call: every alternative)."""
        if node == self.lasts[0]:
            return list(range(len(self.lasts)))
        return [k for k, extra in enumerate(self.absorbed) if node in extra]


def find_groups(graph: PrimitiveGraph, table: Optional[JointTable],
                dead: Optional[List[int]] = None) -> List[Group]:
    """The groups of ``table`` present in ``graph``; adds each alternative's result to
    ``graph.graph_outputs`` (so that its candidates output it). Nodes of an alternative that
    cannot be placed (a folded epilogue whose consumers are not found as offered) are added to
    ``dead``: nothing needs them and they are not emitted."""
    if not table:
        return []
    by_name: Dict[str, int] = {}
    groups: Dict[int, Group] = {}
    where: Dict[Tuple[int, int], int] = {}  # (original node, table index) -> group index
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
            if dead is not None and infos is not None:
                dead.extend(_own_nodes(graph, -1 if orig is None else orig, node.index))
            continue
        group = groups.setdefault(orig, Group(graph.nodes[orig].var, [[orig]], [orig],
                                              [infos[0]], [graph.nodes[orig].var], [[]],
                                              [None]))
        info = infos[k]
        if info.base is None:
            start = group.lasts[-1]
            members = [i for i in graph.members(graph.anc[node.index]) if i > start]
            group.add(members + [node.index], info, group.var, [])
        else:
            base_k = where.get((orig, info.base))
            placed = _folded_nodes(graph, group, base_k, node.index,
                                   by_name.get(info.stands_for))
            if placed is None:
                if dead is not None:
                    dead.extend(_own_nodes(graph, orig, node.index))
                continue
            nodes, value, absorbed = placed
            group.add(nodes, info, value, absorbed, base_k)
        where[(orig, k)] = len(group.nodes) - 1
        graph.graph_outputs.append(node.var)
    return [g for g in groups.values() if len(g.nodes) > 1]


def _own_nodes(graph: PrimitiveGraph, orig: int, last: int) -> List[int]:
    """Node ``last`` and the nodes after ``orig`` that only it reads (a folded call and the
    views of its bias), ascending."""
    own = {last}
    for i in reversed(graph.members(graph.anc[last])):
        readers = {r for v in graph.nodes[i].outputs for r in graph.consumers.get(v, ())}
        if i > orig and readers and readers <= own and not any(
                graph.is_output(v) for v in graph.nodes[i].outputs):
            own.add(i)
    return sorted(own)


def _folded_nodes(graph: PrimitiveGraph, group: Group, base: Optional[int], last: int,
                  stop: Optional[int]):
    """``(nodes, value, absorbed)`` of a folded-epilogue alternative whose library call is
    node ``last`` and extends alternative ``base`` of ``group``, folding the consumers up to
    node ``stop``; None when the offered chain is not there as offered (every node from the
    call's result to ``stop`` read only inside it, nothing visible after the block but
    ``stop``'s result)."""
    orig = group.lasts[0]
    if base is None or stop is None or not graph.desc[orig] >> stop & 1:
        return None
    absorbed = graph.members(graph.desc[orig] & graph.anc[stop]) + [stop]
    inside = set(absorbed) | {orig}
    for i in [orig] + absorbed[:-1]:
        for var in graph.nodes[i].outputs:
            if graph.is_output(var) or any(r not in inside
                                           for r in graph.consumers.get(var, ())):
                return None
    own = _own_nodes(graph, orig, last)
    prefix = [i for i in group.nodes[base][:-1] if i not in own]
    return prefix + own, graph.nodes[stop].var, absorbed


def _is_library(node) -> bool:
    """A native library call (``call_dps_packed`` of a ``tvm_ollie.`` kernel)."""
    return node.name.startswith("tvm_ollie.")


def canon_map(groups: List[Group], graph: PrimitiveGraph) -> Dict[object, object]:
    """Alternative result -> the value it stands for."""
    return {graph.nodes[last].var: value for g in groups
            for last, value in zip(g.lasts[1:], g.values[1:])}


def alt_nodes(groups: List[Group]) -> set:
    """Nodes of every non-original alternative."""
    return {i for g in groups for nodes in g.nodes[1:] for i in nodes}


def banned_for(groups: List[Group], cands: List[Candidate], keep) -> List[int]:
    """Candidates holding a node of an alternative other than ``keep(group)``'s (nodes it
    shares with ``keep(group)`` are not banned)."""
    banned_nodes = 0
    for g in groups:
        kept = set(g.nodes[keep(g)])
        for k, nodes in enumerate(g.nodes):
            if k != keep(g):
                for i in nodes:
                    if i not in kept:
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
    module docstring.

    With measured times ``t_k`` (``t_0``: the original) and analytic singleton sums ``a_k`` of
    each alternative's nodes, the candidates holding alternative ``k``'s last node pay
    ``r_k - min_j r_j`` with ``r_k = (t_k - t_0) + [k > 0] MARGIN t_0 - (a_k - a_0)``: alone,
    alternative ``k`` then costs ``t_k + [k > 0] MARGIN t_0`` up to a constant, which is what
    the Decider compares (an alternative is taken when ``t_k < (1 - MARGIN) t_0``).
    """

    def __init__(self, inner: CostModel, groups: List[Group], graph: PrimitiveGraph):
        from ..transform.decide import MARGIN  # pylint: disable=import-outside-toplevel

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
            base = g.infos[0].measured_s
            raw = [(info.measured_s - base) + (MARGIN * base if k else 0.0) - (a - alone[0])
                   for k, (info, a) in enumerate(zip(g.infos, alone))]
            # a folded epilogue runs the library call it extends: the same correction
            raw = [r if e is None else raw[e] for r, e in zip(raw, g.extends)]
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


def offer_folded(mod: "tvm.IRModule", table: JointTable) -> "tvm.IRModule":
    """Each library alternative of ``table`` again with its epilogue folded (module docstring):
    ``v__alt<j> = K(attrs + bias/res/act, ...)`` after the last consumer that
    :func:`~tvm_ollie.transform.epilogue.fold_chain` folds, added to ``table`` as
    alternative ``j`` (``base``: the alternative it extends; ``stands_for``: that consumer)."""
    # pylint: disable=import-outside-toplevel
    from ..codegen import library as lib
    from ..transform.epilogue import fold_chain, use_counts

    if not table:
        return mod
    updates = {}
    for gv, func in mod.functions_items():
        if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
            continue
        uses = use_counts(func)
        blocks = list(func.body.blocks)
        for bi, block in enumerate(blocks):
            if isinstance(block, relax.DataflowBlock):
                bindings = _folded_bindings(list(block.bindings), table, uses, lib, fold_chain)
                if bindings is not None:
                    blocks[bi] = relax.DataflowBlock(bindings)
                    updates[gv] = relax.Function(func.params, relax.SeqExpr(blocks,
                                                                            func.body.body),
                                                 func.ret_ty, func.is_pure, func.attrs)
    if not updates:
        return mod
    out = tvm.IRModule(dict(mod.functions_items()), attrs=mod.attrs)
    for gv, func in updates.items():
        out[gv] = func
    return relax.transform.Normalize()(out)


def _folded_bindings(bindings: list, table: JointTable, uses, lib, fold_chain) -> Optional[list]:
    """The block with the folded alternatives of its library alternatives (None: none)."""
    after: Dict[int, list] = {}
    latest: Dict[str, object] = {}
    bb = relax.BlockBuilder()
    for binding in bindings:
        hit = _ALT_RE.match(binding.var.name)
        if hit is None:
            latest[binding.var.name] = binding.var
            continue
        name, k = hit.group(1), int(hit.group(2))
        infos, found, var = table.alts.get(name), lib.lib_call_of(binding.value), latest.get(name)
        if infos is None or found is None or var is None or k >= len(infos) \
                or infos[k].base is not None:
            continue
        chain = fold_chain(found[0], found[1], var, bindings, uses)
        if chain is None:
            continue
        stop = bindings[chain.consumers[-1]].var
        shape = [int(d) for d in binding.var.ty.shape]
        call = bb.normalize(lib.emit_call(chain.kernel, chain.operands, shape))
        folded = relax.Var(f"{name}{ALT_TAG}{len(infos)}", call.ty)
        after.setdefault(chain.consumers[-1], []).extend(
            chain.pre + [relax.VarBinding(folded, call)])
        base = infos[k]
        infos.append(AltInfo(f"{base.label} + {'+'.join(chain.steps)}", base.estimate_s,
                             base.measured_s, base.sequential, True, base=k,
                             stands_for=stop.name))
    if not after:
        return None
    out = []
    for j, binding in enumerate(bindings):
        out.append(binding)
        out.extend(after.get(j, []))
    return out


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
                max_alternatives: int = 2, guard: bool = False, plan_timer=None, **opts):
    """Build ``mod`` untuned with joint selection; return ``(executable, OptimizeReport,
    OrchestrationReport)``.

    The Decider of ``opts`` (``time_budget_s`` shared by the call signatures, as in
    :func:`~tvm_ollie.transform.optimize.optimize_module`) offers the alternatives, the
    orchestration chooses among them and the kernel boundaries at once. Regions of several
    calls are decided first, as in the sequential build (:func:`_rewrite_regions`). With a
    ``work_dir`` the candidates holding a linear primitive are timed
    (:class:`~.cost.LinearMeasuredCost`, cached there), the others costed analytically.

    With ``guard`` (a target that runs here), the sequential and derivation-only plans are
    built from the same decisions and the fastest of the three, timed whole, is returned
    (:mod:`.guard`; ``plan_timer`` replaces the timing); ``OptimizeReport.plans`` says which
    and why, and the orchestration report is the winner's (None for derivation only).
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
    # epilogues fold before fission splits activations (as in the sequential build); fission
    # drops unused bindings, which the alternatives are until the selection
    offered = offer_folded(offered, table)
    with tgt:
        offered = keep_alternatives(lambda m: fission(m)[0])(offered)
    cost = None
    if work_dir:  # measured linear kernels, cached by structural hash in work_dir
        cost = LinearMeasuredCost(MeasuredCost(tgt, work_dir), AnalyticCost(tgt))
    reports: list = []

    def build_joint():
        return tvm.compile(offered, target=tgt, relax_pipeline=ollie_orchestration(
            tgt, cost=cost, reports=reports, joint=table))

    report = OptimizeReport(target=tgt.kind.name)
    if guard:
        ex, winner, report.plans, reports, report.epilogues = _guarded(
            build_joint, reports, mod, tgt, cost, decided, plan_timer)
    else:
        ex, winner = build_joint(), "joint"
    report.regions = regions.regions
    for name, sig, choice in decided:
        infos = {a.label: a for a in table.alts.get(name, [])}
        label = table.chosen.get(name, "original") if winner == "joint" else choice.label
        base, got = infos.get("original"), infos.get(label)
        before = (base.measured_s or base.estimate_s) if base else choice.before_s
        after = (got.measured_s or got.estimate_s) if got else before
        how = f"joint selection among {len(infos) or 1} alternatives" if winner == "joint" \
            else f"the {winner} plan, kept by the never-worse guard"
        report.decisions.append(OpDecision(
            "main", name, sig.split(" ", 1)[0], sig, chosen=label,
            reason=f"{how} (sequential: {choice.label}; {choice.reason})",
            explain=choice.explain if label == choice.label else "", before_s=before,
            after_s=after, measured=bool(got and got.measured_s is not None),
            candidates=choice.candidates))
    report.search_s = decider.search_s + regions.search_s
    report.verify_s = decider.verify_s + regions.verify_s
    report.total_s = time.perf_counter() - start
    orch = reports[-1] if reports else None
    if orch is not None and report.plans is not None:
        orch.notes.append(report.plans.to_text().splitlines()[0])
    return ex, report, orch


#: The plan whose outputs the others must match in the guard: TVM's own fusion of the
#: verified rewrite (orchestration is what the guard doubts, not the per-call checks).
GUARD_REFERENCE = "derivation"


def _guarded(build_joint, joint_reports: list, mod, tgt, cost, decided, plan_timer):
    """``(executable, winner, GuardReport, orchestration reports, epilogues)``: the joint
    plan (``build_joint()``, its reports appended to ``joint_reports``) and the sequential and
    derivation-only plans of the same decisions; the fastest is kept (:mod:`.guard`)."""
    # pylint: disable=import-outside-toplevel
    from ..transform.optimize import apply_call_choices
    from ..tune.metaschedule import default_pipeline
    from .cost import sample_args
    from .guard import guard_plans
    from .pipeline import ollie_orchestration

    try:
        args = sample_args(mod["main"])
    except Exception as err:  # pylint: disable=broad-except
        from .guard import GuardReport

        why = f"not timed: no main with static shapes ({type(err).__name__})"
        return build_joint(), "joint", GuardReport(winner="joint", notes=[why]), \
            joint_reports, {}
    seq_mod, epilogues = apply_call_choices(mod, {sig: ch for _, sig, ch in decided})
    reports = {"joint": joint_reports, "sequential": []}
    plans = [("joint", build_joint),
             ("sequential", lambda: tvm.compile(seq_mod, target=tgt, relax_pipeline=(
                 ollie_orchestration(tgt, cost=cost, reports=reports["sequential"])))),
             ("derivation", lambda: tvm.compile(seq_mod, target=tgt,
                                                relax_pipeline=default_pipeline(tgt)))]
    ex, winner, plan_report = guard_plans(plans, args, reference=GUARD_REFERENCE,
                                          timer=plan_timer, target=tgt)
    return ex, winner, plan_report, reports.get(winner, []), \
        (epilogues if winner != "joint" else {})
