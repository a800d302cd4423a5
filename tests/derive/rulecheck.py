"""Shared checks of the derivation-rule tests: a rewrite must keep the interpreter's result."""

from collections import Counter
from typing import List, Optional, Sequence

from hypothesis import event

from tvm_ollie.derive.canon import canonicalize
from tvm_ollie.derive.focus import apply_eager, apply_rules
from tvm_ollie.derive.rules import EAGER_RULES, Rewrite, Rule, RuleContext
from tvm_ollie.ir.nodes import BinOp, Call, Const, IterVar, Scope, Tensor, Var
from tvm_ollie.verify.equivalence import check_equivalent


def assert_equivalent(a: Scope, b: Scope, what: str = "") -> None:
    """``b`` computes what ``a`` does (same shape, integer and float trials)."""
    assert a.shape == b.shape, f"{what}: shape {a.shape} -> {b.shape}"
    res = check_equivalent(a, b, trials=2)
    assert res.ok, f"{what}: {res.reason}\n  before: {a}\n  after:  {b}"


def check_rule(rule: Rule, scope: Scope, ctx: Optional[RuleContext] = None,
               limit: int = 8) -> List[Rewrite]:
    """Apply ``rule`` to ``scope``; every rewrite (and its canonical, eagerly merged form) must be
    equivalent. Returns the rewrites."""
    ctx = ctx or RuleContext()
    out = rule(scope, ctx)
    for rw in out[:limit]:
        assert_equivalent(scope, rw.scope, f"{rule.name}: {rw.note}")
        merged = canonicalize(apply_eager(rw.scope, EAGER_RULES, ctx))
        assert_equivalent(scope, merged, f"{rule.name} (merged, canonical): {rw.note}")
    return out


def check_rule_everywhere(rule: Rule, expr: Scope, ctx: Optional[RuleContext] = None,
                          limit: int = 8) -> int:
    """Apply ``rule`` at every focus of ``expr`` through the driver; all results equivalent."""
    ctx = ctx or RuleContext()
    count = 0
    for step in apply_rules(expr, (rule,), ctx):
        if count >= limit:
            break
        assert_equivalent(expr, step.expr, f"{rule.name} at a nested focus: {step.note}")
        count += 1
    return count


def conv2d_nhwc(n=1, h=4, c=3, f=2, r=3, stride=1, dil=1, pad=None) -> Scope:
    """``Out[n, h, w, f] = Σ A[n, s*h + d*r - p, s*w + d*s - p, c] * K[r, s, f, c]``."""
    p = dil * (r - 1) // 2 if pad is None else pad
    out = (h + 2 * p - dil * (r - 1) - 1) // stride + 1
    vn, vh, vw, vf, vc, vr, vs = (Var(x) for x in "nhwfcrs")
    a = Tensor("A", (n, h, h, c), pad=((0, 0), (p, p), (p, p), (0, 0)))
    k = Tensor("K", (r, r, f, c))
    return Scope(
        [IterVar(vn, 0, n), IterVar(vh, 0, out), IterVar(vw, 0, out), IterVar(vf, 0, f)],
        [IterVar(vc, 0, c), IterVar(vr, 0, r), IterVar(vs, 0, r)],
        a[vn, stride * vh + dil * vr - p, stride * vw + dil * vs - p, vc] * k[vr, vs, vf, vc],
    )


def conv_transpose_gather(n: int, c: int, f: int, size: Sequence[int], taps: Sequence[int],
                          stride: Sequence[int], pad_lo: Sequence[int], pad_hi: Sequence[int],
                          out_pad: Sequence[int], dil: Sequence[int] = None) -> Scope:
    """The lifter's gather form of an NC(H)W transposed convolution (IO(H)W kernel)::

        L<n, o, h..> Σ<c, r..> select(∧ (h + pl - d·r) % s == 0,
                                      x<pad>[n, c, (h + pl - d·r) // s ..], 0) * K[c, o, r..]
    """
    nd = len(size)
    dil = dil or [1] * nd
    out = [(i - 1) * s - pl - ph + d * (t - 1) + o + 1
           for i, s, pl, ph, d, t, o in zip(size, stride, pad_lo, pad_hi, dil, taps, out_pad)]
    vn, vo, vc = Var("n"), Var("o"), Var("c")
    hs = [Var(f"h{d}") for d in range(nd)]
    rs = [Var(f"r{d}") for d in range(nd)]
    idx, guards, pads = [vn, vc], [], [(0, 0), (0, 0)]
    for d in range(nd):
        pos = hs[d] + pad_lo[d] - dil[d] * rs[d]
        lo, hi = pad_lo[d] - (taps[d] - 1) * dil[d], out[d] - 1 + pad_lo[d]
        if stride[d] > 1:
            guards.append(BinOp("==", BinOp("%", pos, Const(stride[d])), Const(0)))
            pos = BinOp("//", pos, Const(stride[d]))
            lo, hi = lo // stride[d], hi // stride[d]
        idx.append(pos)
        pads.append((max(0, -lo), max(0, hi - size[d] + 1)))
    x = Tensor("x", (n, c, *size), pad=pads)
    k = Tensor("K", (c, f, *taps))
    read = x[tuple(idx)]
    if guards:
        cond = guards[0]
        for g in guards[1:]:
            cond = BinOp("and", cond, g)
        read = Call("select", (cond, read, Const(0.0, "float32")))
    loops = [IterVar(vn, 0, n), IterVar(vo, 0, f)] + [IterVar(h, 0, e) for h, e in zip(hs, out)]
    reduce = [IterVar(vc, 0, c)] + [IterVar(r, 0, t) for r, t in zip(rs, taps)]
    return Scope(loops, reduce, read * k[(vc, vo, *rs)])


class Applied:
    """How many generated cases each rule rewrote, so a property test cannot pass vacuously.

    A hypothesis test records every rule it tried (:meth:`note`, also a ``hypothesis.event``
    shown by ``--hypothesis-show-statistics``); after the run, :meth:`require` fails unless each
    named rule applied to at least one generated case.
    """

    def __init__(self):
        self.counts: Counter = Counter()
        self.cases = 0

    def note(self, rule: Rule, n: int) -> None:
        """``rule`` produced ``n`` rewrites on the current case."""
        if n:
            self.counts[rule.name] += 1
            event(f"{rule.name} applied")
        else:
            event(f"{rule.name} did not apply")

    def require(self, *rules: Rule) -> None:
        """Each of ``rules`` applied to at least one case."""
        missing = [r.name for r in rules if not self.counts[r.name]]
        assert not missing, f"never applied in {self.cases} cases: {missing} ({dict(self.counts)})"

    def require_any(self, *rules: Rule) -> None:
        """At least one of ``rules`` applied to some case (a family on unshaped random cases)."""
        assert any(self.counts[r.name] for r in rules), \
            f"none of {[r.name for r in rules]} applied in {self.cases} cases"
