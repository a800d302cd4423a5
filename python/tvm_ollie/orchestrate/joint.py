"""Joint selection: derivation alternatives enter the primitive graph next to the original.

This module is the orchestration's side (the table of offered alternatives, the groups in the
primitive graph, their costs, and the passes that keep or apply them); offering the
alternatives needs the derivation pass's Decider and emitter and lives one floor up, in
:mod:`tvm_ollie.pipeline.joint` (:func:`~tvm_ollie.pipeline.joint.offer_alternatives`,
:func:`~tvm_ollie.pipeline.joint.offer_folded`).

The sequential build decides each heavy call first (:class:`~tvm_ollie.transform.decide.Decider`:
original, native library kernel or derived program) and orchestrates what is left. Here every
verified alternative of a heavy call ``v = conv2d(x, w)`` is emitted into the block right
after it, its result bound to ``v__alt<k>`` (``offer_alternatives``); nothing reads it.
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
  alternative (``offer_folded``). Its result stands for ``c``, not ``v``: it covers ``v``
  and every node on the paths from ``v`` to ``c`` (:attr:`Group.absorbed`), whose cover rows
  accept it, and it shares the nodes before the library call with the alternative it extends.

Costs: a library node costs its calibrated analytic estimate (``Alternative.estimate``), folded
epilogue or not (the kernel applies it in its output pass), or, for the library candidates of
orchestration alone (``AltInfo.profiled``) under a profiled cost model, its measured time.
When the Decider timed the alternatives (untuned check on CPUs, or tuned), each alternative's
candidates holding its last node pay a constant *correction* so that the alternatives' costs
alone (sum of their singleton kernels) differ as the measured times do, plus the Decider's
acceptance margin on every alternative but the original (the Decider takes an alternative
only when it is ``MARGIN`` faster); fusion gains stay analytic (:class:`JointCost`): every
candidate holding a node of such a group costs the analytic estimate, the scale the
corrections are made on, whatever the inner model. A folded alternative is timed as the
alternative it extends.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from ..compat import mutate_functions, relax, tvm
from .candidates import Candidate, make_candidate
from .cost import CostModel
from .graph import PrimitiveGraph

__all__ = ["AltInfo", "Group", "JointCost", "JointTable", "apply_picked", "find_groups",
           "keep_alternatives", "ALT_TAG", "ALT_RE"]

#: Suffix of an alternative's result variable: ``<original>__alt<k>``.
ALT_TAG = "__alt"
ALT_RE = re.compile(r"^(.*)__alt(\d+)$")
_ALT_RE = ALT_RE


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
    #: a library alternative that a cost model able to time library calls measures
    #: (``ProfiledCost.times_library``); ``estimate_s`` is then its analytic estimate only
    profiled: bool = False


@dataclass
class JointTable:
    """Alternatives offered per original variable name (``alts[name][k]``), filled by
    :func:`tvm_ollie.pipeline.joint.offer_alternatives` and read by the orchestration (names
    survive legalization). ``margin``: the Decider's acceptance margin, which
    :class:`JointCost` adds to every alternative but the original (set by whoever offers)."""

    alts: Dict[str, List[AltInfo]] = field(default_factory=dict)
    notes: List[str] = field(default_factory=list)
    chosen: Dict[str, str] = field(default_factory=dict)  # filled by the orchestration
    picked: Dict[str, int] = field(default_factory=dict)  # index into alts[name], likewise
    margin: float = 0.0

    def agrees_with_sequential(self) -> bool:
        """Whether every selected alternative is the Decider's own choice (then the refined
        plan of :func:`apply_picked` is the sequential plan)."""
        for name, infos in self.alts.items():
            k = self.picked.get(name, 0)
            if not (infos[k].sequential or k == 0 and not any(a.sequential for a in infos)):
                return False
        return True

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


def _measured(group: Group) -> bool:
    """Whether the Decider timed every alternative of ``group`` (its costs are corrected)."""
    return all(info.measured_s is not None for info in group.infos)


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
    the Decider compares (an alternative is taken when ``t_k < (1 - MARGIN) t_0``); ``margin``
    is that ``MARGIN`` (:attr:`JointTable.margin`).

    A library alternative marked ``profiled`` (the library candidates of orchestration alone,
    :mod:`tvm_ollie.pipeline.library_offers`) is not fixed at its estimate when the inner
    model times library calls (``times_library``, :class:`~.profiled.ProfiledCost`): its
    estimate goes to the inner model as the call's analytic cost (:attr:`estimates`), which
    builds and times it like any candidate.

    **Measured groups are costed analytically** (:attr:`pinned`): every candidate holding a
    node of a group whose alternatives the Decider timed costs the inner model's analytic
    estimate (``inner.analytic`` when it has one), library calls their fixed estimate. The
    corrections are differences of singleton costs, so they hold only when every candidate
    holding those nodes is priced on the singletons' scale; a profiled model prices some
    candidates measured and the rest at the analytic estimate times a class ratio (0.3 on
    Segformer), so a fused kernel holding the original call cost 0.03x its singleton, and on
    Segformer quick the joint program took a TVM convolution the Decider had measured 34x
    slower than its library kernel (the joint plan ran 2-3x slower than the sequential one).
    The Decider's times are the measurement of these nodes; fusion gains stay analytic.
    """

    def __init__(self, inner: CostModel, groups: List[Group], graph: PrimitiveGraph,
                 margin: float = 0.0):
        self.inner, self.name = inner, f"{inner.name}+joint"
        #: the analytic model of the measured groups' candidates (class docstring)
        self.plain: CostModel = getattr(inner, "analytic", None) or inner
        self.fixed: Dict[int, float] = {}
        #: library nodes the inner model times, with their estimates (profiled alternatives)
        self.estimates: Dict[int, float] = {}
        #: nodes of the groups the Decider timed: their candidates cost ``plain``'s estimate
        self.pinned: set = {i for g in groups if _measured(g) for nodes in g.nodes
                            for i in nodes}
        timed = bool(getattr(inner, "times_library", False))
        for g in groups:
            for k, info in enumerate(g.infos):
                calls = [i for i in g.nodes[k] if _is_library(graph.nodes[i])]
                where = self.estimates if info.profiled and timed and not _measured(g) \
                    else self.fixed
                for i in calls if info.native else []:
                    where[i] = info.estimate_s / len(calls)
        self.correction: Dict[int, float] = {}
        for g in groups:
            if not _measured(g):
                continue
            alone = [sum(self._seconds(graph, make_candidate(graph, 1 << i)) for i in nodes)
                     for nodes in g.nodes]
            base = g.infos[0].measured_s
            raw = [(info.measured_s - base) + (margin * base if k else 0.0) - (a - alone[0])
                   for k, (info, a) in enumerate(zip(g.infos, alone))]
            # a folded epilogue runs the library call it extends: the same correction
            raw = [r if e is None else raw[e] for r, e in zip(raw, g.extends)]
            low = min(raw)
            for last, r in zip(g.lasts, raw):
                self.correction[last] = r - low

    def _seconds(self, graph: PrimitiveGraph, cand: Candidate) -> float:
        if cand.size == 1 and cand.nodes[0] in self.fixed:
            return self.fixed[cand.nodes[0]]
        if self._is_pinned(cand):
            return self.plain.costs(graph, [cand])[0]
        return self._inner_costs(graph, [cand])[0]

    def _is_pinned(self, cand: Candidate) -> bool:
        return bool(self.pinned) and any(i in self.pinned for i in cand.nodes)

    def _inner_costs(self, graph: PrimitiveGraph, cands: list) -> list:
        """The inner model's costs; the library nodes it times get their estimates."""
        if self.estimates:
            return self.inner.costs(graph, cands, estimates=self.estimates)
        return self.inner.costs(graph, cands)

    def kernel_seconds(self, graph: PrimitiveGraph, cand: Candidate) -> float:
        return self._seconds(graph, cand) + self._extra(cand)

    def _extra(self, cand: Candidate) -> float:
        return sum(c for last, c in self.correction.items() if cand.mask >> last & 1)

    def costs(self, graph: PrimitiveGraph, cands) -> list:
        """The inner model's costs of all candidates at once (a profiled model orders its
        measurements over them), the library estimates and corrections applied."""
        cands = list(cands)
        how = ["fixed" if c.size == 1 and c.nodes[0] in self.fixed else
               "plain" if self._is_pinned(c) else "inner" for c in cands]
        plain = iter(self.plain.costs(graph, [c for c, h in zip(cands, how) if h == "plain"]))
        inner = iter(self._inner_costs(graph, [c for c, h in zip(cands, how) if h == "inner"]))
        return [(self.fixed[c.nodes[0]] if h == "fixed" else next(plain) if h == "plain"
                 else next(inner)) + self._extra(c) for c, h in zip(cands, how)]


