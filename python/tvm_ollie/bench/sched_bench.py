"""TVM's default CPU pipeline against ``cpu_pipeline`` (the same plus default CPU schedules).

Run (short; one process, interleaved rounds, medians)::

    TVM_NUM_THREADS=2 python -m tvm_ollie.bench.sched_bench --models segformer,yolox,bert

Every workload is compiled twice for the same ``llvm`` target (``num-cores`` from
``TVM_NUM_THREADS``): ``tvm`` is ``relax.get_default_pipeline(target)`` (legalize and fuse, no
schedule), ``sched`` is :func:`tvm_ollie.tune.cpu_schedule.cpu_pipeline`. Outputs are compared
before timing. Models are the zoo's ``quick`` sizes; kernels are single operators or eOperator-like
TE functions at the sizes our pass emits.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Callable, Dict, List, Sequence, Tuple

import numpy as np

from ..compat import relax, te, tirx, tvm
from ..models import get_model, to_relax
from ..target import normalize_target
from ..tune.cpu_schedule import cpu_pipeline, default_rules
from .timing import measure_interleaved, paired_ratio

R = relax.op


def _im2col(x):
    """An eOperator-like gather: 3x3 im2col of a padded NCHW tensor, as one TE compute."""
    n, c, h, w = (int(d) for d in x.shape)
    return te.compute(
        (n, c * 9, h * w),
        lambda b, r, p: te.if_then_else(
            te.all(p // w + r % 9 // 3 >= 1, p // w + r % 9 // 3 <= h,
                   p % w + r % 3 >= 1, p % w + r % 3 <= w),
            x[b, r // 9, p // w + r % 9 // 3 - 1, p % w + r % 3 - 1], 0.0),
        name="im2col")


#: name -> (params [(shape, dtype)], body(bb, *vars) -> output expr)
KERNELS: Dict[str, Tuple[List[Tuple[tuple, str]], Callable]] = {
    "add+sigmoid+transpose 64x128x56": (
        [((64, 128, 56), "float32"), ((56,), "float32")],
        lambda bb, x, y: R.permute_dims(R.sigmoid(R.add(x, y)), [0, 2, 1])),
    "im2col gather (eOp) 1x128x56x56 -> 3.6M": (
        [((1, 128, 56, 56), "float32")], lambda bb, x: bb.emit_te(_im2col, x)),
    "softmax 64x56x128": ([((64, 56, 128), "float32")],
                          lambda bb, x: R.nn.softmax(x, axis=-1)),
    "layer_norm 512x768": (
        [((512, 768), "float32"), ((768,), "float32"), ((768,), "float32")],
        lambda bb, x, g, b: R.nn.layer_norm(x, g, b, axes=[-1])),
    "mean axis 1 of 64x56x128": ([((64, 56, 128), "float32")],
                                 lambda bb, x: R.mean(x, axis=[1])),
    "max_pool2d 3x3/2 1x64x112x112": (
        [((1, 64, 112, 112), "float32")],
        lambda bb, x: R.nn.max_pool2d(x, (3, 3), (2, 2), (1, 1))),
    "add 4x4x32 (below threshold)": ([((4, 4, 32), "float32")] * 2,
                                     lambda bb, x, y: R.add(x, y)),
}


def _kernel_module(params, body) -> "tvm.IRModule":
    bb = relax.BlockBuilder()
    xs = [relax.Var(f"x{i}", relax.TensorType(s, d)) for i, (s, d) in enumerate(params)]
    with bb.function("main", xs):
        with bb.dataflow():
            out = bb.emit_output(body(bb, *xs))
        bb.emit_func_output(out)
    return bb.get()


def _model_module(name: str) -> Tuple["tvm.IRModule", List[np.ndarray]]:
    spec = get_model(name, quick=True)
    mod, params = to_relax(spec)
    inputs = [x.detach().numpy() for x in spec.example_inputs]
    return mod, inputs + [p.numpy() for p in params]


def _outputs(out) -> List[np.ndarray]:
    if hasattr(out, "numpy"):
        return [out.numpy()]
    return [o for x in out for o in _outputs(x)]


def bench(name: str, mod: "tvm.IRModule", args: Sequence[np.ndarray], target,
          budget_s: float) -> Dict[str, object]:
    """Compile ``mod`` both ways, check outputs agree, time interleaved; one result row."""
    pipelines = {"tvm": relax.get_default_pipeline(target), "sched": cpu_pipeline(target)}
    dev = tvm.cpu()
    targs = [tvm.runtime.tensor(a) for a in args]
    calls, outs, compile_s = {}, {}, {}
    for key, pipeline in pipelines.items():
        start = time.perf_counter()
        ex = tvm.compile(mod, target=target, relax_pipeline=pipeline)
        compile_s[key] = time.perf_counter() - start
        vm = relax.VirtualMachine(ex, dev)
        outs[key] = _outputs(vm["main"](*targs))
        calls[key] = (lambda vm=vm: vm["main"](*targs))
    err = max((float(np.max(np.abs(a.astype("float64") - b.astype("float64")))) if a.size else 0.0
               for a, b in zip(outs["tvm"], outs["sched"])), default=0.0)
    samples = measure_interleaved(calls, budget_s=budget_s)
    return {"name": name, "tvm_ms": samples["tvm"].median * 1e3,
            "sched_ms": samples["sched"].median * 1e3,
            "speedup": 1.0 / paired_ratio(samples["sched"], samples["tvm"]),
            "max_abs_diff": err, "compile_s": (compile_s["tvm"], compile_s["sched"]),
            "rounds": len(samples["tvm"].seconds)}


def threshold_sweep(target, sizes: Sequence[int], budget_s: float) -> None:
    """Where parallel starts to pay: an fp32 add+sigmoid of n elements, parallel or not.

    Both builds use the same rules (inlined, vectorized); only ``min_parallel_work`` differs
    (0: always parallel; above n: never).
    """

    print("| elements | serial (us) | parallel (us) | parallel speedup |")
    print("|---:|---:|---:|---:|", flush=True)
    for n in sizes:
        params = [((n // 64, 64), "float32")] * 2
        mod = _kernel_module(params, lambda bb, x, y: R.sigmoid(R.add(x, y)))
        rng = np.random.default_rng(0)
        args = [tvm.runtime.tensor(rng.standard_normal(s).astype(d)) for s, d in params]
        calls = {}
        for key, work in (("serial", n + 1), ("parallel", 0)):
            pipeline = cpu_pipeline(target, rules=default_rules(min_parallel_work=work))
            vm = relax.VirtualMachine(tvm.compile(mod, target=target, relax_pipeline=pipeline),
                                      tvm.cpu())
            calls[key] = (lambda vm=vm: vm["main"](*args))
        samples = measure_interleaved(calls, budget_s=budget_s)
        print(f"| {n} | {samples['serial'].median * 1e6:.1f} | "
              f"{samples['parallel'].median * 1e6:.1f} | "
              f"{1.0 / paired_ratio(samples['parallel'], samples['serial']):.2f}x |", flush=True)


def _prim_func_call(func, target) -> Callable[[], object]:
    """A call of one PrimFunc on random inputs (integer inputs are zeros: safe indices)."""
    func = func.with_attr("global_symbol", "main")
    kernel = tvm.compile(tvm.IRModule({"main": func}), target=target).jit()["main"]
    rng = np.random.default_rng(0)
    args = []
    for param in func.params:  # in 0.27 a buffer parameter carries its shape and dtype
        shape = [int(d) for d in param.shape]
        dtype = str(param.dtype)
        data = (rng.standard_normal(shape).astype(dtype) if dtype.startswith("float")
                else np.zeros(shape, dtype=dtype))
        args.append(tvm.runtime.tensor(data))
    return lambda: kernel(*args)


def per_kernel(model: str, target, top: int, budget_s: float) -> None:
    """Each PrimFunc of a zoo model timed alone (interleaved), TVM's lowering vs ours."""

    mod, _ = _model_module(model)
    lowered = {"tvm": relax.get_default_pipeline(target)(mod), "sched": cpu_pipeline(target)(mod)}
    rows = []
    for gvar, func in lowered["sched"].functions_items():
        if not isinstance(func, tirx.PrimFunc):
            continue
        base = lowered["tvm"][gvar.name_hint]
        rule = func.attrs.get("ollie.cpu_schedule_rule", "-") if func.attrs else "-"
        try:
            calls = {"tvm": _prim_func_call(base, target), "sched": _prim_func_call(func, target)}
        except Exception as err:  # pylint: disable=broad-except
            print(f"skipped {gvar.name_hint}: {type(err).__name__}", file=sys.stderr)
            continue
        samples = measure_interleaved(calls, budget_s=budget_s, min_rounds=5)
        t_base, t_ours = samples["tvm"].median, samples["sched"].median
        rows.append((t_base, t_ours, gvar.name_hint, rule))
    rows.sort(reverse=True)
    total = (sum(r[0] for r in rows), sum(r[1] for r in rows))
    print(f"{model}: {len(rows)} kernels, sum {total[0] * 1e3:.2f} ms -> {total[1] * 1e3:.2f} ms")
    print("| kernel | rule | TVM (us) | sched (us) | speedup |")
    print("|---|---|---:|---:|---:|")
    slower = [r for r in rows[top:] if r[1] > 1.1 * r[0]]
    for t_base, t_ours, name, rule in rows[:top] + slower:
        print(f"| {name} | {rule} | {t_base * 1e6:.0f} | {t_ours * 1e6:.0f} | "
              f"{t_base / t_ours:.2f}x |", flush=True)
    print(f"({len(slower)} more kernels below the top {top} measured >10% slower, listed last)")


