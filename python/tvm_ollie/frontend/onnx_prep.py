"""Make an ONNX model as exporters write it importable by TVM: fixed shapes, no shape arithmetic.

Exporters (``torch.onnx.export`` with dynamic axes, most toolchains) compute reshape targets at
run time: ``Shape -> Gather -> Unsqueeze -> Concat -> Reshape``. TVM's Relax importer needs those
targets as constants (``Reshape requires the input new shape to be Shape``), and it does not fold
the chain itself. Once the user fixes the input shapes (``--shape x=1,3,48,192``) every such
chain is a constant, so :func:`prepare_onnx` folds it before the importer runs:

1. fix the shapes of the named graph inputs and drop the stale intermediate shape annotations;
2. fuse the QDQ groups of quantized models into their integer operators, as ONNX Runtime does
   (:func:`~tvm_ollie.frontend.onnx_qdq.fuse_qdq`; before any folding, which would turn
   ``DequantizeLinear(weight)`` into a float weight);
3. simplify with a registry tool when one is installed (``onnxsim``, else ``onnxslim``): shape
   inference, constant folding, dead-node removal;
4. otherwise (or when the tool fails) fold by ourselves: onnx shape inference (with data
   propagation), ``Shape`` of a statically shaped tensor -> constant, then every node whose
   inputs are all constants evaluated with onnx's reference evaluator, repeated to a fixpoint;
5. decompose the operators TVM's importer has no converter for (LSTM, ConvInteger, ...) into
   ones it has (:func:`~tvm_ollie.frontend.onnx_decompose.decompose_onnx`).

Measured on nine zoo models exported by both torch exporters at opsets 11-18 (31 files; TVM
alone imports 20): onnxsim 0.8.1, onnxslim 0.1.98 and our own folding each import all 31, and
onnxsim takes about 6x less time than onnxslim (20 s against 132 s in all), so it comes first.
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from .onnx_decompose import DecomposeInfo, decompose_onnx
from .onnx_qdq import fuse_qdq

#: Simplifiers in the order they are tried by ``simplifier="auto"``.
SIMPLIFIERS = ("onnxsim", "onnxslim", "builtin")

#: Our own folding gives up on constants larger than this many elements (a weight transform
#: folds, a materialized broadcast of activations-sized data does not).
_MAX_FOLD_ELEMENTS = 1 << 24

#: Nodes never folded: random values, or control flow whose bodies we do not evaluate.
_NOT_FOLDABLE = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
                 "Multinomial", "Bernoulli", "If", "Loop", "Scan"}  # fmt: skip

#: Rounds of (shape inference, folding) at most: each round exposes the next chain's shapes.
_MAX_ROUNDS = 8


@dataclasses.dataclass
class PrepInfo:
    """What :func:`prepare_onnx` did: the tool used, nodes before/after, time, notes, and the
    operators rewritten for TVM's importer (:func:`~.onnx_decompose.decompose_onnx`)."""

    simplifier: str
    nodes_before: int
    nodes_after: int
    seconds: float
    notes: List[str] = dataclasses.field(default_factory=list)
    decomposed: DecomposeInfo = dataclasses.field(default_factory=DecomposeInfo)


