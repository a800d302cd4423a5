"""Programs: a derived expression instantiated as an ordered list of stages.

A :class:`Program` is what derivation hands back: each :class:`Stage` is either a matched operator
(``matmul``, ``batch_matmul``, ``conv2d``, ``g2bmm``, ``gbmm``, with attributes and a canonical
expression) or an *eOperator* (``eop``: any remaining memory-bound scope, lowered through TE).

Binding convention. A stage's expression reads graph inputs and earlier stages' outputs as
``Tensor(name, shape)``. A stage's output is its scope materialized (``evaluate(stage.expr)``).
A reader may declare an output under another shape with the same number of elements: that is a
row-major *view* (a free reshape), and it may give the view a padding (reads there give 0). This
is how a nested scope's loop offsets and padding are folded into its readers when the scope
becomes its own stage, and how an operator's ``[M, N]`` output is read as ``n, h, w, r, s, f``.

Instantiation (:func:`instantiate`) splits an expression at its matched scopes: each matched
scope becomes an operator stage, preceded by gather eOperators for operands that are not views;
everything else stays in the eOperator of the enclosing scope (unmatched nested scopes stay
nested there: one eOperator, several TE stages). :func:`fuse_memory_bound` then merges chains of
eOperators (a producer read by exactly one eOperator is inlined into it, with stage merging when
the producer is a plain map).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from ..ir.interp import evaluate
from ..ir.nodes import (
    Access,
    BinOp,
    Call,
    IterVar,
    Node,
    Scope,
    Tensor,
    Var,
    input_tensors,
    iter_nodes,
    substitute,
)
from ..ir.rewrite import rewrite
from .cost import program_cost
from .match import Match, form_to_node, linear_form

__all__ = ["Stage", "Program", "Step", "instantiate", "instantiate_all", "fuse_memory_bound",
           "map_accesses", "stage_merge"]


@dataclass(frozen=True)
class Step:
    """One derivation step: the rule applied, what it did, the expression after it."""

    rule: str
    note: str
    expr: Optional[Node] = None


@dataclass(frozen=True, eq=False)
class Stage:
    """One kernel of a program.

    Attributes
    ----------
    name : str
        Name of the stage's output tensor (``T0``, ``T1``...).
    kind : str
        A target operator's name (:data:`tvm_ollie.derive.targets.TARGET_NAMES`) or ``"eop"``.
    expr : Scope
        The stage's semantics, over input tensors and earlier outputs.
    attrs : dict
        Operator attributes (see :class:`tvm_ollie.derive.match.Match`); empty for eops.
    label : str
        What an eop does: ``gather``, ``reshape``, ``transpose``, ``offset-add``, ``pad``,
        ``elementwise``, ``reduce``; the operator signature for operators.
    """

    name: str
    kind: str
    expr: Scope
    attrs: Dict[str, Any] = field(default_factory=dict)
    label: str = ""

    @property
    def shape(self) -> Tuple[int, ...]:
        return self.expr.shape

    @property
    def is_operator(self) -> bool:
        return self.kind != "eop"

    @property
    def reads(self) -> Tuple[str, ...]:
        """Names of the tensors (inputs or earlier stages) the stage reads."""
        return tuple(t.name for t in input_tensors(self.expr))

    def signature(self) -> str:
        """``matmul[49x512 @ 512x4608]`` or ``eop[offset-add 1x7x7x512]``."""
        if self.is_operator:
            return self.label
        return f"eop[{self.label} {'x'.join(str(s) for s in self.shape)}]"


class Program:
    """Stages computing the original expression (the last listed output is the result).

    Parameters
    ----------
    stages : sequence of Stage
        In execution order; each reads only inputs and earlier stages.
    original : Scope
        The expression the program computes.
    output : str
        The stage whose output, reshaped to ``original.shape``, is the result.
    steps : sequence of Step
        The rule path that led to the instantiated expression.
    derived : Scope, optional
        The derived (equivalent) expression that was instantiated.
    """

    def __init__(self, stages: Sequence[Stage], original: Union[Scope, Sequence[Scope]],
                 output: Union[str, Sequence[str]], steps: Sequence[Step] = (),
                 derived: Optional[Scope] = None):
        self.stages: Tuple[Stage, ...] = tuple(stages)
        multi = not isinstance(original, Scope)
        self.originals: Tuple[Scope, ...] = tuple(original) if multi else (original,)
        self.outputs: Tuple[str, ...] = tuple(output) if multi else (output,)
        if len(self.originals) != len(self.outputs):
            raise ValueError("one output stage per original expression")
        self.multi = multi
        self.original = self.originals[0]
        self.output = self.outputs[0]
        self.steps: Tuple[Step, ...] = tuple(steps)
        self.derived = derived if derived is not None else self.original
        names = [s.name for s in self.stages]
        if len(set(names)) != len(names) or not set(self.outputs) <= set(names):
            raise ValueError(f"bad program: stages {names}, outputs {self.outputs}")

    # -- inspection ---------------------------------------------------------------------------

    def stage(self, name: str) -> Stage:
        for s in self.stages:
            if s.name == name:
                return s
        raise KeyError(name)

    @property
    def operators(self) -> Tuple[Stage, ...]:
        return tuple(s for s in self.stages if s.is_operator)

    @property
    def kinds(self) -> Tuple[str, ...]:
        return tuple(s.kind for s in self.stages)

    def consumers(self, name: str) -> Tuple[Stage, ...]:
        return tuple(s for s in self.stages if name in s.reads)

    def __repr__(self) -> str:
        return " -> ".join(s.signature() for s in self.stages)

    def explain(self) -> str:
        """The rule path (expression after each step) and the stages, one per line."""
        lines = [f"original: {o}" for o in self.originals]
        for k, step in enumerate(self.steps, 1):
            after = f"\n     {step.expr}" if step.expr is not None else ""
            note = f": {step.note}" if step.note else ""
            lines.append(f"{k:3d}. {step.rule}{note}{after}")
        if self.steps and self.derived is not self.original:
            lines.append(f"derived: {self.derived}")
        lines.append(f"program: {self!r}")
        for s in self.stages:
            attrs = ""
            if s.attrs:
                attrs = " (" + ", ".join(f"{k}={v}" for k, v in s.attrs.items()) + ")"
            out = "  [output]" if s.name in self.outputs else ""
            lines.append(f"  {s.name} = {s.signature()}{attrs}{out}\n      {s.expr}")
        return "\n".join(lines)

    # -- execution ----------------------------------------------------------------------------

    def evaluate(self, inputs: Mapping[str, np.ndarray], dtype=None):
        """Run the stages with the reference interpreter; the result has the original's shape.

        A program of several expressions (see :mod:`.rules.inter`) returns a tuple of arrays.
        """

        env: Dict[str, np.ndarray] = dict(inputs)
        for s in self.stages:
            feed = {}
            for t in input_tensors(s.expr):
                if t.name not in env:
                    raise ValueError(f"stage {s.name} reads {t.name!r}, which is not available")
                feed[t.name] = _view(env[t.name], t)
            env[s.name] = evaluate(s.expr, feed, dtype)
        outs = tuple(env[name].reshape(o.shape) for name, o in zip(self.outputs, self.originals))
        return outs if self.multi else outs[0]

    def cost(self, target: str = "cuda", peak_flops: Optional[float] = None,
             bandwidth: Optional[float] = None):
        """Analytic cost (see :func:`tvm_ollie.derive.cost.program_cost`)."""

        return program_cost(self, target=target, peak_flops=peak_flops, bandwidth=bandwidth)

    def with_stages(self, stages: Sequence[Stage]) -> "Program":
        """The same program (originals, outputs, steps) with other stages."""
        original = self.originals if self.multi else self.original
        output = self.outputs if self.multi else self.output
        return Program(stages, original, output, self.steps, self.derived)


def _view(arr: np.ndarray, t: Tensor) -> np.ndarray:
    """``arr`` as the tensor ``t`` declares it (a row-major reshape of equal size)."""
    arr = np.asarray(arr)
    if arr.shape == t.shape:
        return arr
    if arr.size != int(np.prod(t.shape, dtype=np.int64)):
        raise ValueError(f"cannot view {t.name}{list(arr.shape)} as {list(t.shape)}")
    return arr.reshape(t.shape)


# --------------------------------------------------------------------------------------------
# Tree utilities


def map_accesses(node: Node, fn: Callable[[Access], Optional[Node]]) -> Node:
    """Rebuild ``node`` replacing accesses where ``fn`` returns a node (also in nested scopes).

    ``fn`` sees each access with its indices already rebuilt; returning None keeps it (with its
    source scope rebuilt recursively).
    """
    return rewrite(node, post=lambda cur: fn(cur) if isinstance(cur, Access) else None,
                   reads_only=True)


def stage_merge(access: Access) -> Optional[Node]:
    """Inline ``(L<x..> { body })[idx]`` as ``body[x := idx]`` when that is exact.

    Exact when the inner scope has no reduction and no padding (its margins would need guards).
    This is the stage-merging equation; the engine's eager rule does the same inside a search.
    """
    src = access.source
    if not isinstance(src, Scope) or src.reduce or any(lo or hi for lo, hi in src.pad):
        return None
    return substitute(src.body, {iv.var: i for iv, i in zip(src.loops, access.indices)})


def normalize_scope(scope: Scope, keep_pad: bool = False) -> Scope:
    """``scope`` with loops shifted to begin at 0 (and its padding dropped unless kept).

    Position ``p`` of the result holds loop value ``begin + p`` of ``scope``: the box of the scope.
    """
    shift = {iv.var: iv.var + iv.begin for iv in scope.loops if iv.begin}
    body = substitute(scope.body, shift) if shift else scope.body
    if shift:
        body = _clean_indices(body)
    loops = [IterVar(iv.var, 0, iv.extent) for iv in scope.loops]
    return Scope(loops, scope.reduce, body, scope.pad if keep_pad else None, scope.reducer)


def _clean_indices(body: Node) -> Node:
    """Re-canonicalize affine indices of the scope's own accesses (``v + 1 - 1`` -> ``v``)."""

    def fix(acc: Access) -> Optional[Node]:
        idx = []
        for i in acc.indices:
            form = linear_form(i)
            idx.append(i if form is None else form_to_node(form[0], form[1]))
        return Access(acc.source, idx)

    return _map_top(body, fix)


