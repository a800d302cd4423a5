"""Banded matmuls (G2BMM/GBMM): the native kernels vs the other implementations the pass has.

    TVM_NUM_THREADS=1 python -m tvm_ollie.bench.native_band [--rounds 30] [--quick] [--budget S]

For each workload the band expression is derived (:func:`tvm_ollie.derive.search.derive`) and
these implementations are built as Relax modules with the pass's default llvm pipeline, checked
against the first, and timed in interleaved rounds (:func:`~.timing.measure_interleaved`: one
call of each per round, a 5 ms pause before each call, which makes every call cache-cold;
median (min), ms):

* ``expr (TE)``: the band expression as one TE kernel (what the region is without derivation);
* ``band op (TE)``: the derived band program, its band stage as the TE kernel (``impl="tvm"``);
* ``band op [native]``: the same program, its band stage on ``tvm_ollie.cpu.g2bmm/gbmm``;
* ``best gather+batch_matmul [native]``: the fastest of up to four derived programs without a
  band stage (gathers + ``batch_matmul`` on the library's matmul).

The programs are printed before the table.
"""

from __future__ import annotations

import argparse
import math
import sys
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .. import native
from ..codegen.lower import to_te
from ..compat import relax, tvm
from ..derive.search import derive
from ..ir.parser import parse
from ..transform.emit import emit_program
from ..tune.metaschedule import default_pipeline
from .table import pivot_table
from .timing import measure_interleaved

#: (label, band kind, batch, length, inner extent (K or N), width, dilation)
WORKLOADS = [
    ("g2bmm[4x256x32, w=16, d=4]", "g2bmm", 4, 256, 32, 16, 4),
    ("gbmm[4x256x33 @ 4x256x32, d=4]", "gbmm", 4, 256, 32, 16, 4),
    ("g2bmm[12x1024x64, w=64, d=1]", "g2bmm", 12, 1024, 64, 64, 1),
    ("gbmm[12x1024x129 @ 12x1024x64, d=1]", "gbmm", 12, 1024, 64, 64, 1),
]

#: Pause before each call (see the module docstring).
GAP_S = 0.005


def band_expr(kind: str, batch: int, length: int, inner: int, width: int, dil: int):
    """The operator's own expression (``B`` zero-padded by ``D*W`` rows on each side)."""
    window = 2 * width + 1
    pad = f"<pad=[0, {dil * width}, 0]>"
    band = f"m + {dil} * w - {dil * width}"
    if kind == "g2bmm":
        return parse(f"L<b:0:{batch}, m:0:{length}, w:0:{window}> Σ<k:0:{inner}> "
                     f"{{ A[b, m, k] * B{pad}[b, {band}, k] }} "
                     f"where A: float32[{batch}, {length}, {inner}]; "
                     f"B: float32[{batch}, {length}, {inner}]")
    return parse(f"L<b:0:{batch}, m:0:{length}, n:0:{inner}> Σ<w:0:{window}> "
                 f"{{ A[b, m, w] * B{pad}[b, {band}, n] }} "
                 f"where A: float32[{batch}, {length}, {window}]; "
                 f"B: float32[{batch}, {length}, {inner}]")


def _build(expr, program, impl: str):
    """A VM function ``main(A, B)`` computing ``program`` (None: ``expr`` as one TE kernel)."""

    a_t, b_t = expr.inputs
    out_shape = tuple(iv.extent for iv in expr.loops)
    bb = relax.BlockBuilder()
    params = [relax.Var(t.name, relax.TensorType(t.shape, "float32")) for t in (a_t, b_t)]
    with bb.function("main", params):
        with bb.dataflow():
            if program is None:
                def compute(a, b):
                    return to_te(expr, placeholders={a_t.name: a, b_t.name: b}, name="band")[1]
                out = bb.emit(bb.call_te(compute, *params, primfunc_name_hint="band"))
            else:
                out = bb.emit(emit_program(bb, program, dict(zip((a_t.name, b_t.name), params)),
                                           out_shape, impl=impl))
            gv = bb.emit_output(out)
        bb.emit_func_output(gv)
    ex = tvm.compile(bb.get(), target="llvm", relax_pipeline=default_pipeline("llvm"))
    return relax.VirtualMachine(ex, tvm.cpu())["main"]


