"""The primitive graph of one Relax dataflow block.

Nodes are the block's bindings in binding order (a topological order): a call is a primitive
of the kind :func:`.primitives.kind_of` says; any other binding (a tuple, an alias, a
``match_cast``...) is a zero-cost ``opaque`` *glue* node that is never fused. Values are the
binding variables: a ``x = t[i]`` of a call's tuple result is not a node, it names output ``i``
of that call's node (multi-output primitives such as ``split``). Edges are variable uses.

Graph inputs are the variables bound outside the block (parameters, earlier blocks) and the
constants in call arguments; graph outputs are the block's non-dataflow variables (the only
ones visible after it). Reachability is kept as integer bitsets so that the candidate
enumeration tests convexity in a few integer operations.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from ..compat import relax, tvm
from .primitives import (Constant, call_name, callee_primfunc, is_fusable_call, kind_of,
                         primfunc_flops)

__all__ = ["Node", "PrimitiveGraph", "build_graph", "value_bytes"]


def value_bytes(ty) -> Optional[int]:
    """Bytes of a tensor (or tuple of tensors) type; None when a shape is not static."""
    if isinstance(ty, relax.TupleType):
        parts = [value_bytes(f) for f in ty.fields]
        return None if any(p is None for p in parts) else sum(parts)
    shape = getattr(ty, "shape", None)
    if shape is None or not hasattr(shape, "values"):
        return 0 if not isinstance(ty, relax.TensorType) else None
    n = 1
    for dim in shape.values:
        if not isinstance(dim, tvm.tirx.IntImm):
            return None
        n *= int(dim.value)
    return n * tvm.runtime.DataType(str(ty.dtype)).bits // 8


@dataclass
class Node:
    """One binding of the block.

    Attributes
    ----------
    index : int
        Position in the block (and in :attr:`PrimitiveGraph.nodes`).
    binding : relax.Binding
        The binding; its variable holds the node's (possibly tuple) result.
    kind : str
        Primitive kind (``opaque`` for glue).
    name : str
        Short name for reports (operator or PrimFunc name).
    inputs : tuple of relax.Var
        Values read, in first-use order, without duplicates.
    constants : tuple of Constant
        Constants among the arguments.
    outputs : tuple of relax.Var
        Values produced: the binding variable, and for a tuple result the variables of its
        ``t[i]`` bindings (``projections``).
    fusable : bool
        Whether the node may share a kernel with others.
    flops : float
        Arithmetic operations (0 when unknown).
    view : bool
        A reshape of a dataflow value (``relax.reshape``, or a ``call_tir`` of a PrimFunc with
        TVM's reshape pattern bound to a dataflow variable): as a kernel alone TVM turns it
        into a view of its input (``RewriteDataflowReshape``, then ``vm.builtin.reshape``), so
        no data moves.
    """

    index: int
    binding: object
    kind: str
    name: str
    inputs: Tuple[object, ...]
    constants: Tuple[object, ...]
    fusable: bool
    flops: float = 0.0
    projections: List[object] = field(default_factory=list)
    view: bool = False

    @property
    def var(self):
        """The binding variable."""
        return self.binding.var

    @property
    def outputs(self) -> Tuple[object, ...]:
        """The variables this node produces (see the class docstring)."""
        return (self.var, *[b.var for b in self.projections])


@dataclass
class PrimitiveGraph:
    """Nodes, values and reachability of one dataflow block (see the module docstring)."""

    nodes: List[Node]
    producer: Dict[object, int]
    consumers: Dict[object, List[int]]
    graph_inputs: List[object]
    graph_outputs: List[object]
    succ: List[int]
    pred: List[int]
    desc: List[int]
    anc: List[int]
    mod: Optional[object] = None
    _outputs: Optional[tuple] = field(default=None, repr=False, compare=False)

    def __len__(self) -> int:
        return len(self.nodes)

    def is_graph_output(self, var) -> bool:
        """Whether ``var`` is in :attr:`graph_outputs`, by a set kept in step with the list
        (the joint selection appends aliases to it). Why not ``var in graph_outputs``: a
        Relax variable's ``==`` is a Python call through TVM's expression overloads, and
        enumerating YOLOX's candidates spent 25 s in 3 million of them."""
        cached = self._outputs
        if cached is None or cached[0] != len(self.graph_outputs):
            cached = self._outputs = (len(self.graph_outputs), set(self.graph_outputs))
        return var in cached[1]

    def is_output(self, var) -> bool:
        """Whether ``var`` is visible after the block."""
        return not isinstance(var, relax.DataflowVar)

    def nbytes(self, value) -> int:
        """Bytes of a value (a variable or constant); 0 when unknown."""
        return value_bytes(value.ty) or 0

    def members(self, mask: int) -> List[int]:
        """Node indices of a bitset, ascending (one step per member, not per bit: the masks
        of a few hundred nodes hold a handful)."""
        out = []
        while mask:
            low = mask & -mask
            out.append(low.bit_length() - 1)
            mask ^= low
        return out


def _inputs_of(value) -> Tuple[List[object], List[object]]:
    """Variables (first-use order, unique) and constants read by a binding value."""
    seen, consts = [], []

    def visit(expr):
        if isinstance(expr, relax.Var):
            if not any(expr.same_as(v) for v in seen):
                seen.append(expr)
        elif isinstance(expr, Constant):
            consts.append(expr)
        elif isinstance(expr, relax.Tuple):
            for f in expr.fields:
                visit(f)
        elif isinstance(expr, relax.Call):
            for a in expr.args:
                visit(a)
        elif isinstance(expr, relax.TupleGetItem):
            visit(expr.tuple_value)
        else:
            for v in relax.analysis.free_vars(expr) if isinstance(expr, relax.Expr) else []:
                visit(v)

    visit(value)
    return seen, consts


def _node_of(index: int, binding, mod) -> Node:
    value = binding.value
    is_call = isinstance(binding, relax.VarBinding) and isinstance(value, relax.Call)
    inputs, consts = _inputs_of(value)
    if not is_call:
        return Node(index, binding, "opaque", type(value).__name__, tuple(inputs), tuple(consts),
                    fusable=False)
    kind = kind_of(value, mod)
    flops = 0.0
    func = callee_primfunc(value, mod)
    if func is not None:
        flops = primfunc_flops(func)[0]
    fusable = kind != "opaque" and is_fusable_call(value)
    return Node(index, binding, kind, call_name(value), tuple(inputs), tuple(consts), fusable,
                flops, view=_is_view(binding, value, func))


def _is_view(binding, call: "relax.Call", func) -> bool:
    """Whether the node is a reshape that TVM makes a view when alone (:class:`Node`)."""
    if not isinstance(binding.var, relax.DataflowVar):
        return False  # RewriteDataflowReshape leaves block outputs as they are
    if func is not None:
        return bool(relax.analysis.has_reshape_pattern(func))
    return isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.reshape"


def build_graph(block: "relax.DataflowBlock", mod: Optional["tvm.IRModule"] = None,
                used_after: Sequence[object] = ()) -> PrimitiveGraph:
    """The primitive graph of a dataflow block.

    Parameters
    ----------
    block : relax.DataflowBlock
        The block (its bindings in order).
    mod : IRModule, optional
        The module holding the PrimFuncs of ``call_tir`` calls (their kinds and FLOPs).
    used_after : sequence of relax.Var
        Extra variables of the block read after it (the block's non-dataflow variables are
        outputs in any case).
    """
    nodes: List[Node] = []
    producer: Dict[object, int] = {}
    for binding in block.bindings:
        value = binding.value
        if isinstance(binding, relax.VarBinding) and isinstance(value, relax.TupleGetItem) \
                and isinstance(value.tuple_value, relax.Var) and value.tuple_value in producer:
            owner = nodes[producer[value.tuple_value]]
            if isinstance(owner.binding.value, relax.Call):
                owner.projections.append(binding)
                producer[binding.var] = owner.index
                continue
        node = _node_of(len(nodes), binding, mod)
        nodes.append(node)
        producer[binding.var] = node.index
    consumers: Dict[object, List[int]] = {}
    graph_inputs: List[object] = []
    n = len(nodes)
    succ, pred = [0] * n, [0] * n
    for node in nodes:
        for var in node.inputs:
            consumers.setdefault(var, []).append(node.index)
            if var in producer:
                src = producer[var]
                succ[src] |= 1 << node.index
                pred[node.index] |= 1 << src
            elif not any(var.same_as(g) for g in graph_inputs):
                graph_inputs.append(var)
    # A node whose tuple result is read whole (not through t[i]) stays alone: a kernel cannot
    # export a nested tuple.
    for node in nodes:
        if node.projections and node.var in consumers:
            node.fusable = False
    extra = list(used_after)
    graph_outputs = [v for node in nodes for v in node.outputs
                     if not isinstance(v, relax.DataflowVar) or any(v.same_as(e) for e in extra)]
    desc = _closure(succ, reversed(range(n)))
    anc = _closure(pred, range(n))
    return PrimitiveGraph(nodes, producer, consumers, graph_inputs, graph_outputs, succ, pred,
                          desc, anc, mod)


def _closure(adj: List[int], order) -> List[int]:
    """Transitive closure of the bitset relation ``adj`` (``adj[i]``: direct neighbours of
    ``i``), visiting ``order`` so that every neighbour's closure is complete before it is read
    (reverse topological order for successors, topological for predecessors)."""
    out = [0] * len(adj)
    for i in order:
        mask, rest = adj[i], adj[i]
        while rest:
            low = rest & -rest
            mask |= out[low.bit_length() - 1]
            rest ^= low
        out[i] = mask
    return out
