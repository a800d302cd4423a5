"""Latency of a statically quantized conv model: tvm-ollie (int8 kernels) vs TVM's kernels vs
ONNX Runtime, each timed alone in its own process; the table in ``docs/onnx-operators.md``.

The model: four 3x3 convolutions (64 channels, 56x56, ReLU after each), built with
``onnx.helper`` from seeded random weights and quantized by ``onnxruntime.quantization.
quantize_static`` (QOperator: ``QLinearConv``; uint8 activations, int8 weights per tensor) on
seeded random calibration inputs. Compiled with ``tvm-ollie compile`` twice: the defaults
(``ollie``: the pass with the native library, so the int8 kernels) and ``--no-library
--no-derive`` (``tvm``: the same import, TVM's kernels); timed with ``tvm-ollie run --repeat``
(median); ONNX Runtime's median over the same number of runs after warm-up.

    TVM_NUM_THREADS=1 python tests/frontend/int8_latency.py [--repeat 50] [--out DIR]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

import numpy as np

CHANNELS, SIZE, LAYERS = 64, 56, 4


def float_model(path: str) -> None:
    """The float model (Conv 3x3 + Relu, ``LAYERS`` times), saved at ``path``."""
    import onnx  # pylint: disable=import-outside-toplevel
    from onnx import TensorProto, helper, numpy_helper  # pylint: disable=import-outside-toplevel

    rng = np.random.default_rng(0)
    nodes, inits, prev = [], [], "x"
    for i in range(LAYERS):
        w = (rng.standard_normal((CHANNELS, CHANNELS, 3, 3)) * 0.06).astype(np.float32)
        b = (rng.standard_normal(CHANNELS) * 0.1).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(b, f"b{i}")]
        nodes.append(helper.make_node("Conv", [prev, f"w{i}", f"b{i}"], [f"c{i}"],
                                      pads=[1, 1, 1, 1]))
        nodes.append(helper.make_node("Relu", [f"c{i}"], [f"r{i}"]))
        prev = f"r{i}"
    shape = [1, CHANNELS, SIZE, SIZE]
    graph = helper.make_graph(nodes, "qconv", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, shape)], [helper.make_tensor_value_info(
            prev, TensorProto.FLOAT, shape)], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)


def quantized_model(directory: str) -> str:
    """``quantize_static`` (QOperator, per tensor) of :func:`float_model`; its path."""
    from onnxruntime import quantization as q  # pylint: disable=import-outside-toplevel

    source, target = os.path.join(directory, "float.onnx"), os.path.join(directory, "qconv.onnx")
    float_model(source)
    rng = np.random.default_rng(1)
    batches = iter([{"x": rng.random((1, CHANNELS, SIZE, SIZE)).astype(np.float32)}
                    for _ in range(4)])

    class Reader(q.CalibrationDataReader):
        def get_next(self):
            return next(batches, None)

    q.quantize_static(source, target, Reader(), quant_format=q.QuantFormat.QOperator,
                      activation_type=q.QuantType.QUInt8, weight_type=q.QuantType.QInt8)
    return target


_ORT = """
import sys, time, numpy as np, onnxruntime as ort
opts = ort.SessionOptions(); opts.intra_op_num_threads = int(sys.argv[3])
s = ort.InferenceSession(sys.argv[1], opts, providers=["CPUExecutionProvider"])
x = {"x": np.random.default_rng(0).random((1, %d, %d, %d)).astype(np.float32)}
for _ in range(5): s.run(None, x)
t = []
for _ in range(int(sys.argv[2])):
    t0 = time.perf_counter(); s.run(None, x); t.append(time.perf_counter() - t0)
print("latency_ms", np.median(t) * 1e3)
""" % (CHANNELS, SIZE, SIZE)


def _cli(*args: str) -> str:
    exe = shutil.which("tvm-ollie") or os.path.join(os.path.dirname(sys.executable), "tvm-ollie")
    out = subprocess.run([exe, *args], capture_output=True, text=True, check=True)
    return out.stdout


def _ms(text: str) -> float:
    """The latency ``tvm-ollie run`` printed, in ms."""
    m = re.search(r"latency: ([0-9.]+) (us|ms|s)\b", text)
    if not m:
        raise RuntimeError(f"no latency in: {text}")
    return float(m.group(1)) * {"us": 1e-3, "ms": 1.0, "s": 1e3}[m.group(2)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=50)
    parser.add_argument("--out", default=None, help="directory for the models and libraries")
    args = parser.parse_args()
    out = args.out or tempfile.mkdtemp(prefix="int8_latency_")
    os.makedirs(out, exist_ok=True)
    model = quantized_model(out)
    threads = os.environ.get("TVM_NUM_THREADS", "1")
    rows = []
    for name, flags in (("ollie", []), ("tvm", ["--no-library", "--no-derive"])):
        lib = os.path.join(out, f"{name}.so")
        _cli("compile", model, "-t", "llvm", "-o", lib, *flags)
        rows.append((name, _ms(_cli("run", lib, "--random-inputs", "--repeat",
                                    str(args.repeat)))))
    ort = subprocess.run([sys.executable, "-c", _ORT, model, str(args.repeat), threads],
                         capture_output=True, text=True, check=True).stdout
    rows.append(("onnxruntime", float(ort.split()[-1])))
    print(f"| system | median latency (ms), {threads} thread(s), {args.repeat} runs |")
    print("|---|---|")
    for name, ms in rows:
        print(f"| {name} | {ms:.2f} |")


if __name__ == "__main__":
    main()
