"""Primitive kinds (table and PrimFunc analysis) and the primitive graph."""

import numpy as np
import pytest

from tvm_ollie.compat import relax, tvm
from tvm_ollie.codegen.builder import single_function_module, tensor_var
from tvm_ollie.orchestrate import KINDS, OP_KIND, build_graph, kind_of
from tvm_ollie.orchestrate.primitives import primfunc_flops

from orch_helpers import const


def _mixed_module():
    def body(bb, x, w):
        c = bb.emit(relax.op.nn.conv2d(x, w, padding=1))
        b = bb.emit(relax.op.add(c, const((1, 4, 1, 1))))
        r = bb.emit(relax.op.nn.relu(b))
        s = bb.emit(relax.op.nn.softmax(r, axis=1))
        p = bb.emit(relax.op.nn.max_pool2d(s, (2, 2), strides=(2, 2)))
        m = bb.emit(relax.op.sum(p, axis=[1], keepdims=True))
        t = bb.emit(relax.op.permute_dims(p, [0, 2, 3, 1]))
        rs = bb.emit(relax.op.reshape(t, (1, 16, 4)))
        mm = bb.emit(relax.op.matmul(rs, const((4, 4), 1)))
        sp = bb.emit(relax.op.split(mm, 2, axis=2))
        a0 = bb.emit(relax.TupleGetItem(sp, 0))
        a1 = bb.emit(relax.TupleGetItem(sp, 1))
        cc = bb.emit(relax.op.concat([a1, a0], axis=2))
        return relax.Tuple([cc, m])

    return single_function_module([tensor_var("x", (1, 4, 8, 8)),
                                   tensor_var("w", (4, 4, 3, 3))], body)


EXPECTED = ["linear", "elementwise", "elementwise", "reduce", "reduce", "reduce", "layout",
            "layout", "linear", "layout", "layout", "opaque"]


def test_table_covers_standard_ops():
    assert OP_KIND["relax.nn.conv2d"] == "linear"
    assert OP_KIND["relax.nn.conv2d_transpose"] == "linear"
    assert OP_KIND["relax.astype"] == OP_KIND["relax.where"] == OP_KIND["relax.clip"] \
        == "elementwise"
    assert OP_KIND["relax.variance"] == OP_KIND["relax.argmax"] == "reduce"
    assert OP_KIND["relax.image.resize2d"] == OP_KIND["relax.nn.pad"] == "layout"
    assert OP_KIND["relax.nn.layer_norm"] == "reduce"
    assert set(OP_KIND.values()) <= set(KINDS)
    call = relax.op.call_dps_packed("tvm_ollie.cpu.matmul", [tensor_var("a", (2, 2))],
                                    relax.TensorType((2, 2), "float32"))
    assert kind_of(call) == "linear"
    call = relax.op.call_dps_packed("other.f", [tensor_var("a", (2, 2))],
                                    relax.TensorType((2, 2), "float32"))
    assert kind_of(call) == "opaque"


@pytest.mark.parametrize("legalize", [False, True])
def test_kinds_before_and_after_legalization(legalize):
    mod = _mixed_module()
    if legalize:
        mod = relax.transform.AnnotateTIROpPattern()(relax.transform.LegalizeOps()(mod))
    graph = build_graph(mod["main"].body.blocks[0], mod)
    assert [n.kind for n in graph.nodes] == EXPECTED
    if legalize:
        conv = graph.nodes[0]
        assert conv.flops == pytest.approx(2 * 4 * 4 * 9 * 8 * 8 + 4 * 10 * 10, rel=0.5)
        assert all(n.fusable for n in graph.nodes[:-1]) and not graph.nodes[-1].fusable


def test_graph_tuples_and_edges():
    mod = _mixed_module()
    block = mod["main"].body.blocks[0]
    graph = build_graph(block, mod)
    # the two t[i] bindings are outputs of the split node, not nodes
    assert len(graph) == len(block.bindings) - 2
    split = graph.nodes[9]
    assert len(split.outputs) == 3 and len(split.projections) == 2
    concat = graph.nodes[10]
    assert {graph.producer[v] for v in concat.inputs} == {9}
    assert graph.pred[10] == 1 << 9
    # conv reads the parameters: graph inputs; the output tuple is the graph output
    assert [v.name for v in graph.graph_inputs] == ["x", "w"]
    assert [v.name for v in graph.graph_outputs] == [block.bindings[-1].var.name]
    # reachability: conv reaches everything, the sum reaches only the output tuple
    assert graph.members(graph.desc[0]) == list(range(1, len(graph)))
    assert graph.members(graph.desc[5]) == [11]
    assert graph.members(graph.anc[11]) == list(range(11))
    assert len(graph.nodes[0].constants) == 0 and len(graph.nodes[1].constants) == 1


def test_members_and_graph_outputs_follow_appended_aliases():
    """``members`` walks set bits only; ``is_graph_output`` answers as ``in graph_outputs``
    does, also after the joint selection appends an alias (the cached set follows)."""
    mod = _mixed_module()
    graph = build_graph(mod["main"].body.blocks[0], mod)
    assert graph.members(0) == [] and graph.members(1 << 300 | 1 << 3 | 1) == [0, 3, 300]
    last, inner = graph.nodes[-1].var, graph.nodes[2].var
    assert graph.is_graph_output(last) and not graph.is_graph_output(inner)
    graph.graph_outputs.append(inner)
    assert graph.is_graph_output(inner)


def test_primfunc_flops_of_matmul():
    mod = single_function_module([tensor_var("a", (8, 16)), tensor_var("b", (16, 4))],
                                 lambda bb, a, b: relax.op.matmul(a, b))
    mod = relax.transform.LegalizeOps()(mod)
    prim = [f for _, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc)][0]
    flops, static = primfunc_flops(prim)
    assert static and flops == 2 * 8 * 16 * 4
    assert np.isfinite(flops)
