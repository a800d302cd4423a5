"""Inter-expression rules: they rewrite programs (several stages or expressions), not one scope.

The intra-expression rules (:mod:`.base` and siblings) rewrite one focus scope into an equivalent
scope. The rules here work one level up, which is why they are :class:`InterRule` objects with the
same name / family / equation-doc shape as :class:`.base.Rule` but an ``apply`` over programs:

* **operator splitting** -- every nested scope of an eOperator that matches a target operator
  becomes its own operator stage (the eOperator then reads its output);
* **memory-bound fusion** -- a chain of eOperators becomes one eOperator (stage merging);
* **merging of independent expressions that read the same input** -- ``X @ W1`` and ``X @ W2``
  become one ``X @ [W1 | W2]`` plus slicing eOperators (the paper's "merging"; EinNet left it
  disabled). One larger GEMM uses the hardware better than two thin ones, at the price of a
  concatenation that is often a one-time weight transformation.

Each rule returns a new :class:`~tvm_ollie.derive.program.Program` or None when it does not
apply; the result computes the same outputs, which the tests check with the interpreter.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from ...ir.nodes import Access, IterVar, Scope, Tensor, Var, iter_nodes
from ..match import TARGETS, Match, gemm_expr, gemm_signature, match_scope
from ..program import Program, Stage, Step, fuse_memory_bound, instantiate, instantiate_all

__all__ = ["InterRule", "SPLIT_OPERATORS", "FUSE_MEMORY_BOUND", "MERGE_SHARED_INPUT",
           "INTER_RULES", "split_operators", "merge_shared_input"]


@dataclass(frozen=True)
class InterRule:
    """A named program-level rule: ``apply(*args, **kwargs) -> Program | None``.

    ``doc`` is the equation; ``family`` is always ``"inter"``; ``costs_depth`` mirrors
    :class:`.base.Rule` (program rules run after the search, so they cost no depth).
    """

    name: str
    doc: str
    apply: Callable[..., Optional[Program]] = field(repr=False)
    family: str = "inter"
    costs_depth: bool = False

    def __call__(self, *args, **kwargs) -> Optional[Program]:
        return self.apply(*args, **kwargs)


# --------------------------------------------------------------------------------------------
# Operator splitting


def _nested_scopes(expr: Scope) -> List[Scope]:
    """Scopes strictly inside ``expr``, outermost first (each once)."""
    out, seen = [], {id(expr)}
    for node in iter_nodes(expr):
        if isinstance(node, Scope) and id(node) not in seen:
            seen.add(id(node))
            out.append(node)
    return out


def _first_match(scope: Scope, targets: Sequence[str]) -> Optional[Match]:
    found = match_scope(scope, targets)
    return found[0] if found else None


def split_operators(program: Program, targets: Sequence[str] = TARGETS) -> Optional[Program]:
    """``eop{ ... (L Σ {X*Y})[idx] ... } -> op(X, Y) ; eop{ ... T[idx'] ... }``.

    Every eOperator stage whose expression (or a nested scope of it) matches a target is
    instantiated with :func:`~tvm_ollie.derive.program.instantiate_all`: the matched scopes become
    operator stages spliced in before it, and it keeps its name and output (readers see no
    change). Returns None when no eOperator has a matching scope.
    """
    stages: List[Stage] = []
    changed = False
    taken = {s.name for s in program.stages}
    for st in program.stages:
        if st.is_operator:
            stages.append(st)
            continue
        matches: Dict[Scope, Match] = {}
        for scope in [st.expr] + _nested_scopes(st.expr):
            m = _first_match(scope, targets)
            if m is not None and not any(_inside(scope, outer) for outer in matches):
                matches[scope] = m
        if not matches:
            stages.append(st)
            continue
        sub = instantiate_all(st.expr, matches, reserved=sorted(taken))
        taken.update(s.name for s in sub.stages)
        for s in sub.stages:
            stages.append(replace(s, name=st.name) if s.name == sub.output else s)
        stages = [_rename_reads(s, sub.output, st.name) for s in stages]
        changed = True
    return program.with_stages(stages) if changed else None


def _inside(node: Scope, outer: Scope) -> bool:
    return node is not outer and any(n is node for n in iter_nodes(outer))


def _rename_reads(stage: Stage, old: str, new: str) -> Stage:
    """Rename reads of tensor ``old`` (a stage renamed to take its eOperator's place)."""
    if old == new or old not in stage.reads:
        return stage
    from ..program import map_accesses  # pylint: disable=import-outside-toplevel

    def fn(acc: Access):
        src = acc.source
        if isinstance(src, Tensor) and src.name == old:
            return Access(Tensor(new, src.shape, src.dtype, src.pad, src.pad_value), acc.indices)
        return None

    return replace(stage, expr=map_accesses(stage.expr, fn))


SPLIT_OPERATORS = InterRule(
    "split-operators",
    "E[(L_x Σ_k {X[f(x,k)] * Y[g(x,k)]})[idx]]  =  T := op(X', Y');  E[T[idx - begin]]",
    split_operators,
)

FUSE_MEMORY_BOUND = InterRule(
    "fuse-memory-bound",
    "T := L_x{e(x)};  L_y{h(T[u(y)])}  =  L_y{h(e(u(y)))}   (T read by that eOperator only)",
    lambda program: _changed(program, fuse_memory_bound(program)),
)


def _changed(before: Program, after: Program) -> Optional[Program]:
    return None if len(after.stages) == len(before.stages) else after


# --------------------------------------------------------------------------------------------
# Merging independent expressions that read the same input


def _gemm_program(expr: Scope) -> Optional[Tuple[Program, Stage]]:
    """``expr`` instantiated as one (batch) matmul at its root, with the operator stage."""
    for m in match_scope(expr, ("matmul", "batch_matmul")):
        prog = instantiate(expr, expr, m)
        ops = prog.operators
        if len(ops) == 1:
            return prog, ops[0]
    return None


def _operand_tensors(op: Stage) -> Tuple[Tensor, Tensor]:
    body = op.expr.body
    return body.a.source, body.b.source


def merge_shared_input(e1: Scope, e2: Scope) -> Optional[Program]:
    """``X @ W1 ; X @ W2  =  Y := X @ [W1 | W2] ; Y[:, :N1] ; Y[:, N1:]`` (either operand shared).

    Both expressions must instantiate as a matmul (or batch matmul with equal batch) at their
    root whose shared operand is the same tensor read the same way (same transpose, same K). The
    other operands are concatenated along their free axis by an eOperator (a sum of two padded
    reads, no branches), one GEMM computes both products, and each original output is a slice of
    it (followed by that expression's own output eOperators). Returns a two-output Program
    (``evaluate`` gives a tuple), or None when the expressions do not share an operand.
    """
    g1, g2 = _gemm_program(e1), _gemm_program(e2)
    if g1 is None or g2 is None:
        return None
    (p1, op1), (p2, op2) = g1, g2
    if op1.kind != op2.kind or op1.attrs["K"] != op2.attrs["K"] or \
            op1.attrs.get("batch") != op2.attrs.get("batch"):
        return None
    a1, b1 = _operand_tensors(op1)
    a2, b2 = _operand_tensors(op2)
    at1, at2 = op1.attrs, op2.attrs
    if a1 is a2 and a1.name not in {s.name for s in p1.stages} and \
            at1["transpose_a"] == at2["transpose_a"] and at1["transpose_b"] == at2["transpose_b"]:
        shared, role = a1, "A"
    elif b1 is b2 and b1.name not in {s.name for s in p1.stages} and \
            at1["transpose_a"] == at2["transpose_a"] and at1["transpose_b"] == at2["transpose_b"]:
        shared, role = b1, "B"
    else:
        return None
    p2 = _renamed(p2, {s.name for s in p1.stages} | {t.name for t in e1.inputs + e2.inputs})
    op2 = p2.stage(_op_name(p2))
    a2, b2 = _operand_tensors(op2)
    others = (b1, b2) if role == "A" else (a1, a2)
    trans = at1["transpose_b"] if role == "A" else at1["transpose_a"]
    lead = 1 if op1.kind == "batch_matmul" else 0
    # Free axis of the concatenated operand: N of B ([K, N] or [N, K]), M of A ([M, K] / [K, M]).
    if role == "A":
        axis = lead + (0 if trans else 1)
        free1, free2, key = at1["N"], at2["N"], "N"
    else:
        axis = lead + (1 if trans else 0)
        free1, free2, key = at1["M"], at2["M"], "M"
    taken = {s.name for s in p1.stages + p2.stages} | {t.name for t in e1.inputs + e2.inputs}
    cat_name = _fresh(taken, "T")
    taken.add(cat_name)
    mm_name = _fresh(taken, "T")
    taken.add(mm_name)
    cat = _concat_stage(cat_name, others, axis)
    cat_t = Tensor(cat_name, cat.shape, cat.expr.dtype)
    attrs = dict(at1)
    attrs[key] = free1 + free2
    pair = (shared, cat_t) if role == "A" else (cat_t, shared)
    mm_expr = gemm_expr(op1.kind, attrs, *pair)
    sig = gemm_signature(attrs)
    mm = Stage(mm_name, op1.kind, mm_expr, attrs, sig)
    out_axis = lead + (1 if role == "A" else 0)
    slice1 = _slice_stage(op1.name, mm, out_axis, 0, free1)
    slice2 = _slice_stage(op2.name, mm, out_axis, free1, free2)
    before = [s for s in p1.stages if _index(p1, s) < _index(p1, op1)] + \
        [s for s in p2.stages if _index(p2, s) < _index(p2, op2)]
    after = [s for s in p1.stages if _index(p1, s) > _index(p1, op1)] + \
        [s for s in p2.stages if _index(p2, s) > _index(p2, op2)]
    stages = before + [cat, mm, slice1, slice2] + after
    note = f"shared {role}={shared.name}: concat along {key} ({free1} + {free2})"
    prog = Program(stages, (e1, e2), (p1.output, p2.output),
                   steps=(Step(MERGE_SHARED_INPUT.name, note),))
    return prog


def _op_name(prog: Program) -> str:
    return prog.operators[0].name


def _index(prog: Program, stage: Stage) -> int:
    return next(k for k, s in enumerate(prog.stages) if s is stage)


def _fresh(taken, prefix: str) -> str:
    k = 0
    while f"{prefix}{k}" in taken:
        k += 1
    return f"{prefix}{k}"


def _renamed(prog: Program, taken) -> Program:
    """``prog`` with stage names that avoid ``taken`` (reads renamed accordingly)."""
    mapping: Dict[str, str] = {}
    used = set(taken)
    for s in prog.stages:
        if s.name in used:
            mapping[s.name] = _fresh(used | set(mapping.values()), "T")
        used.add(mapping.get(s.name, s.name))
    stages = []
    for s in prog.stages:
        for old, new in mapping.items():
            s = _rename_reads(s, old, new)
        stages.append(replace(s, name=mapping.get(s.name, s.name)))
    return Program(stages, prog.original, mapping.get(prog.output, prog.output), prog.steps,
                   prog.derived)


def _concat_stage(name: str, parts: Tuple[Tensor, Tensor], axis: int) -> Stage:
    """``C[.., n, ..] = P1<pad 0:n2>[.., n, ..] + P2<pad n1:0>[.., n - n1, ..]``."""
    p1, p2 = parts
    n1, n2 = p1.shape[axis], p2.shape[axis]
    dims = [Var(f"d{k}") for k in range(p1.ndim)]
    shape = list(p1.shape)
    shape[axis] = n1 + n2
    pad1 = [(0, 0)] * p1.ndim
    pad1[axis] = (0, n2)
    pad2 = [(0, 0)] * p2.ndim
    pad2[axis] = (n1, 0)
    idx2 = list(dims)
    idx2[axis] = dims[axis] - n1
    body = Access(p1.with_pad(pad1), dims) + Access(p2.with_pad(pad2), idx2)
    expr = Scope([IterVar(v, 0, n) for v, n in zip(dims, shape)], [], body)
    return Stage(name, "eop", expr, {}, "concat")


def _slice_stage(name: str, mm: Stage, axis: int, start: int, size: int) -> Stage:
    """``S[.., n, ..] = Y[.., n + start, ..]`` over ``size`` along ``axis``."""
    shape = list(mm.shape)
    shape[axis] = size
    dims = [Var(f"d{k}") for k in range(len(shape))]
    idx = list(dims)
    if start:
        idx[axis] = dims[axis] + start
    y = Tensor(mm.name, mm.shape, mm.expr.dtype)
    expr = Scope([IterVar(v, 0, n) for v, n in zip(dims, shape)], [], Access(y, idx))
    return Stage(name, "eop", expr, {}, "slice")


MERGE_SHARED_INPUT = InterRule(
    "merge-shared-input",
    "L_{m,n1} Σ_k X[m,k]·W1[k,n1] ; L_{m,n2} Σ_k X[m,k]·W2[k,n2]  =  "
    "Y := L_{m,n} Σ_k X[m,k]·(W1 ⊕_n W2)[k,n] ; Y[m, n1] ; Y[m, N1 + n2]",
    merge_shared_input,
)

#: Program-level rules, in the order a pipeline applies them.
INTER_RULES = (SPLIT_OPERATORS, FUSE_MEMORY_BOUND, MERGE_SHARED_INPUT)
