"""Quantized exports of zoo models: tvm-ollie vs ONNX Runtime vs TVM alone, outputs and latency.

Each model (:func:`tvm_ollie.models.get_model`, quick size) is exported to ONNX
(:func:`tvm_ollie.models.export.to_onnx`) and quantized by ONNX Runtime's own tool
(``onnxruntime.quantization.quantize_static``: uint8 activations, int8 weights per output
channel, calibrated on ``CALIBRATION`` seeded normal inputs) in the QOperator format
(``QLinearConv``, ``QLinearAdd``, ``QGemm``: what ``int8_kernels`` runs on oneDNN) and/or the
QDQ format (``QuantizeLinear``/``DequantizeLinear`` around float operators). Every system runs
the quantized file as a user would, each in its own process:

* ``ollie``: ``tvm-ollie compile MODEL.onnx -t llvm`` (the defaults: the ONNX preparation that
  decomposes the integer operators, the int8 kernels, the derivation), then
  ``tvm-ollie run LIB --input NAME=x.npy --repeat N``;
* ``tvm``: the same with ``--no-library --no-derive`` (the same import, TVM's kernels alone);
* ``onnxruntime``: an ``InferenceSession`` (default optimizations, which fuse QDQ pairs into its
  integer kernels), ``intra_op_num_threads`` = ``--threads``.

Reported: the maximum absolute difference of each system's output from ONNX Runtime's on one
seeded input, and the median latency over ``--repeat`` runs (after warm-up)::

    python -m tvm_ollie.bench.quantized --models resnet18 fsrcnn --threads 2 --repeat 50
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

import numpy as np

from ..models import get_model, to_onnx

__all__ = ["Row", "quantize", "run_model", "table", "main"]

#: Calibration inputs given to ``quantize_static``.
CALIBRATION = 8

#: The systems, in table order, with the ``tvm-ollie compile`` flags of the two built ones.
COMPILE_FLAGS = {"ollie": [], "tvm": ["--no-library", "--no-derive"]}

_ORT_TIMER = """
import sys, time, numpy as np, onnxruntime as ort
opts = ort.SessionOptions(); opts.intra_op_num_threads = int(sys.argv[3])
s = ort.InferenceSession(sys.argv[1], opts, providers=["CPUExecutionProvider"])
feeds = {s.get_inputs()[0].name: np.load(sys.argv[4])}
for _ in range(5): s.run(None, feeds)
t = []
for _ in range(int(sys.argv[2])):
    t0 = time.perf_counter(); s.run(None, feeds); t.append(time.perf_counter() - t0)
print("latency_ms", np.median(t) * 1e3)
"""


@dataclass
class Row:
    """One system on one quantized model: ``error`` against ONNX Runtime's output (None when
    it did not build or run: ``note`` says why), ``ms`` the median latency."""

    model: str
    fmt: str
    system: str
    ms: Optional[float] = None
    error: Optional[float] = None
    compile_s: Optional[float] = None
    note: str = ""


class _Reader:
    """``quantize_static``'s calibration reader: ``CALIBRATION`` seeded normal inputs."""

    def __init__(self, name: str, shape: Sequence[int]):
        rng = np.random.default_rng(1)
        self._items = iter([{name: rng.standard_normal(shape).astype(np.float32)}
                            for _ in range(CALIBRATION)])

    def get_next(self):
        return next(self._items, None)


def quantize(model: str, fmt: str, out_dir: str) -> str:
    """``model`` (quick size) exported to ONNX and quantized by ``quantize_static`` in format
    ``fmt`` (``"qoperator"`` or ``"qdq"``); the quantized file's path."""
    # lazy: onnx and onnxruntime are optional benchmark dependencies
    import onnx  # pylint: disable=import-outside-toplevel
    from onnxruntime import quantization as q  # pylint: disable=import-outside-toplevel

    source = os.path.join(out_dir, f"{model}.onnx")
    if not os.path.exists(source):
        to_onnx(get_model(model, quick=True), source)
    graph_input = onnx.load(source).graph.input[0]
    shape = [d.dim_value for d in graph_input.type.tensor_type.shape.dim]

    class Reader(_Reader, q.CalibrationDataReader):
        pass

    target = os.path.join(out_dir, f"{model}_{fmt}.onnx")
    quant_format = q.QuantFormat.QOperator if fmt == "qoperator" else q.QuantFormat.QDQ
    q.quantize_static(source, target, Reader(graph_input.name, shape), quant_format=quant_format,
                      per_channel=True, activation_type=q.QuantType.QUInt8,
                      weight_type=q.QuantType.QInt8)  # fmt: skip
    return target