def systems(kind: str, batch: int, length: int, inner: int, width: int, dil: int,
            budget_s: float) -> Tuple[Dict[str, Callable[[], object]], Dict[str, list]]:
    """``({name: zero-argument call}, {kind of program: [derived programs]})``, all checked."""
    expr = band_expr(kind, batch, length, inner, width, dil)
    res = derive(expr, search_time_s=budget_s, verify=False, max_candidates=64,
                 cost_target="llvm")
    unique = list({repr(p): p for p in res.candidates}.values())
    band = [p for p in unique if kind in p.kinds]
    gemm = [p for p in unique if "batch_matmul" in p.kinds and kind not in p.kinds]
    builds = {"expr (TE)": _build(expr, None, "tvm")}
    if band:
        builds["band op (TE)"] = _build(expr, band[0], "tvm")
        builds["band op [native]"] = _build(expr, band[0], "native")
    for k, prog in enumerate(gemm[:4]):
        builds[f"gather+batch_matmul#{k} [native]"] = _build(expr, prog, "native")
    rng = np.random.default_rng(0)
    args = [tvm.runtime.tensor(rng.standard_normal(t.shape, dtype=np.float32))
            for t in expr.inputs]
    ref = builds["expr (TE)"](*args).numpy()
    for name, fn in builds.items():
        np.testing.assert_allclose(fn(*args).numpy(), ref, rtol=1e-4, atol=1e-4, err_msg=name)
    programs = {"band op": band[:1], "gather+batch_matmul": gemm[:4]}
    return {name: (lambda f=fn: f(*args)) for name, fn in builds.items()}, programs


def time_rounds(runs: Dict[str, Callable[[], object]],
                rounds: int) -> Dict[str, Tuple[float, float]]:
    """``{name: (median ms, min ms)}`` over ``rounds`` interleaved rounds of single calls."""
    samples = measure_interleaved(runs, budget_s=math.inf, min_rounds=rounds, max_rounds=rounds,
                                  min_sample_s=0.0, gap_s=GAP_S)
    return {name: (1e3 * s.median, 1e3 * min(s.seconds)) for name, s in samples.items()}


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Print the derived programs and one Markdown table; 2 without the band kernels."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30, help="interleaved rounds")
    parser.add_argument("--quick", action="store_true", help="the first two workloads only")
    parser.add_argument("--budget", type=float, default=10.0, help="derivation seconds")
    opts = parser.parse_args(argv)
    if not native.provides(native.G2BMM):
        print(f"the native library lacks the band kernels: "
              f"{native.unavailable_reason() or native.library_path()}", file=sys.stderr)
        return 2
    print(f"native library: {native.library_path()}, threads {native.get_num_threads()}")
    rows: List[Tuple[str, Dict[str, str]]] = []
    for label, *workload in WORKLOADS[:2] if opts.quick else WORKLOADS:
        runs, programs = systems(*workload, opts.budget)
        for name, progs in programs.items():
            for prog in progs:
                print(f"  {label} {name}: {prog}")
        ms = time_rounds(runs, opts.rounds)
        gemm = min((v for k, v in ms.items() if k.startswith("gather")), default=None)
        ms = {k: v for k, v in ms.items() if not k.startswith("gather")}
        if gemm is not None:
            ms["best gather+batch_matmul [native]"] = gemm
        rows.append((label, {k: f"{med:.3f} ({low:.3f})" for k, (med, low) in ms.items()}))
    print(f"\n### banded matmuls, ms, median (min) of {opts.rounds} interleaved rounds\n")
    print(pivot_table("workload", rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
