"""Real ONNX models exported by other people's toolchains: import, error and latency against ONNX
Runtime (the table of docs/onnx-operators.md, "Real models").

The models come from packages on PyPI (downloaded by hand, never by the tests):

    pip download --no-deps -d /tmp/models ddddocr==1.6.1 rapidocr-onnxruntime==1.4.4
    (cd /tmp/models && for w in *.whl; do unzip -oq "$w"; done)
    TVM_NUM_THREADS=2 python tests/frontend/real_models.py /tmp/models --threads 2 --repeat 50

For each model, each system in its own process as a user would run it: ``tvm-ollie compile
MODEL --shape NAME=...`` (``ollie``: the defaults) and with ``--no-library --no-derive``
(``tvm``: the same import, TVM's kernels alone), then ``tvm-ollie run --repeat N``; ONNX Runtime
(``onnxruntime``, ``intra_op_num_threads`` = ``--threads``). The Python API import
(``tvm_ollie.from_onnx(path, shapes)``) is checked in this process. Errors: the largest
absolute difference from ONNX Runtime's first output on one seeded input. Each compile's report
(``--explain``: the decisions, the whole-model guard's verdict) is kept beside its library.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from tvm_ollie.bench.quantized import _ORT_TIMER, _cli, _error, _latency_ms

#: (file under the models' directory, what it is, the input's shape for ``--shape``).
MODELS: Tuple[Tuple[str, str, Dict[str, Sequence[int]]], ...] = (
    ("ddddocr/common.onnx", "ddddocr OCR: CRNN, bidirectional LSTM (PyTorch 1.9 export)",
     {"input1": (1, 1, 64, 192)}),
    ("ddddocr/common_old.onnx", "ddddocr OCR, dynamically quantized (onnx.quantize 0.1.0: "
     "22 DynamicQuantizeLinear, 21 ConvInteger, DynamicQuantizeLSTM, MatMulInteger)",
     {"input1": (1, 1, 64, 192)}),
    ("ddddocr/common_det.onnx", "ddddocr detector (YOLOX-style, PyTorch 1.9 export)",
     {"images": (1, 3, 416, 416)}),
    ("rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
     "PP-OCRv4 recognizer (SVTR, paddle2onnx)", {"x": (1, 3, 48, 320)}),
    ("rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
     "PP-OCRv4 detector (DBNet, paddle2onnx)", {"x": (1, 3, 320, 320)}),
    ("rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
     "PP-OCR v2 direction classifier (paddle2onnx)", {"x": (1, 3, 48, 192)}),
)

SYSTEMS = {"ollie": [], "tvm": ["--no-library", "--no-derive"]}


def _find(root: str, relative: str) -> Optional[str]:
    for base, _, files in os.walk(root):
        path = os.path.join(base, os.path.basename(relative))
        if os.path.basename(relative) in files and path.endswith(relative):
            return path
    return None


def _api_import(path: str, shapes) -> str:
    """"yes" when the Python API imports the model, else the error's line."""
    import tvm_ollie  # pylint: disable=import-outside-toplevel

    try:
        tvm_ollie.from_onnx(path, {k: list(v) for k, v in shapes.items()})
    except Exception as err:  # pylint: disable=broad-except
        return f"no: {type(err).__name__}: {str(err).splitlines()[0][:120]}"
    return "yes"


def run_model(path: str, shapes, args) -> List[dict]:
    """ONNX Runtime's output and latency, then each system compiled and run."""
    import onnxruntime  # pylint: disable=import-outside-toplevel

    (name, shape), = shapes.items()
    x = np.random.default_rng(5).random(shape).astype(np.float32)
    stem = os.path.join(args.out, os.path.basename(path)[:-5])
    np.save(stem + "_x.npy", x)
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = args.threads
    session = onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    reference = session.run(None, {name: x})[0]
    timed = subprocess.run([sys.executable, "-c", _ORT_TIMER, path, str(args.repeat),
                            str(args.threads), stem + "_x.npy"], capture_output=True,
                           text=True, check=True).stdout
    rows = [{"system": "onnxruntime", "ms": float(timed.split()[-1]), "error": 0.0}]
    spec = name + "=" + ",".join(str(d) for d in shape)
    for system, flags in SYSTEMS.items():
        lib, out = f"{stem}_{system}.so", f"{stem}_{system}.npz"
        row = {"system": system}
        try:
            start = time.perf_counter()
            report = _cli(["compile", path, "--shape", spec, "-o", lib, "--explain", *flags],
                          args.threads)
            row["compile_s"] = time.perf_counter() - start
            with open(f"{stem}_{system}_compile.txt", "w", encoding="utf-8") as fh:
                fh.write(report)  # the decisions and the whole-model guard's verdict
            text = _cli(["run", lib, "--input", f"{name}={stem}_x.npy", "--output", out,
                         "--repeat", str(args.repeat)], args.threads)
            row["ms"] = _latency_ms(text)
            with np.load(out) as outputs:
                row["error"] = _error(outputs[outputs.files[0]], reference)
        except RuntimeError as err:
            row["note"] = str(err)[:200]
        rows.append(row)
    return rows


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", help="the directory the wheels were unzipped into")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=50)
    parser.add_argument("--only", nargs="*", default=None, help="file names to run")
    parser.add_argument("--out", default="/tmp/ollie-real-models")
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    print(f"| model | input | API import | ollie ms | tvm ms | onnxruntime ms | ollie max error "
          f"| tvm max error | ollie compile s |\n|---|---|---|---|---|---|---|---|---|")
    for relative, what, shapes in MODELS:
        if args.only and os.path.basename(relative) not in args.only:
            continue
        path = _find(args.models, relative)
        if path is None:
            print(f"| {what} | not found under {args.models} |")
            continue
        api = _api_import(path, shapes)
        rows = {r["system"]: r for r in run_model(path, shapes, args)}
        cells = [f"{rows[s]['ms']:.3f}" if "ms" in rows[s] else rows[s].get("note", "-")
                 for s in ("ollie", "tvm", "onnxruntime")]
        errors = [f"{rows[s]['error']:.2g}" if "error" in rows[s] else "-"
                  for s in ("ollie", "tvm")]
        shape = "x".join(str(d) for d in next(iter(shapes.values())))
        compile_s = rows["ollie"].get("compile_s")
        tail = f"{compile_s:.0f}" if compile_s is not None else "-"
        print(f"| {what} (`{os.path.basename(relative)}`) | {shape} | {api} | "
              + " | ".join(cells + errors + [tail]) + " |", flush=True)


if __name__ == "__main__":
    main()
