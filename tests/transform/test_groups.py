"""Groups of independent matmuls that read the same operand (Q/K/V projections): found by the
graph, merged into one GEMM by the inter-expression rules, verified, and emitted in place."""

import numpy as np
import pytest
import tvm
from tvm import relax

from tvm_ollie.derive.rules.inter import inline_views, merge_shared_inputs
from tvm_ollie.ir.interp import evaluate
from tvm_ollie.transform import optimize_module
from tvm_ollie.transform.groups import find_shared_input_groups

from small_models import LLVM_CALIB

N, C = 8, 16


def _linears(n_proj=3, widths=None, bias=True, shared_reshape=False, attention=True):
    """``x -> n_proj`` linears (``permute_dims(W)`` + ``matmul`` + bias), then a tiny attention
    (or the sum of the projections) so the projections' readers sit between them."""
    rng = np.random.default_rng(0)
    widths = widths or [C] * n_proj
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, N, C), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            outs = []
            for width in widths:
                src = bb.emit(relax.op.reshape(x, (N, C))) if shared_reshape else x
                w = relax.const(rng.standard_normal((width, C)).astype("float32"))
                y = bb.emit(relax.op.matmul(src, bb.emit(relax.op.permute_dims(w))))
                if bias:
                    b = relax.const(rng.standard_normal((width,)).astype("float32"))
                    y = bb.emit(relax.op.add(y, b))
                outs.append(y)
            if attention and len(outs) == 3:
                kt = relax.op.permute_dims(outs[1], (0, 2, 1) if not shared_reshape else None)
                s = bb.emit(relax.op.nn.softmax(relax.op.matmul(outs[0], kt)))
                out = bb.emit_output(relax.op.matmul(s, outs[2]))
            else:
                out = bb.emit_output(relax.op.concat(outs, axis=-1))
        bb.emit_func_output(out)
    return bb.get()


def _run(mod_or_ex, x):
    ex = tvm.compile(mod_or_ex, target="llvm") if isinstance(mod_or_ex, tvm.IRModule) \
        else mod_or_ex
    vm = relax.VirtualMachine(ex, tvm.cpu())
    return vm["main"](tvm.runtime.tensor(x)).numpy()


def _merged(sig, alts):
    """Chooser: the merged program of a group (else the cost model decides)."""
    return next((a for a in alts if a.program is not None and a.program.multi and
                 a.impl == "tvm"), None)


def test_qkv_group_found_and_merged_program_is_exact():
    groups = find_shared_input_groups(_linears())
    assert len(groups) == 1
    g = groups[0]
    assert g.size == 3 and g.position == 0 and str(g.shared.name) == "x"
    # permute_dims of a constant weight is read as the folded constant (as TVM builds it)
    assert [n for n, v in g.inputs() if isinstance(v, relax.Var)] == ["x"]
    (prog,) = g.programs()
    assert prog.multi and [s.kind for s in prog.operators] == ["matmul"]
    assert "merge-shared-input" in prog.explain()
    rng = np.random.default_rng(1)
    feed = {n: rng.standard_normal([int(d) for d in v.ty.shape]) for n, v in g.inputs()}
    got = prog.evaluate(feed)
    for expr, out in zip(g.lifts(), got):
        np.testing.assert_allclose(out, evaluate(expr, feed), rtol=1e-10, atol=1e-10)


def test_merge_of_three_reads_the_product_once_per_output():
    g = find_shared_input_groups(_linears(widths=[16, 8, 24], attention=False, bias=False))[0]
    prog = merge_shared_inputs(g.lifts())
    slices = [s for s in prog.stages if s.name in prog.outputs]
    mm = prog.operators[0].name
    # inline_views: every output is one slice of the merged product, not a slice of a slice
    assert all(s.reads == (mm,) for s in slices)
    assert inline_views(prog).stages == prog.stages
    assert prog.operators[0].attrs["N"] == 48