def _map_top(node: Node, fn: Callable[[Access], Node]) -> Node:
    """Like :func:`map_accesses` but does not enter nested scopes (their iterators differ)."""
    if isinstance(node, Access):
        return fn(Access(node.source, tuple(_map_top(i, fn) for i in node.indices)))
    if isinstance(node, BinOp):
        return BinOp(node.op, _map_top(node.a, fn), _map_top(node.b, fn))
    if isinstance(node, Call):
        return Call(node.func, tuple(_map_top(a, fn) for a in node.args))
    return node


# --------------------------------------------------------------------------------------------
# eOperator labels


def eop_label(expr: Scope) -> str:
    """A short name for what an eOperator does (for repr and explain)."""
    body = expr.body
    if isinstance(body, Access) and not any(isinstance(n, Scope) for n in iter_nodes(body)):
        if expr.reduce:
            return "offset-add"
        if any(lo or hi for lo, hi in expr.pad):
            return "pad"
        loops = [iv.var for iv in expr.loops]
        if all(isinstance(i, Var) for i in body.indices) and len(set(body.indices)) == len(
                body.indices) and set(body.indices) <= set(loops):
            src_shape = body.source.shape
            ordered = [i for i in body.indices]
            if ordered == [v for v in loops if v in ordered] and all(
                    iv.extent == n for iv, n in zip(_by_var(expr, ordered), src_shape)):
                return "reshape"
            return "transpose"
        return "gather"
    if expr.reduce:
        return "reduce"
    return "elementwise"