def main(argv: Sequence[str] = None) -> int:
    """Command line entry point: prints a markdown table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="segformer,yolox,bert",
                        help="comma-separated zoo models (quick size); empty for none")
    parser.add_argument("--no-kernels", action="store_true", help="skip the single kernels")
    parser.add_argument("--budget", type=float, default=3.0,
                        help="seconds of interleaved timing per workload (at least 5 rounds)")
    parser.add_argument("--threshold", action="store_true",
                        help="only the parallel-threshold sweep (add+sigmoid, 1K-256K elements)")
    parser.add_argument("--per-kernel", default="",
                        help="time every PrimFunc of this zoo model alone (not interleaved)")
    args = parser.parse_args(argv)
    target = normalize_target("llvm")
    if args.per_kernel:
        per_kernel(args.per_kernel, target, top=25, budget_s=min(args.budget, 0.3))
        return 0
    if args.threshold:
        print(f"target {target}, TVM threads {tvm.runtime.num_threads()}", flush=True)
        threshold_sweep(target, [1024, 4096, 16384, 65536, 262144], args.budget)
        return 0
    work = []
    if not args.no_kernels:
        work += [(k, lambda k=k: (_kernel_module(*KERNELS[k]),
                                  None)) for k in KERNELS]
    work += [(m, lambda m=m: _model_module(m)) for m in args.models.split(",") if m]
    print(f"target {target}, TVM threads {tvm.runtime.num_threads()}", flush=True)
    print("| workload | TVM default (ms) | + cpu schedules (ms) | speedup | max abs diff |"
          " compile s (tvm/sched) |")
    print("|---|---:|---:|---:|---:|---:|", flush=True)
    for name, make in work:
        mod, inputs = make()
        if inputs is None:
            rng = np.random.default_rng(0)
            inputs = [rng.standard_normal(s).astype(d) for s, d in KERNELS[name][0]]
        row = bench(name, mod, inputs, target, args.budget)
        print(f"| {row['name']} | {row['tvm_ms']:.3f} | {row['sched_ms']:.3f} | "
              f"{row['speedup']:.2f}x | {row['max_abs_diff']:.1e} | "
              f"{row['compile_s'][0]:.1f} / {row['compile_s'][1]:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