def prepare_onnx(model, shapes: Optional[Mapping[str, Sequence[int]]] = None,
                 simplifier: str = "auto") -> Tuple[object, PrepInfo]:  # fmt: skip
    """Fix input shapes and fold shape computations and constant subgraphs to constants.

    Parameters
    ----------
    model : onnx.ModelProto
        The model (not modified).
    shapes : mapping from input name to dimensions, optional
        Shapes of the graph inputs to fix (inputs not named keep their declared shape).
    simplifier : str
        ``"auto"`` (the first installed of :data:`SIMPLIFIERS` that succeeds), ``"onnxslim"``,
        ``"onnxsim"``, ``"builtin"`` (our own folding only) or ``"none"`` (shapes only).

    Returns
    -------
    model : onnx.ModelProto
        The prepared model.
    info : PrepInfo
        Which simplifier ran, node counts, time and why any simplifier was skipped.
    """
    # lazy: onnx is an optional dependency
    import onnx  # pylint: disable=import-outside-toplevel

    start = time.perf_counter()
    prepared = onnx.ModelProto()
    prepared.CopyFrom(model)
    before = len(prepared.graph.node)
    fix_input_shapes(prepared, shapes or {})
    _complete_output_types(prepared)
    order = _simplifier_order(simplifier)
    notes: List[str] = []
    # Before the simplifier: it would fold DequantizeLinear(weight) into a float weight.
    fused = fuse_qdq(prepared)
    if fused:
        notes.append("QDQ groups fused into integer operators: " +
                     ", ".join(f"{op} {n}" for op, n in sorted(fused.items())))
    used = "none"
    for name in order:
        try:
            prepared = _SIMPLIFY[name](prepared)
            used = name
            break
        except ImportError:
            notes.append(f"{name} not installed")
        except Exception as err:  # pylint: disable=broad-except  # a tool bug: try the next
            notes.append(f"{name} failed: {str(err).strip().splitlines()[0] if str(err) else err}")
    dropped = drop_empty_optional_inputs(prepared)
    if dropped:
        notes.append(f"{dropped} empty optional input(s) marked absent")
    # Operators TVM's importer lacks become importable ones, now that the shapes are static.
    prepared, decomposed = decompose_onnx(prepared)
    if decomposed.inlined:
        # Function bodies compute shapes at run time (Shape -> Reshape): fold them as well.
        prepared = _fold_or_keep(prepared, notes)
    if decomposed.summary():
        notes.append(f"decomposed for the importer: {decomposed.summary()}")
    info = PrepInfo(used, before, len(prepared.graph.node), time.perf_counter() - start, notes,
                    decomposed)  # fmt: skip
    return prepared, info


def _fold_or_keep(model, notes: List[str]):
    """:func:`fold_constants` of the model, or the model itself when folding fails."""
    try:
        return fold_constants(model)
    except Exception as err:  # pylint: disable=broad-except  # a model inference rejects
        notes.append(f"folding after decomposition failed: {str(err).strip()[:200]}")
        return model


#: Optional inputs that exporters fill with an empty tensor to mean "absent": op -> positions.
_OPTIONAL_INPUTS = {"Resize": (1, 2)}


def drop_empty_optional_inputs(model) -> int:
    """Name an optional input ``""`` (absent) where the exporter passed an empty constant.

    Opset 11-12 exporters give ``Resize`` an empty ``roi`` and an empty ``scales`` tensor next to
    ``sizes``; the ONNX spec reads an empty tensor there as absent, TVM's importer reads it as
    given and rejects "both scales and sizes". Returns how many inputs were marked absent.
    """
    empty = {t.name for t in model.graph.initializer if 0 in t.dims}
    for node in model.graph.node:
        if node.op_type == "Constant" and node.attribute and 0 in node.attribute[0].t.dims:
            empty.update(node.output)
    count = 0
    for node in model.graph.node:
        for position in _OPTIONAL_INPUTS.get(node.op_type, ()):
            if position < len(node.input) and node.input[position] in empty:
                node.input[position] = ""
                count += 1
    return count


def fix_input_shapes(model, shapes: Mapping[str, Sequence[int]]) -> None:
    """Set the named graph inputs' dimensions (in place) and drop intermediate shape records.

    The recorded ``value_info`` of intermediates holds the exporter's symbolic dimensions, which
    would contradict the fixed ones; shape inference recomputes them.
    """
    if not shapes:
        return
    inputs = {i.name: i for i in model.graph.input}
    for name, dims in shapes.items():
        tensor_type = inputs[name].type.tensor_type
        tensor_type.shape.ClearField("dim")
        for dim in dims:
            tensor_type.shape.dim.add().dim_value = int(dim)
    del model.graph.value_info[:]
    for output in model.graph.output:
        # Output dimensions named by the exporter are recomputed as well.
        for dim in output.type.tensor_type.shape.dim:
            if dim.HasField("dim_param"):
                dim.ClearField("dim_param")


