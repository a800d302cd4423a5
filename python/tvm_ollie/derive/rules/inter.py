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
  concatenation that is often a one-time weight transformation;
* **merging with bias adds** -- ``X @ W1 + b1`` and ``X @ W2 + b2`` (projections as importers
  emit them) become ``Z := X @ [W1 | W2] + [b1 | b2]`` plus slices: one add on the merged
  product, which a GEMM kernel takes as its epilogue.

Each rule returns a new :class:`~tvm_ollie.derive.program.Program` or None when it does not
apply; the result computes the same outputs, which the tests check with the interpreter.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

from ...ir.nodes import Access, BinOp, Const, IterVar, Scope, Tensor, Var, iter_nodes
from ..match import Match, gemm_expr, gemm_signature
from ..program import (Program, Stage, Step, _inline, fuse_memory_bound, instantiate,
                       instantiate_all, map_accesses)
from ..targets import TARGET_NAMES, match_scope

__all__ = ["InterRule", "SPLIT_OPERATORS", "FUSE_MEMORY_BOUND", "MERGE_SHARED_INPUT",
           "MERGE_SHARED_INPUT_BIAS", "INTER_RULES", "split_operators", "merge_shared_input",
           "merge_gemm_stages", "merge_shared_inputs", "merge_shared_inputs_bias",
           "inline_views", "combine_programs", "guard_one_bias"]


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


def split_operators(program: Program, targets: Sequence[str] = TARGET_NAMES) -> Optional[Program]:
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
            if m is not None:
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


def _rename_reads(stage: Stage, old: str, new: str) -> Stage:
    """Rename reads of tensor ``old`` (a stage renamed to take its eOperator's place)."""
    if old == new or old not in stage.reads:
        return stage

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
#
# One larger GEMM uses the hardware better than two thin ones that read the same operand: the
# shared operand is read once and the launch count halves. The other operands are concatenated
# by an eOperator -- for weights, a one-time transformation in practice -- and each original
# output is a slice of the merged product, renamed to the original stage so readers see nothing.

GEMM_KINDS = ("matmul", "batch_matmul")


def combine_programs(p1: Program, p2: Program) -> Program:
    """``p1`` and ``p2`` side by side as one multi-output program (``p2``'s stages renamed apart).

    The outputs are ``p1``'s then ``p2``'s; ``evaluate`` returns a tuple. Stages of ``p2`` whose
    names clash with a stage or an input of ``p1`` (or an input of ``p2``) are renamed, and so
    are the reads of them.
    """
    taken = {s.name for s in p1.stages} | _input_names(p1) | _input_names(p2)
    p2 = _renamed(p2, taken)
    return Program(p1.stages + p2.stages, p1.originals + p2.originals,
                   p1.outputs + p2.outputs, p1.steps + p2.steps)


def _input_names(prog: Program) -> set:
    return {t.name for o in prog.originals for t in o.inputs}


def merge_gemm_stages(program: Program) -> Optional[Program]:
    """Merge the first pair of independent GEMM stages of ``program`` that share an operand.

    ``T1 := X @ W1; T2 := X @ W2`` becomes ``C := [W1 | W2]; Y := X @ C; T1 := Y[.., :N1];
    T2 := Y[.., N1:]`` (likewise for a shared right operand, concatenating along M). The two
    stages must be the same kind with equal K, batch and transposes, read the shared tensor with
    the same declared shape and padding, and not depend on each other. Returns None when no pair
    qualifies. Call again to merge further pairs.
    """
    gemms = [s for s in program.stages if s.kind in GEMM_KINDS]
    for i, s1 in enumerate(gemms):
        for s2 in gemms[i + 1:]:
            merged = _merge_pair(program, s1, s2)
            if merged is not None:
                return merged
    return None


def _operand_tensors(op: Stage) -> Tuple[Tensor, Tensor]:
    body = op.expr.body
    return body.a.source, body.b.source