def _by_var(expr: Scope, vars_: Sequence[Var]) -> List[IterVar]:
    ranges = {iv.var: iv for iv in expr.loops}
    return [ranges[v] for v in vars_]


# --------------------------------------------------------------------------------------------
# Instantiation


def _steps(steps: Sequence[Any]) -> Tuple[Step, ...]:
    out = []
    for st in steps or ():
        if isinstance(st, Step):
            out.append(st)
        elif isinstance(st, (tuple, list)):
            parts = list(st) + [None, None, None]
            out.append(Step(str(parts[0]), "" if parts[1] is None else str(parts[1]), parts[2]
                            if isinstance(parts[2], Node) else None))
        else:
            rule = getattr(st, "rule", None) or getattr(st, "name", None) or str(st)
            rule = getattr(rule, "name", rule)
            note = getattr(st, "note", "") or ""
            expr = getattr(st, "expr", None)
            out.append(Step(str(rule), str(note), expr if isinstance(expr, Node) else None))
    return tuple(out)


class _Builder:
    """Splits an expression into stages at its matched scopes."""

    def __init__(self, root: Scope, matches: Mapping[Scope, Match], reserved=()):
        self.root = root
        self.matches = dict(matches)
        self.taken = {t.name for t in input_tensors(root)} | set(reserved)
        self.stages: List[Stage] = []
        self.materialized: Dict[Scope, str] = {}
        self.counter = 0

    def fresh(self) -> str:
        while f"T{self.counter}" in self.taken:
            self.counter += 1
        name = f"T{self.counter}"
        self.taken.add(name)
        return name

    def add(self, kind: str, expr: Scope, attrs=None, label: str = "") -> str:
        name = self.fresh()
        if kind == "eop":
            label = label or eop_label(expr)
        self.stages.append(Stage(name, kind, expr, dict(attrs or {}), label))
        return name

    # -- rewriting of eOperator bodies: matched scopes become reads of their stages

    def rewrite(self, node: Node) -> Node:
        return map_accesses(node, self._replace)

    def _replace(self, acc: Access) -> Optional[Node]:
        src = acc.source
        if isinstance(src, Scope) and src in self.matches:
            return self.read_output(src, acc.indices)
        return None

    def read_output(self, scope: Scope, indices: Sequence[Node]) -> Access:
        """The access ``scope[indices]`` as a read of the stage that computes ``scope``."""
        match = self.matches[scope]
        name = self.operator(scope, match)
        pos = {iv.var: k for k, iv in enumerate(scope.loops)}
        order = match.out_order
        shape = [scope.loops[pos[v]].extent for v in order]
        pad = [scope.pad[pos[v]] for v in order]
        idx = []
        for v in order:
            k = pos[v]
            i, b = indices[k], scope.loops[k].begin
            form = linear_form(i)
            idx.append(form_to_node(form[0], form[1] - b) if form is not None else
                       (i - b if b else i))
        t = Tensor(name, shape or [1], scope.dtype, pad or None)
        return Access(t, idx or [0])

    def operator(self, scope: Scope, match: Match) -> str:
        if scope in self.materialized:
            return self.materialized[scope]
        tensors = [self.operand(op) for op in match.operands]
        expr = match.operator_expr(*tensors)
        name = self.add(match.kind, expr, match.attrs, match.signature())
        self.materialized[scope] = name
        return name

    def operand(self, op) -> Tensor:
        src = op.source
        if op.is_view:
            if isinstance(src, Tensor):
                return Tensor(src.name, op.shape, src.dtype)
            name = self.eop_of(src)
            return Tensor(name, op.shape, src.dtype)
        gather = self.rewrite(op.gather)
        name = self.add("eop", gather, label="gather")
        return Tensor(name, op.shape, gather.dtype)

    def eop_of(self, scope: Scope) -> str:
        """A nested scope as its own stage (its box: begins at 0, padding left to readers)."""
        if scope in self.matches:
            match = self.matches[scope]
            if match.output_is_view() and not any(b.begin for b in scope.loops):
                return self.operator(scope, match)
        if scope in self.materialized:
            return self.materialized[scope]
        expr = normalize_scope(self.rewrite(scope))
        name = self.add("eop", expr)
        self.materialized[scope] = name
        return name

    def build_root(self) -> str:
        root = self.root
        if root not in self.matches:
            return self.add("eop", self.rewrite(root))
        match = self.matches[root]
        name = self.operator(root, match)
        if match.output_is_view() and not any(lo or hi for lo, hi in root.pad):
            return name
        loops = [iv.var for iv in root.loops]
        body = self.read_output(root, loops)
        return self.add("eop", Scope(root.loops, (), body, root.pad))


