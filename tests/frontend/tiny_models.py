"""Tiny conv models in every form the command line loads, with a numpy reference.

The model is ``relu(conv2d(x, w, padding=1) + b)`` in NCHW/OIHW, small enough that compiling it
takes a second or two.
"""

from __future__ import annotations

import textwrap
from typing import Tuple

import numpy as np

CIN, COUT, SIZE = 2, 4, 6
X_SHAPE = (1, CIN, SIZE, SIZE)


def weights(seed: int = 0) -> Tuple[np.ndarray, np.ndarray]:
    """Seeded conv weight (OIHW) and bias."""
    rng = np.random.default_rng(seed)
    w = rng.uniform(-1, 1, (COUT, CIN, 3, 3)).astype("float32")
    b = rng.uniform(-1, 1, (COUT,)).astype("float32")
    return w, b


def reference(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    """numpy ``relu(conv2d(x, w, padding=1) + b)``."""
    padded = np.pad(x.astype("float64"), ((0, 0), (0, 0), (1, 1), (1, 1)))
    windows = np.lib.stride_tricks.sliding_window_view(padded, (3, 3), axis=(2, 3))
    y = np.einsum("nchwrs,fcrs->nfhw", windows, w.astype("float64")) + b[None, :, None, None]
    return np.maximum(y, 0.0)


def write_onnx(path: str, seed: int = 0, dynamic_batch: bool = False) -> Tuple[np.ndarray, ...]:
    """Write the model as ONNX (weights as initializers) and return ``(w, b)``."""
    import onnx  # pylint: disable=import-outside-toplevel
    from onnx import TensorProto, helper, numpy_helper  # pylint: disable=import-outside-toplevel

    w, b = weights(seed)
    dims = ["N" if dynamic_batch else 1, CIN, SIZE, SIZE]
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1],
                             kernel_shape=[3, 3]),
            helper.make_node("Relu", ["c"], ["y"]),
        ],
        "tiny_conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=[numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, path)
    return w, b


def relax_module(seed: int = 0, weights_as_params: bool = False):
    """The model as a Relax module: weights are constants, or (optionally) parameters of main."""
    from tvm import relax  # pylint: disable=import-outside-toplevel

    w, b = weights(seed)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(X_SHAPE, "float32"))
    params = [x]
    if weights_as_params:
        wv = relax.Var("w", relax.TensorType(w.shape, "float32"))
        bv = relax.Var("b", relax.TensorType(b.shape, "float32"))
        params += [wv, bv]
    else:
        wv, bv = relax.const(w), relax.const(b)
    with bb.function("main", params):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, wv, padding=1))
            y = bb.emit(relax.op.add(y, relax.op.reshape(bv, (1, COUT, 1, 1))))
            y = bb.emit_output(relax.op.nn.relu(y))
        bb.emit_func_output(y)
    return bb.get()


def write_python_model(path: str, seed: int = 0) -> None:
    """Write ``path`` with ``make()`` returning ``(mod, {"w": ..., "b": ...})`` (weights as
    parameters of main, to be bound by the loader) and ``make_detached()`` returning the
    ``detach_params`` form ``(mod, {"main": [w, b]})``."""
    source = f"""
        import sys
        sys.path.insert(0, {repr(__file__.rsplit('/', 1)[0])})
        import tiny_models

        def make():
            w, b = tiny_models.weights({seed})
            return tiny_models.relax_module({seed}, weights_as_params=True), {{"w": w, "b": b}}

        def make_detached():
            w, b = tiny_models.weights({seed})
            mod = tiny_models.relax_module({seed}, weights_as_params=True)
            return mod, {{"main": [w, b]}}

        def not_a_module():
            return 42
    """
    with open(path, "w", encoding="utf-8") as file:
        file.write(textwrap.dedent(source))