def _same_read(t1: Tensor, t2: Tensor) -> bool:
    return t1 is t2 or (t1.name == t2.name and t1.shape == t2.shape and t1.pad == t2.pad
                        and t1.pad_value == t2.pad_value and t1.dtype == t2.dtype)


def _depends(program: Program, later: Stage, earlier: Stage) -> bool:
    """Whether ``later`` reads ``earlier``'s output, directly or through other stages."""
    produced = {s.name: s for s in program.stages}
    stack, seen = [later], set()
    while stack:
        cur = stack.pop()
        for name in cur.reads:
            if name == earlier.name:
                return True
            if name in produced and name not in seen:
                seen.add(name)
                stack.append(produced[name])
    return False


def _merge_pair(program: Program, s1: Stage, s2: Stage) -> Optional[Program]:
    at1, at2 = s1.attrs, s2.attrs
    if s1.kind != s2.kind or any(at1.get(k) != at2.get(k) for k in
                                 ("K", "batch", "transpose_a", "transpose_b")):
        return None
    a1, b1 = _operand_tensors(s1)
    a2, b2 = _operand_tensors(s2)
    if _same_read(a1, a2) and not _same_read(b1, b2):
        role, others, key = "A", (b1, b2), "N"
        axis_in = 0 if at1["transpose_b"] else 1  # B is [K, N] or, transposed, [N, K]
    elif _same_read(b1, b2) and not _same_read(a1, a2):
        role, others, key = "B", (a1, a2), "M"
        axis_in = 1 if at1["transpose_a"] else 0  # A is [M, K] or, transposed, [K, M]
    else:
        return None
    if any(any(lo or hi for lo, hi in t.pad) for t in others):
        return None  # the concatenation pads its parts itself
    if _depends(program, s2, s1) or _depends(program, s1, s2):
        return None
    lead = 1 if s1.kind == "batch_matmul" else 0
    free1, free2 = at1[key], at2[key]
    taken = {s.name for s in program.stages} | _input_names(program)
    cat_name = _fresh(taken, "T")
    mm_name = _fresh(taken | {cat_name}, "T")
    cat = _concat_stage(cat_name, others, lead + axis_in)
    cat_t = Tensor(cat_name, cat.shape, cat.expr.dtype)
    attrs = dict(at1)
    attrs[key] = free1 + free2
    shared = a1 if role == "A" else b1
    pair = (shared, cat_t) if role == "A" else (cat_t, shared)
    mm = Stage(mm_name, s1.kind, gemm_expr(s1.kind, attrs, *pair), attrs, gemm_signature(attrs))
    out_axis = lead + (1 if role == "A" else 0)
    slice1 = _slice_stage(s1.name, mm, out_axis, 0, free1)
    slice2 = _slice_stage(s2.name, mm, out_axis, free1, free2)
    rest = [s for s in program.stages if s is not s1 and s is not s2]
    stages = _toposort(rest + [cat, mm, slice1, slice2])
    if stages is None:
        return None
    note = f"{s1.name}, {s2.name} share {role}={shared.name}: concat along {key} " \
           f"({free1} + {free2})"
    original = program.originals if program.multi else program.original
    output = program.outputs if program.multi else program.output
    return Program(stages, original, output, program.steps + (Step(MERGE_SHARED_INPUT.name,
                                                                         note),),
                   None if program.multi else program.derived)


def _toposort(stages: List[Stage]) -> Optional[List[Stage]]:
    """Order ``stages`` so each follows the stages it reads (stable: earliest ready first)."""
    names = {s.name for s in stages}
    order, done = [], set()
    pending = list(stages)
    while pending:
        for k, s in enumerate(pending):
            if all(r in done or r not in names for r in s.reads):
                order.append(s)
                done.add(s.name)
                del pending[k]
                break
        else:
            return None  # a cycle: the two GEMMs were not independent
    return order