def instantiate_all(expr: Scope, matches: Mapping[Scope, Match], steps: Sequence[Any] = (),
                    original: Optional[Scope] = None, fuse: bool = True,
                    reserved: Sequence[str] = ()) -> Program:
    """Instantiate ``expr`` with several matched scopes (each becomes an operator stage).

    Parameters
    ----------
    expr : Scope
        The (derived) expression; every key of ``matches`` must be a scope inside it.
    matches : Mapping[Scope, Match]
        Matched scopes (by identity) and how they were matched (:func:`~.targets.match_scope`).
    steps : sequence
        The rule path: :class:`Step` objects, ``(rule, note, expr)`` tuples, or objects with
        ``rule``/``name``, ``note`` and ``expr`` attributes.
    original : Scope, optional
        The expression before derivation (defaults to ``expr``).
    fuse : bool
        Merge chains of eOperators (:func:`fuse_memory_bound`).
    reserved : sequence of str
        Names the new stages must not take (stages of an enclosing program).
    """
    present = {id(n) for n in iter_nodes(expr)}
    for scope, match in matches.items():
        if id(scope) not in present:
            raise ValueError(f"matched scope is not part of the expression: {scope}")
        if match.scope is not scope:
            raise ValueError("a match must be keyed by the scope it matched")
    builder = _Builder(expr, matches, reserved)
    out = builder.build_root()
    prog = Program(builder.stages, original if original is not None else expr, out,
                   _steps(steps), expr)
    return fuse_memory_bound(prog) if fuse else prog


