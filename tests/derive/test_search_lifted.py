"""The search on what the lifter emits for Relax operators (the Relax pass derives exactly that).

Each case lifts one small Relax call (or a ``permute_dims`` -> ``matmul`` chain, the permute's
scope read by the matmul) and derives: the expected operator + eOperator form must be found within
a small depth, and the program must agree with the lifted expression on random inputs.
"""

from __future__ import annotations

import re

import pytest

tvm = pytest.importorskip("tvm")

from tvm import relax  # noqa: E402

from tvm_ollie.derive import derive  # noqa: E402
from tvm_ollie.derive.focus import replace_node  # noqa: E402
from tvm_ollie.derive.search import verify_candidate  # noqa: E402
from tvm_ollie.ir.nodes import Call, Tensor, iter_nodes  # noqa: E402
from tvm_ollie.lift import lift  # noqa: E402

R = relax.op
F32 = "float32"
#: a matmul (operands possibly gathered first) followed by the offset-add of the taps
MATMUL_OFFSET_ADD = r"^(eop\[gather[^\]]*\] -> )*matmul\[[^\]]*\] -> eop\[offset-add"


def lifted_chain(make, inputs):
    """Lift every binding of ``make``'s dataflow block; later lifts read earlier ones' scopes."""
    bb = relax.BlockBuilder()
    params = [relax.Var(n, relax.TensorType(s, F32)) for n, s in inputs.items()]
    with bb.function("f", params):
        with bb.dataflow():
            out = bb.emit_output(make(bb, *params))
        bb.emit_func_output(out)
    mod = bb.get()
    scopes = {}
    expr = None
    for binding in mod["f"].body.blocks[0].bindings:
        expr = lift(binding.value, mod)
        for t in {n for n in iter_nodes(expr) if isinstance(n, Tensor) and n.name in scopes}:
            expr = replace_node(expr, t, scopes[t.name])
        scopes[str(binding.var.name)] = expr
    return expr


def lifted(make, inputs):
    """The lift of one Relax call ``make(*inputs)``."""
    return lifted_chain(lambda bb, *xs: make(*xs), inputs)


def derive_expect(expr, targets, pattern, max_depth, accept=lambda prog: True):
    """Derive; return the first program matching ``pattern`` and ``accept`` (and the depth at
    which it was found), verified against ``expr``."""
    res = derive(expr, targets=targets, max_depth=max_depth, search_time_s=60, verify=False,
                 max_candidates=None)
    rx = re.compile(pattern)
    progs = {repr(p): p for p in res.candidates if rx.search(repr(p)) and accept(p)}
    hit = next(((d, rep) for _, d, rep in res.stats.found_log if rep in progs), None)
    assert hit is not None, f"{pattern} not found: {res.stats.summary()}\n{expr}"
    prog = progs[hit[1]]
    ok, why = verify_candidate(expr, prog)
    assert ok, f"{prog!r}: {why}"
    return prog, hit[0]


CONV_T = [  # (N, spatial, kernel, padding, output_padding), stride 2, C = F = 4
    (1, 3, 4, 1, 0), (2, 3, 3, 0, 1), (1, 4, 3, 1, 1), (2, 3, 4, 0, 0),
]


@pytest.mark.parametrize("n,hw,k,p,op", CONV_T)
def test_lifted_conv2d_transpose_to_matmul(n, hw, k, p, op):
    expr = lifted(lambda x, w: R.nn.conv2d_transpose(x, w, strides=2, padding=p,
                                                       output_padding=op),
                  {"x": (n, 4, hw, hw), "w": (4, 4, k, k)})
    assert any(isinstance(x, Call) and x.func == "select" for x in iter_nodes(expr))
    # a matmul + offset-add (summing some taps inside the matmul) at depth 2 ...
    derive_expect(expr, ("matmul",), MATMUL_OFFSET_ADD, max_depth=2)

    # ... and at depth 3 EinNet's form: every input pixel times every tap once,
    # N·H·W x C by C x F·k·k, then the offset-add of the taps that land on each output pixel
    def einnet(prog):
        mm = next(s for s in prog.stages if s.kind == "matmul")
        dims = mm.attrs["M"], mm.attrs["K"], mm.attrs["N"]
        return dims[1] == 4 and {dims[0], dims[2]} == {n * hw * hw, 4 * k * k}

    _, depth = derive_expect(expr, ("matmul",), MATMUL_OFFSET_ADD, max_depth=3, accept=einnet)
    assert depth <= 3  # 1 with the guided map_to_target (its mappings cost no depth)


