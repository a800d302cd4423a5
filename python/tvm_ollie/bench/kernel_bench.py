"""Kernel benchmark of the native library: GEMM GFLOP/s and conv2d time against other systems.

    python -m tvm_ollie.bench.kernel_bench [--threads N] [--budget-s S] [--only gemm|conv]

Systems (each with the same thread count): the native library with each backend
(``ollie-onednn``, ``ollie-openblas``, ``ollie-default``; for conv2d the plain, blocked-format
and prepacked-weight implementations in NCHW and NHWC), numpy (GEMM only), PyTorch, ONNX
Runtime (a one-node ONNX model built with ``onnx.helper``) and untuned TVM (``tvm.compile`` with
the default pipeline; skipped where one run takes more than 2 s). Every system runs once per
round in rotating order (:func:`tvm_ollie.bench.timing.measure_interleaved`); the table gives
medians. Missing optional systems (torch, onnxruntime) are reported as such, not fatal.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np
import tvm_ffi

from .. import native
from ..compat import relax, tvm
from .env import configure_threads
from .table import pivot_table
from .timing import measure_interleaved

#: GEMM shapes (M, K, N, label): Out[M, N] = A[M, K] @ B[K, N].
GEMM_SHAPES: List[Tuple[int, int, int, str]] = [
    (256, 256, 256, "square 256"),
    (512, 512, 512, "square 512"),
    (1024, 1024, 1024, "square 1024"),
    (4608, 512, 49, "derived conv3x3 W1: 4608x512 @ 512x49"),
    (49, 4608, 512, "skinny 49x4608 @ 4608x512"),
    (4096, 448, 64, "derived 4096x448 @ 448x64"),
    (128, 768, 3072, "BERT FFN 128x768 @ 768x3072"),
    (1, 768, 768, "GEMV 1x768 @ 768x768"),
]

#: conv2d workloads (N, C, H, W, O, K, pad, groups, label), stride 1.
CONV_SHAPES: List[Tuple[int, int, int, int, int, int, int, int, str]] = [
    (1, 512, 7, 7, 512, 3, 1, 1, "W1 conv3x3 1x512x7x7 -> 512"),
    (1, 64, 56, 56, 64, 3, 1, 1, "ResNet conv3x3 1x64x56x56 -> 64"),
    (1, 96, 56, 56, 96, 3, 1, 96, "depthwise 3x3 1x96x56x56"),
]

TVM_MAX_RUN_S = 2.0


def _gemm_runs(m, k, n, threads, skip: List[str]) -> Dict[str, Callable[[], object]]:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, k)).astype("float32")
    b = rng.standard_normal((k, n)).astype("float32")
    out = np.empty((m, n), "float32")
    runs: Dict[str, Callable[[], object]] = {}
    if native.available():
        f = tvm_ffi.get_global_func(native.MATMUL)
        ta, tb, to = (tvm_ffi.from_dlpack(x) for x in (a, b, out))
        for lib in ("onednn", "openblas"):
            runs[f"ollie-{lib}"] = (lambda lib=lib: f(f"lib={lib}", ta, tb, to))
        runs["ollie-default"] = lambda: f("", ta, tb, to)
    runs["numpy"] = lambda: np.matmul(a, b, out=out)
    try:
        # lazy: torch is a heavy, optional dependency
        import torch

        torch.set_num_threads(threads)
        xa, xb, xo = torch.from_numpy(a), torch.from_numpy(b), torch.from_numpy(out)
        runs["torch"] = lambda: torch.matmul(xa, xb, out=xo)
    except ImportError:
        skip.append("torch (not installed)")
    ort = _ort_session("MatMul", [("A", a.shape), ("B", b.shape)], (m, n), {}, threads, skip)
    if ort is not None:
        runs["onnxruntime"] = lambda: ort.run(None, {"A": a, "B": b})

    def tvm_build():
        bb = relax.BlockBuilder()
        va = relax.Var("a", relax.TensorType((m, k), "float32"))
        vb = relax.Var("b", relax.TensorType((k, n), "float32"))
        with bb.function("main", [va, vb]):
            with bb.dataflow():
                y = bb.emit_output(relax.op.matmul(va, vb))
            bb.emit_func_output(y)
        return bb.get(), [a, b]

    _add_tvm(runs, tvm_build, threads, skip, f"gemm {m}x{k}x{n}")
    return runs


def _conv_runs(n, c, h, w, o, k, pad, groups, threads, skip) -> Dict[str, Callable[[], object]]:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, c, h, w)).astype("float32")
    wt = rng.standard_normal((o, c // groups, k, k)).astype("float32")
    oh, ow = h + 2 * pad - k + 1, w + 2 * pad - k + 1
    runs: Dict[str, Callable[[], object]] = {}
    common = f"stride=1,1;pad={pad},{pad},{pad},{pad};dil=1,1;groups={groups}"
    if native.available():
        f = tvm_ffi.get_global_func(native.CONV2D)
        x_nhwc = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
        w_hwio = np.ascontiguousarray(wt.transpose(2, 3, 1, 0))
        out_nchw = np.empty((n, o, oh, ow), "float32")
        out_nhwc = np.empty((n, oh, ow, o), "float32")
        t = {name: tvm_ffi.from_dlpack(v) for name, v in
             dict(x=x, w=wt, xh=x_nhwc, wh=w_hwio, on=out_nchw, oh=out_nhwc).items()}
        pack = tvm_ffi.get_global_func(native.CONV2D_PACK_WEIGHT)
        for lay, kl, xk, wk, ok in (("NCHW", "OIHW", "x", "w", "on"),
                                    ("NHWC", "HWIO", "xh", "wh", "oh")):
            attrs = f"layout={lay};klayout={kl};{common}"
            for fmt in ("plain", "blocked"):
                runs[f"ollie-{lay}-{fmt}"] = (lambda a=f"{attrs};fmt={fmt}", xk=xk, wk=wk, ok=ok:
                                              f(a, t[xk], t[wk], t[ok]))
            size = native.conv2d_packed_size(attrs, t[xk].shape, t[wk].shape)
            t[f"p{lay}"] = tvm_ffi.from_dlpack(np.empty(size, "float32"))
            pack(attrs, t[xk], t[wk], t[f"p{lay}"])
            runs[f"ollie-{lay}-packed"] = (
                lambda a=f"{attrs};wpacked=1;kernel={k},{k}", xk=xk, pk=f"p{lay}", ok=ok:
                f(a, t[xk], t[pk], t[ok]))
    try:
        # lazy: torch is a heavy, optional dependency
        import torch

        torch.set_num_threads(threads)
        tx, tw = torch.from_numpy(x), torch.from_numpy(wt)
        runs["torch"] = lambda: torch.nn.functional.conv2d(tx, tw, padding=pad, groups=groups)
    except ImportError:
        skip.append("torch (not installed)")
    ort = _ort_session("Conv", [("X", x.shape), ("W", wt.shape)], (n, o, oh, ow),
                       {"pads": [pad] * 4, "group": groups, "kernel_shape": [k, k]}, threads,
                       skip, initializer=("W", wt))
    if ort is not None:
        runs["onnxruntime"] = lambda: ort.run(None, {"X": x})

    def tvm_build():
        bb = relax.BlockBuilder()
        vx = relax.Var("x", relax.TensorType((n, c, h, w), "float32"))
        vw = relax.Var("w", relax.TensorType((o, c // groups, k, k), "float32"))
        with bb.function("main", [vx, vw]):
            with bb.dataflow():
                y = bb.emit_output(relax.op.nn.conv2d(vx, vw, padding=pad, groups=groups))
            bb.emit_func_output(y)
        return bb.get(), [x, wt]

    _add_tvm(runs, tvm_build, threads, skip, f"conv {c}x{h}x{w}->{o}")
    return runs


def _ort_session(op, inputs, out_shape, attrs, threads, skip, initializer=None):
    try:
        # lazy: onnx is an optional dependency; onnxruntime is an optional dependency
        import onnx
        import onnxruntime as ort
        from onnx import TensorProto, helper, numpy_helper
    except ImportError:
        skip.append("onnxruntime (not installed)")
        return None
    graph_inputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape))
                    for name, shape in inputs if initializer is None or name != initializer[0]]
    inits = [numpy_helper.from_array(initializer[1], initializer[0])] if initializer else []
    node = helper.make_node(op, [name for name, _ in inputs], ["Y"], **attrs)
    graph = helper.make_graph([node], "g", graph_inputs,
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT,
                                                             list(out_shape))], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(model.SerializeToString(), opts,
                                providers=["CPUExecutionProvider"])


def _add_tvm(runs, build, threads, skip, label):
    mod, arrays = build()
    ex = tvm.compile(mod, target=tvm.target.Target({"kind": "llvm", "num-cores": threads}))
    vm = relax.VirtualMachine(ex, tvm.cpu())
    args = [tvm.runtime.tensor(a) for a in arrays]
    start = time.perf_counter()
    vm["main"](*args)
    once = time.perf_counter() - start
    if once > TVM_MAX_RUN_S:
        skip.append(f"tvm-untuned on {label} ({once:.1f} s per run)")
        return
    runs["tvm-untuned"] = lambda: vm["main"](*args)


def main(argv: Optional[List[str]] = None) -> int:
    """Run the benchmark and print Markdown tables."""
    parser = argparse.ArgumentParser(description="tvm-ollie native kernel benchmark")
    parser.add_argument("--threads", type=int,
                        default=int(os.environ.get("TVM_NUM_THREADS", "2")))
    parser.add_argument("--budget-s", type=float, default=2.0,
                        help="timing budget per shape (interleaved rounds)")
    parser.add_argument("--only", choices=["gemm", "conv"], default=None)
    opts = parser.parse_args(argv)

    # TVM_NUM_THREADS, no spinning in TVM's pool (its workers would steal the cores from the
    # next system in the interleaved rounds); OMP_WAIT_POLICY=PASSIVE is set by native.load().
    configure_threads(opts.threads)

    if native.available():
        native.set_num_threads(opts.threads)
    else:
        print(f"native library unavailable: {native.unavailable_reason()}", file=sys.stderr)
    skip: List[str] = []
    print(f"threads={opts.threads}, OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')}, "
          f"TVM_THREAD_POOL_SPIN_COUNT={os.environ.get('TVM_THREAD_POOL_SPIN_COUNT', 'unset')}"
          f", medians of interleaved runs (budget {opts.budget_s} s per shape)\n")
    if opts.only in (None, "gemm"):
        table = []
        for m, k, n, label in GEMM_SHAPES:
            runs = _gemm_runs(m, k, n, opts.threads, skip)
            res = measure_interleaved(runs, budget_s=opts.budget_s)
            flops = 2.0 * m * n * k
            table.append((f"{label} (M,K,N={m},{k},{n})",
                          {name: flops / s.median / 1e9 for name, s in res.items()}))
        _print_table("GEMM, GFLOP/s (higher is better)", table, "{:.1f}")
    if opts.only in (None, "conv"):
        table = []
        for n, c, h, w, o, k, pad, groups, label in CONV_SHAPES:
            runs = _conv_runs(n, c, h, w, o, k, pad, groups, opts.threads, skip)
            res = measure_interleaved(runs, budget_s=opts.budget_s)
            table.append((label, {name: s.median * 1e3 for name, s in res.items()}))
        _print_table("conv2d, ms (lower is better)", table, "{:.3f}")
    if skip:
        print("skipped: " + "; ".join(sorted(set(skip))))
    if native.available():
        print("\n" + native.info())
    return 0


def _print_table(title, table, fmt):
    print(f"### {title}\n")
    print(pivot_table("shape", table, fmt))
    print()


if __name__ == "__main__":
    sys.exit(main())
