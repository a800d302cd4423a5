"""Derivation through widening casts: float16 reads summed in float32 derive like float32 ones."""

from __future__ import annotations

import numpy as np

from tvm_ollie.derive import derive
from tvm_ollie.derive.casts import widen_reads
from tvm_ollie.ir.interp import evaluate, random_inputs
from tvm_ollie.ir.nodes import Call, IterVar, Scope, Tensor, Var, is_cast, iter_nodes
from tvm_ollie.transform.decide import check_exact
from tvm_ollie.verify.tolerance import tolerance


def _conv3x3(dtype: str, acc: str, n=1, h=4, c=8, f=8) -> Scope:
    """NHWC conv3x3 (padding 1) reading ``dtype`` data under ``acc`` casts."""
    vn, vh, vw, vf, vc, vr, vs = (Var(x) for x in "nhwfcrs")
    a = Tensor("A", (n, h, h, c), dtype, pad=((0, 0), (1, 1), (1, 1), (0, 0)))
    k = Tensor("K", (3, 3, f, c), dtype)
    return Scope([IterVar(vn, 0, n), IterVar(vh, 0, h), IterVar(vw, 0, h), IterVar(vf, 0, f)],
                 [IterVar(vc, 0, c), IterVar(vr, 0, 3), IterVar(vs, 0, 3)],
                 Call(acc, (a[vn, vh + vr - 1, vw + vs - 1, vc],))
                 * Call(acc, (k[vr, vs, vf, vc],)))


def test_widen_reads_retypes_only_consistently_cast_inputs():
    conv = _conv3x3("float16", "float32")
    wide, retyped = widen_reads(conv)
    assert retyped == {"A": ("float16", "float32"), "K": ("float16", "float32")}
    assert not any(is_cast(n) for n in iter_nodes(wide))
    # A read under a cast that is not widening keeps A's type (K's reads are all widened).
    a = next(n for n in iter_nodes(conv) if isinstance(n, Tensor) and n.name == "A")
    plain = Call("bfloat16", (a[Var("n"), Var("h"), Var("w"), Var("f")],))
    _, retyped = widen_reads(conv.replace(body=conv.body + Call("float32", (plain,))))
    assert set(retyped) == {"K"}


def test_float16_conv3x3_accumulating_in_float32_becomes_matmul_plus_offset_add():
    conv = _conv3x3("float16", "float32")
    res = derive(conv, targets=("matmul",), max_depth=1, max_candidates=2)
    form = "matmul[16x8 @ 8x72] -> eop[offset-add 1x4x4x8]"
    assert form in [repr(p) for p in res.candidates]
    prog = next(p for p in res.candidates if repr(p) == form)
    mm = prog.stages[0].expr
    assert mm.dtype == "float32"  # the matmul accumulates in float32, as the original
    assert {t.dtype for t in mm.inputs} == {"float16"}  # and reads the float16 inputs
    assert prog.original is conv
    inputs = {k: v.astype(np.float16) for k, v in random_inputs(conv, seed=2).items()}
    ref = evaluate(conv, inputs, np.float64)
    np.testing.assert_allclose(prog.evaluate(inputs), ref, rtol=tolerance("float32"),
                               atol=tolerance("float32"))
    assert check_exact(prog) == (True, "")
