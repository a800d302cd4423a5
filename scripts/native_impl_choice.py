"""The measurements behind the native library's default choices (NATIVE_NOTES.md).

GEMM: oneDNN vs OpenBLAS (``lib=``) on the benchmark shapes, GFLOP/s, best and median of
repeated back-to-back calls. conv2d: plain / blocked / prepacked weights on the benchmark
workloads in NCHW and NHWC, ms. conv2d_transpose: plain / blocked on transposed convolutions
of the zoo's kinds (GCN, DCGAN, FSRCNN), ms; ``deconv-epilogue``: its cost of a relu or a residual,
us. Set TVM_NUM_THREADS to choose the thread count.

    TVM_NUM_THREADS=2 python scripts/native_impl_choice.py [gemm|conv|deconv|deconv-epilogue]
"""

import sys
import time

import numpy as np
import tvm_ffi

from tvm_ollie import native
from tvm_ollie.bench.kernel_bench import CONV_SHAPES, GEMM_SHAPES


def _times(fn, seconds=0.4, at_least=5):
    fn()
    out = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end or len(out) < at_least:
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    out.sort()
    return out[0], out[len(out) // 2]


def gemm():
    f = tvm_ffi.get_global_func(native.MATMUL)
    for m, k, n, label in GEMM_SHAPES:
        a = np.random.rand(m, k).astype("float32")
        b = np.random.rand(k, n).astype("float32")
        o = np.empty((m, n), "float32")
        ta, tb, to = map(tvm_ffi.from_dlpack, (a, b, o))
        cells = []
        for lib in ("onednn", "openblas"):
            best, med = _times(lambda lib=lib: f(f"lib={lib}", ta, tb, to))
            cells.append(f"{lib} {2 * m * n * k / best / 1e9:.1f} (median "
                         f"{2 * m * n * k / med / 1e9:.1f})")
        print(f"{label}: " + ", ".join(cells), flush=True)


def conv():
    f = tvm_ffi.get_global_func(native.CONV2D)
    pack = tvm_ffi.get_global_func(native.CONV2D_PACK_WEIGHT)
    for n, c, h, w, o, k, pad, g, label in CONV_SHAPES:
        for layout in ("NCHW", "NHWC"):
            x = np.random.rand(n, c, h, w).astype("float32")
            wt = np.random.rand(o, c // g, k, k).astype("float32")
            klayout, out = "OIHW", np.empty((n, o, h, w), "float32")
            if layout == "NHWC":
                x = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
                wt = np.ascontiguousarray(wt.transpose(2, 3, 1, 0))
                klayout, out = "HWIO", np.empty((n, h, w, o), "float32")
            attrs = f"layout={layout};klayout={klayout};pad={pad},{pad},{pad},{pad};groups={g}"
            packed = np.empty(native.conv2d_packed_size(attrs, x.shape, wt.shape), "float32")
            tx, tw, tp, to = map(tvm_ffi.from_dlpack, (x, wt, packed, out))
            pack(attrs, tx, tw, tp)
            runs = {
                "default": lambda: f(attrs, tx, tw, to),
                "plain": lambda: f(attrs + ";fmt=plain", tx, tw, to),
                "blocked": lambda: f(attrs + ";fmt=blocked", tx, tw, to),
                "packed": lambda: f(attrs + f";wpacked=1;kernel={k},{k}", tx, tp, to),
            }
            cells = [f"{name} {_times(fn)[0] * 1e3:.2f}" for name, fn in runs.items()]
            print(f"{label} {layout}: " + ", ".join(cells) + " (ms, best)", flush=True)


#: (label, data NCHW, out channels, kernel, stride, pad, output padding, groups)
DECONV_SHAPES = [
    ("GCN 1x21x32x32 -> 21 k4 s2 p1", (1, 21, 32, 32), 21, 4, 2, 1, 0, 1),
    ("1x64x16x16 -> 32 k4 s2 p1", (1, 64, 16, 16), 32, 4, 2, 1, 0, 1),
    ("DCGAN 1x512x4x4 -> 256 k4 s2 p1", (1, 512, 4, 4), 256, 4, 2, 1, 0, 1),
    ("DCGAN 1x128x16x16 -> 3 k4 s2 p1", (1, 128, 16, 16), 3, 4, 2, 1, 0, 1),
    ("FSRCNN 1x56x32x32 -> 1 k9 s3 p4 op2", (1, 56, 32, 32), 1, 9, 3, 4, 2, 1),
    ("grouped 1x64x28x28 -> 64 k4 s2 p1 g=64", (1, 64, 28, 28), 64, 4, 2, 1, 0, 64),
]


def deconv():
    f = tvm_ffi.get_global_func(native.CONV2D_TRANSPOSE)
    for label, (n, c, h, w), o, k, s, p, op, g in DECONV_SHAPES:
        x = np.random.rand(n, c, h, w).astype("float32")
        wt = np.random.rand(c, o // g, k, k).astype("float32")
        oh, ow = ((d - 1) * s - 2 * p + k + op for d in (h, w))
        out = np.empty((n, o, oh, ow), "float32")
        tx, tw, to = map(tvm_ffi.from_dlpack, (x, wt, out))
        attrs = f"stride={s},{s};pad={p},{p},{p},{p};opad={op},{op};groups={g}"
        cells = []
        for fmt in ("default", "plain", "blocked"):
            text = attrs if fmt == "default" else attrs + f";fmt={fmt}"
            best, med = _times(lambda text=text: f(text, tx, tw, to))
            cells.append(f"{fmt} {best * 1e3:.3f} (median {med * 1e3:.3f})")
        print(f"{label}: " + ", ".join(cells) + " ms", flush=True)


#: DCGAN's quick layers (widths / 8): (label, data shape, output channels), k4 s2 p1.
EPILOGUE_SHAPES = [("DCGAN quick 1x64x4x4 -> 32", (1, 64, 4, 4), 32),
                   ("DCGAN quick 1x16x16x16 -> 8", (1, 16, 16, 16), 8),
                   ("DCGAN quick 1x8x32x32 -> 3", (1, 8, 32, 32), 3)]


def deconv_epilogue():
    """conv2d_transpose (default format) with bias only, bias + relu, bias + residual, us."""
    f = tvm_ffi.get_global_func(native.CONV2D_TRANSPOSE)
    for label, (n, c, h, w), o in EPILOGUE_SHAPES:
        x = np.random.rand(n, c, h, w).astype("float32")
        wt = np.random.rand(c, o, 4, 4).astype("float32")
        bias = np.random.rand(o).astype("float32")
        res = np.random.rand(n, o, 2 * h, 2 * w).astype("float32")
        out = np.empty_like(res)
        tx, tw, tb, tr, to = map(tvm_ffi.from_dlpack, (x, wt, bias, res, out))
        attrs = "stride=2,2;pad=1,1,1,1;bias=1"
        cells = []
        for what, extra, args in (("bias", "", (tx, tw, tb, to)),
                                  ("bias+relu", ";act=relu", (tx, tw, tb, to)),
                                  ("bias+residual", ";res=1", (tx, tw, tb, tr, to))):
            best, med = _times(lambda text=attrs + extra, args=args: f(text, *args))
            cells.append(f"{what} {best * 1e6:.1f} (median {med * 1e6:.1f})")
        print(f"{label}: " + ", ".join(cells) + " us", flush=True)


if __name__ == "__main__":
    assert native.available(), native.unavailable_reason()
    what = sys.argv[1] if len(sys.argv) > 1 else "both"
    if what in ("gemm", "both"):
        gemm()
    if what in ("conv", "both"):
        conv()
    if what == "deconv":
        deconv()
    if what == "deconv-epilogue":
        deconv_epilogue()
