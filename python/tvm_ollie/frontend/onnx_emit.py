"""What an ONNX decomposition rule sees and writes with: the rule record and its context.

A :class:`Rule` is data (operator, guard, emitter; the equation in the emitter's docstring).
The :class:`RuleContext` holds what shape inference and the initializers say about the model
(static shapes, element types, constant values) and collects the replacement nodes and new
initializers under names that cannot collide with the model's.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np


@dataclasses.dataclass(frozen=True)
class Rule:
    """One decomposition: ``guard`` says why it does not apply ("" when it does), ``emit``
    writes the replacement (its docstring holds the specification's equation)."""

    op: str
    guard: Callable[[Any, "RuleContext"], str]
    emit: Callable[[Any, "RuleContext"], None]
    domains: Tuple[str, ...] = ("", "ai.onnx")


def attributes(node) -> Dict[str, Any]:
    """The node's attributes as Python values (strings decoded)."""
    # lazy: onnx is an optional dependency
    from onnx import helper  # pylint: disable=import-outside-toplevel

    values = {}
    for attr in node.attribute:
        value = helper.get_attribute_value(attr)
        if isinstance(value, bytes):
            value = value.decode()
        elif isinstance(value, list) and value and isinstance(value[0], bytes):
            value = [v.decode() for v in value]
        values[attr.name] = value
    return values


def optional_input(node, position: int) -> str:
    """The node's input at ``position``, or "" when absent."""
    return node.input[position] if position < len(node.input) else ""


class RuleContext:
    """Facts about the model for the rules, and the sink of what they emit."""

    def __init__(self, model) -> None:
        # lazy: onnx is an optional dependency
        from onnx import numpy_helper  # pylint: disable=import-outside-toplevel

        graph = model.graph
        self.opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")),
                          1)  # fmt: skip
        self.shapes: Dict[str, Tuple[int, ...]] = {}
        self.types: Dict[str, int] = {}
        for info in list(graph.input) + list(graph.value_info) + list(graph.output):
            tensor_type = info.type.tensor_type
            if tensor_type.elem_type:
                self.types[info.name] = tensor_type.elem_type
            dims = tensor_type.shape.dim if tensor_type.HasField("shape") else None
            if dims is not None and all(d.HasField("dim_value") for d in dims):
                self.shapes[info.name] = tuple(d.dim_value for d in dims)
        self.values: Dict[str, np.ndarray] = {}
        for tensor in graph.initializer:
            self.values[tensor.name] = numpy_helper.to_array(tensor)
        for node in graph.node:
            if node.op_type == "Constant":
                for attr in node.attribute:
                    if attr.name == "value":
                        self.values[node.output[0]] = numpy_helper.to_array(attr.t)
        for name, value in self.values.items():
            self.shapes[name] = tuple(value.shape)
            self.types.setdefault(name, _tensor_type(value.dtype))
        self._taken = set(self.shapes) | set(self.types) | {
            name for node in graph.node for name in list(node.input) + list(node.output)}
        #: every name a node or the graph's outputs read (an unread node output is dead)
        self.consumed = {name for node in graph.node for name in node.input} | {
            info.name for info in graph.output}
        self.initializers: List[Any] = []
        self.unrolled_steps: Dict[str, int] = {}
        self._nodes: List[Any] = []
        self._prefix = "d"

    # -- reading ----------------------------------------------------------------------------

    def shape(self, name: str) -> Optional[Tuple[int, ...]]:
        """The static shape of ``name``, or None when some dimension is unknown."""
        return self.shapes.get(name)

    def value(self, name: str) -> Optional[np.ndarray]:
        """The constant value of ``name`` (initializer or ``Constant``), or None."""
        return self.values.get(name) if name else None

    def dtype(self, name: str) -> Optional[np.dtype]:
        """The numpy element type of ``name``, or None when unknown."""
        # lazy: onnx is an optional dependency
        from onnx import helper  # pylint: disable=import-outside-toplevel

        elem = self.types.get(name)
        return np.dtype(helper.tensor_dtype_to_np_dtype(elem)) if elem else None

    # -- writing ----------------------------------------------------------------------------

    def emit(self, rule: Rule, node) -> List[Any]:
        """Run ``rule`` on ``node``; the replacement nodes, in order."""
        self._nodes = []
        self._prefix = re.sub(r"[^A-Za-z0-9_]", "_", node.name or node.op_type) + "__"
        rule.emit(node, self)
        nodes, self._nodes = self._nodes, []
        return nodes

    def fresh(self, hint: str) -> str:
        """A name nothing in the model uses yet."""
        base = f"{self._prefix}{hint}"
        name, count = base, 0
        while name in self._taken:
            count += 1
            name = f"{base}_{count}"
        self._taken.add(name)
        return name

    def add(self, op: str, inputs: Sequence[str], outputs: Union[int, Sequence[str]] = 1,
            domain: str = "", **attrs) -> Union[str, List[str]]:  # fmt: skip
        """Append ``op(inputs)``; its output name (or names when ``outputs`` is a list or > 1)."""
        # lazy: onnx is an optional dependency
        from onnx import helper  # pylint: disable=import-outside-toplevel

        names = [self.fresh(op.lower()) for _ in range(outputs)] if isinstance(
            outputs, int) else list(outputs)
        node = helper.make_node(op, list(inputs), names, name=self.fresh(op), domain=domain or None,
                                **attrs)  # fmt: skip
        self._nodes.append(node)
        return names[0] if isinstance(outputs, int) and outputs == 1 else names

    def const(self, value, hint: str = "c", dtype=None) -> str:
        """A new initializer holding ``value``; its name."""
        # lazy: onnx is an optional dependency
        from onnx import numpy_helper  # pylint: disable=import-outside-toplevel

        array = np.asarray(value, dtype=dtype)
        name = self.fresh(hint)
        self.initializers.append(numpy_helper.from_array(array, name))
        self.values[name] = array
        self.shapes[name] = tuple(array.shape)
        return name

    def bind(self, source: str, target: str) -> None:
        """Make the node output ``target`` (a name the model reads) hold ``source``."""
        if target:
            self.add("Identity", [source], [target])

    # -- opset-dependent spellings ----------------------------------------------------------

    def reshape(self, x: str, shape: Sequence[int]) -> str:
        """``Reshape(x, shape)`` with a constant target."""
        return self.add("Reshape", [x, self.const(np.array(shape, np.int64), "shape")])

    def slice(self, x: str, axis: int, start: int, end: int) -> str:
        """``x[start:end]`` along ``axis``."""
        consts = [self.const(np.array([v], np.int64), "s") for v in (start, end, axis)]
        return self.add("Slice", [x] + consts)

    def gather(self, x: str, index: int, axis: int,
               shape: Optional[Sequence[int]] = None) -> str:  # fmt: skip
        """``x`` at ``index`` along ``axis`` (the axis removed). With ``x``'s static shape known
        (given or inferred) a ``Slice`` and a ``Reshape``: TVM lowers a ``Gather`` to a ``take``
        that warns about unchecked indices once per node."""
        shape = shape or self.shape(x)
        if shape is None:
            return self.add("Gather", [x, self.const(np.array(index, np.int64), "i")], axis=axis)
        axis = axis % len(shape)
        kept = [d for k, d in enumerate(shape) if k != axis]
        return self.reshape(self.slice(x, axis, index, index + 1), kept)

    def reduce(self, op: str, x: str, axes: Sequence[int], keepdims: int = 1) -> str:
        """``op`` (``ReduceSum``, ``ReduceMax``, ...) over ``axes``: axes are an input from
        opset 13 for ``ReduceSum`` and from 18 for the others, an attribute before."""
        as_input = self.opset >= (13 if op == "ReduceSum" else 18)
        if as_input:
            return self.add(op, [x, self.const(np.array(axes, np.int64), "axes")],
                            keepdims=keepdims)  # fmt: skip
        return self.add(op, [x], axes=list(axes), keepdims=keepdims)


def _tensor_type(dtype: np.dtype) -> int:
    # lazy: onnx is an optional dependency
    from onnx import helper  # pylint: disable=import-outside-toplevel

    try:
        return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    except (KeyError, TypeError, ValueError):
        return 0
