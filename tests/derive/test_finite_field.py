"""Exact checks of derived programs over Z_p (Schwartz-Zippel) for polynomial expressions."""

import pytest

from rulecheck import conv2d_nhwc
from tvm_ollie.derive.program import Program, Stage
from tvm_ollie.derive.search import derive
from tvm_ollie.ir.nodes import Call, IterVar, Scope, Tensor, Var
from tvm_ollie.verify.finite_field import (
    PRIMES,
    NotPolynomial,
    check_program_mod_p,
    magnitude_bound,
    polynomial_degree,
)


def _matmul(m=4, k=6, n=5, reducer="sum", relu=False):
    vm, vn, vk = Var("m"), Var("n"), Var("k")
    a, b = Tensor("A", (m, k)), Tensor("B", (k, n))
    body = a[vm, vk] * b[vk, vn]
    if relu:
        body = Call("relu", [body])
    return Scope([IterVar(vm, 0, m), IterVar(vn, 0, n)], [IterVar(vk, 0, k)], body,
                 reducer=reducer)


def test_derived_programs_agree_mod_p_with_a_bound():
    conv = conv2d_nhwc(h=5, r=3, c=2, f=2)
    res = derive(conv, max_depth=2, search_time_s=5.0, max_states=200, verify=False,
                 max_candidates=None)
    progs = res.candidates[:12]
    assert progs
    for prog in progs:
        r = check_program_mod_p(prog)
        assert r.applicable and r.ok, (repr(prog), r)
        assert r.degree == 2 and r.p in PRIMES
        assert r.bound == pytest.approx((2 / r.p) ** 3) and r.bound < 1e-15


def test_a_wrong_program_is_caught():
    conv = conv2d_nhwc(h=5, r=3, c=2, f=2, pad=1)
    # the kernel read flipped (convolution instead of correlation): same shape, other values
    vn, vh, vw, vf, vc, vr, vs = (iv.var for iv in conv.loops + conv.reduce)
    a, k = (t for t in {n.source for n in _accesses(conv)})
    a, k = (a, k) if a.name == "A" else (k, a)
    flipped = conv.replace(body=a[vn, vh + vr - 1, vw + vs - 1, vc] * k[2 - vr, vs, vf, vc])
    wrong = Program([Stage("T0", "eop", flipped, label="elementwise")], conv, "T0")
    r = check_program_mod_p(wrong)
    assert r.applicable and not r.ok and "differs mod" in r.reason
    right = Program([Stage("T0", "eop", conv, label="elementwise")], conv, "T0")
    assert check_program_mod_p(right).ok


def test_non_polynomial_expressions_are_not_checked():
    for expr, why in ((_matmul(reducer="max"), "max reduction"),
                      (_matmul(relu=True), "function relu")):
        prog = Program([Stage("T0", "eop", expr, label="elementwise")], expr, "T0")
        r = check_program_mod_p(prog)
        assert not r.applicable and why in r.reason
        with pytest.raises(NotPolynomial):
            polynomial_degree(expr)


def test_prime_keeps_the_float64_evaluation_exact():
    mm = _matmul(k=6)
    assert polynomial_degree(mm) == 2
    # 6 products of two values below p: below 2^53 for p < 2^25, not for 2^31 - 1
    assert magnitude_bound(mm, 2**31 - 1) > 2.0**53 > magnitude_bound(mm, 33554393)
    r = check_program_mod_p(Program([Stage("T0", "eop", mm, label="elementwise")], mm, "T0"))
    assert r.ok and r.p == 33554393


def _accesses(scope):
    from tvm_ollie.derive.rules.base import body_accesses

    return body_accesses(scope.body)


def test_decision_core_rejects_a_program_wrong_over_z_p():
    from tvm_ollie.transform.decide import check_exact

    conv = conv2d_nhwc(h=5, r=3, c=2, f=2, pad=1)
    vn, vh, vw, vf, vc, vr, vs = (iv.var for iv in conv.loops + conv.reduce)
    a, k = sorted({n.source for n in _accesses(conv)}, key=lambda t: t.name)
    flipped = conv.replace(body=a[vn, vh + vr - 1, vw + vs - 1, vc] * k[2 - vr, vs, vf, vc])
    ok, why = check_exact(Program([Stage("T0", "eop", flipped, label="elementwise")], conv, "T0"))
    assert not ok and why.startswith("differs over Z_")
    assert check_exact(Program([Stage("T0", "eop", conv, label="elementwise")], conv, "T0")) == \
        (True, "")
