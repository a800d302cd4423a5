"""The measurements behind the native library's default choices (docs/native-library.md).

    TVM_NUM_THREADS=2 python -m tvm_ollie.bench.native_choice \
        [gemm|conv|deconv|deconv-epilogue|both] [--threads N] [--budget-s S] [--quick]

* ``gemm``: oneDNN vs OpenBLAS (``lib=``) on :data:`~.kernel_bench.GEMM_SHAPES`, GFLOP/s;
* ``conv``: the default, plain, blocked and prepacked-weight conv2d on
  :data:`~.kernel_bench.CONV_SHAPES` in NCHW and NHWC, ms;
* ``deconv``: conv2d_transpose by implementation (the default; oneDNN on the plain and on the
  blocked formats; the GEMM + scatter of ``fmt=gemm``) on transposed convolutions of the zoo's
  kinds (GCN, DCGAN, FSRCNN, a grouped one), ms;
* ``deconv-epilogue``: what a relu or a residual adds to conv2d_transpose on DCGAN's quick
  layers, us;
* ``both`` (the default): ``gemm`` then ``conv``.

Each implementation is timed alone, back to back (no other system in between: these are the
library's own alternatives, and the question is which is faster when it runs), one call per
sample, for ``--budget-s`` seconds and at least five calls; cells are ``best (median)``.
The thread count is the library's (``TVM_NUM_THREADS`` at load), or ``--threads``.
"""

from __future__ import annotations

import argparse
import sys
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import tvm_ffi

from .. import native
from .kernel_bench import CONV_SHAPES, GEMM_SHAPES
from .table import pivot_table
from .timing import measure_interleaved

#: (label, data NCHW, out channels, kernel, stride, pad, output padding, groups)
DECONV_SHAPES = [
    ("GCN 1x21x32x32 -> 21 k4 s2 p1", (1, 21, 32, 32), 21, 4, 2, 1, 0, 1),
    ("1x64x16x16 -> 32 k4 s2 p1", (1, 64, 16, 16), 32, 4, 2, 1, 0, 1),
    ("DCGAN 1x512x4x4 -> 256 k4 s2 p1", (1, 512, 4, 4), 256, 4, 2, 1, 0, 1),
    ("DCGAN 1x128x16x16 -> 3 k4 s2 p1", (1, 128, 16, 16), 3, 4, 2, 1, 0, 1),
    ("FSRCNN 1x56x32x32 -> 1 k9 s3 p4 op2", (1, 56, 32, 32), 1, 9, 3, 4, 2, 1),
    ("grouped 1x64x28x28 -> 64 k4 s2 p1 g=64", (1, 64, 28, 28), 64, 4, 2, 1, 0, 64),
]

#: DCGAN's quick layers (widths / 8): (label, data shape, output channels), k4 s2 p1.
EPILOGUE_SHAPES = [("DCGAN quick 1x64x4x4 -> 32", (1, 64, 4, 4), 32),
                   ("DCGAN quick 1x16x16x16 -> 8", (1, 16, 16, 16), 8),
                   ("DCGAN quick 1x8x32x32 -> 3", (1, 8, 32, 32), 3)]

Row = Tuple[str, Dict[str, str]]

#: Upper bound on the timed calls of one implementation (the budget ends the timing first).
MAX_CALLS = 1_000_000


def best_and_median(fn: Callable[[], object], budget_s: float) -> Tuple[float, float]:
    """Seconds per call of ``fn`` run alone: the best and the median sample."""
    samples = measure_interleaved({"fn": fn}, budget_s=budget_s, max_rounds=MAX_CALLS,
                                  min_sample_s=0.0)["fn"]
    return min(samples.seconds), samples.median


def _cell(fn: Callable[[], object], budget_s: float, scale: float, digits: int = 3) -> str:
    best, median = best_and_median(fn, budget_s)
    return f"{best * scale:.{digits}f} ({median * scale:.{digits}f})"


def gemm(budget_s: float, quick: bool) -> List[Row]:
    """GFLOP/s of each GEMM backend, ``best (median)``."""
    f = tvm_ffi.get_global_func(native.MATMUL)
    rng = np.random.default_rng(0)
    rows = []
    for m, k, n, label in GEMM_SHAPES[:1] if quick else GEMM_SHAPES:
        a = rng.random((m, k), dtype=np.float32)
        b = rng.random((k, n), dtype=np.float32)
        ta, tb, to = map(tvm_ffi.from_dlpack, (a, b, np.empty((m, n), "float32")))
        cells = {}
        for lib in ("onednn", "openblas"):
            best, median = best_and_median(lambda lib=lib: f(f"lib={lib}", ta, tb, to), budget_s)
            flop = 2.0 * m * n * k
            cells[lib] = f"{flop / best / 1e9:.1f} ({flop / median / 1e9:.1f})"
        rows.append((label, cells))
    return rows


