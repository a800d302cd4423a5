"""Data-layout transformation: each rewrite keeps the interpreter's result."""

from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import conv_like_scopes, scopes

from rulecheck import Applied, check_rule, check_rule_everywhere, conv2d_nhwc
from tvm_ollie.derive.canon import canonicalize
from tvm_ollie.derive.rules import SPLIT_DIM, SPLIT_LOOP
from tvm_ollie.ir.nodes import Access, IterVar, Scope, Tensor, Var


def _g2bmm(dil=2, m=8, w=1, k=3):
    b, vm, vw, vk = (Var(x) for x in "bmwk")
    a = Tensor("A", (1, m, k))
    bt = Tensor("B", (1, m, k), pad=((0, 0), (dil * w, dil * w), (0, 0)))
    return Scope([IterVar(b, 0, 1), IterVar(vm, 0, m), IterVar(vw, 0, 2 * w + 1)],
                 [IterVar(vk, 0, k)], a[b, vm, vk] * bt[b, vm + dil * (vw - w), vk])


def test_split_dim_of_a_dilated_read():
    g2 = _g2bmm()
    split = next(rw.scope for rw in SPLIT_LOOP(g2) if "split L m" in rw.note)
    inner = split.body.source
    rws = check_rule(SPLIT_DIM, inner)
    assert rws
    for rw in rws:
        new = canonicalize(rw.scope)
        gathers = [a for a in _accesses(new) if isinstance(a.source, Scope)]
        assert gathers, rw.note
        # after simplification the gathered read uses plain iterators, no // or %
        assert all("//" not in str(i) and "%" not in str(i) for g in gathers for i in g.indices)


def _accesses(scope):
    from tvm_ollie.derive.rules.base import body_accesses

    return body_accesses(scope.body)


@st.composite
def strided_convs(draw):
    """NHWC convolutions with an index stride (stride or dilation 2) that divides the input
    extent: the guard of split_dim holds by construction."""
    stride, dil = draw(st.sampled_from([(2, 1), (1, 2), (2, 2)]))
    r, pad = draw(st.integers(1, 3)), draw(st.integers(0, 1))
    if dil * (r - 1) == 0 and stride == 1:
        r = 2
    h = 2 * draw(st.integers(max(2, -(-(dil * (r - 1) + 1 - 2 * pad) // 2)), 3))  # h > k
    return conv2d_nhwc(n=1, h=h, c=draw(st.integers(1, 2)), f=draw(st.integers(1, 2)), r=r,
                       stride=stride, dil=dil, pad=pad)


@given(strided_convs())
@settings(max_examples=15)
def test_split_dim_applies_to_strided_convs(scope):
    rws = check_rule(SPLIT_DIM, scope, limit=2)
    assert rws, f"split_dim did not apply to {scope}"


def test_split_dim_on_conv_like():
    applied = Applied()

    # about 1 case in 14 has a stride dividing its extent (strided_convs has one in each)
    @given(conv_like_scopes(kinds=("g2bmm", "gbmm", "conv1d", "conv2d")))
    @settings(max_examples=50)
    def run(scope):
        applied.cases += 1
        applied.note(SPLIT_DIM, len(check_rule(SPLIT_DIM, scope, limit=3)))

    run()
    applied.require(SPLIT_DIM)


def test_split_dim_on_random_scopes():
    applied = Applied()

    @given(scopes(max_depth=2))
    @settings(max_examples=30)
    def run(scope):
        applied.cases += 1
        applied.note(SPLIT_DIM, check_rule_everywhere(SPLIT_DIM, scope, limit=3))

    run()
    applied.require(SPLIT_DIM)