def test_qkv_merged_through_optimize_matches_tvm():
    mod = _linears(attention=False, shared_reshape=True)
    new, rep = optimize_module(mod, "llvm", calibration=LLVM_CALIB, library=False,
                               chooser=_merged, search_time_s=2.0)
    (group,) = [r for r in rep.regions if " share " in r.contents]
    assert group.rewritten, group.reason
    # the regions around the merged calls (permute_dims + matmul + bias) are not decided again
    members = {v.strip() for v in group.var_name.split(",")}
    assert not [r for r in rep.regions if r is not group and
                members & {c.split("=")[0] for c in r.contents.split(", ")}]
    # the three projections became one matmul
    assert new["main"].script().count("R.matmul(") == 1
    x = np.random.default_rng(2).standard_normal((1, N, C)).astype("float32")
    np.testing.assert_allclose(_run(new, x), _run(mod, x), rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_qkv_merged_in_attention_block_matches_tvm():
    """The projections' readers (bias, attention) sit between them and move after the merge."""
    mod = _linears()
    new, rep = optimize_module(mod, "llvm", calibration=LLVM_CALIB, library=False,
                               region_calls=1, chooser=_merged, search_time_s=2.0)
    (group,) = [r for r in rep.regions if "share x" in r.contents]
    assert group.rewritten, group.reason
    assert new["main"].script().count("R.matmul(") == 3  # the attention keeps its two
    x = np.random.default_rng(2).standard_normal((1, N, C)).astype("float32")
    np.testing.assert_allclose(_run(new, x), _run(mod, x), rtol=1e-4, atol=1e-4)


def test_views_of_one_input_are_one_shared_input():
    """Importers emit one ``reshape`` of the input per linear: still one shared input."""
    mod = _linears(n_proj=2, widths=[16, 32], shared_reshape=True, attention=False)
    (g,) = find_shared_input_groups(mod, bias=False)
    assert len({n for n, _ in g.inputs()}) == 3  # the shared view and two weights
    assert len(g.programs()) == 1


@pytest.mark.slow
def test_views_of_one_input_merged_through_optimize_match_tvm():
    mod = _linears(n_proj=2, widths=[16, 32], shared_reshape=True, attention=False)
    new, rep = optimize_module(mod, "llvm", calibration=LLVM_CALIB, library=False,
                               region_calls=1, chooser=_merged, search_time_s=2.0)
    assert any(r.rewritten for r in rep.regions)
    x = np.random.default_rng(3).standard_normal((1, N, C)).astype("float32")
    np.testing.assert_allclose(_run(new, x), _run(mod, x), rtol=1e-4, atol=1e-4)


def _dependent(through_other_binding: bool):
    rng = np.random.default_rng(0)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((C, C), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit(relax.op.matmul(x, relax.const(rng.standard_normal((C, C)).astype(
                "float32"))))
            w2 = bb.emit(relax.op.add(a, relax.const(np.float32(1.0)))) \
                if through_other_binding else a
            b = bb.emit(relax.op.matmul(x, w2))
            out = bb.emit_output(relax.op.add(a, b))
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("through_other_binding", [False, True])
def test_dependent_matmuls_are_not_grouped(through_other_binding):
    assert find_shared_input_groups(_dependent(through_other_binding)) == []


def test_group_bound_and_disabled():
    mod = _linears(n_proj=5, widths=[8] * 5, attention=False)
    sizes = [g.size for g in find_shared_input_groups(mod, max_ops=4)]
    assert sizes == [4]  # the fifth alone is no group
    assert find_shared_input_groups(mod, max_ops=1) == []


def _branches(kernel=1):
    """Inception-like: 1x1 (or ``kernel``) convolutions of one input, concatenated."""
    rng = np.random.default_rng(0)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 16, 6, 6), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            ys = [bb.emit(relax.op.nn.relu(relax.op.nn.conv2d(
                x, relax.const(rng.standard_normal((o, 16, kernel, kernel)).astype("float32")),
                padding=kernel // 2))) for o in (8, 12)]
            out = bb.emit_output(relax.op.concat(ys, axis=1))
        bb.emit_func_output(out)
    return bb.get()


def test_conv1x1_branches_merge_into_one_gemm():
    mod = _branches()
    (g,) = find_shared_input_groups(mod)
    (prog,) = g.programs()
    assert [s.kind for s in prog.operators] == ["matmul"]
    assert prog.operators[0].attrs["M"] == 20  # 8 + 12 filters
    rng = np.random.default_rng(1)
    feed = {n: rng.standard_normal([int(d) for d in v.ty.shape]) for n, v in g.inputs()}
    for expr, out in zip(g.lifts(), prog.evaluate(feed)):
        np.testing.assert_allclose(out.reshape(expr.shape), evaluate(expr, feed), rtol=1e-10)


def test_conv3x3_branches_do_not_merge():
    (g,) = find_shared_input_groups(_branches(kernel=3))
    assert g.programs() == []


@pytest.mark.slow
def test_conv1x1_branches_through_optimize_match_tvm():
    mod = _branches()
    new, rep = optimize_module(mod, "llvm", calibration=LLVM_CALIB, library=False,
                               region_calls=1, chooser=_merged, search_time_s=2.0)
    assert any(r.rewritten for r in rep.regions)
    assert "conv2d" not in new["main"].script()
    x = np.random.default_rng(4).standard_normal((1, 16, 6, 6)).astype("float32")
    np.testing.assert_allclose(_run(new, x), _run(mod, x), rtol=1e-4, atol=1e-4)
