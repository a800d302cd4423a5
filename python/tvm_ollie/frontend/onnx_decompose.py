"""Rewrite the ONNX operators TVM's importer has no converter for into operators it has.

TVM 0.27's Relax ONNX importer lacks about 45 standard operators (recurrent layers, integer
convolutions and matrix products, a few normalizations); a model holding one of them stops at
import although ONNX Runtime runs it. :func:`decompose_onnx` runs inside the ONNX preparation
(:func:`~tvm_ollie.frontend.onnx_prep.prepare_onnx`), after the input shapes are fixed, and
replaces every such node by an equivalent subgraph of importable operators:

1. a node whose schema carries a function body (``Celu``, ``Swish``, the window functions) or a
   context-dependent function (``RotaryEmbedding``, ``SoftmaxCrossEntropyLoss``, ...) is
   expanded with onnx's own inliner (:func:`_expand_functions`);
2. the rest come from the rules of :data:`RULES` (one table in
   :mod:`~tvm_ollie.frontend.onnx_rules`): each names the operator, states the specification's
   equation, guards the attribute combinations it reproduces exactly and emits the replacement
   nodes with ``onnx.helper``.

A node nothing handles is left in place: the loader then stops with its one-line error.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, FrozenSet, List, Optional, Tuple

import numpy as np

from .onnx_native import CONVERTERS, DOMAIN, DOMAIN_VERSION
from .onnx_rules import RULES, RuleContext

#: Function expansions and rule rewrites per call at most (an expansion may expose a node that
#: itself needs a rule).
_MAX_ROUNDS = 4

#: The private domain expanded schema functions are registered in while onnx inlines them.
_INLINE_DOMAIN = "tvm_ollie.inline"


@dataclasses.dataclass
class DecomposeInfo:
    """What :func:`decompose_onnx` replaced.

    Attributes
    ----------
    replaced : dict from operator to count
        Nodes rewritten by a rule.
    inlined : dict from operator to count
        Nodes expanded from their schema's function body.
    unrolled_steps : dict from node name to count
        Time steps each recurrent node was unrolled into.
    refused : dict from operator to reason
        Nodes a rule exists for but whose attributes it does not reproduce exactly.
    """

    replaced: Dict[str, int] = dataclasses.field(default_factory=dict)
    inlined: Dict[str, int] = dataclasses.field(default_factory=dict)
    unrolled_steps: Dict[str, int] = dataclasses.field(default_factory=dict)
    refused: Dict[str, str] = dataclasses.field(default_factory=dict)

    def summary(self) -> str:
        """One line: ``LSTM x1 (unrolled 7 steps), Celu x2 (inlined)`` or ``""``."""
        parts = [f"{op} x{n}" for op, n in sorted(self.replaced.items())]
        parts += [f"{op} x{n} (inlined)" for op, n in sorted(self.inlined.items())]
        if self.unrolled_steps:
            parts.append(f"{sum(self.unrolled_steps.values())} recurrent step(s) unrolled")
        return ", ".join(parts)


def importer_ops() -> FrozenSet[str]:
    """The operators TVM's ONNX importer converts (its convert map, plus what it handles inline).

    Empty when this TVM has no such table (nothing is then decomposed).
    """
    try:
        # pylint: disable=import-outside-toplevel
        # lazy: TVM's ONNX importer imports onnx
        from tvm.relax.frontend.onnx.onnx_frontend import _get_convert_map

        return frozenset(_get_convert_map()) | {"Constant", "If"} | frozenset(CONVERTERS)
    except (ImportError, AttributeError, TypeError):
        return frozenset()


def decompose_onnx(model, supported: Optional[FrozenSet[str]] = None
                   ) -> Tuple[object, DecomposeInfo]:  # fmt: skip
    """Replace the nodes TVM's importer cannot convert by importable equivalents.

    Parameters
    ----------
    model : onnx.ModelProto
        The model, its input shapes fixed (recurrent layers unroll over the static sequence
        length); not modified.
    supported : frozenset of str, optional
        Operators the importer converts (default: :func:`importer_ops`).

    Returns
    -------
    model : onnx.ModelProto
        The rewritten model (the same object when nothing needed rewriting).
    info : DecomposeInfo
        What was rewritten, and the unrolled step counts.
    """
    # lazy: onnx is an optional dependency
    import onnx  # pylint: disable=import-outside-toplevel

    supported = importer_ops() if supported is None else supported
    info = DecomposeInfo()
    if not supported or not _foreign_nodes(model, supported):
        return model, info
    rewritten = onnx.ModelProto()
    rewritten.CopyFrom(model)
    for _ in range(_MAX_ROUNDS):
        changed = _expand_functions(rewritten, supported, set(RULES), info)
        inferred = _infer(rewritten)
        context = RuleContext(inferred)
        nodes = []
        for node in rewritten.graph.node:
            rule = RULES.get(node.op_type) if node.op_type not in supported else None
            if rule is None or node.domain not in rule.domains:
                nodes.append(node)
                continue
            reason = rule.guard(node, context)
            if reason:
                info.refused[node.op_type] = reason
                nodes.append(node)
                continue
            nodes.extend(context.emit(rule, node))
            info.replaced[node.op_type] = info.replaced.get(node.op_type, 0) + 1
            changed = True
        if not changed:
            break
        del rewritten.graph.node[:]
        rewritten.graph.node.extend(nodes)
        rewritten.graph.initializer.extend(context.initializers)
        info.unrolled_steps.update(context.unrolled_steps)
    _drop_unused_domains(rewritten)
    _import_native_domain(rewritten)
    return rewritten, info


def _foreign_nodes(model, supported: FrozenSet[str]) -> List[object]:
    return [n for n in model.graph.node if n.op_type not in supported]


def _infer(model):
    """The model with inferred shapes (the input when inference fails: rules then refuse)."""
    # lazy: onnx is an optional dependency
    import onnx  # pylint: disable=import-outside-toplevel

    try:
        return onnx.shape_inference.infer_shapes(model, data_prop=True)
    except Exception:  # pylint: disable=broad-except  # a model inference rejects
        return model


# ---------------------------------------------------------------------------------------------
# Schema functions, expanded by onnx's inliner
# ---------------------------------------------------------------------------------------------


def _expand_functions(model, supported, ruled, info: DecomposeInfo) -> bool:
    """Inline the schema function of every unsupported node that has one and no rule (in place).

    Each such node is renamed into a private domain whose model-local function is the schema's
    body at the model's opset (or its context-dependent body, built from the node and its input
    types); :func:`onnx.inliner.inline_local_functions` then substitutes it, attributes and
    names included. Returns True when anything was inlined.
    """
    # lazy: onnx is an optional dependency
    import onnx  # pylint: disable=import-outside-toplevel
    import onnx.inliner  # pylint: disable=import-outside-toplevel

    opset = _opset(model)
    types = _value_types(_infer(model))
    functions, counts = [], {}
    for index, node in enumerate(model.graph.node):
        if node.op_type in supported or node.op_type in ruled or node.domain not in ("", "ai.onnx"):
            continue
        _fill_default_attributes(node, opset)
        body = _function_body(node, opset, types)
        if body is None:
            continue
        body.domain, body.name = _INLINE_DOMAIN, f"{node.op_type}_{index}"
        counts[node.op_type] = counts.get(node.op_type, 0) + 1
        node.domain, node.op_type = body.domain, body.name
        functions.append(body)
    if not functions:
        return False
    model.functions.extend(functions)
    model.opset_import.append(onnx.helper.make_opsetid(_INLINE_DOMAIN, 1))
    inlined = onnx.inliner.inline_local_functions(model)
    model.CopyFrom(inlined)
    for node in model.graph.node:
        _constant_as_tensor(node)
    for op, count in counts.items():
        info.inlined[op] = info.inlined.get(op, 0) + count
    return True


def _function_body(node, opset: int, types):
    """The node's schema function at ``opset`` as a FunctionProto, or None when it has none."""
    # lazy: onnx is an optional dependency
    import onnx  # pylint: disable=import-outside-toplevel

    try:
        schema = onnx.defs.get_schema(node.op_type, opset, node.domain or "")
    except onnx.defs.SchemaError:
        return None
    # Bodies are registered under the opset they were written for: take the newest not above
    # the model's.
    body = b""
    plain = [v for v in schema.function_opset_versions if v <= opset]
    if schema.has_function and plain:
        body = schema.get_function_with_opset_version(max(plain)) or b""
    dependent = [v for v in schema.context_dependent_function_opset_versions if v <= opset]
    if not body and schema.has_context_dependent_function and dependent:
        input_types = [types[name].SerializeToString() for name in node.input if name in types]
        if len(input_types) != len([name for name in node.input if name]):
            return None
        try:
            body = schema.get_context_dependent_function_with_opset_version(
                max(dependent), node.SerializeToString(), input_types)
        except Exception:  # pylint: disable=broad-except  # onnx refuses this node's types
            return None
    if not body:
        return None
    function = onnx.FunctionProto()
    function.ParseFromString(body)
    if not function.node:
        return None
    _bind_attributes(function, node)
    return function if _at_opset(function, opset) else None


