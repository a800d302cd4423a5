"""Transposed convolutions: the native kernel vs untuned TVM vs eager PyTorch, medians in ms.

Each system is timed in interleaved rounds (one call of each per round, after warm-up), so
that a load change on the shared machine hits every system alike. Run with one thread:

    TVM_NUM_THREADS=1 python scripts/native_deconv_compare.py [--rounds 15]
"""

import argparse
import os
import time

import numpy as np
import tvm_ffi

from tvm_ollie import native
from tvm_ollie.codegen import library as lib
from tvm_ollie.compat import relax, tvm
from tvm_ollie.codegen.builder import single_function_module, tensor_var
from tvm_ollie.tune.metaschedule import default_pipeline

#: (label, data NCHW, out channels, kernel, stride, padding)
WORKLOADS = [
    ("1x21x32x32 -> 21 k4 s2 p1 (GCN)", (1, 21, 32, 32), 21, 4, 2, 1),
    ("1x64x16x16 -> 32 k4 s2 p1", (1, 64, 16, 16), 32, 4, 2, 1),
]


def _systems(shape, o, k, s, p):
    """``{name: zero-argument callable}`` for one workload (all on the same random data)."""
    import torch  # after tvm_ollie: OMP_WAIT_POLICY is set before libgomp starts

    torch.set_num_threads(int(os.environ.get("TVM_NUM_THREADS", "1")))
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape, dtype=np.float32)
    w = rng.standard_normal((shape[1], o, k, k), dtype=np.float32)
    mod = single_function_module([tensor_var("x", x.shape), tensor_var("w", w.shape)],
                                 lambda bb, xv, wv: relax.op.nn.conv2d_transpose(
                                     xv, wv, strides=s, padding=p))
    ex = tvm.compile(mod, target="llvm", relax_pipeline=default_pipeline("llvm"))
    vm = relax.VirtualMachine(ex, tvm.cpu())
    tx, tw = tvm.runtime.tensor(x), tvm.runtime.tensor(w)
    ref = vm["main"](tx, tw).numpy()
    out = np.empty(ref.shape, np.float32)
    kernel = tvm_ffi.get_global_func(native.CONV2D_TRANSPOSE)
    attrs = lib.conv2d_transpose_call((s, s), (p,) * 4, (0, 0), (1, 1), 1).text()
    fx, fw, fo = map(tvm_ffi.from_dlpack, (x, w, out))
    kernel(attrs, fx, fw, fo)
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-3)
    xt, wt = torch.from_numpy(x), torch.from_numpy(w)
    with torch.no_grad():
        got = torch.nn.functional.conv_transpose2d(xt, wt, stride=s, padding=p).numpy()
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-3)

    def run_torch():
        with torch.no_grad():
            torch.nn.functional.conv_transpose2d(xt, wt, stride=s, padding=p)

    return {"ollie-native": lambda: kernel(attrs, fx, fw, fo),
            "tvm-untuned": lambda: vm["main"](tx, tw), "torch": run_torch}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    assert native.provides(native.CONV2D_TRANSPOSE), native.unavailable_reason() or "old library"
    for label, shape, o, k, s, p in WORKLOADS:
        systems = _systems(shape, o, k, s, p)
        times = {name: [] for name in systems}
        for fn in systems.values():
            fn()
        for _ in range(args.rounds):
            for name, fn in systems.items():
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
        cells = [f"{name} {np.median(t) * 1e3:.3f}" for name, t in times.items()]
        print(f"{label}: " + ", ".join(cells) + f" (ms, median of {args.rounds})", flush=True)


if __name__ == "__main__":
    main()
