"""End-to-end GPU check of the OllieOptimize pass (build anywhere, run on a CUDA GPU).

1. Builds a small conv / conv-transpose model for CUDA twice: TVM's default pipeline (dlight)
   and ``tvm_ollie.pipeline.build`` (the rewrite, then the same pipeline); both executables
   are exported with ``export_library`` (CUDA source is JIT-compiled when loaded on the GPU).
2. Unless ``--no-run``: loads both on ``cuda:0``, runs them with the Relax VM on the same
   random inputs, compares them with each other and with an llvm build on the CPU (relative
   error of the largest magnitude <= 1e-4 in float32), and times both (median of VM
   ``time_evaluator``).

Exit status 0 when everything built (and, when run, matched); 1 otherwise.

    python scripts/gpu_check.py --no-run        # dry run: build + export, no device needed
    python scripts/gpu_check.py                 # on the GPU machine
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time

import numpy as np


def model():
    """conv3x3 -> relu -> conv2d_transpose (stride 2) -> relu -> conv3x3 -> conv1x1."""
    from tvm import relax

    def var(name, shape):
        return relax.Var(name, relax.TensorType(shape, "float32"))

    params = [var("x", (1, 32, 16, 16)), var("w1", (64, 32, 3, 3)), var("k", (64, 32, 4, 4)),
              var("w2", (32, 32, 3, 3)), var("w3", (16, 32, 1, 1))]
    bb = relax.BlockBuilder()
    with bb.function("main", params):
        x, w1, k, w2, w3 = params
        with bb.dataflow():
            y = bb.emit(relax.op.nn.relu(relax.op.nn.conv2d(x, w1, padding=1)))
            y = bb.emit(relax.op.nn.relu(relax.op.nn.conv2d_transpose(y, k, strides=2,
                                                                        padding=1)))
            y = bb.emit(relax.op.nn.conv2d(y, w2, padding=1))
            out = bb.emit_output(relax.op.nn.conv2d(y, w3))
        bb.emit_func_output(out)
    return bb.get()


def rel_err(got: np.ndarray, ref: np.ndarray) -> float:
    """Largest absolute difference relative to the largest magnitude of ``ref``."""
    return float(np.max(np.abs(got.astype(np.float64) - ref))) / max(
        float(np.max(np.abs(ref))), 1e-6)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-run", action="store_true", help="build and export only")
    parser.add_argument("--out", default=None, help="directory for the exported libraries")
    parser.add_argument("--time-budget", type=float, default=10.0)
    parser.add_argument("--repeat", type=int, default=10)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("tvm_ollie.derive").setLevel(logging.CRITICAL)

    import tvm
    from tvm import relax

    from tvm_ollie.pipeline import build, cuda_source
    from tvm_ollie.target import normalize_target

    target = normalize_target("cuda")
    mod = model()
    out_dir = args.out or tempfile.mkdtemp(prefix="ollie_gpu_check_")
    os.makedirs(out_dir, exist_ok=True)

    t0 = time.perf_counter()
    ex_base = tvm.compile(mod, target=target, relax_pipeline=relax.get_default_pipeline(target))
    t_base = time.perf_counter() - t0
    t0 = time.perf_counter()
    ex_ollie, report = build(mod, target=target, time_budget_s=args.time_budget)
    t_ollie = time.perf_counter() - t0
    print(report.to_text())
    ok = True
    for name, ex, secs in (("baseline", ex_base, t_base), ("ollie", ex_ollie, t_ollie)):
        src = cuda_source(ex)
        kernels = src.count("__global__")
        path = os.path.join(out_dir, f"{name}.so")
        ex.export_library(path)
        print(f"[build] {name}: {secs:.1f}s, {kernels} CUDA kernels, {path} "
              f"({os.path.getsize(path)} bytes)")
        ok &= kernels > 0
    if args.no_run:
        print("[run] skipped (--no-run)")
        return 0 if ok else 1

    dev = tvm.cuda(0)
    if not dev.exist:
        print("[run] no CUDA device found; rerun on a GPU machine or pass --no-run")
        return 1
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal([int(s) for s in p.ty.shape]).astype("float32")
              for p in mod["main"].params]
    cpu_ref = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())["main"](
        *[tvm.runtime.tensor(a) for a in inputs]).numpy()
    outs, times = {}, {}
    for name in ("baseline", "ollie"):
        lib = tvm.runtime.load_module(os.path.join(out_dir, f"{name}.so"))
        vm = relax.VirtualMachine(lib, dev)
        targs = [tvm.runtime.tensor(a, dev) for a in inputs]
        outs[name] = vm["main"](*targs).numpy()
        res = vm.time_evaluator("main", dev, number=10, repeat=args.repeat)(*targs)
        times[name] = res.median
    for name in ("baseline", "ollie"):
        err = rel_err(outs[name], cpu_ref)
        good = err <= 1e-4
        ok &= good
        print(f"[run] {name}: median {times[name] * 1e6:.1f} us, rel. error vs CPU {err:.1e} "
              f"{'OK' if good else 'MISMATCH'}")
    err = rel_err(outs["ollie"], outs["baseline"])
    ok &= err <= 1e-4
    print(f"[run] ollie vs baseline: rel. error {err:.1e}, speedup "
          f"{times['baseline'] / times['ollie']:.2f}x")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