def _cli(args: List[str], threads: int) -> str:
    exe = os.path.join(os.path.dirname(sys.executable), "tvm-ollie")
    env = dict(os.environ, TVM_NUM_THREADS=str(threads))
    done = subprocess.run([exe, *args], capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        raise RuntimeError((done.stderr or done.stdout).strip().splitlines()[-1])
    return done.stdout


def _latency_ms(text: str) -> float:
    """The median latency ``tvm-ollie run`` printed, in ms."""
    found = re.search(r"latency: ([0-9.]+) (us|ms|s)\b", text)
    if not found:
        raise RuntimeError(f"no latency in: {text[-300:]}")
    return float(found.group(1)) * {"us": 1e-3, "ms": 1.0, "s": 1e3}[found.group(2)]


def _error(ours: np.ndarray, reference: np.ndarray) -> float:
    return float(np.abs(ours.astype(np.float64) - reference.astype(np.float64)).max())


def _built_row(model, fmt, system, path, name, x_path, reference, args) -> Row:
    """``system`` (ollie or tvm) compiled and run through the CLI on ``path``."""
    lib = os.path.join(args.out, f"{model}_{fmt}_{system}.so")
    out = os.path.join(args.out, f"{model}_{fmt}_{system}.npz")
    row = Row(model, fmt, system)
    try:
        start = time.perf_counter()
        _cli(["compile", path, "-t", "llvm", "-o", lib, "--trials", str(args.trials),
              *COMPILE_FLAGS[system]], args.threads)  # fmt: skip
        row.compile_s = time.perf_counter() - start
        text = _cli(["run", lib, "--input", f"{name}={x_path}", "--output", out, "--repeat",
                     str(args.repeat)], args.threads)  # fmt: skip
    except RuntimeError as err:
        row.note = str(err)
        return row
    row.ms = _latency_ms(text)
    with np.load(out) as outputs:
        row.error = _error(outputs[outputs.files[0]], reference)
    return row


def run_model(model: str, fmt: str, args) -> List[Row]:
    """The three systems on ``model`` quantized in ``fmt``."""
    # lazy: onnx and onnxruntime are optional benchmark dependencies
    import onnx  # pylint: disable=import-outside-toplevel
    import onnxruntime  # pylint: disable=import-outside-toplevel

    path = quantize(model, fmt, args.out)
    graph_input = onnx.load(path).graph.input[0]
    shape = [d.dim_value for d in graph_input.type.tensor_type.shape.dim]
    x = np.random.default_rng(5).standard_normal(shape).astype(np.float32)
    x_path = os.path.join(args.out, f"{model}_x.npy")
    np.save(x_path, x)
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    reference = session.run(None, {graph_input.name: x})[0]
    rows = [_built_row(model, fmt, system, path, graph_input.name, x_path, reference, args)
            for system in COMPILE_FLAGS]  # fmt: skip
    timed = subprocess.run([sys.executable, "-c", _ORT_TIMER, path, str(args.repeat),
                            str(args.threads), x_path], capture_output=True, text=True,
                           check=True).stdout  # fmt: skip
    rows.append(Row(model, fmt, "onnxruntime", ms=float(timed.split()[-1]), error=0.0))
    return rows


def table(rows: Sequence[Row], threads: int, repeat: int) -> str:
    """The markdown table: one line per model and format, each system's latency and error."""
    systems = list(COMPILE_FLAGS) + ["onnxruntime"]
    head = ("| model (quantize_static) | " + " | ".join(f"{s} ms" for s in systems) +
            " | ollie max error | tvm max error | ORT / ollie |")
    lines = [f"Median latency over {repeat} runs, {threads} thread(s); errors against ONNX "
             "Runtime's output on one seeded input.", "", head,
             "|" + "---|" * (len(systems) + 4)]
    by_key: Dict[tuple, Dict[str, Row]] = {}
    for row in rows:
        by_key.setdefault((row.model, row.fmt), {})[row.system] = row
    for (model, fmt), found in by_key.items():
        cells = [_ms_cell(found.get(s)) for s in systems]
        ollie, ort = found.get("ollie"), found.get("onnxruntime")
        ratio = f"{ort.ms / ollie.ms:.2f}" if ollie and ollie.ms and ort and ort.ms else "-"
        errors = [_error_cell(found.get(s)) for s in ("ollie", "tvm")]
        lines.append(f"| {model} ({fmt}) | " + " | ".join(cells + errors + [ratio]) + " |")
    notes = [f"- {r.model} ({r.fmt}) {r.system}: {r.note}" for r in rows if r.note]
    return "\n".join(lines + ([""] + notes if notes else []))


def _ms_cell(row: Optional[Row]) -> str:
    return f"{row.ms:.3f}" if row and row.ms is not None else "failed"


def _error_cell(row: Optional[Row]) -> str:
    return f"{row.error:.3g}" if row and row.error is not None else "-"


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["resnet18", "fsrcnn"])
    parser.add_argument("--formats", nargs="+", default=["qoperator", "qdq"],
                        choices=["qoperator", "qdq"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=50)
    parser.add_argument("--trials", type=int, default=0,
                        help="MetaSchedule trials of both built systems (default 0)")
    parser.add_argument("--out", default=None, help="directory for the models and libraries")
    args = parser.parse_args(argv)
    args.out = args.out or tempfile.mkdtemp(prefix="quantized_")
    os.makedirs(args.out, exist_ok=True)
    rows = [row for model in args.models for fmt in args.formats
            for row in run_model(model, fmt, args)]  # fmt: skip
    print(table(rows, args.threads, args.repeat))


if __name__ == "__main__":
    main()