def _complete_output_types(model) -> None:
    """Give graph outputs declared without a shape the inferred one (in place).

    The onnx checker, which the simplifiers run, rejects an output type without a shape.
    """
    # lazy: onnx is an optional dependency
    import onnx  # pylint: disable=import-outside-toplevel

    missing = [o for o in model.graph.output if not o.type.tensor_type.HasField("shape")]
    if not missing:
        return
    try:
        inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
    except Exception:  # pylint: disable=broad-except  # inference fails: the tools will say why
        return
    types = {o.name: o.type for o in inferred.graph.output}
    for output in missing:
        if output.name in types and types[output.name].tensor_type.HasField("shape"):
            output.type.CopyFrom(types[output.name])


def _simplifier_order(simplifier: str) -> Tuple[str, ...]:
    if simplifier == "auto":
        return SIMPLIFIERS
    if simplifier == "none":
        return ()
    if simplifier not in SIMPLIFIERS:
        raise ValueError(f"unknown simplifier {simplifier!r}; known: auto, none, "
                         f"{', '.join(SIMPLIFIERS)}")  # fmt: skip
    # A named tool that fails still falls back to our own folding.
    return (simplifier, "builtin") if simplifier != "builtin" else ("builtin",)


def _with_onnxslim(model):
    # lazy: onnxslim is an optional dependency
    import onnxslim  # pylint: disable=import-outside-toplevel

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        slimmed = onnxslim.slim(model)
    if slimmed is None:
        raise RuntimeError("onnxslim returned no model")
    return slimmed


def _with_onnxsim(model):
    # lazy: onnxsim is an optional dependency
    import onnxsim  # pylint: disable=import-outside-toplevel

    simplified, ok = onnxsim.simplify(model, check_n=0)
    if not ok:
        raise RuntimeError("onnxsim could not validate the simplified model")
    return simplified


# ---------------------------------------------------------------------------------------------
# Our own folding (no third-party tool)
# ---------------------------------------------------------------------------------------------


def fold_constants(model):
    """Shape inference plus constant folding with onnx's reference evaluator, to a fixpoint.

    A node folds when every input is a constant (an initializer, a ``Constant`` node or an
    earlier folded value) or when it is ``Shape``/``Size`` of a tensor whose inferred shape is
    fully static. Folded outputs become initializers; nodes nothing reads are removed.
    """
    # lazy: onnx is an optional dependency
    import onnx  # pylint: disable=import-outside-toplevel

    for _ in range(_MAX_ROUNDS):
        model = onnx.shape_inference.infer_shapes(model, data_prop=True)
        if not _fold_once(model):
            break
    _remove_dead_nodes(model)
    return onnx.shape_inference.infer_shapes(model, data_prop=True)


def _fold_once(model) -> bool:
    """One pass over the nodes in order; True when anything folded."""
    # lazy: onnx is an optional dependency
    from onnx import numpy_helper  # pylint: disable=import-outside-toplevel

    graph = model.graph
    consts: Dict[str, np.ndarray] = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    static = _static_shapes(graph)
    opsets = {o.domain or "": o.version for o in model.opset_import}
    graph_outputs = {o.name for o in graph.output}
    kept, folded = [], False
    for node in graph.node:
        # A graph output stays the output of a node (an importer needs one to return).
        values = None if graph_outputs.intersection(node.output) else _evaluate_node(
            node, consts, static, opsets)
        if values is None:
            kept.append(node)
            continue
        for name, value in zip(node.output, values):
            consts[name] = value
            graph.initializer.append(numpy_helper.from_array(value, name))
        folded = True
    if folded:
        del graph.node[:]
        graph.node.extend(kept)
    return folded


