"""Analytic cost rewards fusion; measured cost builds a kernel once per structure."""

import json
import os

from tvm_ollie.compat import relax
from tvm_ollie.codegen.builder import single_function_module, tensor_var
from tvm_ollie.orchestrate import AnalyticCost, MeasuredCost, build_graph
from tvm_ollie.orchestrate.candidates import make_candidate
from tvm_ollie.orchestrate.cost import kernel_traffic

from orch_helpers import CALIB


def _two_blocks():
    """Two identical exp -> add chains on different inputs."""
    def body(bb, x, y):
        a = bb.emit(relax.op.exp(x))
        b = bb.emit(relax.op.add(a, x))
        c = bb.emit(relax.op.exp(y))
        d = bb.emit(relax.op.add(c, y))
        return relax.Tuple([b, d])

    mod = single_function_module([tensor_var("x", (64, 64)), tensor_var("y", (64, 64))], body)
    mod = relax.transform.AnnotateTIROpPattern()(relax.transform.LegalizeOps()(mod))
    return mod, build_graph(mod["main"].body.blocks[0], mod)


def test_intermediates_cost_nothing():
    _, graph = _two_blocks()
    fused = make_candidate(graph, 0b0011)
    flops, moved = kernel_traffic(graph, fused)
    assert moved == 2 * 64 * 64 * 4  # reads x, writes b; a stays inside
    assert flops == 2 * 64 * 64
    cost = AnalyticCost("llvm", CALIB, launch_s=1e-6)
    parts = [make_candidate(graph, 1 << i) for i in (0, 1)]
    assert cost.kernel_seconds(graph, fused) < sum(cost.kernel_seconds(graph, p) for p in parts)


def test_measured_cost_is_cached_by_structure(tmp_path):
    _, graph = _two_blocks()
    first, second = make_candidate(graph, 0b0011), make_candidate(graph, 0b1100)
    cost = MeasuredCost("llvm", work_dir=str(tmp_path), number=1, repeat=2)
    t1 = cost.kernel_seconds(graph, first)
    t2 = cost.kernel_seconds(graph, second)
    assert t1 > 0 and t1 == t2
    assert cost.builds == 1 and cost.hits == 1 and not cost.failures
    with open(os.path.join(tmp_path, MeasuredCost.FILE), encoding="utf-8") as fh:
        assert len(json.load(fh)) == 1
    again = MeasuredCost("llvm", work_dir=str(tmp_path))
    assert again.kernel_seconds(graph, second) == t1 and again.builds == 0


def _reshape_chain():
    """relu -> reshape -> expand_dims -> add, the last a block output."""
    def body(bb, x):
        a = bb.emit(relax.op.nn.relu(x))
        b = bb.emit(relax.op.reshape(a, (32, 128)))
        c = bb.emit(relax.op.expand_dims(b, 0))
        return relax.op.add(c, c)

    mod = single_function_module([tensor_var("x", (64, 64))], body)
    mod = relax.transform.AnnotateTIROpPattern()(relax.transform.LegalizeOps()(mod))
    return mod, build_graph(mod["main"].body.blocks[0], mod)


def test_a_lone_view_costs_the_launch_only():
    """A reshape alone becomes a view of its input after legalization
    (``RewriteDataflowReshape``): no traffic is charged, so fusing it gains nothing."""
    mod, graph = _reshape_chain()
    assert [n.view for n in graph.nodes] == [False, True, True, False]
    cost = AnalyticCost("llvm", CALIB, launch_s=1e-6)
    assert cost.kernel_seconds(graph, make_candidate(graph, 0b0010)) == 1e-6
    assert cost.kernel_seconds(graph, make_candidate(graph, 0b0100)) == 1e-6
    relu = cost.kernel_seconds(graph, make_candidate(graph, 0b0001))
    assert cost.kernel_seconds(graph, make_candidate(graph, 0b0011)) == relu  # same traffic
    with_pipeline = relax.transform.RewriteDataflowReshape()(
        relax.transform.FuseTIR()(mod))  # what the default pipeline does with them alone
    text = with_pipeline["main"].script()
    assert text.count("R.reshape(") == 2
