"""Operators of tvm-ollie's own ONNX domain: whole layers that a native kernel runs in one call.

A decomposition rule (:mod:`~tvm_ollie.frontend.onnx_rnn`) may replace a standard node by one
of these when the native library has its kernel; :func:`native_converters` then lends TVM's
ONNX importer a converter for each, which writes the kernel's ``call_dps_packed``. The weights
arrive already packed in the kernel's layout (constants the rule wrote), so the converter only
passes operands through.

* ``tvm_ollie.LSTMLayer(X [T, N, I], W [I, D*4H], R [D, H, 4H], B [D, 4H], H0 [D, N, H],
  C0 [D, N, H], [WS [D, 4H], RS [D, 4H]]) -> Y [T, D, N, H]``, attributes ``reverse`` (1: the
  one direction walks from the last step) and ``quant`` (1: DynamicQuantizeLSTM's products,
  ``W``/``R`` centered 8-bit weights as floats, ``WS``/``RS`` their scales):
  ``tvm_ollie.cpu.lstm`` (``tvm_ollie/lstm.cc``, its equations there).

Why through the importer: a ``call_dps_packed`` in the imported module is what the optimizer
already treats as a library call (a linear primitive it neither lifts nor rewrites), and TVM's
importer has no other way in for an operator it does not know.
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Dict, Iterator

from .. import native
from ..compat import relax, tvm

#: The ONNX domain of the operators below (and its opset version).
DOMAIN = "tvm_ollie"
DOMAIN_VERSION = 1
#: The whole-layer LSTM node and its native kernel.
LSTM_LAYER = "LSTMLayer"
LSTM_KERNEL = "tvm_ollie.cpu.lstm"

_NATIVE_LAYERS: "contextvars.ContextVar[bool]" = contextvars.ContextVar(
    "tvm_ollie_native_layers", default=True)


@contextlib.contextmanager
def unrolled_layers() -> Iterator[None]:
    """Within the block, the rules unroll recurrent layers instead of writing the native
    whole-layer nodes (a model imported for a GPU target: the kernels are CPU code)."""
    token = _NATIVE_LAYERS.set(False)
    try:
        yield
    finally:
        _NATIVE_LAYERS.reset(token)


def native_layer_available(kernel: str) -> str:
    """"" when a rule may write the whole-layer node of ``kernel``; otherwise why not."""
    if not _NATIVE_LAYERS.get():
        return "native layers are off (unrolled_layers)"
    if not native.provides(kernel):
        return f"the native library has no {kernel}"
    return ""


def _attr_int(attr, name: str, default: int) -> int:
    value = attr.get(name, default)
    return int(value)


class _LSTMLayer:
    """TVM importer converter of ``tvm_ollie.LSTMLayer``: the kernel's ``call_dps_packed``."""

    @classmethod
    def get_converter(cls, opset: int):  # pylint: disable=unused-argument
        """The importer asks every converter for the function of the model's opset."""
        return cls.convert

    @staticmethod
    def convert(bb, inputs, attr, params):  # pylint: disable=unused-argument
        """``Y = tvm_ollie.cpu.lstm("dir=...", X, W, R, B, H0, C0)``."""
        x, w, r, b, h0, c0 = inputs[:6]
        quantized = _attr_int(attr, "quant", 0)
        steps, batch, _ = (int(v) for v in x.ty.shape)
        directions, hidden, _ = (int(v) for v in r.ty.shape)
        if directions == 2:
            direction = "bidirectional"
        else:
            direction = "reverse" if _attr_int(attr, "reverse", 0) else "forward"
        out = relax.TensorType((steps, directions, batch, hidden), "float32")
        text = f"dir={direction}" + (";quant=1" if quantized else "")
        operands = [tvm.ir.StringImm(text), x, w, r, b, h0, c0] + (
            list(inputs[6:8]) if quantized else [])
        return relax.call_dps_packed(LSTM_KERNEL, operands, out)


#: Operator -> its importer converter.
CONVERTERS: Dict[str, type] = {LSTM_LAYER: _LSTMLayer}


@contextlib.contextmanager
def native_converters() -> Iterator[None]:
    """Within the block, TVM's ONNX importer also converts the operators of :data:`CONVERTERS`
    (its converter table is read through one module function, extended here and restored)."""
    # lazy: TVM's ONNX importer imports onnx (optional)
    from tvm.relax.frontend.onnx import onnx_frontend  # pylint: disable=import-outside-toplevel

    original = onnx_frontend._get_convert_map  # pylint: disable=protected-access

    def extended():
        table = original()
        table.update(CONVERTERS)
        return table

    onnx_frontend._get_convert_map = extended  # pylint: disable=protected-access
    try:
        yield
    finally:
        onnx_frontend._get_convert_map = original  # pylint: disable=protected-access
