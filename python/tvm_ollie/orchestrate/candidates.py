"""Candidate kernels: convex, connected groups of primitives.

A group ``K`` of nodes can be one kernel when it is *convex* (no path leaves ``K`` and comes
back: ``desc(K) & anc(K)`` has no node outside ``K``), otherwise the kernel would both feed and
wait for a node outside it. Korch enumerates differences of downsets; here candidates grow
from every node by adding a neighbour and closing the result under convexity
(``closure(K) = K | (desc(K) & anc(K))``), level by level (all groups of size k before size
k+1), which enumerates the connected convex groups up to ``max_kernel_size`` (every such group
is reached: removing a source or sink that keeps it connected leaves a convex group).

Rules on a group (:func:`admissible`):

* at most one ``linear`` primitive; a group with one holds besides it only ``elementwise`` and
  ``layout`` primitives (its prologue and epilogue: what feeds its operands or consumes its
  result), so a convolution absorbs its bias, activation, transpose... (Korch kept linear
  primitives alone);
* non-fusable nodes (glue, opaque, native calls, whole-tuple reads) are singletons only.

A kernel may have several outputs: every value produced inside and read outside (or a graph
output). Every single node is always a candidate, so the selection always has a solution.
Enumeration stops at ``max_candidates`` and reports it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, List, Optional, Tuple

from .graph import PrimitiveGraph
from .primitives import NATIVE_PREFIX

__all__ = ["Candidate", "Enumeration", "admissible", "enumerate_candidates", "is_convex",
           "is_library_kernel", "make_candidate"]


@dataclass(frozen=True)
class Candidate:
    """A group of nodes that may be one kernel.

    Attributes
    ----------
    mask : int
        The nodes, as a bitset over node indices.
    nodes : tuple of int
        The same, ascending (a topological order).
    inputs : tuple of relax.Var
        Values read from outside the group (produced by other nodes or graph inputs).
    outputs : tuple of relax.Var
        Values produced inside and read outside, or graph outputs.
    constants : tuple of relax.Constant
        Constant arguments of its nodes.
    """

    mask: int
    nodes: Tuple[int, ...]
    inputs: Tuple[object, ...]
    outputs: Tuple[object, ...]
    constants: Tuple[object, ...]

    @property
    def size(self) -> int:
        """Number of primitives."""
        return len(self.nodes)


@dataclass
class Enumeration:
    """Candidates of one graph (or partition) and why the enumeration stopped."""

    candidates: List[Candidate]
    stop_reason: str  # "exhausted" or "max_candidates"
    max_size_seen: int


def is_convex(graph: PrimitiveGraph, mask: int) -> bool:
    """No path leaves ``mask`` and re-enters it."""
    return closure(graph, mask) == mask


def closure(graph: PrimitiveGraph, mask: int) -> int:
    """The smallest convex superset of ``mask``."""
    desc = anc = 0
    for i in graph.members(mask):
        desc |= graph.desc[i]
        anc |= graph.anc[i]
    return mask | (desc & anc)


def admissible(graph: PrimitiveGraph, nodes: Iterable[int]) -> bool:
    """Kind rules of a multi-node kernel (see the module docstring)."""
    kinds = []
    for i in nodes:
        node = graph.nodes[i]
        if not node.fusable:
            return False
        kinds.append(node.kind)
    linear = kinds.count("linear")
    if linear > 1:
        return False
    if linear == 1:
        return all(k in ("linear", "elementwise", "layout") for k in kinds)
    return True


def is_library_kernel(graph: PrimitiveGraph, cand: Candidate) -> bool:
    """A single native library call (``call_dps_packed`` of a ``tvm_ollie.`` kernel): a
    kernel of its own, offered as an alternative (a library candidate, its epilogue folded
    or not), so it can be built and timed alone and banned when it fails."""
    return cand.size == 1 and graph.nodes[cand.nodes[0]].name.startswith(NATIVE_PREFIX)


def make_candidate(graph: PrimitiveGraph, mask: int) -> Candidate:
    """The candidate of a node bitset: its external inputs, outputs and constants."""
    nodes = tuple(graph.members(mask))
    inputs: List[object] = []
    outputs: List[object] = []
    consts: List[object] = []
    for i in nodes:
        node = graph.nodes[i]
        for var in node.inputs:
            src = graph.producer.get(var)
            if (src is None or not mask >> src & 1) and not any(var.same_as(v) for v in inputs):
                inputs.append(var)
        consts.extend(node.constants)
        for var in node.outputs:
            readers = graph.consumers.get(var, ())
            if graph.is_output(var) or graph.is_graph_output(var) or \
                    any(not mask >> r & 1 for r in readers):
                outputs.append(var)
    return Candidate(mask, nodes, tuple(inputs), tuple(outputs), tuple(consts))


def _neighbours(graph: PrimitiveGraph, mask: int, allowed: int) -> int:
    out = 0
    for i in graph.members(mask):
        out |= graph.succ[i] | graph.pred[i]
    return out & allowed & ~mask


def enumerate_candidates(graph: PrimitiveGraph, max_kernel_size: int = 8,
                         max_candidates: int = 2000,
                         nodes: Optional[Iterable[int]] = None) -> Enumeration:
    """Connected convex candidate kernels of ``graph`` (or of the sub-range ``nodes``).

    Parameters
    ----------
    graph : PrimitiveGraph
        The graph.
    max_kernel_size : int
        Most primitives in one kernel.
    max_candidates : int
        Most candidates; the singletons are always included (and counted).
    nodes : iterable of int, optional
        Restrict to these nodes (a partition); convexity is still checked on the whole graph.
    """
    scope = list(range(len(graph))) if nodes is None else sorted(nodes)
    allowed = 0
    for i in scope:
        if graph.nodes[i].fusable:
            allowed |= 1 << i
    seen = {1 << i for i in scope}
    level = [1 << i for i in scope if allowed >> i & 1]
    found: List[int] = [1 << i for i in scope]
    stop, biggest = "exhausted", 1
    size = 1
    while level and size < max_kernel_size and stop == "exhausted":
        nxt: List[int] = []
        for mask in level:
            grow = _neighbours(graph, mask, allowed)
            while grow:
                low = grow & -grow
                grow ^= low
                new = closure(graph, mask | low)
                if new in seen or new & ~allowed:
                    continue
                seen.add(new)
                count = bin(new).count("1")
                if count > max_kernel_size or not admissible(graph, graph.members(new)):
                    continue
                if len(found) >= max_candidates:
                    stop = "max_candidates"
                    break
                found.append(new)
                nxt.append(new)
                biggest = max(biggest, count)
            if stop != "exhausted":
                break
        level = nxt
        size += 1
    return Enumeration([make_candidate(graph, m) for m in found], stop, biggest)
