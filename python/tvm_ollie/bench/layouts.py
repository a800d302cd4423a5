"""Blocked layouts across chains of native convolutions: the same rewritten module with and
without :func:`tvm_ollie.transform.blocked_layout.blocked_layout`, timed in alternating rounds.

::

    TVM_NUM_THREADS=2 python -m tvm_ollie.bench.layouts --models resnet18 candy --quick

Each model (the zoo's, constants as weights) goes through the pass once with the layout step
off; that module is built as it is (``plain``) and after the layout step (``layouts``; and
``layouts:FMT`` for each ``--formats`` forced on every chain), so both columns share every
other decision (``--native``: every operator the library has on its native kernel, so that the
per-operator decisions, which do not see layouts, cannot split a chain). Outputs are compared,
then the builds are timed in alternating rounds in this process
(:func:`tvm_ollie.pipeline.guard.alternating_medians`); ``onnxruntime`` (the model's ONNX
export, all graph optimizations, no spinning) is timed alone after them for reference when
installed. Medians in ms (``--clock cpu``: CPU time of the process, all threads);
docs/layouts.md has the results.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from typing import Dict, List

import numpy as np

from ..compat import relax, tvm
from ..models import get_model, to_onnx, to_relax
from ..pipeline.compile import compile_module
from ..pipeline.guard import alternating_medians
from ..transform.blocked_layout import blocked_layout
from ..transform.choosing import native_everywhere
from ..transform.optimize import optimize_module


def _vm_runner(ex, inputs: List[np.ndarray]):
    vm = relax.VirtualMachine(ex, tvm.cpu())
    args = [tvm.runtime.tensor(a) for a in inputs]
    return lambda: vm["main"](*args)


def _first(out) -> np.ndarray:
    while not hasattr(out, "numpy"):
        out = out[0]
    return out.numpy()


def _onnxruntime(spec, inputs: List[np.ndarray], threads: int):
    try:
        import onnxruntime as ort  # pylint: disable=import-outside-toplevel
    except ImportError:
        return None
    path = os.path.join(tempfile.mkdtemp(prefix="ollie-layouts-"), f"{spec.name}.onnx")
    to_onnx(spec, path)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    # a spinning ONNX Runtime pool slows the TVM builds timed in the same process
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    sess = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
    feed = {i.name: a for i, a in zip(sess.get_inputs(), inputs)}
    return lambda: sess.run(None, feed)


CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def measure(name: str, quick: bool, formats: List[str], threads: int,
            time_s: float, native: bool = False, clock: str = "wall",
            pack: bool = False) -> Dict[str, object]:
    """One model's row: chains converted, max difference, median ms per column. ``native``:
    every operator the library has on it (no derivation, no timing of decisions); ``pack``:
    also the ``layouts+packed`` column (the chains' constant weights packed at compile time)."""
    spec = get_model(name, quick=quick)
    mod, _ = to_relax(spec, weights="constants")
    inputs = [t.detach().numpy() for t in spec.example_inputs]
    opts = dict(chooser=native_everywhere, derive=False) if native else {}
    rewritten, _ = optimize_module(mod, target="llvm", trials=0, blocked_layout=False, **opts)
    modules = {"plain": rewritten}
    laid, report = blocked_layout(rewritten)
    modules["layouts"] = laid
    if pack:
        modules["layouts+packed"] = blocked_layout(rewritten, pack_weights=True)[0]
    for fmt in formats:
        modules[f"layouts:{fmt}"] = blocked_layout(rewritten, fmt=fmt)[0]
    runs = {k: _vm_runner(compile_module(m, "llvm"), inputs) for k, m in modules.items()}
    ref = _first(runs["plain"]())
    diff = max(float(np.abs(_first(r()) - ref).max()) for r in runs.values())
    medians = alternating_medians(runs, time_s=time_s, min_rounds=9, hopeless=float("inf"),
                                  clock=CLOCKS[clock])
    ort_run = _onnxruntime(spec, inputs, threads)
    if ort_run is not None:  # alone, after the TVM builds (its pool would slow them)
        medians.update(alternating_medians({"onnxruntime": ort_run}, time_s=time_s / 2,
                                           clock=CLOCKS[clock]))
    return {"model": name, "chains": report.to_text(), "max_diff": diff,
            "ms": {k: v * 1e3 for k, v in medians.items()}}


def main(argv=None) -> None:
    """Command line (module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["resnet18", "candy", "yolox", "csrnet"])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--formats", nargs="*", default=[],
                        help="also force these formats on every chain (nhwc, nChw8c, nChw16c)")
    parser.add_argument("--time", type=float, default=10.0, help="timing seconds per model")
    parser.add_argument("--native", action="store_true",
                        help="every operator the library has on its native kernel (no "
                             "derivation): the decisions cannot split a chain")
    parser.add_argument("--pack", action="store_true",
                        help="also the layouts+packed column (weights packed at compile time)")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                        help="wall time, or the process's CPU time (all its threads: the work "
                             "done, less moved by other processes on a loaded machine)")
    args = parser.parse_args(argv)
    threads = int(os.environ.get("TVM_NUM_THREADS", "1"))
    print(f"load average before: {os.getloadavg()}")
    for name in args.models:
        row = measure(name, args.quick, args.formats, threads, args.time, args.native,
                      args.clock, args.pack)
        ms = row["ms"]
        cells = "  ".join(f"{k} {v:.3f}" for k, v in ms.items())
        ratio = ms["plain"] / ms["layouts"]
        print(f"{name}: {cells}  plain/layouts {ratio:.2f}  max|diff| {row['max_diff']:.2e}")
        print(f"  {row['chains']}")
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
