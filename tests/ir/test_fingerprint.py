"""Tests of expression fingerprints (``tvm_ollie.ir.fingerprint``)."""

from __future__ import annotations

import random

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import conv_like_scopes, scopes

from tvm_ollie.ir import affine
from tvm_ollie.ir import fingerprint as fingerprint_module
from tvm_ollie.ir.fingerprint import fingerprint
from tvm_ollie.ir.interp import evaluate, random_inputs
from tvm_ollie.ir.nodes import Access, BinOp, Call, Const, IterVar, Node, Scope, Tensor, Var

N, H, W, F, C, R, S, I, J = (Var(x) for x in ("n", "h", "w", "f", "c", "r", "s", "i", "j"))
A = Tensor("A", (1, 7, 7, 8), pad=[0, 1, 1, 0])
K = Tensor("K", (3, 3, 8, 8))
LOOPS = (IterVar(N, 0, 1), IterVar(H, 0, 7), IterVar(W, 0, 7), IterVar(F, 0, 8))
REDUCE = (IterVar(C, 0, 8), IterVar(R, 0, 3), IterVar(S, 0, 3))


def conv(a_idx=None, k_idx=None, loops=LOOPS, reduce=REDUCE, a=A, k=K, reducer="sum"):
    a_idx = a_idx or (N, H + R - 1, W + S - 1, C)
    k_idx = k_idx or (R, S, F, C)
    return Scope(loops, reduce, a[a_idx] * k[k_idx], reducer=reducer)


# -- expression transformers that must not change the fingerprint ------------------------------


class Rewriter:
    """Renames every iterator, permutes reductions and swaps commutative operands at random."""

    def __init__(self, seed: int, rename=True, permute=True, swap=True):
        self.rng = random.Random(seed)
        self.rename, self.permute, self.swap = rename, permute, swap
        self.counter = 0

    def scope(self, s: Scope) -> Scope:
        mapping = {}
        for iv in s.loops + s.reduce:
            self.counter += 1
            mapping[iv.var] = Var(f"fresh_{self.counter}") if self.rename else iv.var
        loops = tuple(IterVar(mapping[iv.var], iv.begin, iv.end) for iv in s.loops)
        reduce = [IterVar(mapping[iv.var], iv.begin, iv.end) for iv in s.reduce]
        if self.permute:
            self.rng.shuffle(reduce)
        return Scope(loops, reduce, self.expr(s.body, mapping), s.pad, s.reducer)

    def expr(self, node: Node, mapping) -> Node:
        if type(node) is Var:
            return mapping[node]
        if type(node) is BinOp:
            a, b = self.expr(node.a, mapping), self.expr(node.b, mapping)
            if self.swap and node.op in ("+", "*") and self.rng.random() < 0.5:
                a, b = b, a
            return BinOp(node.op, a, b)
        if type(node) is Call:
            return Call(node.func, tuple(self.expr(x, mapping) for x in node.args))
        if type(node) is Access:
            source = self.scope(node.source) if type(node.source) is Scope else node.source
            return Access(source, tuple(self.expr(i, mapping) for i in node.indices))
        return node


# -- invariance --------------------------------------------------------------------------------