def _bind_attributes(function, node) -> None:
    """Replace the body's references to the node's attributes (``@alpha``) by their values, and
    drop those the node does not set (in place): onnx's version converter loses references."""
    values = {a.name: a for a in node.attribute}
    for inner in function.node:
        kept = []
        for attr in inner.attribute:
            if not attr.ref_attr_name:
                kept.append(attr)
            elif attr.ref_attr_name in values:
                bound = type(attr)()
                bound.CopyFrom(values[attr.ref_attr_name])
                bound.name = attr.name
                kept.append(bound)
        del inner.attribute[:]
        inner.attribute.extend(kept)


def _fill_default_attributes(node, opset: int) -> None:
    """Give the node the schema's default for every attribute it does not set (in place): the
    inliner drops a body attribute that refers to an attribute the node lacks."""
    # lazy: onnx is an optional dependency
    import onnx  # pylint: disable=import-outside-toplevel

    try:
        schema = onnx.defs.get_schema(node.op_type, opset, node.domain or "")
    except onnx.defs.SchemaError:  # an operator onnx does not know: nothing to expand
        return
    present = {a.name for a in node.attribute}
    for name, attr in schema.attributes.items():
        if name not in present and attr.default_value.type:
            default = onnx.AttributeProto()
            default.CopyFrom(attr.default_value)
            default.name = name
            node.attribute.append(default)