def _gemm_programs(expr: Scope) -> List[Program]:
    """``expr`` instantiated as one (batch) matmul at its root, one program per operand order."""
    out = []
    for m in match_scope(expr, GEMM_KINDS):
        prog = instantiate(expr, expr, m)
        if len(prog.operators) == 1:
            out.append(prog)
    return out


def merge_shared_input(a: Union[Scope, Program], b: Union[Scope, Program, None] = None
                       ) -> Optional[Program]:
    """``X @ W1 ; X @ W2  =  Y := X @ [W1 | W2] ; Y[:, :N1] ; Y[:, N1:]`` (either operand shared).

    Parameters
    ----------
    a, b : Scope or Program
        Two expressions (each must instantiate as a matmul or batch matmul at its root), two
        programs, or one program (``b`` None) whose own GEMM stages are merged.

    Returns
    -------
    Program or None
        A program computing the same outputs (two expressions or programs give a multi-output
        program: ``evaluate`` returns a tuple), with one GEMM instead of two; None when no pair
        of GEMMs shares an operand read the same way.
    """
    if isinstance(a, Program):
        if b is None:
            return merge_gemm_stages(a)
        if not isinstance(b, Program):
            raise TypeError("merge_shared_input: pass two programs or two expressions")
        return merge_gemm_stages(combine_programs(a, b))
    if not isinstance(a, Scope) or not isinstance(b, Scope):
        raise TypeError("merge_shared_input: pass two programs or two expressions")
    for p1 in _gemm_programs(a):
        for p2 in _gemm_programs(b):
            merged = merge_gemm_stages(combine_programs(p1, p2))
            if merged is not None:
                return merged
    return None


def merge_shared_inputs(exprs: Sequence[Scope], max_pairs: int = 8) -> Optional[Program]:
    """``X @ W1 ; ... ; X @ Wn  =  Y := X @ [W1 | ... | Wn] ; Y[:, :N1] ; ...``: all of
    ``exprs`` as one multi-output program with a single GEMM, or None.

    Each expression must instantiate as a (batch) matmul at its root; the first operand order
    of each that merges with the GEMM built so far is taken (:func:`merge_shared_input` pair by
    pair, at most ``max_pairs`` merges). None when some expression does not merge: a partial
    merge would leave two GEMMs, which is not what the caller asked for.
    """
    if len(exprs) < 2 or len(exprs) - 1 > max_pairs:
        return None
    merged = merge_shared_input(exprs[0], exprs[1])
    for expr in exprs[2:]:
        if merged is None:
            return None
        nxt = None
        for prog in _gemm_programs(expr):
            nxt = merge_gemm_stages(combine_programs(merged, prog))
            if nxt is not None:
                break
        merged = nxt
    if merged is None or len(merged.operators) != 1:
        return None
    return inline_views(_one_concat(merged))


def _one_concat(program: Program) -> Program:
    """``C1 := P1 ⊕ P2; C2 := C1 ⊕ P3; ...  =  C := P1 ⊕ P2 ⊕ ... ⊕ Pn``: the pairwise
    concatenations of successive merges fused into one eOperator (still a concatenation)."""
    concats = {s.name for s in program.stages if s.label == "concat"}
    fused = fuse_memory_bound(program)
    return fused.with_stages([replace(s, label="concat") if s.name in concats else s
                              for s in fused.stages])  # fmt: skip


def inline_views(program: Program) -> Program:
    """``S := Y[f(x)]; T := S[g(x)]  =  T := Y[f(g(x))]``: an eOperator that is one read (a
    slice or another view) and is no output is inlined into every eOperator reading it, so
    slices of slices read the merged product once."""

    stages = list(program.stages)
    changed = True
    while changed:
        changed = False
        for k, prod in enumerate(stages):
            body = prod.expr.body
            if prod.is_operator or prod.name in program.outputs or prod.expr.reduce or \
                    not isinstance(body, Access) or not isinstance(body.source, Tensor):
                continue
            users = [s for s in stages if prod.name in s.reads]
            if not users or any(u.is_operator for u in users):
                continue
            fused = [_inline(u, prod) for u in users]
            if any(f is None or prod.name in f.reads for f in fused):
                continue
            for u, f in zip(users, fused):
                stages[stages.index(u)] = f
            del stages[k]
            changed = True
            break
    return program.with_stages(stages)


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
    outputs = tuple(mapping.get(o, o) for o in prog.outputs)
    if prog.multi:
        return Program(stages, prog.originals, outputs, prog.steps)
    return Program(stages, prog.original, outputs[0], prog.steps, prog.derived)


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


