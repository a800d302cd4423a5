"""``python -m tvm_ollie.bench.user_path``: the zoo through the paths a user takes.

For each zoo model at its quick size, three paths:

* ``onnx-13`` and ``onnx-17``: exported to ONNX with dynamic axes (batch, and height/width of
  4-D inputs) by the TorchScript exporter at that opset (``--dynamo``: the dynamo exporter,
  every axis ``Dim.AUTO``), imported by the CLI's loader with the example input's shape fixed
  (:func:`tvm_ollie.frontend.loader.load_module`) and built with the ollie pipeline
  (``trials=0``);
* ``torch.compile``: ``torch.compile(model, backend="tvm_ollie", dynamic=False)``.

Each row says whether the model was imported (every graph compiled, for ``torch.compile``),
whether its outputs equal eager PyTorch's (max abs error within a tolerance scaled by the
output's magnitude), and the median latency of eager PyTorch and of the compiled model (called
in alternating blocks, see :func:`paired_ms`; eager PyTorch on ``TVM_NUM_THREADS`` threads
when set; ``--clock cpu``: the process's CPU time instead of wall time). A step that fails
ends its row with the reason, in one line. Rows are appended to ``--jsonl`` as they are made
(one process per model survives a crash or a time-out of another); ``--render FILE`` prints
the markdown table of such a file.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import tempfile
import time
import warnings
from dataclasses import asdict, dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import tvm_ffi

from ..compat import relax, tvm
from ..frontend import torch_backend
from ..frontend.loader import load_module
from ..frontend.torch_entry import from_tvm, to_tvm
from ..models.registry import get_model, list_models
from ..pipeline import build

#: relative tolerance of "equal to eager" (float32, a few hundred accumulated terms)
RTOL = 1e-4
#: the paths of a row, in table order
PATHS = ("onnx-13", "onnx-17", "torch.compile")
#: executables of imported modules by structural hash (two opsets often import the same module)
_BUILT: Dict[int, Tuple[object, float]] = {}
#: the clocks of ``--clock``: wall time, or this process's CPU time (every thread), which other
#: processes' load on a shared machine disturbs much less (with one thread, the time computing)
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
#: the clock latencies are measured with (``--clock``)
CLOCK = {"now": time.perf_counter}


@dataclass
class Row:
    """One model through one path."""

    model: str
    path: str
    imported: str = "no"
    equal: str = ""
    max_err: Optional[float] = None
    eager_ms: Optional[float] = None
    ollie_ms: Optional[float] = None
    build_s: Optional[float] = None
    note: str = ""


def dynamic_axes(names: Sequence[str], ranks: Sequence[int]) -> Dict[str, Dict[int, str]]:
    """The legacy exporter's ``dynamic_axes``: batch of every input, height and width of 4-D
    ones (what a user exporting an image model writes)."""
    return {n: ({0: "batch", 2: "height", 3: "width"} if r == 4 else {0: "batch"})
            for n, r in zip(names, ranks)}


def flatten(value) -> List[np.ndarray]:
    """Outputs (a tensor, or nested tuples/lists of them) as a flat list of numpy arrays."""
    if isinstance(value, (tuple, list)):
        return [a for v in value for a in flatten(v)]
    if hasattr(value, "detach"):
        return [value.detach().cpu().numpy()]
    if hasattr(value, "numpy"):
        return [value.numpy()]
    return [np.asarray(value)]


def compare(got: Sequence[np.ndarray], ref: Sequence[np.ndarray],
            rtol: float = RTOL) -> Tuple[bool, float, str]:
    """Whether ``got`` equals ``ref`` within ``rtol`` of the largest reference magnitude (at
    least 1); returns (equal, max abs error, why not)."""
    if len(got) != len(ref):
        return False, float("inf"), f"{len(got)} outputs, eager has {len(ref)}"
    worst = 0.0
    for i, (g, r) in enumerate(zip(got, ref)):
        if tuple(g.shape) != tuple(r.shape):
            return False, float("inf"), f"output {i}: shape {tuple(g.shape)} != {r.shape}"
        if not r.size:
            continue
        err = float(np.max(np.abs(g.astype(np.float64) - r.astype(np.float64))))
        if not np.isfinite(err):
            return False, float("inf"), f"output {i}: non-finite values"
        worst = max(worst, err)
        tol = rtol * max(float(np.max(np.abs(r))), 1.0)
        if err > tol:
            return False, worst, f"output {i}: max abs err {err:.3g} > {tol:.3g}"
    return True, worst, ""


def median_ms(fn: Callable[[], object], runs: int = 5, warmup: int = 1) -> float:
    """Median wall time of ``fn()`` in milliseconds over ``runs`` calls after ``warmup``."""
    for _ in range(warmup):
        fn()
    times = []
    clock = CLOCK["now"]
    for _ in range(max(runs, 1)):
        start = clock()
        fn()
        times.append(clock() - start)
    return statistics.median(times) * 1e3


def paired_ms(first: Callable[[], object], second: Callable[[], object], runs: int = 5,
              block: int = 3) -> Tuple[float, float]:
    """Median milliseconds of ``first()`` and ``second()``, measured in alternating blocks.

    Each block starts with one untimed call and then times ``block`` calls: the two runtimes
    (PyTorch's OpenMP and TVM's thread pool) leave their worker threads spinning for a while
    after a call, so on a machine with few cores the first call after a switch can pay for the
    other runtime's spinning threads. Blocks still alternate, so that a change of the machine's
    load hits both alike; ``runs`` timed calls of each are taken in all (rounded up to whole
    blocks).
    """
    block = max(int(block), 1)
    clock = CLOCK["now"]
    a, b = [], []
    for _ in range(-(-max(runs, 1) // block)):
        for fn, times in ((first, a), (second, b)):
            fn()
            for _ in range(block):
                start = clock()
                fn()
                times.append(clock() - start)
    return statistics.median(a) * 1e3, statistics.median(b) * 1e3


def one_line(err: BaseException, limit: int = 120) -> str:
    """``Type: first line of the message`` cut to ``limit`` characters."""
    text = str(err).strip().splitlines()
    msg = f"{type(err).__name__}: {text[0] if text else ''}"
    return msg if len(msg) <= limit else msg[:limit - 3] + "..."


def render(rows: Sequence[Row]) -> str:
    """The markdown table (models in first-seen order, paths in :data:`PATHS` order)."""

    def num(v, fmt):
        return "" if v is None else format(v, fmt)

    order = {m: i for i, m in enumerate(dict.fromkeys(r.model for r in rows))}
    rows = sorted(rows, key=lambda r: (order[r.model], PATHS.index(r.path)
                                       if r.path in PATHS else len(PATHS)))
    lines = ["| model | path | imported | equal to eager (max err) | eager ms | ollie ms "
             "| eager/ollie | build s | note |",
             "|---|---|---|---|---:|---:|---:|---:|---|"]
    for r in rows:
        ratio = f"{r.eager_ms / r.ollie_ms:.2f}x" if r.eager_ms and r.ollie_ms else ""
        equal = f"{r.equal} ({r.max_err:.1e})" if r.max_err is not None and r.equal else r.equal
        lines.append(f"| {r.model} | {r.path} | {r.imported} | {equal} | "
                     f"{num(r.eager_ms, '.2f')} | {num(r.ollie_ms, '.2f')} | "
                     f"{ratio} | {num(r.build_s, '.0f')} | {r.note.replace('|', '/')} |")
    return "\n".join(lines)


def _export(spec, path: str, opset: int, dynamo: bool) -> None:
    # lazy: torch is a heavy, optional dependency
    import torch  # pylint: disable=import-outside-toplevel

    names = [f"input{i}" for i in range(len(spec.example_inputs))]
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if dynamo:
            dims = tuple({i: torch.export.Dim.AUTO for i in range(t.dim())}
                         for t in spec.example_inputs)
            torch.onnx.export(spec.module, spec.example_inputs, path, input_names=names,
                              opset_version=opset, dynamo=True, dynamic_shapes=dims,
                              external_data=False, verbose=False)
        else:
            axes = dynamic_axes(names, [t.dim() for t in spec.example_inputs])
            torch.onnx.export(spec.module, spec.example_inputs, path, input_names=names,
                              opset_version=opset, dynamo=False, dynamic_axes=axes)


def onnx_row(spec, opset: int, ref, eager: Callable[[], object], opts: dict, runs: int,
             dynamo: bool = False) -> Row:
    """Export ``spec`` at ``opset``, load it as the CLI does, build with ollie, compare, time."""

    row = Row(spec.name, f"onnx-{opset}")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, f"{spec.name}.onnx")
        try:
            _export(spec, path, opset, dynamo)
        except Exception as err:  # pylint: disable=broad-except
            row.note = f"export failed: {one_line(err)}"
            return row
        shapes = [f"input{i}={','.join(map(str, t.shape))}"
                  for i, t in enumerate(spec.example_inputs)]
        try:
            mod = load_module(path, shapes)
        except Exception as err:  # pylint: disable=broad-except
            row.note = f"import failed: {one_line(err)}"
            return row
    row.imported = "yes"
    key = tvm_ffi.structural_hash(mod)
    if key in _BUILT:
        ex, row.build_s = _BUILT[key]
        row.note = "imports the same module as the other opset (one build)"
    else:
        start = time.perf_counter()
        try:
            ex, _ = build(mod, "llvm", trials=0, **opts)
        except Exception as err:  # pylint: disable=broad-except
            row.note = f"build failed: {one_line(err)}"
            return row
        row.build_s = time.perf_counter() - start
        _BUILT[key] = (ex, row.build_s)
    main = relax.VirtualMachine(ex, tvm.cpu())["main"]
    args = [to_tvm(t.contiguous()) for t in spec.example_inputs]
    try:
        got = flatten(from_tvm(main(*args)))
    except Exception as err:  # pylint: disable=broad-except
        row.note = f"run failed: {one_line(err)}"
        return row
    ok, row.max_err, why = compare(got, ref)
    row.equal = "yes" if ok else "no"
    row.note = "; ".join(x for x in (row.note, why) if x)
    row.eager_ms, row.ollie_ms = paired_ms(eager, lambda: main(*args), runs)
    return row


def compile_row(spec, ref, eager: Callable[[], object], opts: dict, runs: int) -> Row:
    """``torch.compile(model, backend="tvm_ollie")``: every graph compiled?, compare, time."""
    # lazy: torch is a heavy, optional dependency
    import torch  # pylint: disable=import-outside-toplevel

    torch_backend.register()
    torch._dynamo.reset()  # pylint: disable=protected-access
    row = Row(spec.name, "torch.compile")
    before = dict(torch_backend.STATS)
    compiled = torch.compile(spec.module, backend=torch_backend.BACKEND_NAME, dynamic=False,
                             options=dict(opts))
    start = time.perf_counter()
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            out = compiled(*spec.example_inputs)
        except Exception as err:  # pylint: disable=broad-except
            row.note = f"torch.compile failed: {one_line(err)}"
            return row
    row.build_s = time.perf_counter() - start
    done = torch_backend.STATS["compiled"] - before["compiled"]
    fell = torch_backend.STATS["eager"] - before["eager"]
    reasons = [str(w.message) for w in caught if "tvm_ollie" in str(w.message)]
    row.imported = "yes" if done and not fell else (f"partial ({done}/{done + fell} graphs)"
                                                    if done else "no")
    if fell:
        row.note = reasons[0][:160] if reasons else f"{fell} graphs ran in eager PyTorch"
    ok, row.max_err, why = compare(flatten(out), ref)
    row.equal = "yes" if ok else "no"
    row.note = "; ".join(x for x in (row.note, why) if x)
    with torch.no_grad():
        row.eager_ms, row.ollie_ms = paired_ms(eager, lambda: compiled(*spec.example_inputs),
                                               runs)
    return row


def model_rows(name: str, paths: Sequence[str], opts: dict, runs: int,
               dynamo: bool = False) -> List[Row]:
    """Every requested path of one zoo model (quick size)."""
    # lazy: torch is a heavy, optional dependency
    import torch  # pylint: disable=import-outside-toplevel

    spec = get_model(name, quick=True)
    with torch.no_grad():
        ref = flatten(spec.module(*spec.example_inputs))

    def eager():
        with torch.no_grad():
            return spec.module(*spec.example_inputs)

    rows = []
    for path in paths:
        try:
            if path == "torch.compile":
                rows.append(compile_row(spec, ref, eager, opts, runs))
            else:
                rows.append(onnx_row(spec, int(path.split("-")[1]), ref, eager, opts, runs,
                                     dynamo))
        except Exception as err:  # pylint: disable=broad-except  # one row per failure
            rows.append(Row(name, path, note=one_line(err)))
    return rows


def load_rows(path: str) -> List[Row]:
    """Rows of a ``--jsonl`` file."""
    with open(path, encoding="utf-8") as f:
        return [Row(**json.loads(line)) for line in f if line.strip()]


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Command line (see the module docstring)."""
    parser = argparse.ArgumentParser(prog="python -m tvm_ollie.bench.user_path",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", help="zoo models (default: all)")
    parser.add_argument("--paths", nargs="+", default=list(PATHS), choices=PATHS)
    parser.add_argument("--dynamo", action="store_true", help="the dynamo ONNX exporter")
    parser.add_argument("--runs", type=int, default=5, help="timed runs (median)")
    parser.add_argument("--search-time", type=float, default=5.0,
                        help="derivation time per build (seconds)")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                        help="latency clock: wall time, or the process's CPU time (a shared "
                             "machine; meaningful with TVM_NUM_THREADS=1)")
    parser.add_argument("--jsonl", help="append each row to this file")
    parser.add_argument("--render", help="print the table of a --jsonl file and exit")
    args = parser.parse_args(argv)
    if args.render:
        print(render(load_rows(args.render)))
        return 0
    CLOCK["now"] = CLOCKS[args.clock]

    # lazy: torch is a heavy, optional dependency
    import torch  # pylint: disable=import-outside-toplevel

    logging.getLogger("tvm_ollie").setLevel(logging.ERROR)
    threads = os.environ.get("TVM_NUM_THREADS")
    if threads:  # eager PyTorch on as many threads as TVM's runtime
        torch.set_num_threads(int(threads))
    opts = dict(search_time_s=args.search_time)
    rows = []
    for name in args.models or list_models():
        for row in model_rows(name, args.paths, opts, args.runs, args.dynamo):
            rows.append(row)
            print(f"{row.model} {row.path}: imported={row.imported} equal={row.equal} "
                  f"{row.note}", file=sys.stderr, flush=True)
            if args.jsonl:
                with open(args.jsonl, "a", encoding="utf-8") as f:
                    f.write(json.dumps(asdict(row)) + "\n")
    print(render(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
