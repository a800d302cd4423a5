"""Regions: partitioning, lifting a region as one expression, deriving and replacing it whole.

The banded attention is written the way exported graphs write it: ``pad`` + ``take`` with a
constant affine index + ``matmul`` (+ reshapes/permutes), with window ``W`` and dilation ``D``::

    scores[h, m, w] = sum_k q[h, m, k] * k_pad[h, m + D * w, k]   (k padded by D * W)
"""

from __future__ import annotations

import numpy as np
import pytest

tvm = pytest.importorskip("tvm")

from tvm import relax  # noqa: E402

from tvm_ollie.ir.interp import evaluate  # noqa: E402
from tvm_ollie.transform.optimize import optimize_module  # noqa: E402
from tvm_ollie.transform.regions import (dataflow_blocks, find_regions,  # noqa: E402
                                         isolated_region_module)

R = relax.op
F32 = "float32"
H, N, DK, W, D = 2, 16, 4, 2, 2


def _band_index() -> np.ndarray:
    return (np.arange(N)[:, None] + D * np.arange(2 * W + 1)[None, :]).astype("int64")


def _banded_module(extra_use: bool = False, relu: bool = True):
    """``relu(reshape(q @ permute(take(pad(k), idx))))`` (+ an outside use of the scores)."""
    bb = relax.BlockBuilder()
    q = relax.Var("q", relax.TensorType((1, H, N, DK), F32))
    k = relax.Var("k", relax.TensorType((1, H, N, DK), F32))
    with bb.function("main", [q, k]):
        with bb.dataflow():
            kp = bb.emit(R.nn.pad(k, [0, 0, 0, 0, D * W, D * W, 0, 0]))
            keys = bb.emit(R.take(kp, relax.const(_band_index()), axis=2))  # 1,H,N,2W+1,DK
            qe = bb.emit(R.expand_dims(q, 3))  # 1,H,N,1,DK
            kt = bb.emit(R.permute_dims(keys, [0, 1, 2, 4, 3]))  # 1,H,N,DK,2W+1
            s = bb.emit(R.matmul(qe, kt))  # 1,H,N,1,2W+1
            s2 = bb.emit(R.reshape(s, (1, H, N, 2 * W + 1)))
            out = bb.emit(R.nn.relu(s2)) if relu else s2
            if extra_use:
                out = bb.emit(R.add(out, R.sum(s2, axis=[3], keepdims=True)))
            gv = bb.emit_output(out)
        bb.emit_func_output(gv)
    return bb.get()


def _run(mod, args):
    ex = tvm.compile(mod, target="llvm")
    vm = relax.VirtualMachine(ex, tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(a) for a in args])
    return out.numpy()


def _args(seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((1, H, N, DK)).astype(F32) for _ in range(2)]


def test_partition_banded_attention():
    (region,) = find_regions(_banded_module())
    assert [op.replace("relax.", "") for op in region.op_names] == [
        "nn.pad", "take", "expand_dims", "permute_dims", "matmul", "reshape", "nn.relu"]
    assert [n for n, _ in region.inputs()] == ["k", "q"]  # the index tensor is not an input
    assert region.out_shape == (1, H, N, 2 * W + 1)


def test_partition_stops_at_a_value_used_outside():
    """``s2`` is also read by the sum, so the region ends there (single output)."""
    (region,) = find_regions(_banded_module(extra_use=True))
    assert region.op_names[-1] == "relax.reshape"
    assert str(region.output.name) == "lv5"


def test_partition_size_bound_and_single_calls():
    mod = _banded_module()
    (one,) = find_regions(mod, max_calls=1)
    assert one.op_names == ["relax.matmul"]
    (small,) = find_regions(mod, max_calls=3)
    assert small.size == 3 and "relax.matmul" in small.op_names


def test_region_lift_matches_tvm():
    """The region lifted as one (flattened) expression equals the region run by TVM."""
    (region,) = find_regions(_banded_module())
    expr = region.lift()
    assert str(expr).count("L<") == 2  # relu over one flattened reduction
    q, k = _args()
    got = evaluate(expr, {"q": q, "k": k})
    want = _run(isolated_region_module(region), [k, q])
    np.testing.assert_allclose(got.reshape(want.shape), want, rtol=1e-5, atol=1e-5)


def _prefer(kind):
    def timer(mod, label):  # noqa: ARG001
        if "|original" in label and not label.endswith("]"):
            return 1.0
        return 0.5 if kind in label else 0.9

    return timer


def test_banded_attention_becomes_g2bmm_end_to_end():
    """pad + take + matmul is derived into a g2bmm stage, verified against TVM and emitted;
    the result equals plain ``tvm.compile`` of the original."""
    mod = _banded_module(relu=False)
    new, report = optimize_module(mod, "llvm", search_time_s=8.0, library=False,
                                  timer=_prefer("g2bmm"))
    (reg,) = report.regions
    assert reg.rewritten, reg.reason
    assert "g2bmm" in reg.chosen
    assert "g2bmm" in report.to_text()
    assert any("g2bmm" in gv.name_hint for gv in new.get_global_vars())
    args = _args(1)
    np.testing.assert_allclose(_run(new, args), _run(mod, args), rtol=1e-5, atol=1e-5)


def test_region_that_fails_is_left_exactly_as_it_was():
    mod = _banded_module(relu=False)
    new, report = optimize_module(mod, "llvm", search_time_s=3.0, library=False,
                                  timer=_prefer("g2bmm"),
                                  checker=lambda ref, cand: (False, "rejected by the test"))
    assert not report.regions[0].rewritten
    assert "rejected by the test" in report.regions[0].reason
    tvm.ir.assert_structural_equal(new, mod)