# --------------------------------------------------------------------------------------------
# Merging with bias adds
#
# Projections are ``X @ W_i + b_i``. Merged without their adds, each bias add would read its
# slice of the product again; merged with them, one add runs on the merged product (a GEMM
# kernel's epilogue) and the slices follow. The biases concatenate like the weights: a
# one-time transformation when they are constants.


@dataclass(frozen=True)
class _Biased:
    """``L<x> { G[x] + B[f(x)] }``: the GEMM scope ``G``, read at the loop variables (and 0 on
    unit dimensions), the bias read ``B[f(x)]`` and the loop variable of ``G``'s last axis."""

    gemm: Scope
    bias: Access
    last: Var


def guard_bias_add(expr: Scope) -> Optional[_Biased]:
    """Guard ``bias-add``: ``expr`` is ``L<x> { G[x] + B[f(x)] }`` (either order) with ``G`` an
    unpadded reduction read at ``expr``'s loop variables in order, each over its whole extent
    (0 on the unit dimensions ``expr`` dropped) and the last one on ``G``'s last axis; ``B`` an
    unpadded input tensor of ``expr``'s dtype; no reduction or padding outside; loops from 0."""
    body = expr.body
    if expr.reduce or any(lo or hi for lo, hi in expr.pad) or not isinstance(body, BinOp) or \
            body.op != "+" or any(iv.begin for iv in expr.loops):
        return None
    for g, b in ((body.a, body.b), (body.b, body.a)):
        if isinstance(g, Access) and isinstance(g.source, Scope) and \
                isinstance(b, Access) and isinstance(b.source, Tensor) and \
                g.source.reduce and _identity_read(g, expr.loops) and \
                b.source.dtype == expr.dtype and \
                not any(lo or hi for lo, hi in b.source.pad):
            return _Biased(g.source, b, g.indices[-1])
    return None


def _identity_read(acc: Access, loops: Sequence[IterVar]) -> bool:
    """``acc`` reads its (unpadded, loops from 0) scope at ``loops``' variables in order, each
    over the whole extent of its axis, and at 0 on the other axes, which have extent 1; the
    last axis is read by a loop variable."""
    src = acc.source
    if any(lo or hi for lo, hi in src.pad) or any(iv.begin for iv in src.loops):
        return False
    rest = list(loops)
    for idx, extent in zip(acc.indices, src.shape):
        if rest and idx is rest[0].var and rest[0].extent == extent:
            rest.pop(0)
        elif not (isinstance(idx, Const) and int(idx.value) == 0 and extent == 1):
            return False
    return not rest and isinstance(acc.indices[-1], Var)


def guard_bias_along_last(biased: _Biased, size: int) -> bool:
    """Guard ``bias-along-last-axis``: the bias varies along the GEMM's last axis (the merged
    product's concatenation axis) only: its indices are that axis's loop variable once, over
    a bias dimension of the output's ``size`` there, and constant 0 elsewhere."""
    hits = 0
    for idx, extent in zip(biased.bias.indices, biased.bias.source.shape):
        if idx is biased.last:
            hits += 1
            if extent != size:
                return False
        elif not (isinstance(idx, Const) and int(idx.value) == 0):
            return False
    return hits == 1 and biased.gemm.shape[-1] == size