def instantiate(expr: Scope, scope: Scope, match: Match, steps: Sequence[Any] = (),
                original: Optional[Scope] = None) -> Program:
    """Instantiate ``expr`` with its nested (or root) ``scope`` computed by ``match``.

    The matched scope becomes an operator stage (with gather eOperators for operands that are
    not free views); the rest of the expression becomes eOperators reading it, with the scope's
    loop offsets and padding folded into their reads. ``Program.evaluate`` equals
    ``evaluate(expr)``.
    """
    return instantiate_all(expr, {scope: match}, steps, original)


# --------------------------------------------------------------------------------------------
# Fusion of memory-bound chains


def fuse_memory_bound(program: Program) -> Program:
    """Merge every eOperator read by exactly one other eOperator (and by nothing else) into it.

    The producer's scope is nested into the consumer at each read (loop-value coordinates equal
    positions, since stage scopes start at 0), then stage merging inlines it when exact. Views
    of another shape are not fused (that would need div/mod index arithmetic).
    """
    stages = list(program.stages)
    changed = True
    while changed:
        changed = False
        for k, prod in enumerate(stages):
            if prod.is_operator or prod.name in program.outputs:
                continue
            users = [s for s in stages if prod.name in s.reads]
            if len(users) != 1 or users[0].is_operator:
                continue
            fused = _inline(users[0], prod)
            if fused is None:
                continue
            j = stages.index(users[0])
            stages[j] = fused
            del stages[k]
            changed = True
            break
    return program.with_stages(stages)


def _inline(consumer: Stage, producer: Stage) -> Optional[Stage]:
    pexpr = producer.expr
    if any(lo or hi for lo, hi in pexpr.pad) or any(iv.begin for iv in pexpr.loops):
        return None
    ok = [True]

    def fn(acc: Access) -> Optional[Node]:
        src = acc.source
        if not (isinstance(src, Tensor) and src.name == producer.name):
            return None
        if src.shape != pexpr.shape:
            ok[0] = False
            return None
        nested = Access(pexpr.replace(pad=src.pad), acc.indices)
        merged = stage_merge(nested)
        return merged if merged is not None else nested

    expr = map_accesses(consumer.expr, fn)
    if not ok[0]:
        return None
    expr = expr if consumer.expr.loops == expr.loops else expr
    return replace(consumer, expr=expr, label=eop_label(expr))
