"""QDQ-format quantized models to their integer operators, as ONNX Runtime runs them.

``quantize_static(..., quant_format=QDQ)`` writes float operators between ``DequantizeLinear``
and ``QuantizeLinear``: ``Q(Conv(DQ(x), DQ(w), DQ(b)))``. Taken literally that is a float
convolution (TVM imports it so: float kernels, and rounding that differs from the integer
result). ONNX Runtime fuses each such group into its integer operator before running it; this
step does the same on the ONNX graph, so the integer operators then go through
:mod:`.onnx_quant` and the int8 kernels. Each rule (one row of :data:`QDQ_RULES`: the float
operator, the integer one, its guard) follows ONNX Runtime's QDQ selectors:

* ``Q(Conv(DQ(x), DQ(w) [, DQ(b)])) = QLinearConv(x, xs, xz, w, ws, wz, ys, yz [, b])``: ``w``
  constant (per tensor, or per output channel with the DQ's ``axis`` 0), ``b`` int32 with zero
  point 0 and scale ``xs * ws`` (the QLinearConv bias convention);
* ``Q(MatMul(DQ(a), DQ(b))) = QLinearMatMul(a, as, az, b, bs, bz, ys, yz)``: ``b`` constant,
  per tensor or per column (``axis`` 1);
* ``Q(Gemm(DQ(a), DQ(b) [, DQ(c)])) = com.microsoft.QGemm(a, as, az, b, bs, bz, c, ys, yz)``
  (``transA`` 0, ``beta`` 1; ``b`` constant per tensor or per output column; ``c`` int32 at
  scale ``as * bs`` with zero point 0; ``alpha`` and ``transB`` kept);
* ``Q(Add(DQ(a), DQ(b))) = com.microsoft.QLinearAdd(...)`` for same-typed 8-bit operands;
* ``Q(MaxPool(DQ(x)))`` with the same scale and zero point on both sides ``= MaxPool(x)``
  (the maximum commutes with the monotone, identical dequantization and requantization).

Guards common to all: the float result read by the one ``QuantizeLinear`` only (and not a
graph output), every scale and zero point a constant scalar (but the weight's), zero points
present. A group that fails stays float (TVM imports it as written).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Callable, Dict, List, NamedTuple, Optional

import numpy as np

__all__ = ["QDQ_RULES", "QdqRule", "fuse_qdq"]

_MICROSOFT = "com.microsoft"


class _Graph:
    """The lookups the rules need: initializers, producers, consumers, graph outputs."""

    def __init__(self, graph):
        # lazy: onnx is an optional dependency
        from onnx import numpy_helper  # pylint: disable=import-outside-toplevel

        self.values = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
        self.producer = {out: node for node in graph.node for out in node.output}
        self.consumers: Dict[str, List[object]] = defaultdict(list)
        for node in graph.node:
            for name in node.input:
                self.consumers[name].append(node)
        self.outputs = {o.name for o in graph.output}

    def dq(self, name: str):
        """The ``DequantizeLinear`` producing ``name`` with a constant zero point, else None."""
        node = self.producer.get(name)
        if node is None or node.op_type != "DequantizeLinear" or len(node.input) < 3:
            return None
        if node.input[1] not in self.values or node.input[2] not in self.values:
            return None
        return node

    def scalar(self, name: str) -> Optional[np.ndarray]:
        value = self.values.get(name)
        return value if value is not None and value.size == 1 else None

    def only_q(self, name: str):
        """The one ``QuantizeLinear`` reading ``name`` with constant scalar parameters."""
        readers = self.consumers.get(name, [])
        if len(readers) != 1 or name in self.outputs:
            return None
        q = readers[0]
        if q.op_type != "QuantizeLinear" or len(q.input) < 3:
            return None
        if self.scalar(q.input[1]) is None or self.scalar(q.input[2]) is None:
            return None
        return q


def _axis(node) -> int:
    for attr in node.attribute:
        if attr.name == "axis":
            return int(attr.i)
    return 1


def _activation(g: _Graph, name: str):
    """A DQ of an 8-bit tensor with scalar constant scale and zero point, else None."""
    dq = g.dq(name)
    if dq is None or g.scalar(dq.input[1]) is None or g.scalar(dq.input[2]) is None:
        return None
    if g.values[dq.input[2]].dtype not in (np.uint8, np.int8):
        return None
    return dq


def _weight(g: _Graph, name: str, axis: int):
    """A DQ of a constant 8-bit weight, per tensor or per ``axis``, else None."""
    dq = g.dq(name)
    if dq is None or dq.input[0] not in g.values:
        return None
    w, scale = g.values[dq.input[0]], g.values[dq.input[1]]
    if w.dtype not in (np.uint8, np.int8) or g.values[dq.input[2]].shape != scale.shape:
        return None
    if scale.size != 1 and (scale.ndim != 1 or _axis(dq) % w.ndim != axis % w.ndim):
        return None
    return dq


def _conv(g: _Graph, node, q) -> Optional[object]:
    x, w = _activation(g, node.input[0]), _weight(g, node.input[1], 0)
    if x is None or w is None:
        return None
    inputs = [x.input[0], x.input[1], x.input[2], w.input[0], w.input[1], w.input[2],
              q.input[1], q.input[2]]
    if len(node.input) > 2 and node.input[2]:
        bias = _int32_bias(g, node.input[2], x, w)
        if bias is None:
            return None
        inputs.append(bias)
    return _node("QLinearConv", inputs, q.output[0], node.attribute)


def _int32_bias(g: _Graph, name: str, x, w) -> Optional[str]:
    """The int32 tensor behind the bias ``name`` when it is dequantized with zero point 0 and
    scale ``x_scale * w_scale`` (what QLinearConv and QGemm take as their bias), else None."""
    b = g.dq(name)
    if b is None or b.input[0] not in g.values or g.values[b.input[0]].dtype != np.int32:
        return None
    expected = g.values[x.input[1]].astype(np.float32) * g.values[w.input[1]].astype(np.float32)
    if np.any(g.values[b.input[2]] != 0) or not np.allclose(
            g.values[b.input[1]], expected, rtol=1e-6, atol=0):
        return None
    return b.input[0]


def _matmul(g: _Graph, node, q) -> Optional[object]:
    a, b = _activation(g, node.input[0]), _weight(g, node.input[1], 1)
    if a is None or b is None or g.values[b.input[0]].ndim != 2:
        return None
    return _node("QLinearMatMul", [a.input[0], a.input[1], a.input[2], b.input[0], b.input[1],
                                   b.input[2], q.input[1], q.input[2]], q.output[0])


def _attributes(node) -> Dict[str, object]:
    # lazy: onnx is an optional dependency
    from onnx import helper  # pylint: disable=import-outside-toplevel

    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _gemm(g: _Graph, node, q) -> Optional[object]:
    attrs = _attributes(node)
    if attrs.get("transA", 0) or float(attrs.get("beta", 1.0)) != 1.0:
        return None
    trans_b = int(attrs.get("transB", 0))
    a, b = _activation(g, node.input[0]), _weight(g, node.input[1], 0 if trans_b else 1)
    if a is None or b is None or g.values[b.input[0]].ndim != 2:
        return None
    inputs = [a.input[0], a.input[1], a.input[2], b.input[0], b.input[1], b.input[2]]
    bias = ""
    if len(node.input) > 2 and node.input[2]:
        bias = _int32_bias(g, node.input[2], a, b)
        if bias is None:
            return None
    inputs.append(bias)
    return _node("QGemm", inputs + [q.input[1], q.input[2]], q.output[0], domain=_MICROSOFT,
                 alpha=float(attrs.get("alpha", 1.0)), transB=trans_b)


def _add(g: _Graph, node, q) -> Optional[object]:
    a, b = _activation(g, node.input[0]), _activation(g, node.input[1])
    if a is None or b is None:
        return None
    types = {g.values[a.input[2]].dtype, g.values[b.input[2]].dtype,
             g.values[q.input[2]].dtype}
    if len(types) != 1:
        return None
    return _node("QLinearAdd", [a.input[0], a.input[1], a.input[2], b.input[0], b.input[1],
                                b.input[2], q.input[1], q.input[2]], q.output[0],
                 domain=_MICROSOFT)  # fmt: skip


def _maxpool(g: _Graph, node, q) -> Optional[object]:
    x = _activation(g, node.input[0])
    if x is None or len(node.output) != 1:
        return None
    same = all(np.array_equal(g.values[x.input[i]], g.values[q.input[i]]) and
               g.values[x.input[i]].dtype == g.values[q.input[i]].dtype for i in (1, 2))
    if not same:
        return None
    return _node("MaxPool", [x.input[0]], q.output[0], node.attribute)


def _node(op: str, inputs, output: str, attributes=(), domain: str = "", **attrs):
    """``op(inputs) -> output`` with the float operator's ``attributes`` and new ``attrs``."""
    # lazy: onnx is an optional dependency
    from onnx import helper  # pylint: disable=import-outside-toplevel

    node = helper.make_node(op, list(inputs), [output], name=f"{output}_{op}",
                            domain=domain or None, **attrs)  # fmt: skip
    node.attribute.extend(attributes)
    return node