def _slice_offset(stage: Stage, product: str, shape: Tuple[int, ...]
                  ) -> Optional[Tuple[int, int]]:
    """``(axis, start)`` when ``stage`` is ``S[d] = P[d + start e_axis]`` over ``product``
    (of ``shape``), the slice along one axis (axis 0 when it spans all of ``P``)."""
    body = stage.expr.body
    if stage.is_operator or stage.expr.reduce or not isinstance(body, Access) or \
            not isinstance(body.source, Tensor) or body.source.name != product or \
            tuple(body.source.shape) != tuple(shape) or \
            any(lo or hi for lo, hi in body.source.pad):
        return None
    if len(stage.expr.loops) != len(shape) or any(iv.begin for iv in stage.expr.loops):
        return None
    cut = None
    for k, (iv, idx) in enumerate(zip(stage.expr.loops, body.indices)):
        off = _offset_of(idx, iv.var)
        if off is None:
            return None
        if off or stage.shape[k] != shape[k]:
            if cut is not None:
                return None
            cut = (k, off)
    return cut or (0, 0)


def _offset_of(idx, var) -> Optional[int]:
    """``c`` when ``idx`` is ``var + c`` (or ``var``), else None."""
    if idx is var:
        return 0
    if isinstance(idx, BinOp) and idx.op == "+":
        for v, c in ((idx.a, idx.b), (idx.b, idx.a)):
            if v is var and isinstance(c, Const):
                return int(c.value)
    return None


def _bias_concat_stage(name: str, parts: Sequence[Tuple[Access, int, int]], total: int,
                       dtype: str) -> Stage:
    """``C[n] = Σ_i B_i<pad off_i : total - off_i - N_i>[.., n - off_i, ..]`` (the other bias
    indices 0): the biases side by side, each at its slice's offset."""
    n = Var("n")
    body = None
    for acc, start, size in parts:
        src = acc.source
        pad, idx = [], []
        for i, extent in zip(acc.indices, src.shape):
            if isinstance(i, Const):
                pad.append((0, 0))
                idx.append(i)
            else:
                pad.append((start, total - start - size))
                idx.append(n - start if start else n)
        read = Access(src.with_pad(pad), idx)
        body = read if body is None else body + read
    return Stage(name, "eop", Scope([IterVar(n, 0, total)], [], body), {}, "concat")


def guard_one_bias(parts: Sequence[_Biased]) -> bool:
    """Guard ``one-bias``: every expression adds the same bias tensor, read the same way (the
    merged product's rows are the expressions' stacked, so one add covers them all)."""
    first = parts[0].bias
    return all(p.bias.source.name == first.source.name and
               p.bias.source.shape == first.source.shape and
               p.bias.source.dtype == first.source.dtype and
               [isinstance(i, Const) for i in p.bias.indices] ==
               [isinstance(i, Const) for i in first.indices] for p in parts[1:])


