"""CSRNet's dilated convolutions: ollie's build of the model as given (the library's dilated
kernel) against its build after the rule dilated-to-batch (dense convolutions over the
interleaved sub-grids, :mod:`tvm_ollie.transform.dilated_batch`) and ONNX Runtime::

    TVM_NUM_THREADS=1 python -m tvm_ollie.bench.dilated_conv [--size 14] [--rounds 60]

One thread, so that each call runs on the calling thread and its thread CPU time
(``time.thread_time``) is what the call cost, whatever else the shared machine runs; wall
time beside it. Every system is first checked against ollie's output, then timed in
interleaved rounds (one call of each per round). Ratios are per round, to ollie's build of
the model as given (above 1: that build is faster).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np

from ..compat import relax, tvm
from ..pipeline.build import build
from ..transform.dilated_batch import dilated_to_batch
from .table import markdown_table

#: CSRNet's back end at paper size (models/csrnet.py).
WIDTHS = (512, 512, 512, 512, 256, 128, 64)


def _ollie(mod, work_dir: str) -> Callable[[np.ndarray], np.ndarray]:
    ex, _ = build(mod, target="llvm", trials=0, work_dir=work_dir)
    vm = relax.VirtualMachine(ex, tvm.cpu())
    return lambda x: vm["main"](tvm.runtime.tensor(x)).numpy()


def _ort(model, x, work_dir: str) -> Optional[Callable[[np.ndarray], np.ndarray]]:
    """ONNX Runtime on one thread (None without onnxruntime)."""
    try:
        import onnxruntime as ort  # pylint: disable=import-outside-toplevel
        import torch  # pylint: disable=import-outside-toplevel
    except ImportError:
        return None
    path = os.path.join(work_dir, "dilated.onnx")
    torch.onnx.export(model, (torch.from_numpy(x),), path, input_names=["x"], dynamo=False)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = opts.inter_op_num_threads = 1
    sess = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
    return lambda a: sess.run(None, {"x": a})[0]


def systems(widths: Sequence[int], size: int, work_dir: str, with_ort: bool = True):
    """``({name: call}, input)`` of the three systems on CSRNet's back end of ``widths``."""
    # pylint: disable=import-outside-toplevel
    import torch
    from tvm.relax.frontend.torch import from_exported_program

    from ..models.csrnet import CSRNetBackend

    torch.manual_seed(0)
    model = CSRNetBackend(list(widths)).eval()
    x = torch.randn(1, widths[0], size, size)
    mod = from_exported_program(torch.export.export(model, (x,)), unwrap_unit_return_tuple=True)
    grids, count = dilated_to_batch(mod)
    runs = {"ollie (dilated)": _ollie(mod, os.path.join(work_dir, "dilated"))}
    if count:
        runs["ollie (sub-grids)"] = _ollie(grids, os.path.join(work_dir, "subgrids"))
    ort = _ort(model, x.numpy(), work_dir) if with_ort else None
    if ort is not None:
        runs["onnxruntime"] = ort
    return runs, x.numpy()


def interleaved(runs: Dict[str, Callable], x: np.ndarray, rounds: int):
    """``{name: (thread cpu seconds, wall seconds)}`` per call, one call of each per round."""
    cpu: Dict[str, List[float]] = {k: [] for k in runs}
    wall: Dict[str, List[float]] = {k: [] for k in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            c, t = time.thread_time(), time.perf_counter()
            run(x)
            wall[name].append(time.perf_counter() - t)
            cpu[name].append(time.thread_time() - c)
    return {k: (np.array(cpu[k]), np.array(wall[k])) for k in runs}


def report(times, base: str) -> str:
    """The Markdown table: ms per call and the per-round ratio to ``base`` (quartiles)."""
    rows = []
    for name, (cpu, wall) in times.items():
        ratio = cpu / times[base][0]
        rows.append([name, f"{cpu.min() * 1e3:.2f}", f"{np.median(cpu) * 1e3:.2f}",
                     f"{np.median(wall) * 1e3:.2f}",
                     f"{np.median(ratio):.3f} ({np.percentile(ratio, 25):.3f}-"
                     f"{np.percentile(ratio, 75):.3f})"])
    return markdown_table(["system", "cpu min", "cpu median", "wall median",
                           f"cpu / {base} (quartiles)"], rows)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Build, check, time and print the table."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=int, default=14, help="feature map side (paper: 14)")
    ap.add_argument("--widths", default=",".join(map(str, WIDTHS)),
                    help="channel widths of the convolutions, comma-separated")
    ap.add_argument("--rounds", type=int, default=60)
    ap.add_argument("--no-ort", action="store_true", help="leave ONNX Runtime out")
    args = ap.parse_args(argv)
    widths = [int(w) for w in args.widths.split(",")]
    with tempfile.TemporaryDirectory(prefix="ollie-dilated-") as work:
        runs, x = systems(widths, args.size, work, not args.no_ort)
        want = runs["ollie (dilated)"](x)
        for name, run in runs.items():
            got = run(x)
            scale = max(float(np.abs(want).max()), 1e-6)
            if float(np.abs(got - want).max()) > 1e-3 * scale:
                print(f"{name}: output differs from ollie's", file=sys.stderr)
                return 1
        load = open("/proc/loadavg").read().split()[:3] if os.path.exists("/proc/loadavg") \
            else ["?"]
        times = interleaved(runs, x, args.rounds)
    print(f"1x{widths[0]}x{args.size}x{args.size}, widths {args.widths}, {args.rounds} "
          f"rounds, ms per call, load {' '.join(load)}")
    print(report(times, "ollie (dilated)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