class QdqRule(NamedTuple):
    """The float operator ``op`` between DQs and one Q, and ``fuse(graph, node, q)``: the
    integer node replacing both, or None when a guard fails."""

    op: str
    fuse: Callable


#: The QDQ groups fused, by their float operator.
QDQ_RULES = (QdqRule("Conv", _conv), QdqRule("MatMul", _matmul), QdqRule("Gemm", _gemm),
             QdqRule("Add", _add), QdqRule("MaxPool", _maxpool))


def fuse_qdq(model) -> Dict[str, int]:
    """Replace every QDQ group of :data:`QDQ_RULES` in ``model`` (in place) by its integer
    operator; DQ nodes left unread are removed. Returns the count per float operator."""
    rules = {r.op: r for r in QDQ_RULES}
    g = _Graph(model.graph)
    counts: Dict[str, int] = defaultdict(int)
    replaced, dropped = {}, set()
    for node in model.graph.node:
        rule = rules.get(node.op_type)
        q = g.only_q(node.output[0]) if rule and node.domain in ("", "ai.onnx") else None
        fused = rule.fuse(g, node, q) if q is not None else None
        if fused is None:
            continue
        replaced[id(node)] = fused
        dropped.add(id(q))
        counts[node.op_type] += 1
    if not counts:
        return {}
    nodes = [replaced.get(id(n), n) for n in model.graph.node if id(n) not in dropped]
    nodes = _without_unread_dq(nodes, {o.name for o in model.graph.output})
    if any(n.domain == _MICROSOFT for n in nodes) and not any(
            o.domain == _MICROSOFT for o in model.opset_import):
        model.opset_import.add(domain=_MICROSOFT, version=1)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return dict(counts)


def _without_unread_dq(nodes, graph_outputs) -> list:
    read = {name for n in nodes for name in n.input} | set(graph_outputs)
    return [n for n in nodes if n.op_type != "DequantizeLinear" or n.output[0] in read]