def merge_shared_inputs_bias(exprs: Sequence[Scope], max_pairs: int = 8) -> Optional[Program]:
    """``X @ W1 + b1 ; ... ; X @ Wn + bn  =  Z := X @ [W1 | ... | Wn] + [b1 | ... | bn] ;
    Z[:, :N1] ; ...`` and ``X1 @ W + b ; ... ; Xn @ W + b  =  Z := [X1 ; ... ; Xn] @ W + b ;
    Z[:M1] ; ...``: all of ``exprs`` as one multi-output program with a single GEMM and one
    bias add, or None.

    Guards (named): ``bias-add`` (:func:`guard_bias_add`) on every expression; the GEMMs merge
    (:func:`merge_shared_inputs`, whose own guards apply) into one product every output is a
    slice of, along one axis; the slices tile that axis (``slices-tile-axis``);
    ``bias-along-last-axis`` (:func:`guard_bias_along_last`) for every bias. Slices along the
    last axis (a shared left operand, the weights concatenated along N) concatenate the
    biases the same way; slices along another axis (a shared right operand, the left operands
    stacked along M: the unrolled steps of a recurrence reading one weight) need ``one-bias``
    (:func:`guard_one_bias`).
    """
    parts = [guard_bias_add(e) for e in exprs]
    if len(exprs) < 2 or any(p is None for p in parts):
        return None
    merged = merge_shared_inputs([p.gemm for p in parts], max_pairs)
    if merged is None:
        return None
    (mm,) = merged.operators
    slices = [merged.stage(o) for o in merged.outputs]
    cuts = [_slice_offset(s, mm.name, mm.shape) for s in slices]
    if any(c is None for c in cuts) or len({c[0] for c in cuts}) != 1:
        return None
    axis, last = cuts[0][0], len(mm.shape) - 1
    spans = sorted((start, start + s.shape[axis]) for (_, start), s in zip(cuts, slices))
    if spans[0][0] != 0 or spans[-1][1] != mm.shape[axis] or \
            any(a[1] != b[0] for a, b in zip(spans, spans[1:])):
        return None
    if not all(guard_bias_along_last(p, s.shape[last]) for p, s in zip(parts, slices)):
        return None
    taken = {s.name for s in merged.stages} | _input_names(merged) | \
        {t.name for p in parts for t in [p.bias.source]}
    dtype = exprs[0].dtype
    dims = [Var(f"d{k}") for k in range(len(mm.shape))]
    if axis == last:  # a shared left operand: the biases concatenate like the weights
        cat_name = _fresh(taken, "T")
        extra = [_bias_concat_stage(cat_name, [(p.bias, start, s.shape[axis])
                                               for p, (_, start), s in zip(parts, cuts, slices)],
                                    mm.shape[axis], dtype)]  # fmt: skip
        bias = Access(Tensor(cat_name, extra[0].shape, dtype), [dims[last]])
    elif guard_one_bias(parts):  # a shared right operand: the rows stack, one bias for all
        first = parts[0].bias
        extra = []
        bias = Access(first.source, [i if isinstance(i, Const) else dims[last]
                                     for i in first.indices])  # fmt: skip
    else:
        return None
    add_name = _fresh(taken | {s.name for s in extra}, "T")
    y = Tensor(mm.name, mm.shape, mm.expr.dtype)
    body = Access(y, dims) + bias
    add = Stage(add_name, "eop", Scope([IterVar(v, 0, n) for v, n in zip(dims, mm.shape)], [],
                                       body), {"axis": last}, "bias-add")
    stages = []
    for st in merged.stages:
        if st.name in merged.outputs:
            st = _rename_reads(st, mm.name, add_name)
        stages.append(st)
        if st is mm:
            stages += extra + [add]
    stages = _toposort(stages)
    if stages is None:
        return None
    note = f"bias adds of {', '.join(merged.outputs)} as one add " + \
        ("of their concatenated biases" if axis == last else "of their one bias")
    return Program(stages, tuple(exprs), merged.outputs,
                   merged.steps + (Step(MERGE_SHARED_INPUT_BIAS.name, note),))


MERGE_SHARED_INPUT_BIAS = InterRule(
    "merge-shared-input-bias",
    "L_{m,n1} (X·W1)[m,n1] + b1[n1] ; L_{m,n2} (X·W2)[m,n2] + b2[n2]  =  "
    "Z := L_{m,n} (X·(W1 ⊕_n W2))[m,n] + (b1 ⊕ b2)[n] ; Z[m, n1] ; Z[m, N1 + n2]   and   "
    "L_{m1,n} (X1·W)[m1,n] + b[n] ; L_{m2,n} (X2·W)[m2,n] + b[n]  =  "
    "Z := L_{m,n} ((X1 ⊕_m X2)·W)[m,n] + b[n] ; Z[m1, n] ; Z[M1 + m2, n]",
    merge_shared_inputs_bias,
)

#: Program-level rules, in the order a pipeline applies them.
INTER_RULES = (SPLIT_OPERATORS, FUSE_MEMORY_BOUND, MERGE_SHARED_INPUT, MERGE_SHARED_INPUT_BIAS)
