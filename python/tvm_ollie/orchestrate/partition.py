"""Split a big primitive graph into independent selection problems.

The binary program grows with the candidates, so a long graph is cut, in topological order,
into segments of at most ``max_nodes`` nodes; each segment is solved alone with the values of
earlier segments available and the values later segments (or the graph outputs) read
required. Candidates never cross a cut, so only fusions across the cut are lost: the cut is
placed where the frontier is narrowest, i.e. where the fewest values produced before it are read
after it (a single value: a cut vertex of the dataflow, such as a residual block boundary).
Within the last ``window`` positions before the size bound the narrowest frontier wins (the
latest on ties); a frontier of width <= ``narrow`` cuts as soon as the segment has
``min_nodes`` nodes. A segment whose candidates exceed the selection's budget is cut in two
again (:func:`split_in_two`), so every program stays small enough to solve.
"""

from __future__ import annotations

from typing import List

from .graph import PrimitiveGraph

__all__ = ["frontier_widths", "partition", "split_in_two"]


def frontier_widths(graph: PrimitiveGraph) -> List[int]:
    """``w[i]``: values produced by nodes ``<= i`` and read by nodes ``> i``."""
    n = len(graph)
    delta = [0] * (n + 1)
    for var, readers in graph.consumers.items():
        src = graph.producer.get(var)
        if src is None:
            continue
        last = max(readers)
        if last > src:
            delta[src] += 1
            delta[last] -= 1
    widths, run = [], 0
    for i in range(n):
        run += delta[i]
        widths.append(run)
    return widths


def partition(graph: PrimitiveGraph, max_nodes: int = 48, min_nodes: int = 12,
              narrow: int = 1) -> List[List[int]]:
    """Node index ranges (consecutive in topological order) covering ``graph``."""
    n = len(graph)
    if n <= max_nodes:
        return [list(range(n))] if n else []
    widths = frontier_widths(graph)
    parts, start = [], 0
    while start < n:
        end = min(n, start + max_nodes)
        if end == n:
            parts.append(list(range(start, n)))
            break
        cut = None
        for i in range(start + min_nodes - 1, end - 1):
            if widths[i] <= narrow:
                cut = i
                break
        if cut is None:
            lo = start + max(1, max_nodes // 2) - 1
            best = min(range(lo, end), key=lambda i: (widths[i], -i))
            cut = best
        parts.append(list(range(start, cut + 1)))
        start = cut + 1
    return parts


def split_in_two(graph: PrimitiveGraph, nodes: List[int]) -> List[List[int]]:
    """Cut a range of nodes (consecutive in topological order) in two at the narrowest
    frontier of its middle half (used when a partition has too many candidates)."""
    if len(nodes) < 2:
        return [nodes]
    widths = frontier_widths(graph)
    lo, hi = len(nodes) // 4, max(len(nodes) // 4 + 1, 3 * len(nodes) // 4)
    cut = min(range(lo, hi), key=lambda k: (widths[nodes[k]], abs(k - len(nodes) // 2)))
    return [nodes[:cut + 1], nodes[cut + 1:]] if cut + 1 < len(nodes) else [nodes]
