"""Transposed convolutions: the native kernel vs untuned TVM vs eager PyTorch, medians in ms.

    TVM_NUM_THREADS=1 python -m tvm_ollie.bench.native_deconv [--rounds 15] [--quick]

Every system is first checked against untuned TVM on the same random data, then timed in
interleaved rounds (:func:`~.timing.measure_interleaved`, one call of each per round, back to
back, after one warm-up call), so that a load change on a shared machine hits every system
alike. ``tvm-untuned`` is ``tvm.compile`` with the pass's default llvm pipeline (TVM's own CPU
schedules included); ``torch`` is eager ``conv_transpose2d`` with ``TVM_NUM_THREADS`` threads
(left out, with a note, when PyTorch is not installed).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import tvm_ffi

from .. import native
from ..codegen import library as lib
from ..compat import relax, tvm
from ..frontend.builder import single_function_module, tensor_var
from ..tune.metaschedule import default_pipeline
from .table import pivot_table
from .timing import measure_interleaved

#: (label, data NCHW, out channels, kernel, stride, padding)
WORKLOADS = [
    ("1x21x32x32 -> 21 k4 s2 p1 (GCN)", (1, 21, 32, 32), 21, 4, 2, 1),
    ("1x64x16x16 -> 32 k4 s2 p1", (1, 64, 16, 16), 32, 4, 2, 1),
]

Runs = Dict[str, Callable[[], object]]


def _tvm_untuned(x: np.ndarray, w: np.ndarray, s: int, p: int) -> Tuple[Callable, np.ndarray]:
    mod = single_function_module([tensor_var("x", x.shape), tensor_var("w", w.shape)],
                                 lambda bb, xv, wv: relax.op.nn.conv2d_transpose(
                                     xv, wv, strides=s, padding=p))
    ex = tvm.compile(mod, target="llvm", relax_pipeline=default_pipeline("llvm"))
    vm = relax.VirtualMachine(ex, tvm.cpu())
    tx, tw = tvm.runtime.tensor(x), tvm.runtime.tensor(w)
    return (lambda: vm["main"](tx, tw)), vm["main"](tx, tw).numpy()


def _native(x: np.ndarray, w: np.ndarray, s: int, p: int, ref: np.ndarray) -> Callable:
    out = np.empty(ref.shape, np.float32)
    kernel = tvm_ffi.get_global_func(native.CONV2D_TRANSPOSE)
    attrs = lib.conv2d_transpose_call((s, s), (p,) * 4, (0, 0), (1, 1), 1).text()
    fx, fw, fo = map(tvm_ffi.from_dlpack, (x, w, out))
    kernel(attrs, fx, fw, fo)
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-3, err_msg="ollie-native")
    return lambda: kernel(attrs, fx, fw, fo)


def _torch(x: np.ndarray, w: np.ndarray, s: int, p: int, ref: np.ndarray) -> Callable:
    # lazy: torch is a heavy, optional dependency
    import torch  # pylint: disable=import-outside-toplevel

    torch.set_num_threads(int(os.environ.get("TVM_NUM_THREADS", "1")))
    xt, wt = torch.from_numpy(x), torch.from_numpy(w)

    def run():
        with torch.no_grad():
            return torch.nn.functional.conv_transpose2d(xt, wt, stride=s, padding=p)

    np.testing.assert_allclose(run().numpy(), ref, rtol=1e-4, atol=1e-3, err_msg="torch")
    return run


def systems(shape: Tuple[int, ...], o: int, k: int, s: int, p: int, notes: List[str]) -> Runs:
    """``{name: zero-argument call}`` for one workload, each checked against untuned TVM."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape, dtype=np.float32)
    w = rng.standard_normal((shape[1], o, k, k), dtype=np.float32)
    tvm_run, ref = _tvm_untuned(x, w, s, p)
    runs = {"ollie-native": _native(x, w, s, p, ref), "tvm-untuned": tvm_run}
    try:
        runs["torch"] = _torch(x, w, s, p, ref)
    except ImportError:
        notes.append("torch: not installed")
    return runs


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Print one Markdown table; 2 without the library's conv2d_transpose."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15, help="interleaved rounds")
    parser.add_argument("--quick", action="store_true", help="the first workload only")
    opts = parser.parse_args(argv)
    if not native.provides(native.CONV2D_TRANSPOSE):
        print(f"the native library lacks conv2d_transpose: "
              f"{native.unavailable_reason() or native.library_path()}", file=sys.stderr)
        return 2
    notes: List[str] = []
    rows = []
    for label, shape, o, k, s, p in WORKLOADS[:1] if opts.quick else WORKLOADS:
        samples = measure_interleaved(systems(shape, o, k, s, p, notes), budget_s=math.inf,
                                      min_rounds=opts.rounds, max_rounds=opts.rounds,
                                      min_sample_s=0.0, gap_s=0.0)
        rows.append((label, {name: f"{1e3 * t.median:.3f}" for name, t in samples.items()}))
    print(f"### conv2d_transpose, ms, median of {opts.rounds} interleaved rounds, "
          f"{native.get_num_threads()} threads\n")
    print(pivot_table("workload", rows))
    for note in sorted(set(notes)):
        print(f"\n{note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
