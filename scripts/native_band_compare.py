"""Banded matmuls (G2BMM/GBMM): the native kernels vs the other implementations the pass has.

For each workload the band expression is derived (:func:`tvm_ollie.derive.derive`) and these
implementations are built as Relax modules with the pass's default llvm pipeline and timed in
interleaved rounds (one call of each per round, after warm-up, a 5 ms pause before each call;
medians and minima, ms):

* ``expr (TE)``: the band expression as one TE kernel (what the region is without derivation);
* ``<band op> (TE)``: the derived band program, its band stage as the TE kernel (``impl="tvm"``);
* ``<band op> [native]``: the same program, its band stage on ``tvm_ollie.cpu.g2bmm/gbmm``;
* ``gather+batch_matmul [native]``: the fastest (here) of the derived programs without a band
  stage (gathers + ``batch_matmul`` on the library's matmul).

Run with one thread::

    TVM_NUM_THREADS=1 python scripts/native_band_compare.py [--rounds 30] [--quick]
"""

import argparse
import time

import numpy as np

from tvm_ollie import native
from tvm_ollie.compat import relax, tvm
from tvm_ollie.derive.search import derive
from tvm_ollie.ir.parser import parse
from tvm_ollie.transform.emit import emit_program
from tvm_ollie.tune.metaschedule import default_pipeline

#: (label, band kind, batch, length, inner extent (K or N), width, dilation)
WORKLOADS = [
    ("g2bmm[4x256x32, w=16, d=4]", "g2bmm", 4, 256, 32, 16, 4),
    ("gbmm[4x256x33 @ 4x256x32, d=4]", "gbmm", 4, 256, 32, 16, 4),
    ("g2bmm[12x1024x64, w=64, d=1]", "g2bmm", 12, 1024, 64, 64, 1),
    ("gbmm[12x1024x129 @ 12x1024x64, d=1]", "gbmm", 12, 1024, 64, 64, 1),
]


def band_expr(kind, batch, length, inner, width, dil):
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


def _build(expr, program, impl):
    """A VM function ``main(A, B)`` computing ``program`` (None: ``expr`` as one TE kernel)."""
    from tvm_ollie.codegen.lower import to_te  # pylint: disable=import-outside-toplevel

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


def _systems(kind, batch, length, inner, width, dil, budget_s):
    expr = band_expr(kind, batch, length, inner, width, dil)
    res = derive(expr, time_budget_s=budget_s, verify=False, max_candidates=64,
                 cost_target="llvm")
    unique = list({repr(p): p for p in res.candidates}.values())
    band = [p for p in unique if kind in p.kinds]
    gemm = [p for p in unique if "batch_matmul" in p.kinds and kind not in p.kinds]
    builds = {"expr (TE)": _build(expr, None, "tvm")}
    if band:
        builds[f"{kind} (TE)"] = _build(expr, band[0], "tvm")
        builds[f"{kind} [native]"] = _build(expr, band[0], "native")
    for k, prog in enumerate(gemm[:4]):
        builds[f"gather+batch_matmul#{k} [native]"] = _build(expr, prog, "native")
    rng = np.random.default_rng(0)
    args = [tvm.runtime.tensor(rng.standard_normal(t.shape, dtype=np.float32))
            for t in expr.inputs]
    ref = builds["expr (TE)"](*args).numpy()
    for name, fn in builds.items():
        np.testing.assert_allclose(fn(*args).numpy(), ref, rtol=1e-4, atol=1e-4, err_msg=name)
    programs = {f"{kind} (TE)": band[:1], "gather+batch_matmul": gemm[:4]}
    return {name: (lambda f=fn: f(*args)) for name, fn in builds.items()}, programs


def _time(systems, rounds):
    for fn in systems.values():
        for _ in range(3):
            fn()
    times = {name: [] for name in systems}
    for _ in range(rounds):
        for name, fn in systems.items():
            time.sleep(0.005)
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {name: (1e3 * float(np.median(ts)), 1e3 * float(np.min(ts)))
            for name, ts in times.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--quick", action="store_true", help="the first two workloads only")
    parser.add_argument("--budget", type=float, default=10.0, help="derivation seconds")
    args = parser.parse_args()
    if not native.provides(native.G2BMM):
        raise SystemExit(f"the native library lacks the band kernels ({native.library_path()})")
    print(f"native library: {native.library_path()}, threads {native.get_num_threads()}")
    for label, *workload in WORKLOADS[:2] if args.quick else WORKLOADS:
        systems, programs = _systems(*workload, args.budget)
        for name, progs in programs.items():
            for prog in progs:
                print(f"  {name}: {prog}")
        ms = _time(systems, args.rounds)
        gemm = min((v for k, v in ms.items() if k.startswith("gather")), default=None)
        cells = ", ".join(f"{k} {med:.3f} ({low:.3f})" for k, (med, low) in ms.items())
        best = f"; best gather+batch_matmul {gemm[0]:.3f} ({gemm[1]:.3f})" if gemm else ""
        print(f"{label}: {cells}{best} (ms, median (min) of {args.rounds})", flush=True)


if __name__ == "__main__":
    main()