def _at_opset(function, opset: int) -> bool:
    """Bring the body to the model's default-domain opset (in place); False when it cannot be.

    onnx's inliner keeps a function whose opset differs from the model's. A body whose
    operators mean the same at both opsets (the same schema versions) is relabelled; otherwise
    onnx's version converter rewrites it (its adapters, or its refusal).
    """
    # lazy: onnx is an optional dependency
    import onnx  # pylint: disable=import-outside-toplevel
    import onnx.version_converter  # pylint: disable=import-outside-toplevel
    from onnx import helper  # pylint: disable=import-outside-toplevel

    written = next((o for o in function.opset_import if o.domain in ("", "ai.onnx")), None)
    if written is None or written.version == opset:
        return True
    try:
        same = all(onnx.defs.get_schema(n.op_type, written.version).since_version
                   == onnx.defs.get_schema(n.op_type, opset).since_version
                   for n in function.node if n.domain in ("", "ai.onnx"))  # fmt: skip
    except onnx.defs.SchemaError:
        return False
    if not same:
        graph = helper.make_graph(
            list(function.node), "body",
            [helper.make_empty_tensor_value_info(name) for name in function.input],
            # Optional outputs the body does not write (a context-dependent body for a node
            # that does not ask for them) are left out.
            [helper.make_empty_tensor_value_info(name) for name in function.output
             if any(name in n.output for n in function.node)])
        try:
            converted = onnx.version_converter.convert_version(
                helper.make_model(graph, opset_imports=list(function.opset_import)), opset)
        except Exception:  # pylint: disable=broad-except  # no adapter for some operator
            return False
        del function.node[:]
        function.node.extend(converted.graph.node)
    written.version = opset
    return True


def _constant_as_tensor(node) -> None:
    """``Constant`` with ``value_float(s)``/``value_int(s)`` (what function bodies write) as a
    ``value`` tensor, the one form TVM's importer reads (in place)."""
    # lazy: onnx is an optional dependency
    from onnx import helper, numpy_helper  # pylint: disable=import-outside-toplevel

    if node.op_type != "Constant" or len(node.attribute) != 1:
        return
    attr = node.attribute[0]
    kinds = {"value_float": np.float32, "value_floats": np.float32, "value_int": np.int64,
             "value_ints": np.int64}  # fmt: skip
    if attr.name not in kinds:
        return
    value = np.array(helper.get_attribute_value(attr), dtype=kinds[attr.name])
    del node.attribute[:]
    node.attribute.append(helper.make_attribute("value", numpy_helper.from_array(value)))


def _value_types(model) -> Dict[str, object]:
    graph = model.graph
    types = {v.name: v.type for v in list(graph.input) + list(graph.value_info)
             + list(graph.output)}  # fmt: skip
    # lazy: onnx is an optional dependency
    import onnx  # pylint: disable=import-outside-toplevel

    for tensor in graph.initializer:
        types[tensor.name] = onnx.helper.make_tensor_type_proto(tensor.data_type, tensor.dims)
    return types


def _opset(model) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)


def _drop_unused_domains(model) -> None:
    """Remove the private inlining domain (and its functions) once nothing refers to it."""
    if any(n.domain == _INLINE_DOMAIN for n in model.graph.node):
        return
    kept = [o for o in model.opset_import if o.domain != _INLINE_DOMAIN]
    del model.opset_import[:]
    model.opset_import.extend(kept)
    functions = [f for f in model.functions if f.domain != _INLINE_DOMAIN]
    del model.functions[:]
    model.functions.extend(functions)


def _import_native_domain(model) -> None:
    """Declare tvm-ollie's domain when a rule wrote one of its whole-layer nodes
    (:mod:`~tvm_ollie.frontend.onnx_native`): the onnx checker wants every domain imported."""
    used = any(n.domain == DOMAIN for n in model.graph.node)
    if used and all(o.domain != DOMAIN for o in model.opset_import):
        # lazy: onnx is an optional dependency
        from onnx import helper  # pylint: disable=import-outside-toplevel

        model.opset_import.append(helper.make_opsetid(DOMAIN, DOMAIN_VERSION))