def _evaluate_node(node, consts, static, opsets) -> Optional[List[np.ndarray]]:
    """The node's output values when it can be folded, else None."""
    if node.domain not in ("", "ai.onnx") or node.op_type in _NOT_FOLDABLE:
        return None
    if node.op_type == "Constant":
        return [_constant_value(node)] if _constant_value(node) is not None else None
    if node.op_type in ("Shape", "Size") and node.input[0] in static:
        shape = static[node.input[0]]
        if node.op_type == "Size":
            return [np.array(int(np.prod(shape)), dtype=np.int64)]
        start, end = _shape_slice(node, len(shape))
        return [np.array(shape[start:end], dtype=np.int64)]
    inputs = [name for name in node.input if name]
    if not inputs or any(name not in consts for name in inputs):
        return None
    try:
        # pylint: disable=import-outside-toplevel
        # lazy: onnx is an optional dependency
        from onnx.reference import ReferenceEvaluator

        feeds = {name: consts[name] for name in inputs}
        values = ReferenceEvaluator(_node_model(node, feeds, opsets)).run(None, feeds)
    except Exception:  # pylint: disable=broad-except  # an op the evaluator lacks: keep it
        return None
    values = [np.asarray(v) for v in values]
    if any(v.size > _MAX_FOLD_ELEMENTS or v.dtype == object for v in values):
        return None
    return values


def _node_model(node, feeds: Mapping[str, np.ndarray], opsets: Mapping[str, int]):
    """A one-node model at the model's opsets (a bare node would run at the newest opset)."""
    # lazy: onnx is an optional dependency
    from onnx import helper  # pylint: disable=import-outside-toplevel

    inputs = [helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(value.dtype),
                                            value.shape) for name, value in feeds.items()]
    outputs = [helper.make_empty_tensor_value_info(name) for name in node.output if name]
    graph = helper.make_graph([node], "fold", inputs, outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid(domain, version)
                                                   for domain, version in opsets.items()])


def _constant_value(node) -> Optional[np.ndarray]:
    # lazy: onnx is an optional dependency
    from onnx import helper, numpy_helper  # pylint: disable=import-outside-toplevel

    for attr in node.attribute:
        value = helper.get_attribute_value(attr)
        if attr.name == "value":
            return numpy_helper.to_array(value)
        if attr.name in ("value_float", "value_int"):
            return np.array(value, dtype=np.float32 if attr.name == "value_float" else np.int64)
        if attr.name in ("value_floats", "value_ints"):
            return np.array(value, dtype=np.float32 if attr.name == "value_floats" else np.int64)
    return None


def _shape_slice(node, rank: int) -> Tuple[int, int]:
    """``Shape``'s ``start``/``end`` attributes (opset 15), clamped like the operator does."""
    attrs = {a.name: a.i for a in node.attribute}
    start, end = attrs.get("start", 0), attrs.get("end", rank)
    start = min(max(start + rank if start < 0 else start, 0), rank)
    end = min(max(end + rank if end < 0 else end, 0), rank)
    return start, end


def _static_shapes(graph) -> Dict[str, List[int]]:
    """Tensors whose every dimension inference knows, name -> dims."""
    shapes = {}
    for info in list(graph.input) + list(graph.value_info) + list(graph.output):
        tensor_type = info.type.tensor_type
        if not tensor_type.HasField("shape"):
            continue
        dims = tensor_type.shape.dim
        if all(d.HasField("dim_value") for d in dims):
            shapes[info.name] = [d.dim_value for d in dims]
    return shapes


def _remove_dead_nodes(model) -> None:
    """Drop nodes and initializers that no graph output depends on."""
    graph = model.graph
    needed = {o.name for o in graph.output}
    kept = []
    for node in reversed(graph.node):
        if any(name in needed for name in node.output):
            kept.append(node)
            needed.update(name for name in node.input if name)
            for attr in node.attribute:  # subgraphs read outer-scope names
                for sub in list(attr.g.node if attr.HasField("g") else []):
                    needed.update(sub.input)
    del graph.node[:]
    graph.node.extend(reversed(kept))
    initializers = [t for t in graph.initializer if t.name in needed]
    del graph.initializer[:]
    graph.initializer.extend(initializers)


_SIMPLIFY = {"onnxsim": _with_onnxsim, "onnxslim": _with_onnxslim, "builtin": fold_constants}
