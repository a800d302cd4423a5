"""Real ONNX models exported by other people's toolchains: import, error and latency against ONNX
Runtime (the table of docs/onnx-operators.md, "Real models").

The models come from packages on PyPI (downloaded by hand, never by the tests):

    pip download --no-deps -d /tmp/models ddddocr==1.6.1 rapidocr-onnxruntime==1.4.4
    (cd /tmp/models && for w in *.whl; do unzip -oq "$w"; done)
    TVM_NUM_THREADS=2 python tests/frontend/real_models.py /tmp/models --threads 2 --repeat 10 \
        --rounds 5

For each model, each system is built once in its own process as a user would build it:
``tvm-ollie compile MODEL --shape NAME=...`` (``ollie``: the defaults; ``--build NAME=EXE``,
repeated, times these ``tvm-ollie`` executables instead, such as two checkouts') and with
``--no-library --no-derive`` (``tvm``: the same import, TVM's kernels alone; ``--no-tvm`` leaves
it out). Then ``--rounds`` rounds alternate ONNX Runtime (``intra_op_num_threads`` =
``--threads``, a fresh process, 5 warm-ups) and ``tvm-ollie run --repeat N`` of each system, so
that every system shares the machine's drift; a system's latency is the median of its rounds'
medians, and its best round's median is printed beside it. The Python API import
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

from tvm_ollie.bench.quantized import _ORT_TIMER, _error, _latency_ms

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

#: The flags of TVM's build of the same import.
TVM_FLAGS = ["--no-library", "--no-derive"]


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


def _tool(exe: str, args: List[str], threads: int) -> str:
    """``exe args`` (a ``tvm-ollie``) with ``TVM_NUM_THREADS=threads``; its stdout."""
    env = dict(os.environ, TVM_NUM_THREADS=str(threads))
    done = subprocess.run([exe, *args], capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        raise RuntimeError((done.stderr or done.stdout).strip().splitlines()[-1])
    return done.stdout


def _systems(args) -> Dict[str, Tuple[str, List[str]]]:
    """Each system's ``tvm-ollie`` and compile flags: each ``--build NAME=EXE`` (or ``ollie``,
    this environment's, when there is none), and ``tvm`` unless ``--no-tvm``."""
    own = os.path.join(os.path.dirname(sys.executable), "tvm-ollie")
    systems = {name: (exe, []) for name, exe in (b.split("=", 1) for b in args.build)}
    if not systems:
        systems["ollie"] = (own, [])
    if not args.no_tvm:
        systems["tvm"] = (own, TVM_FLAGS)
    return systems


def _build(path: str, spec: str, stem: str, system: str, exe_flags, args) -> dict:
    """``system`` compiled (or its library kept with ``--reuse``); its row."""
    exe, flags = exe_flags
    lib = f"{stem}_{system}.so"
    row = {"system": system, "lib": lib, "exe": exe}
    if args.reuse and os.path.exists(lib):
        return row
    start = time.perf_counter()
    try:
        report = _tool(exe, ["compile", path, "--shape", spec, "-o", lib, "--explain", *flags],
                       args.threads)
    except RuntimeError as err:
        row["note"] = str(err)[:200]
        return row
    row["compile_s"] = time.perf_counter() - start
    with open(f"{stem}_{system}_compile.txt", "w", encoding="utf-8") as fh:
        fh.write(report)  # the decisions and the whole-model guard's verdict
    return row


def _ort_ms(path: str, x_path: str, args) -> float:
    timed = subprocess.run([sys.executable, "-c", _ORT_TIMER, path, str(args.repeat),
                            str(args.threads), x_path], capture_output=True, text=True,
                           check=True).stdout
    return float(timed.split()[-1])


def run_model(path: str, shapes, args) -> Dict[str, dict]:
    """ONNX Runtime's output, each system built, then ``--rounds`` alternated timings."""
    import onnxruntime  # pylint: disable=import-outside-toplevel

    (name, shape), = shapes.items()
    x = np.random.default_rng(5).random(shape).astype(np.float32)
    stem = os.path.join(args.out, os.path.basename(path)[:-5])
    x_path = stem + "_x.npy"
    np.save(x_path, x)
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = args.threads
    session = onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    reference = session.run(None, {name: x})[0]
    spec = name + "=" + ",".join(str(d) for d in shape)
    rows = {s: _build(path, spec, stem, s, ef, args) for s, ef in _systems(args).items()}
    rows["onnxruntime"] = {"system": "onnxruntime", "error": 0.0, "rounds": []}
    for _ in range(args.rounds):
        rows["onnxruntime"]["rounds"].append(_ort_ms(path, x_path, args))
        for system, row in rows.items():
            if system == "onnxruntime" or "note" in row:
                continue
            out = f"{stem}_{system}.npz"
            try:
                text = _tool(row["exe"], ["run", row["lib"], "--input", f"{name}={x_path}",
                                          "--output", out, "--repeat", str(args.repeat)],
                             args.threads)
            except RuntimeError as err:
                row["note"] = str(err)[:200]
                continue
            row.setdefault("rounds", []).append(_latency_ms(text))
            with np.load(out) as outputs:
                row["error"] = _error(outputs[outputs.files[0]], reference)
    for row in rows.values():
        if row.get("rounds"):
            row["ms"], row["best"] = float(np.median(row["rounds"])), min(row["rounds"])
    return rows


def _cell(row: dict) -> str:
    if "ms" not in row:
        return row.get("note", "-")
    return f"{row['ms']:.3g} ({row['best']:.3g})"


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", help="the directory the wheels were unzipped into")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=10, help="runs per round and system")
    parser.add_argument("--rounds", type=int, default=5, help="alternated rounds per model")
    parser.add_argument("--build", action="append", default=[], metavar="NAME=EXE",
                        help="another tvm-ollie executable to build and time as NAME")
    parser.add_argument("--no-tvm", action="store_true", help="leave TVM's build out")
    parser.add_argument("--reuse", action="store_true", help="keep libraries already built")
    parser.add_argument("--only", nargs="*", default=None, help="file names to run")
    parser.add_argument("--out", default="/tmp/ollie-real-models")
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    names = list(_systems(args)) + ["onnxruntime"]
    built = [s for s in names if s != "onnxruntime"]
    print("| model | input | API import | " + " | ".join(f"{s} ms" for s in names)
          + " | " + " | ".join(f"{s} max error" for s in built)
          + " | " + " | ".join(f"{s} compile s" for s in built) + " |")
    print("|" + "---|" * (3 + len(names) + 2 * len(built)))
    for relative, what, shapes in MODELS:
        if args.only and os.path.basename(relative) not in args.only:
            continue
        path = _find(args.models, relative)
        if path is None:
            print(f"| {what} | not found under {args.models} |")
            continue
        api = _api_import(path, shapes)
        rows = run_model(path, shapes, args)
        errors = [f"{rows[s]['error']:.2g}" if "error" in rows[s] else "-" for s in built]
        compiles = [f"{rows[s]['compile_s']:.0f}" if "compile_s" in rows[s] else "-"
                    for s in built]
        shape = "x".join(str(d) for d in next(iter(shapes.values())))
        print(f"| {what} (`{os.path.basename(relative)}`) | {shape} | {api} | "
              + " | ".join([_cell(rows[s]) for s in names] + errors + compiles) + " |",
              flush=True)


if __name__ == "__main__":
    main()
