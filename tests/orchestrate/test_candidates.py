"""Candidate kernels are connected, convex, admissible, and all of them are found."""

import itertools

import pytest

from tvm_ollie.compat import relax
from tvm_ollie.codegen.builder import single_function_module, tensor_var
from tvm_ollie.orchestrate import build_graph, enumerate_candidates, is_convex
from tvm_ollie.orchestrate.candidates import admissible

from orch_helpers import random_dag_module


def _paths_leave_and_return(graph, nodes):
    """Convexity by definition: a path from the set through an outside node back into it."""
    inside = set(nodes)
    succ = {i: graph.members(graph.succ[i]) for i in range(len(graph))}
    # nodes outside reachable from the set
    frontier = [j for i in inside for j in succ[i] if j not in inside]
    seen = set(frontier)
    while frontier:
        j = frontier.pop()
        for k in succ[j]:
            if k in inside:
                return True
            if k not in seen:
                seen.add(k)
                frontier.append(k)
    return False


def _connected(graph, nodes):
    nodes = set(nodes)
    start = next(iter(nodes))
    seen, todo = {start}, [start]
    while todo:
        i = todo.pop()
        for j in graph.members(graph.succ[i] | graph.pred[i]):
            if j in nodes and j not in seen:
                seen.add(j)
                todo.append(j)
    return seen == nodes


@pytest.mark.parametrize("seed", range(6))
def test_candidates_are_convex_and_complete(seed):
    mod = random_dag_module(9, seed)
    graph = build_graph(mod["main"].body.blocks[0], mod)
    k = 4
    enum = enumerate_candidates(graph, max_kernel_size=k, max_candidates=10 ** 6)
    assert enum.stop_reason == "exhausted"
    found = {c.nodes for c in enum.candidates}
    assert len(found) == len(enum.candidates)  # no duplicates
    for i in range(len(graph)):
        assert (i,) in found  # every singleton
    for cand in enum.candidates:
        assert cand.size <= k
        assert not _paths_leave_and_return(graph, cand.nodes)
        assert is_convex(graph, cand.mask)
        assert cand.size == 1 or (_connected(graph, cand.nodes)
                                  and admissible(graph, cand.nodes))
    # brute force: every connected convex admissible group of size <= k is a candidate
    fusable = [i for i in range(len(graph)) if graph.nodes[i].fusable]
    for size in range(2, k + 1):
        for group in itertools.combinations(fusable, size):
            if _connected(graph, group) and not _paths_leave_and_return(graph, group):
                assert tuple(group) in found


def test_outputs_and_inputs_of_a_candidate():
    mod = random_dag_module(6, 3)
    graph = build_graph(mod["main"].body.blocks[0], mod)
    for cand in enumerate_candidates(graph, 6).candidates:
        for var in cand.outputs:
            assert graph.producer[var] in cand.nodes
        for var in cand.inputs:
            assert graph.producer.get(var) not in cand.nodes


def test_linear_absorbs_only_elementwise_and_layout():
    def body(bb, x, w, v):
        a = bb.emit(relax.op.nn.relu(x))
        c = bb.emit(relax.op.nn.conv2d(a, w, padding=1))
        r = bb.emit(relax.op.nn.relu(c))
        s = bb.emit(relax.op.sum(r, axis=[1], keepdims=True))
        c2 = bb.emit(relax.op.nn.conv2d(r, v, padding=1))
        return relax.Tuple([s, c2])

    mod = single_function_module([tensor_var("x", (1, 2, 4, 4)), tensor_var("w", (2, 2, 3, 3)),
                                  tensor_var("v", (2, 2, 3, 3))], body)
    graph = build_graph(mod["main"].body.blocks[0], mod)
    groups = {c.nodes for c in enumerate_candidates(graph, 8).candidates}
    assert (0, 1, 2) in groups  # prologue + conv + epilogue
    assert not any({1, 4} <= set(g) for g in groups)  # two linear primitives
    assert not any({1, 3} <= set(g) for g in groups)  # linear with a reduction


def test_limit_is_reported():
    mod = random_dag_module(12, 1)
    graph = build_graph(mod["main"].body.blocks[0], mod)
    enum = enumerate_candidates(graph, max_kernel_size=6, max_candidates=len(graph) + 3)
    assert enum.stop_reason == "max_candidates"
    assert len(enum.candidates) == len(graph) + 3