def test_conv_invariances():
    base = fingerprint(conv())
    assert 0 <= base < 2 ** 64
    # renamed iterators, reordered reduction list, operands swapped
    n2, h2, w2, f2, c2, r2, s2 = (Var(x + "_") for x in "nhwfcrs")
    renamed = Scope((IterVar(n2, 0, 1), IterVar(h2, 0, 7), IterVar(w2, 0, 7), IterVar(f2, 0, 8)),
                    (IterVar(s2, 0, 3), IterVar(c2, 0, 8), IterVar(r2, 0, 3)),
                    K[r2, s2, f2, c2] * A[n2, Const(-1) + r2 + h2, s2 + (w2 - 1), c2])
    assert fingerprint(renamed) == base
    # index spelled with a split and merge of the same value
    split = conv(a_idx=(N, 2 * ((H + R - 1) // 2) + (H + R - 1) % 2, W + S - 1, C))
    assert fingerprint(split) == base


def test_index_spelling_with_mod_terms():
    t = Tensor("T", (16,))
    loops = (IterVar(I, 0, 16),)
    plain = Scope(loops, (), t[I])
    assert fingerprint(Scope(loops, (), t[4 * (I // 4) + I % 4])) == fingerprint(plain)
    assert fingerprint(Scope(loops, (), t[I % 4 + (I // 4) * 4])) == fingerprint(plain)
    assert fingerprint(Scope(loops, (), t[I % 4])) != fingerprint(Scope(loops, (), t[I % 2]))
    assert fingerprint(Scope(loops, (), t[I % 4])) != fingerprint(Scope(loops, (), t[I // 4]))
    assert fingerprint(Scope(loops, (), t[(I + 1) % 4])) != fingerprint(Scope(loops, (), t[I % 4]))


def test_commutative_body_operators():
    t, u = Tensor("T", (4,)), Tensor("U", (4,))
    loops = (IterVar(I, 0, 4),)

    def fp(body):
        return fingerprint(Scope(loops, (), body))

    assert fp(t[I] + u[I]) == fp(u[I] + t[I])
    assert fp(t[I] * 2.0) == fp(Const(2.0) * t[I])
    assert fp(Call("max", (t[I], u[I]))) == fp(Call("max", (u[I], t[I])))
    assert fp(BinOp("<", t[I], u[I])) == fp(BinOp(">", u[I], t[I]))
    assert fp(t[I] - u[I]) != fp(u[I] - t[I])
    assert fp(t[I] / u[I]) != fp(u[I] / t[I])
    assert fp(Call("pow", (t[I], u[I]))) != fp(Call("pow", (u[I], t[I])))


def test_reduction_iterators_told_apart_by_use():
    a, k = Tensor("A", (3, 3)), Tensor("K", (3, 3))
    loops = (IterVar(I, 0, 1),)
    reduce = (IterVar(R, 0, 3), IterVar(S, 0, 3))
    same = Scope(loops, reduce, a[R, S] * k[R, S])
    crossed = Scope(loops, reduce, a[R, S] * k[S, R])
    assert fingerprint(same) != fingerprint(crossed)
    # ...but swapping the roles of r and s everywhere is a renaming
    assert fingerprint(Scope(loops, reduce, a[S, R] * k[S, R])) == fingerprint(same)
    assert fingerprint(Scope(loops, reduce, a[S, R] * k[R, S])) == fingerprint(crossed)
    # refinement through combined indices: r + s vs r + 2s
    t = Tensor("T", (9,))
    assert fingerprint(Scope(loops, reduce, a[R, S] * t[R + 2 * S])) != \
        fingerprint(Scope(loops, reduce, a[R, S] * t[2 * R + S]))


def test_loops_identified_by_position():
    t = Tensor("T", (4, 4))
    ij = (IterVar(I, 0, 4), IterVar(J, 0, 4))
    assert fingerprint(Scope(ij, (), t[I, J])) != fingerprint(Scope(ij, (), t[J, I]))
    ji = (IterVar(J, 0, 4), IterVar(I, 0, 4))
    assert fingerprint(Scope(ji, (), t[J, I])) == fingerprint(Scope(ij, (), t[I, J]))


def test_sensitivity():
    base = fingerprint(conv())
    different = [
        conv(a_idx=(N, H + 2 * R - 1, W + S - 1, C)),                   # a coefficient
        conv(a_idx=(N, H + R, W + S - 1, C)),                           # a constant
        conv(a=Tensor("B", (1, 7, 7, 8), pad=[0, 1, 1, 0])),            # a tensor name
        conv(a=Tensor("A", (1, 7, 7, 9), pad=[0, 1, 1, 0])),            # a shape
        conv(a=Tensor("A", (1, 7, 7, 8), pad=[0, 1, 2, 0])),            # a pad
        conv(a=Tensor("A", (1, 7, 7, 8), "float16", pad=[0, 1, 1, 0])),  # a dtype
        conv(a=Tensor("A", (1, 7, 7, 8), pad=[0, 1, 1, 0], pad_value=1.0)),
        conv(loops=(IterVar(N, 0, 1), IterVar(H, 0, 6), IterVar(W, 0, 7), IterVar(F, 0, 8))),
        conv(loops=(IterVar(N, 0, 1), IterVar(H, 1, 8), IterVar(W, 0, 7), IterVar(F, 0, 8))),
        conv(reduce=(IterVar(C, 0, 8), IterVar(R, 0, 2), IterVar(S, 0, 3))),
        conv(reducer="max"),
        conv().replace(pad=[0, 1, 0, 0]),
        conv().replace(body=conv().body * 2.0),
        conv().replace(body=Call("relu", (conv().body,))),
    ]
    prints = [fingerprint(e) for e in different]
    assert base not in prints
    assert len(set(prints)) == len(prints)
    assert fingerprint(conv().replace(body=conv().body * 2.0)) != \
        fingerprint(conv().replace(body=conv().body * 3.0))


def test_nested_scopes_hashed_structurally():
    t = Tensor("T", (8,))
    inner = Scope((IterVar(J, 0, 8),), (), t[J] * 2.0)
    inner_renamed = Scope((IterVar(Var("q"), 0, 8),), (), Const(2.0) * t[Var("q")])
    inner_other = Scope((IterVar(J, 0, 8),), (), t[J] * 3.0)
    loops = (IterVar(I, 0, 8),)
    outer = Scope(loops, (), Access(inner, (I,)))
    assert fingerprint(Scope(loops, (), Access(inner_renamed, (I,)))) == fingerprint(outer)
    assert fingerprint(Scope(loops, (), Access(inner_other, (I,)))) != fingerprint(outer)
    assert fingerprint(Scope(loops, (), t[I] * 2.0)) != fingerprint(outer)


def test_bare_expressions_and_tensors():
    assert fingerprint(H + R) == fingerprint(R + H)
    assert fingerprint(H + R) != fingerprint(H + S)  # free iterators are identified by name
    assert fingerprint(A) != fingerprint(K)
    assert fingerprint(Const(1.0)) != fingerprint(Const(1))
    assert fingerprint(Const(-1)) != fingerprint(Const(-2))
    assert fingerprint(Const(float("nan"))) == fingerprint(Const(float("nan")))


def _fingerprint_text() -> str:
    """The fingerprint of :func:`conv` parsed back from its text (run in this process and in
    one with another string-hash seed)."""
    from tvm_ollie.ir.parser import parse  # pylint: disable=import-outside-toplevel

    return str(fingerprint(parse(str(conv()))))


def test_deterministic_across_processes(other_hash_seed_lines):
    """A new process with another string-hash seed than this one's (the suite's one such
    process, ``conftest.py``) computes the same fingerprint."""
    assert int(other_hash_seed_lines["fingerprint"]) == fingerprint(conv())
    assert _fingerprint_text() == str(fingerprint(conv()))


def test_cache_clearing_keeps_values():
    expr = conv()
    before = fingerprint(expr)
    fingerprint_module.clear_cache()
    affine.clear_cache()
    assert fingerprint(expr) == before


# -- properties --------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scopes(max_depth=2), st.integers(0, 10 ** 6))
def test_invariant_under_rewriting_random_scopes(scope, seed):
    rewritten = Rewriter(seed).scope(scope)
    assert fingerprint(rewritten) == fingerprint(scope)


@settings(max_examples=60, deadline=None)
@given(conv_like_scopes(), st.integers(0, 10 ** 6))
def test_invariant_under_rewriting_conv_like(scope, seed):
    assert fingerprint(Rewriter(seed).scope(scope)) == fingerprint(scope)
    assert fingerprint(Rewriter(seed, permute=False, swap=False).scope(scope)) == \
        fingerprint(scope)


def _perturb(scope: Scope, how: str, where: int) -> Scope:
    """Change one subscript of the outer body: +1, or one more loop iterator."""
    accesses = [n for n in _outer_accesses(scope.body)]
    access = accesses[where % len(accesses)]
    dim = where % len(access.indices)
    extra = Const(1) if how == "const" else scope.loops[where % len(scope.loops)].var
    indices = list(access.indices)
    indices[dim] = indices[dim] + extra
    new = Access(access.source, tuple(indices))
    return scope.replace(body=_replace(scope.body, access, new))


def _outer_accesses(node):
    if type(node) is Access:
        yield node
    elif type(node) in (BinOp, Call):
        for child in node.children:
            yield from _outer_accesses(child)


def _replace(node, old, new):
    if node is old:
        return new
    if type(node) is BinOp:
        return BinOp(node.op, _replace(node.a, old, new), _replace(node.b, old, new))
    if type(node) is Call:
        return Call(node.func, tuple(_replace(a, old, new) for a in node.args))
    return node


@settings(max_examples=60, deadline=None)
@given(conv_like_scopes(), st.sampled_from(("const", "var")), st.integers(0, 100))
def test_sensitive_to_subscript_changes(scope, how, where):
    changed = _perturb(scope, how, where)
    assert fingerprint(changed) != fingerprint(scope)


@settings(max_examples=60, deadline=None)
@given(conv_like_scopes(), st.integers(0, 100))
def test_sensitive_to_range_changes(scope, where):
    ivs = list(scope.loops + scope.reduce)
    pick = where % len(ivs)
    iv = ivs[pick]
    ivs[pick] = IterVar(iv.var, iv.begin, iv.end + 1)
    changed = Scope(ivs[:len(scope.loops)], ivs[len(scope.loops):], scope.body)
    assert fingerprint(changed) != fingerprint(scope)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scopes(max_depth=1, max_loops=2, max_reduce=2, max_extent=3, allow_pad=False),
       scopes(max_depth=1, max_loops=2, max_reduce=2, max_extent=3, allow_pad=False))
def test_equal_fingerprints_mean_equal_values(a, b):
    """Small random scopes often coincide up to renaming; then (and only then) prints agree."""
    if fingerprint(a) != fingerprint(b):
        return
    inputs = random_inputs(a, seed=3)
    np.testing.assert_allclose(evaluate(a, inputs, dtype="float64"),
                               evaluate(b, inputs, dtype="float64"), rtol=1e-9, atol=1e-12)