def test_lifted_conv1d_transpose_to_matmul():
    expr = lifted(lambda x, w: R.nn.conv1d_transpose(x, w, strides=2, padding=1,
                                                       output_padding=1),
                  {"x": (2, 4, 5), "w": (4, 3, 3)})
    derive_expect(expr, ("matmul",), MATMUL_OFFSET_ADD, max_depth=2)


CONVS = [
    ("nchw-3x3", lambda x, w: R.nn.conv2d(x, w, padding=1),
     {"x": (1, 4, 4, 4), "w": (4, 4, 3, 3)}, 2),
    ("nhwc-3x3", lambda x, w: R.nn.conv2d(x, w, padding=1, data_layout="NHWC",
                                          kernel_layout="HWIO"),
     {"x": (1, 4, 4, 4), "w": (3, 3, 4, 4)}, 2),
    ("nchw-1x3", lambda x, w: R.nn.conv2d(x, w, padding=(0, 1)),
     {"x": (1, 4, 4, 4), "w": (4, 4, 1, 3)}, 2),
    ("nchw-3x1-nhwc", lambda x, w: R.nn.conv2d(x, w, padding=(1, 0), data_layout="NHWC",
                                               kernel_layout="HWIO"),
     {"x": (2, 4, 4, 4), "w": (3, 1, 4, 4)}, 2),
    ("nchw-3x3-stride2", lambda x, w: R.nn.conv2d(x, w, padding=1, strides=2),
     {"x": (1, 4, 6, 6), "w": (4, 4, 3, 3)}, 3),
    ("nchw-3x3-dilation2", lambda x, w: R.nn.conv2d(x, w, padding=2, dilation=2),
     {"x": (1, 4, 5, 5), "w": (4, 4, 3, 3)}, 2),
    ("conv1d", lambda x, w: R.nn.conv1d(x, w, padding=1),
     {"x": (2, 4, 6), "w": (4, 4, 3)}, 2),
]


@pytest.mark.parametrize("name,make,inputs,depth", CONVS, ids=[c[0] for c in CONVS])
def test_lifted_conv_to_matmul_offset_add(name, make, inputs, depth):
    expr = lifted(make, inputs)
    derive_expect(expr, ("matmul",), MATMUL_OFFSET_ADD, max_depth=depth)


@pytest.mark.parametrize("name,make,inputs,depth", CONVS[:2], ids=[c[0] for c in CONVS[:2]])
def test_lifted_conv_matches_conv2d_at_once(name, make, inputs, depth):
    expr = lifted(make, inputs)
    _, found = derive_expect(expr, ("conv2d",), r"^conv2d\[", max_depth=0)
    assert found == 0


def test_lifted_matmul_with_transposed_lhs():
    expr = lifted_chain(lambda bb, a, b: R.matmul(bb.emit(R.permute_dims(a, [1, 0])), b),
                        {"a": (4, 3), "b": (4, 5)})
    prog, _ = derive_expect(expr, ("matmul",), r"^matmul\[3x4 @ 4x5\]$", max_depth=0)
    assert prog.stages[0].attrs["transpose_a"]


def test_lifted_batch_matmul_with_transposed_rhs():
    expr = lifted_chain(
        lambda bb, a, b: R.matmul(a, bb.emit(R.permute_dims(b, [0, 2, 1]))),
        {"a": (2, 3, 4), "b": (2, 5, 4)})
    prog, _ = derive_expect(expr, ("batch_matmul",), r"^batch_matmul\[2x3x4 @ 2x4x5\]$",
                            max_depth=0)
    assert prog.stages[0].attrs["transpose_b"]


def test_lifted_batch_matmul_broadcast():
    expr = lifted(R.matmul, {"a": (2, 3, 4), "b": (4, 5)})
    derive_expect(expr, ("matmul", "batch_matmul"), r"matmul\[", max_depth=0)