def conv(budget_s: float, quick: bool) -> List[Row]:
    """Milliseconds of each conv2d implementation and layout, ``best (median)``."""
    f = tvm_ffi.get_global_func(native.CONV2D)
    pack = tvm_ffi.get_global_func(native.CONV2D_PACK_WEIGHT)
    rng = np.random.default_rng(0)
    rows = []
    for n, c, h, w, o, k, pad, g, label in CONV_SHAPES[:1] if quick else CONV_SHAPES:
        for layout in ("NCHW", "NHWC"):
            x = rng.random((n, c, h, w), dtype=np.float32)
            wt = rng.random((o, c // g, k, k), dtype=np.float32)
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
                "default": lambda a=attrs: f(a, tx, tw, to),
                "plain": lambda a=attrs: f(a + ";fmt=plain", tx, tw, to),
                "blocked": lambda a=attrs: f(a + ";fmt=blocked", tx, tw, to),
                "packed": lambda a=attrs: f(a + f";wpacked=1;kernel={k},{k}", tx, tp, to),
            }
            rows.append((f"{label} {layout}",
                         {name: _cell(fn, budget_s, 1e3) for name, fn in runs.items()}))
    return rows


def deconv(budget_s: float, quick: bool) -> List[Row]:
    """Milliseconds of conv2d_transpose per format, ``best (median)``."""
    f = tvm_ffi.get_global_func(native.CONV2D_TRANSPOSE)
    rng = np.random.default_rng(0)
    rows = []
    for label, (n, c, h, w), o, k, s, p, op, g in DECONV_SHAPES[:1] if quick else DECONV_SHAPES:
        x = rng.random((n, c, h, w), dtype=np.float32)
        wt = rng.random((c, o // g, k, k), dtype=np.float32)
        oh, ow = ((d - 1) * s - 2 * p + k + op for d in (h, w))
        tx, tw, to = map(tvm_ffi.from_dlpack, (x, wt, np.empty((n, o, oh, ow), "float32")))
        attrs = f"stride={s},{s};pad={p},{p},{p},{p};opad={op},{op};groups={g}"
        cells = {}
        for fmt in ("default", "plain", "blocked", "gemm"):
            text = attrs if fmt == "default" else attrs + f";fmt={fmt}"
            cells[fmt] = _cell(lambda text=text: f(text, tx, tw, to), budget_s, 1e3)
        rows.append((label, cells))
    return rows


def deconv_epilogue(budget_s: float, quick: bool) -> List[Row]:
    """Microseconds of conv2d_transpose (default format) with bias, + relu, + residual."""
    f = tvm_ffi.get_global_func(native.CONV2D_TRANSPOSE)
    rng = np.random.default_rng(0)
    rows = []
    for label, (n, c, h, w), o in EPILOGUE_SHAPES[:1] if quick else EPILOGUE_SHAPES:
        x = rng.random((n, c, h, w), dtype=np.float32)
        wt = rng.random((c, o, 4, 4), dtype=np.float32)
        bias = rng.random(o, dtype=np.float32)
        res = rng.random((n, o, 2 * h, 2 * w), dtype=np.float32)
        tx, tw, tb, tr, to = map(tvm_ffi.from_dlpack, (x, wt, bias, res, np.empty_like(res)))
        attrs = "stride=2,2;pad=1,1,1,1;bias=1"
        cells = {}
        for what, extra, args in (("bias", "", (tx, tw, tb, to)),
                                  ("bias+relu", ";act=relu", (tx, tw, tb, to)),
                                  ("bias+residual", ";res=1", (tx, tw, tb, tr, to))):
            cells[what] = _cell(lambda text=attrs + extra, args=args: f(text, *args),
                                budget_s, 1e6, 1)
        rows.append((label, cells))
    return rows


#: choice -> [(title, needed global, benchmark)]
BENCHMARKS = {
    "gemm": [("GEMM, GFLOP/s (higher is better)", native.MATMUL, gemm)],
    "conv": [("conv2d, ms (lower is better)", native.CONV2D, conv)],
    "deconv": [("conv2d_transpose, ms (lower is better)", native.CONV2D_TRANSPOSE, deconv)],
    "deconv-epilogue": [("conv2d_transpose epilogues, us (lower is better)",
                         native.CONV2D_TRANSPOSE, deconv_epilogue)],
}
BENCHMARKS["both"] = BENCHMARKS["gemm"] + BENCHMARKS["conv"]


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Print one Markdown table per benchmark; 2 when the library lacks its kernel."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", nargs="?", choices=sorted(BENCHMARKS), default="both")
    parser.add_argument("--threads", type=int, default=None,
                        help="the library's thread count (default: TVM_NUM_THREADS at load)")
    parser.add_argument("--budget-s", type=float, default=0.4,
                        help="timing seconds per implementation and shape")
    parser.add_argument("--quick", action="store_true", help="the first shape of each table")
    opts = parser.parse_args(argv)
    if opts.threads is not None and native.available():
        native.set_num_threads(opts.threads)
    for title, needed, bench in BENCHMARKS[opts.what]:
        if not native.provides(needed):
            print(f"native library lacks {needed}: "
                  f"{native.unavailable_reason() or native.library_path()}", file=sys.stderr)
            return 2
        print(f"### {title}, best (median), {native.get_num_threads()} threads\n")
        print(pivot_table("shape", bench(opts.budget_s, opts.quick)))
        print(flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