def test_multi_output_program_is_emitted_as_a_tuple():
    """Two matmuls sharing ``x``, combined into one program of two outputs."""
    from tvm_ollie.derive.rules.inter import combine_programs  # pylint: disable=C0415
    from tvm_ollie.derive.search import derive  # pylint: disable=C0415
    from tvm_ollie.lift import lift_relax_call  # pylint: disable=C0415
    from tvm_ollie.transform.emit import emit_program  # pylint: disable=C0415

    x = relax.Var("x", relax.TensorType((8, 6), F32))
    w1 = relax.Var("w1", relax.TensorType((6, 5), F32))
    w2 = relax.Var("w2", relax.TensorType((6, 3), F32))
    progs = []
    for w in (w1, w2):
        call = relax.BlockBuilder().normalize(R.matmul(x, w))
        res = derive(lift_relax_call(call), targets=("matmul",), max_depth=1,
                     search_time_s=5.0)
        progs.append(next(p for p in res.candidates if "matmul" in p.kinds))
    prog = combine_programs(*progs)
    assert prog.multi
    bb = relax.BlockBuilder()
    with bb.function("main", [x, w1, w2]):
        with bb.dataflow():
            out = bb.emit_output(emit_program(bb, prog, {"x": x, "w1": w1, "w2": w2},
                                              [(8, 5), (8, 3)]))
        bb.emit_func_output(out)
    ex = tvm.compile(bb.get(), target="llvm")
    vm = relax.VirtualMachine(ex, tvm.cpu())
    rng = np.random.default_rng(0)
    a, b1, b2 = (rng.standard_normal(s).astype(F32) for s in ((8, 6), (6, 5), (6, 3)))
    got = vm["main"](*[tvm.runtime.tensor(v) for v in (a, b1, b2)])
    np.testing.assert_allclose(got[0].numpy(), a @ b1, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got[1].numpy(), a @ b2, rtol=1e-5, atol=1e-5)


def _onnx_banded_module():
    """The exporter's form: Pad, Transpose, GatherND (constant indices), Transpose, Einsum,
    imported by TVM's ONNX frontend (pad and einsum become ``call_tir``, the indices go through
    the frontend's negative-index normalization)."""
    pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper  # pylint: disable=C0415
    from tvm.relax.frontend.onnx import from_onnx  # pylint: disable=C0415

    pads = np.array([0, 0, D * W, 0, 0, 0, D * W, 0], "int64")
    nodes = [
        helper.make_node("Pad", ["k", "pads"], ["kp"]),
        helper.make_node("Transpose", ["kp"], ["kt"], perm=[2, 0, 1, 3]),
        helper.make_node("GatherND", ["kt", "idx"], ["g"]),
        helper.make_node("Transpose", ["g"], ["keys"], perm=[2, 3, 0, 1, 4]),
        helper.make_node("Einsum", ["q", "keys"], ["s"], equation="bhmk,bhmwk->bhmw"),
    ]
    spec = [1, H, N, DK]
    graph = helper.make_graph(
        nodes, "band",
        [helper.make_tensor_value_info("q", TensorProto.FLOAT, spec),
         helper.make_tensor_value_info("k", TensorProto.FLOAT, spec)],
        [helper.make_tensor_value_info("s", TensorProto.FLOAT, [1, H, N, 2 * W + 1])],
        [numpy_helper.from_array(pads, "pads"),
         numpy_helper.from_array(_band_index()[..., None], "idx")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    return from_onnx(model, keep_params_in_input=False)


@pytest.mark.slow  # the model's own form stays in the default run (test_banded_attention_...)
def test_onnx_form_becomes_g2bmm():
    mod = _onnx_banded_module()
    (region,) = [r for r in find_regions(mod) if r.size > 1]
    assert any("gather_nd" in op for op in region.op_names)
    assert any(op.startswith("relax.call_tir:einsum") for op in region.op_names)
    new, report = optimize_module(mod, "llvm", search_time_s=8.0, library=False,
                                  timer=_prefer("g2bmm"))
    (reg,) = report.regions
    assert reg.rewritten and "g2bmm" in reg.chosen, reg.reason
    args = _args(2)
    np.testing.assert_allclose(_run(new, args), _run(mod, args), rtol=1e-5, atol=1e-5)


def test_explain_lists_regions():
    from tvm_ollie.frontend.explain import region_lines  # pylint: disable=C0415
    from tvm_ollie.transform.report import OptimizeReport, RegionDecision  # pylint: disable=C0415

    reg = RegionDecision("main", "lv6", "lv=nn.pad, lv1=take, lv4=matmul", "L<i:0:2> { x[i] }",
                         chosen="g2bmm[2x16x4, w=2, d=2]", reason="measured", before_s=2e-3,
                         after_s=1e-3, measured=True)
    text = region_lines([reg])
    assert "lv1=take" in text and "became:     g2bmm[2x16x4, w=2, d=2]" in text
    assert "1/1 regions rewritten" in OptimizeReport(regions=[reg]).to_text()


def test_dataflow_blocks_yields_each_block_with_its_function():
    mod = _banded_module()
    found = list(dataflow_blocks(mod))
    assert [gv.name_hint for gv, _ in found] == ["main"]
    assert len(found[0][1].bindings) == len(mod["main"].body.blocks[0].bindings)