def apply_picked(mod: "tvm.IRModule", table: JointTable) -> "tvm.IRModule":
    """``mod`` with offered alternatives (``offer_alternatives``, ``offer_folded``)
    as the joint selection picked them (``table.picked``): the picked alternative's result
    replaces the value it stands for (the call's result, or a folded epilogue's last
    consumer) in every reader, the other alternatives are dropped, and what nothing reads
    any more (the replaced call or epilogue) is removed.

    Why: in the joint program an alternative's nodes cannot fuse with the readers of the call
    they replace (module docstring); orchestrating this module again lets them, with the
    joint program's kernels still one feasible selection.
    """
    keep = {f"{name}{ALT_TAG}{k}": (name, k) for name, k in table.picked.items() if k}

    @relax.expr_functor.mutator
    class _Pick(relax.PyExprMutator):
        def __init__(self, module):
            super().__init__(module)
            self.latest: Dict[str, object] = {}

        def visit_var_binding_(self, binding):  # pylint: disable=arguments-renamed
            name = binding.var.name
            if _ALT_RE.match(name) and name not in keep:
                return  # an alternative not picked: nothing reads it
            base, k = keep.get(name, (None, 0))
            info = table.alts[base][k] if base is not None else None
            old = self.latest.get(info.stands_for if info.base is not None else base) \
                if info is not None else None
            if old is None:
                super().visit_var_binding_(binding)
                self.latest[name] = binding.var
                return
            # the value it replaces is bound again, under its name and its kind of variable
            # (an alternative is a block output only so that it survives until the selection)
            value = self.visit_expr(binding.value)
            emit = self.builder_.emit if isinstance(old, relax.DataflowVar) \
                else self.builder_.emit_output
            self.set_var_remap(old, emit(value, name_hint=old.name))

    return relax.transform.DeadCodeElimination()(mutate_functions(_Pick(mod), mod))


def keep_alternatives(inner: "tvm.transform.Pass") -> "tvm.transform.Pass":
    """``inner`` (``FoldConstant``, which drops unused bindings) with every function's
    alternative results returned alongside its result meanwhile, so that they survive."""

    @tvm.transform.module_pass(opt_level=0, name="KeepAlternatives")
    def _keep(mod: "tvm.IRModule", _ctx) -> "tvm.IRModule":
        # a copy: assigning into ``mod`` would change the caller's module too (the joint
        # build keeps the unfissioned module for its refined plan)
        mod = tvm.IRModule(dict(mod.functions_items()), attrs=mod.attrs)
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
