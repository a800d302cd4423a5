"""Pictures of an orchestration: the primitive graph with the chosen kernels drawn over it.

:func:`kernel_layout` runs what :func:`~tvm_ollie.orchestrate.pipeline.orchestrate_module` runs
(fission, legalization, selection) and returns, for the first dataflow block of a function,
every primitive with its position (topological level, row), its edges, and the kernel that
computes it; :func:`draw_kernels` draws that with matplotlib (one colour per multi-primitive
kernel, grey for primitives that run alone). The layout is plain data so that tests and other
front ends (graphviz, a notebook widget) need no matplotlib.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

from ..compat import relax, tvm
from .graph import build_graph
from .pipeline import OrchestrateConfig, orchestrate_module
from .report import OrchestrationReport

__all__ = ["KernelLayout", "kernel_layout", "draw_kernels"]


@dataclass
class KernelLayout:
    """The primitive graph of one dataflow block and the kernel of each primitive.

    Attributes
    ----------
    names, kinds : list of str
        Primitive names (binding variables) and kinds, in block order.
    positions : list of (int, int)
        ``(level, row)``: the longest path from a block input, and the rank within the level.
    edges : list of (int, int)
        Producer -> consumer pairs of primitive indices.
    kernel : list of int
        Index of the kernel computing each primitive (-1: not in any reported kernel).
    kernel_sizes : list of int
        Primitives per kernel.
    report : OrchestrationReport
        The orchestration's report (costs, partitions).
    """

    names: List[str]
    kinds: List[str]
    positions: List[Tuple[int, int]]
    edges: List[Tuple[int, int]]
    kernel: List[int]
    kernel_sizes: List[int]
    report: OrchestrationReport


def kernel_layout(mod: "tvm.IRModule", target="llvm", function: str = "main",
                  fission: Optional[Callable[["tvm.IRModule"], "tvm.IRModule"]] = None,
                  config: Optional[OrchestrateConfig] = None) -> KernelLayout:
    """Orchestrate ``mod`` and lay out the first dataflow block of ``function``."""
    _, report = orchestrate_module(mod, target, fission=fission, config=config)
    tgt = tvm.target.Target(target) if isinstance(target, str) else target
    with tgt:
        legal = mod if fission is None else fission(mod)
        legal = tvm.transform.Sequential([relax.transform.LegalizeOps(),
                                          relax.transform.AnnotateTIROpPattern(),
                                          relax.transform.FoldConstant()])(legal)
    block = next(b for b in legal[function].body.blocks
                 if isinstance(b, relax.DataflowBlock))
    graph = build_graph(block, legal)
    index = {node.name: node.index for node in graph.nodes}
    kernel, sizes = [-1] * len(graph), []
    for part in report.partitions:
        if part.function != function:
            continue
        for k in part.kernels:
            members = [index[n] for n in k.primitives if n in index]
            for i in members:
                kernel[i] = len(sizes)
            sizes.append(len(members))
    edges = [(graph.producer[v], node.index) for node in graph.nodes for v in node.inputs
             if v in graph.producer]
    return KernelLayout([n.name for n in graph.nodes], [n.kind for n in graph.nodes],
                        _levels(len(graph), edges), edges, kernel, sizes, report)


def _levels(n: int, edges: List[Tuple[int, int]]) -> List[Tuple[int, int]]:
    """``(level, row)`` per node: levels by longest path (nodes come in topological order)."""
    preds: Dict[int, List[int]] = {}
    for a, b in edges:
        preds.setdefault(b, []).append(a)
    level = [0] * n
    for i in range(n):
        level[i] = max((level[p] + 1 for p in preds.get(i, [])), default=0)
    rows: Dict[int, int] = {}
    out = []
    for i in range(n):
        out.append((level[i], rows.get(level[i], 0)))
        rows[level[i]] = rows.get(level[i], 0) + 1
    return out


#: Short labels of the primitive kinds.
_SHORT = {"elementwise": "elem", "reduce": "red", "layout": "layout", "linear": "LINEAR",
          "opaque": "opaque"}


def draw_kernels(layout: KernelLayout, ax=None, labels: bool = True):
    """Draw ``layout`` with matplotlib; returns the axes. Primitives of one fused kernel share
    a colour and a shaded hull; primitives computed alone are grey."""
    # lazy: matplotlib is optional (drawing only)
    import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel

    if ax is None:
        width = max(6.0, 0.9 * (1 + max((p[0] for p in layout.positions), default=0)))
        height = max(3.0, 0.7 * (1 + max((p[1] for p in layout.positions), default=0)))
        _, ax = plt.subplots(figsize=(min(width, 30.0), min(height, 12.0)))
    colours = plt.get_cmap("tab20")
    xy = [(float(x), -float(y)) for x, y in layout.positions]
    for a, b in layout.edges:  # edges that skip levels arc, so that they do not hide others
        bend = 0.0 if layout.positions[b][0] - layout.positions[a][0] <= 1 else -0.35
        ax.annotate("", xy=xy[b], xytext=xy[a],
                    arrowprops=dict(arrowstyle="->", color="0.6", lw=0.8,
                                    connectionstyle=f"arc3,rad={bend}"))
    fused = [k for k, size in enumerate(layout.kernel_sizes) if size > 1]
    colour_of = {k: colours(j % 20) for j, k in enumerate(fused)}
    for k in fused:
        pts = [xy[i] for i, kk in enumerate(layout.kernel) if kk == k]
        xs, ys = [p[0] for p in pts], [p[1] for p in pts]
        ax.add_patch(plt.Rectangle((min(xs) - 0.35, min(ys) - 0.3), max(xs) - min(xs) + 0.7,
                                   max(ys) - min(ys) + 0.6, color=colour_of[k], alpha=0.25,
                                   lw=0))
    for i, (x, y) in enumerate(xy):
        ax.scatter([x], [y], s=120, color=colour_of.get(layout.kernel[i], "0.7"),
                   edgecolors="black", linewidths=0.5, zorder=3)
        if labels:
            ax.text(x, y - 0.12, _SHORT.get(layout.kinds[i], layout.kinds[i]), ha="center",
                    va="top", fontsize=7)
    ax.set_title(f"{len(layout.names)} primitives -> {len(layout.kernel_sizes)} kernels "
                 f"({len(fused)} fused, one colour each)")
    ax.axis("off")
    return ax
