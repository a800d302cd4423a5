"""The Relax VM's own cost per run of ollie's executables, with and without cached allocations.

The VM instrument of ``tvm-ollie profile`` costs about 1 us per call, more than most builtins
it times (``vm.builtin.alloc_tensor`` is ~0.1 us), so this measures without it:

* **VM only**: the executable's lowered module with every kernel (TVM PrimFunc or native
  packed call) replaced by TVM's no-op ``testing.nop`` and built again; what a run then costs is
  the VM's dispatch, its builtins (allocations, kills, tuple items, checks) and the Python call.
  Calling-thread CPU time (``time.thread_time``), which other processes on the cores barely
  move, median of rounds of 50 runs.
* **whole model**: the two executables (``cached_alloc`` off, on) in one process, warm plain
  loops in alternating rounds (50 calls each), medians and the median of per-round ratios.
* **calls**: the calls in ``main`` of each lowered module, by callee.
* **builtins** (``--builtins``): nanoseconds per call of single VM builtins, from Relax
  functions of N unrolled calls each, less an empty function, calling-thread CPU time.

Both executables are built from one rewritten module (:func:`optimize_module`, with the
decisions kept in the work dir: the second build reuses the first's), lowered by the ollie CPU
pipeline (:func:`tvm_ollie.pipeline.default_pipeline`) with the switch off and on: the rewrite,
without the whole-model guard or the library plan of :func:`tvm_ollie.pipeline.build`.

``TVM_NUM_THREADS=2 python -m tvm_ollie.bench.vm_overhead resnet18 yolox --threads 2 --work-dir
/tmp/vmo`` (``TVM_NUM_THREADS`` is read when TVM starts: set it in the environment).
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import time
from typing import Callable, Dict, List, Sequence, Tuple

import numpy as np

from ..codegen.cached_alloc import cached_alloc_scope
from ..compat import relax, tirx, tvm
from ..models.registry import get_model
from ..pipeline.compile import default_pipeline
from ..transform.optimize import optimize_module
from .systems import BenchContext

NOP = "testing.nop"


def lowered_module(mod: "tvm.IRModule", target: str, cached: bool) -> "tvm.IRModule":
    """``mod`` through the ollie CPU pipeline, ``cached_alloc`` as given: the module the VM's
    code is generated from."""
    with cached_alloc_scope(cached):
        return default_pipeline(target)(mod)


def build_lowered(lowered: "tvm.IRModule", target: str = "llvm") -> "tvm.runtime.Executable":
    """Code generation of an already lowered module (no Relax pipeline)."""
    return tvm.compile(lowered, target=target, relax_pipeline=None)


def _is_kernel(mod: "tvm.IRModule", op) -> bool:
    if isinstance(op, tvm.ir.GlobalVar):
        return isinstance(mod[op], tirx.PrimFunc)
    return isinstance(op, relax.ExternFunc) and not str(op.global_symbol).startswith("vm.") \
        and str(op.global_symbol) not in ("tvm_ollie.vm.cached_alloc", NOP)


def without_kernels(lowered: "tvm.IRModule") -> Tuple["tvm.IRModule", int]:
    """``(module, n)``: every kernel call of the Relax functions replaced by ``testing.nop``
    with the same arguments (n calls); VM builtins stay."""

    @relax.expr_functor.mutator
    class _NoKernels(relax.PyExprMutator):  # pylint: disable=too-few-public-methods
        def __init__(self):
            super().__init__(lowered)
            self.replaced = 0

        def visit_call_(self, call):  # pylint: disable=arguments-renamed
            call = super().visit_call_(call)
            if not _is_kernel(lowered, call.op):
                return call
            self.replaced += 1
            return relax.Call(relax.ExternFunc(NOP), call.args, ty_args=[relax.ObjectType()])

    mutator = _NoKernels()
    funcs = {gv: (mutator.visit_expr(f) if isinstance(f, relax.Function) else f)
             for gv, f in lowered.functions.items()}
    return tvm.IRModule(funcs, attrs=lowered.attrs), mutator.replaced


def calls_by_callee(lowered: "tvm.IRModule", name: str = "main") -> Dict[str, int]:
    """The calls ``name`` makes per run, by callee: builtins by name, kernels as ``TVM kernel``
    or ``native kernel`` (tuple items are ``vm.builtin.tuple_getitem`` calls in the VM)."""
    count: collections.Counter = collections.Counter()

    def visit(expr):
        if isinstance(expr, relax.TupleGetItem):
            count["tuple_getitem"] += 1
        if not isinstance(expr, relax.Call):
            return
        if _is_kernel(lowered, expr.op):
            count["TVM kernel" if isinstance(expr.op, tvm.ir.GlobalVar) else "native kernel"] += 1
        elif isinstance(expr.op, relax.ExternFunc):
            count[str(expr.op.global_symbol)] += 1
        elif isinstance(expr.op, tvm.ir.Op):
            count[expr.op.name] += 1

    relax.analysis.post_order_visit(lowered[name], visit)
    return dict(count)


def cpu_per_run(run: Callable[[], object], rounds: int = 7, number: int = 50) -> float:
    """Median calling-thread CPU seconds of one ``run()`` (after 20 warm-up calls)."""
    for _ in range(20):
        run()
    samples = []
    for _ in range(rounds):
        start = time.thread_time()
        for _ in range(number):
            run()
        samples.append((time.thread_time() - start) / number)
    return statistics.median(samples)


def alternating(runs: Sequence[Callable[[], object]], rounds: int = 9, number: int = 50
                ) -> List[List[float]]:
    """Wall seconds per call of each run, ``rounds`` alternating rounds of ``number`` calls
    (after 20 warm-up calls each)."""
    for run in runs:
        for _ in range(20):
            run()
    out: List[List[float]] = [[] for _ in runs]
    for _ in range(rounds):
        for i, run in enumerate(runs):
            start = time.perf_counter()
            for _ in range(number):
                run()
            out[i].append((time.perf_counter() - start) / number)
    return out


def _runner(ex, args) -> Callable[[], object]:
    vm = relax.VirtualMachine(ex, tvm.cpu())
    main = vm["main"]
    return lambda: main(*args)


def _builtin_bodies(n: int) -> Dict[str, Callable]:
    """Bodies of the ``--builtins`` functions: ``n`` calls of one builtin (or pair) each."""
    nop = relax.ExternFunc(NOP)
    mem = relax.op.memory

    def storage(bb):
        return bb.emit(mem.alloc_storage(relax.ShapeExpr([4096]), 0, "global", "uint8"))

    def view(bb, st):
        return bb.emit(mem.alloc_tensor(st, 0, relax.ShapeExpr([1, 8]), "float32"))

    def echo3(bb, x):  # an opaque tuple: its items cannot be folded away
        return bb.emit(relax.Call(relax.ExternFunc("testing.echo"), [relax.Tuple([x, x, x])],
                                  ty_args=[relax.TupleType([x.ty] * 3)]))

    def call(bb, func, args):
        return bb.emit(relax.Call(func, args, ty_args=[relax.ObjectType()]))

    def once(state, key, make):  # one storage / tuple shared by the n calls
        if key not in state:
            state[key] = make()
        return state[key]

    def repeat(step):
        def body(bb, x):
            state = {}
            for i in range(n):
                step(bb, x, i, state)
        return body

    return {
        "empty": lambda bb, x: None,
        "null_value (a kill)": repeat(lambda bb, x, i, st: call(
            bb, relax.ExternFunc("vm.builtin.null_value"), [])),
        "alloc_tensor (+ its kill)": repeat(lambda bb, x, i, st: bb.emit(mem.kill_tensor(
            view(bb, once(st, "s", lambda: storage(bb)))))),
        "alloc_storage (+ its kill)": repeat(lambda bb, x, i, st: bb.emit(
            mem.kill_storage(storage(bb)))),
        "testing.nop, 1 tensor argument": repeat(lambda bb, x, i, st: call(bb, nop, [x])),
        "testing.nop, 3 tensor arguments": repeat(lambda bb, x, i, st: call(bb, nop, [x] * 3)),
        "tuple_getitem (+ its kill) + testing.nop": repeat(lambda bb, x, i, st: call(
            bb, nop, [bb.emit(relax.TupleGetItem(once(st, "t", lambda: echo3(bb, x)), i % 3))])),
    }


def builtin_costs(n: int = 200) -> Dict[str, float]:
    """Nanoseconds of CPU per call of each body of :func:`_builtin_bodies` (less the empty
    function's, divided by ``n``); the empty function's own time per run under ``empty``."""
    bodies = _builtin_bodies(n)
    bb = relax.BlockBuilder()
    names = {}
    for i, (label, body) in enumerate(bodies.items()):
        x = relax.Var("x", relax.TensorType((1, 8), "float32"))
        names[label] = f"f{i}"
        with bb.function(names[label], [x]):
            body(bb, x)
            bb.emit_func_output(x)
    vm = relax.VirtualMachine(tvm.compile(bb.get(), target="llvm"), tvm.cpu())
    x = tvm.runtime.tensor(np.zeros((1, 8), "float32"))
    per_run = {label: cpu_per_run(lambda f=vm[name]: f(x), rounds=15, number=200)
               for label, name in names.items()}
    empty = per_run.pop("empty")
    return dict({"empty": empty * 1e9}, **{k: (v - empty) / n * 1e9 for k, v in per_run.items()})


def measure_model(name: str, work_dir: str, threads: int, rounds: int) -> dict:
    """Build ``name`` (quick, constant weights) off and on; the three measurements."""
    spec = get_model(name, quick=True)
    ctx = BenchContext(threads=threads, work_dir=work_dir, weights="constants")
    mod, params, _ = ctx.relax_module(spec)
    rewritten, _ = optimize_module(mod, target="llvm", work_dir=ctx.model_dir(spec, "ollie"))
    args = [tvm.runtime.tensor(x.numpy()) for x in spec.example_inputs] + list(params)
    result = {"model": name}
    lowered = {on: lowered_module(rewritten, "llvm", on) for on in (False, True)}
    runs = [_runner(build_lowered(lowered[on]), args) for on in (False, True)]
    walls = alternating(runs, rounds)
    result["wall_ms"] = [statistics.median(w) * 1e3 for w in walls]
    result["ratio"] = statistics.median(b / a for a, b in zip(*walls))
    for on in (False, True):
        nop, replaced = without_kernels(lowered[on])
        result[f"vm_us_{'on' if on else 'off'}"] = \
            cpu_per_run(_runner(build_lowered(nop), args)) * 1e6
        result[f"calls_{'on' if on else 'off'}"] = calls_by_callee(lowered[on])
        result["kernels"] = replaced
    return result


def to_text(results: Sequence[dict], threads: int) -> str:
    """A Markdown table of :func:`measure_model`'s results."""
    lines = [f"VM only: calling-thread CPU us per run, kernels replaced by {NOP}; whole model: "
             f"warm loops, {threads} threads, alternating rounds; calls in main per run",
             "",
             "| model | kernels | VM only, off us | VM only, on us | whole, off ms | whole, on ms |"
             " on/off | calls off -> on |",
             "|---|---|---|---|---|---|---|---|"]
    for r in results:
        calls = f"{sum(r['calls_off'].values())} -> {sum(r['calls_on'].values())}"
        lines.append(f"| {r['model']} | {r['kernels']} | {r['vm_us_off']:.1f} | "
                     f"{r['vm_us_on']:.1f} | {r['wall_ms'][0]:.3f} | {r['wall_ms'][1]:.3f} | "
                     f"{r['ratio']:.3f} | {calls} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    """The command line (module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("models", nargs="*")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--work-dir", default="bench_vm_overhead")
    parser.add_argument("--builtins", action="store_true",
                        help="also time single VM builtins (ns per call)")
    args = parser.parse_args(argv)
    if args.builtins:
        for label, ns in builtin_costs().items():
            print(f"{label}: {ns:.0f} ns" + (" per run (the floor)" if label == "empty" else ""))
    results = [measure_model(m, args.work_dir, args.threads, args.rounds) for m in args.models]
    print(f"load average {os.getloadavg()}")
    print(to_text(results, args.threads))
    for r in results:
        print(r["model"], "off:", r["calls_off"])
        print(r["model"], "on: ", r["calls_on"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
