"""``python -m tvm_ollie.bench.per_call``: the fixed cost of one operator call, per system.

At the zoo's quick sizes a model's kernels take microseconds (InfoGAN quick: 1 MFLOP), so what
every call costs besides its arithmetic (the Relax VM's dispatch and argument handling, the
native entry point's checks, waking OpenMP's or TVM's workers, allocations) weighs as much as
the kernels. This benchmark isolates that cost on chains of tiny operators:

* ``conv``: ``length`` x [conv2d 3x3, 8 -> 8 channels, on 1x8x16x16, then relu] (one layer:
  every system fuses the relu into the convolution);
* ``eltwise``: ``length`` x relu on 1x8x16x16 (TVM fuses such a chain into one kernel, ONNX
  Runtime runs a node per operator; not tanh: TVM's lowering of tanh repeats its argument, and
  16 nested tanh did not finish compiling in 10 minutes);
* ``empty``: one add of a constant on a 1x8 tensor, the floor of one model call.

The columns are benchmark systems (``ollie``, ``tvm``, ``onnxruntime``...), ``library-layouts``
(``library`` with the chain in oneDNN's activation format, docs/layouts.md) and ``library``: the
conv chain with the native conv for every layer (what ollie emits when the library wins each
decision; the ollie build measures and may keep TVM's kernel for such small convolutions).
A column may carry environment variables of its own worker: ``library@OMP_WAIT_POLICY=ACTIVE``.
Each column is prepared and timed in a fresh worker process (:mod:`.worker`), one at a time, in
rotating rounds (:func:`.timing.measure_rounds`), as the isolated benchmark does; the report
gives each chain's median time and microseconds per layer (model time / ``length``). Then a
worker per chain and build (:data:`PROFILED`) profiles it with the VM instrument
(:mod:`tvm_ollie.profiler`): time per kind of call (library kernels, TVM kernels, VM builtins)
and the gap between the model's time and its calls' sum (dispatch between calls).
``docs/per-call.md`` has the measurements::

    python -m tvm_ollie.bench.per_call --length 16 --threads 2 --out /tmp/per-call
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import tvm_ffi

from .. import native
from ..codegen.library import conv2d_call, emit_call
from ..compat import relax, tvm
from ..models import to_relax
from ..models.registry import ModelSpec
from ..pipeline import build as ollie_build
from ..profiler.api import profile_executable
from ..transform.blocked_layout import blocked_layout
from .check import as_numpy_list
from .outcome import Outcome, check_outcome, prepare_outcome
from .systems import UNTUNED_SHARED, BenchContext, prepare_tvm_executable
from .table import markdown_table
from .timing import WARM, Samples, measure_rounds
from .worker import Worker, WorkerFailed

#: The chains, in table order.
CHAINS = ("conv", "eltwise", "empty")

#: Channels and spatial size of the conv and eltwise chains' activations (1 x C x H x W).
CHANNELS, SIZE = 8, 16


def _chain_module(chain: str, length: int):
    """``(nn.Module, inputs)`` of ``chain`` (seeded by the caller)."""
    # lazy: torch is a heavy, optional dependency
    import torch  # pylint: disable=import-outside-toplevel
    from torch import nn  # pylint: disable=import-outside-toplevel

    class ConvChain(nn.Module):
        def __init__(self):
            super().__init__()
            self.convs = nn.ModuleList(nn.Conv2d(CHANNELS, CHANNELS, 3, padding=1)
                                       for _ in range(length))  # fmt: skip

        def forward(self, x):
            for conv in self.convs:
                x = torch.relu(conv(x))
            return x

    class EltwiseChain(nn.Module):
        def forward(self, x):
            for _ in range(length):
                x = torch.relu(x)
            return x

    class Empty(nn.Module):
        def forward(self, x):
            return x + 1.0

    if chain == "conv":
        return ConvChain(), (torch.randn(1, CHANNELS, SIZE, SIZE),)
    if chain == "eltwise":
        return EltwiseChain(), (torch.randn(1, CHANNELS, SIZE, SIZE),)
    if chain == "empty":
        return Empty(), (torch.randn(1, CHANNELS),)
    raise ValueError(f"unknown chain {chain!r}; known: {', '.join(CHAINS)}")


def layers(chain: str, length: int) -> int:
    """Operators (layers) of the chain: what its time is divided by."""
    return 1 if chain == "empty" else length


def chain_spec(chain: str, length: int, seed: int = 0) -> ModelSpec:
    """The chain as a benchmark model (seeded weights and input; its ``key`` names the work
    dir of its builds)."""
    # lazy: torch is a heavy, optional dependency
    import torch  # pylint: disable=import-outside-toplevel

    if length < 1:
        raise ValueError(f"length must be >= 1, got {length}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        module, inputs = _chain_module(chain, length)
    module = module.eval()
    for param in module.parameters():
        param.requires_grad_(False)
    name = chain if chain == "empty" else f"{chain}{length}"
    return ModelSpec(name=name, module=module, example_inputs=tuple(inputs), quick=True, batch=1,
                     paper="extra", description=f"per-call chain {name}")  # fmt: skip


def parse_column(column: str) -> Tuple[str, Dict[str, str]]:
    """``SYSTEM[@KEY=VALUE[,KEY=VALUE...]]`` -> ``(system, {KEY: VALUE})``."""
    system, _, rest = column.partition("@")
    env = {}
    for item in filter(None, rest.split(",")):
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise ValueError(f"column {column!r}: expected KEY=VALUE after '@', got {item!r}")
        env[key] = value
    return system, env


def library_chain_module(spec: ModelSpec):
    """The conv chain as the ollie pass writes it when the library wins every layer: one
    ``tvm_ollie.cpu.conv2d`` call per layer (bias and relu as its epilogue), weights as
    constants; the module the ``library`` column builds with TVM's default pipeline."""
    shape = tuple(spec.example_inputs[0].shape)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    call = conv2d_call((1, 1), (1, 1, 1, 1), (1, 1), 1, "NCHW", "OIHW").with_attrs(bias="1",
                                                                                  act="relu")
    with bb.function("main", [x]):
        with bb.dataflow():
            y = x
            for conv in spec.module.convs:
                weight = relax.const(tvm.runtime.tensor(conv.weight.numpy()))
                bias = relax.const(tvm.runtime.tensor(conv.bias.numpy()))
                y = bb.emit(emit_call(call, [y, weight, bias], shape))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


def prepare_library(spec: ModelSpec, ctx: BenchContext, layouts: bool = False) -> Outcome:
    """The ``library`` column: :func:`library_chain_module` built by TVM, run once;
    ``layouts`` (the ``library-layouts`` column): the chain kept in oneDNN's activation format
    (:func:`tvm_ollie.transform.blocked_layout.blocked_layout`, docs/layouts.md)."""
    if not native.available():
        return {"status": "skipped", "reason": native.unavailable_reason()}, None, None
    start = time.perf_counter()
    mod = library_chain_module(spec)
    if layouts:
        mod, _ = blocked_layout(mod)
    ex = tvm.compile(mod, target=ctx.target)
    prepared = prepare_tvm_executable(ex, [], spec, ctx, time.perf_counter() - start)
    outputs = as_numpy_list(prepared.run())
    return {"status": "built", "compile_s": prepared.compile_s}, prepared.run, outputs


#: The column that calls the native conv for every layer whatever it measures (the ollie
#: build decides per call and may keep TVM's kernel): only the conv chain has one.
LIBRARY = "library"
#: The ``library`` column's module with its chain kept in oneDNN's activation format.
LIBRARY_LAYOUTS = "library-layouts"


#: The builds profiled per chain (the VM instrument sees every call they make).
PROFILED = ("ollie", LIBRARY)


def column_context(column: str, ctx_kwargs: dict) -> dict:
    """The :class:`.BenchContext` arguments of a column: a column with an environment of its own
    gets a work dir of its own, so that its ollie build measures and decides under that
    environment instead of reusing the decisions measured under another."""
    if "@" not in column:
        return ctx_kwargs
    safe = "".join(c if c.isalnum() or c in "-_=." else "_" for c in column)[-100:]
    return dict(ctx_kwargs, work_dir=os.path.join(ctx_kwargs["work_dir"], "columns", safe))


def chain_outcome(system: str, chain: str, length: int, ctx_kwargs: dict) -> Outcome:
    """A worker's factory: prepare ``system`` on the chain (:func:`.outcome.prepare_outcome`;
    :func:`prepare_library` for the ``library`` column)."""
    spec, ctx = chain_spec(chain, length), BenchContext(**ctx_kwargs)
    if system in (LIBRARY, LIBRARY_LAYOUTS):
        if chain != "conv":
            return {"status": "skipped", "reason": "no library kernel"}, None, None
        return prepare_library(spec, ctx, layouts=system == LIBRARY_LAYOUTS)
    return prepare_outcome(system, spec, ctx)


def profile_outcome(system: str, chain: str, length: int, ctx_kwargs: dict,
                    runs: int) -> Outcome:  # fmt: skip
    """A worker's factory: build the chain as ``system`` does (``ollie``: the timed columns'
    work dir, so the same decisions; ``library``: :func:`library_chain_module`) and profile
    ``runs`` calls; ``(result, None, None)`` where ``result`` holds the time per kind of call
    (net of the instrument) and the model's time without the profiler."""
    spec = chain_spec(chain, length)
    ctx = BenchContext(**ctx_kwargs)
    if system == LIBRARY:
        ex = tvm.compile(library_chain_module(spec), target=ctx.target)
    else:
        mod, _ = to_relax(spec, weights=ctx.weights)
        ex, _ = ollie_build(mod, target=ctx.target, trials=0,
                            work_dir=ctx.model_dir(spec, UNTUNED_SHARED))  # fmt: skip
    args = [x.numpy() for x in spec.example_inputs]
    prof = profile_executable(ex, args, tvm.cpu(0), runs=runs, stat="min")
    floor = prof.hook_floor_s() or 0.0
    rows = [(r.key, r.count, r.total_s - floor * r.count) for r in prof.by_kind()]
    return {"status": "built", "model_s": prof.unprofiled_median_s(), "calls": prof.calls_per_run(),
            "hook_floor_s": floor, "kinds": rows}, None, None  # fmt: skip


def serial_sweep_outcome(channels: Sequence[int], rounds: int) -> Outcome:
    """A worker's factory: one native conv 3x3 C -> C on 1xCx16x16 per ``channels``, timed
    single-threaded (the threshold above the call) and with the library's threads (threshold
    0) in turn, ``rounds`` rounds; ``(result, None, None)``, ``result["rows"]`` holding per C
    the MFLOP, both medians (s) and the median of the per-round ratios serial / threaded."""
    if not native.provides(native.SET_SERIAL_FLOPS):
        return {"status": "skipped", "reason": "the native library has no threshold"}, None, None
    conv = tvm_ffi.get_global_func(native.CONV2D)
    attrs = "pad=1,1,1,1;bias=1;act=relu"
    rng = np.random.default_rng(0)
    modes = {"serial": 10**15, "threaded": 0}
    rows, before = [], native.get_serial_flops()
    try:
        for c in channels:
            shapes = ((1, c, SIZE, SIZE), (c, c, 3, 3), (c,), (1, c, SIZE, SIZE))
            arrays = [rng.standard_normal(s).astype("float32") for s in shapes]
            args = [tvm_ffi.from_dlpack(a) for a in arrays]
            calls = max(5, 20000 // (c * c))
            seconds: Dict[str, List[float]] = {m: [] for m in modes}
            for _ in range(rounds + 1):  # the first round warms up (primitives created)
                for mode, flops in modes.items():
                    native.set_serial_flops(flops)
                    start = time.perf_counter()
                    for _ in range(calls):
                        conv(attrs, *args)
                    seconds[mode].append((time.perf_counter() - start) / calls)
            serial, threaded = seconds["serial"][1:], seconds["threaded"][1:]
            rows.append({"channels": c, "mflop": 2 * c * c * 9 * SIZE * SIZE / 1e6,
                         "serial_s": statistics.median(serial),
                         "threaded_s": statistics.median(threaded),
                         "ratio": statistics.median(a / b for a, b in zip(serial, threaded))})
    finally:
        native.set_serial_flops(before)
    return {"status": "built", "threads": native.get_num_threads(), "rows": rows}, None, None


def serial_sweep_table(result: dict) -> str:
    """Markdown: a row per conv size: MFLOP, both medians in us and the ratio."""
    rows = [[str(r["channels"]), f"{r['mflop']:.2f}", f"{r['serial_s'] * 1e6:.1f}",
             f"{r['threaded_s'] * 1e6:.1f}", f"{r['ratio']:.2f}"]
            for r in result.get("rows", [])]  # fmt: skip
    threads = result.get("threads", "?")
    return markdown_table(["C", "MFLOP", "1 thread us", f"{threads} threads us",
                           "1 thread / threaded (median of round ratios)"], rows)


def _reference(chain: str, length: int) -> list:
    # lazy: torch is a heavy, optional dependency
    import torch  # pylint: disable=import-outside-toplevel

    spec = chain_spec(chain, length)
    with torch.inference_mode():
        return as_numpy_list(spec.module(*spec.example_inputs))


def _environment(changes: Dict[str, str], threads: int) -> Dict[str, str]:
    env = dict(os.environ, **changes)
    env.setdefault("TVM_NUM_THREADS", str(threads))
    return env


def time_chain(chain: str, length: int, columns: Sequence[str], ctx_kwargs: dict,
               timing: dict, log: Callable[[str], None] = print) -> Tuple[dict, Dict[str, Samples]]:
    """Prepare every column on the chain in its own worker, check it against PyTorch and time
    the workers in rotating rounds; ``(results per column, samples per column)``."""
    reference = _reference(chain, length)
    results: Dict[str, dict] = {}
    workers: Dict[str, Worker] = {}
    try:
        for column in columns:
            system, changes = parse_column(column)
            worker = Worker(column, chain_outcome,
                            dict(system=system, chain=chain, length=length,
                                 ctx_kwargs=column_context(column, ctx_kwargs)),
                            env=_environment(changes, ctx_kwargs["threads"]))  # fmt: skip
            try:
                result, outputs = worker.ready()
            except WorkerFailed as err:
                result, outputs = {"status": "error", "reason": str(err)}, None
            results[column] = result
            if outputs is not None and check_outcome(result, outputs, reference):
                workers[column] = worker
            else:
                log(f"  {chain}/{column}: {result.get('status')} {result.get('reason', '')}")
                worker.close()
        failures: Dict[str, str] = {}

        def settle(previous: Optional[str]) -> None:
            if previous in workers:
                workers[previous].settle()

        samples = measure_rounds(workers, settle=settle, failures=failures, **timing)
        for column, reason in failures.items():
            results[column].update(status="error", reason=f"timing failed: {reason}")
    finally:
        for worker in workers.values():
            worker.close()
    for column, sample in samples.items():
        results[column]["median_s"] = sample.median
        results[column]["rounds"] = len(sample.seconds)
    return results, samples


def profile_chain(system: str, chain: str, length: int, ctx_kwargs: dict, runs: int) -> dict:
    """``system``'s profile of the chain, in a worker of its own (:func:`profile_outcome`)."""
    worker = Worker("profile", profile_outcome,
                    dict(system=system, chain=chain, length=length, ctx_kwargs=ctx_kwargs,
                         runs=runs),
                    env=_environment({}, ctx_kwargs["threads"]))  # fmt: skip
    try:
        return worker.ready()[0]
    except WorkerFailed as err:
        return {"status": "error", "reason": str(err)}
    finally:
        worker.close()


def per_call_table(rows: Dict[str, Dict[str, dict]], lengths: Dict[str, int],
                   columns: Sequence[str]) -> str:
    """Markdown: a row per chain, a column per system: median model time in us, then us per
    layer and, for the columns after the first, the ratio to the first column's median."""
    body = []
    for chain, results in rows.items():
        first = results.get(columns[0], {}).get("median_s")
        cells = [f"{chain} ({lengths[chain]})"]
        for column in columns:
            median = results.get(column, {}).get("median_s")
            if median is None:
                cells.append(results.get(column, {}).get("status", "-"))
                continue
            text = f"{median * 1e6:.1f} ({median * 1e6 / lengths[chain]:.1f}/layer"
            if first and column != columns[0]:
                text += f", {median / first:.2f}x"
            cells.append(text + ")")
        body.append(cells)
    return markdown_table(["chain (layers)"] + list(columns), body)


def profile_table(profiles: Dict[str, dict]) -> str:
    """Markdown: per chain and profiled build, the time per kind of call (us per run, net of
    the instrument), the calls' sum and the model's time (the difference: dispatch between
    calls, below the instrument's resolution when negative)."""
    kinds: List[str] = []
    for prof in profiles.values():
        kinds += [k for k, _, _ in prof.get("kinds", []) if k not in kinds]
    body = []
    for chain, prof in profiles.items():
        if "kinds" not in prof:
            body.append([chain] + ["-"] * (len(kinds) + 2) + [prof.get("reason", "error")[:60]])
            continue
        by_kind = {k: (count, total) for k, count, total in prof["kinds"]}
        cells = [chain]
        for kind in kinds:
            count, total = by_kind.get(kind, (0, 0.0))
            cells.append(f"{total * 1e6:.1f} ({count:g})" if count else "-")
        calls = sum(total for _, _, total in prof["kinds"])
        cells += [f"{calls * 1e6:.1f}", f"{prof['model_s'] * 1e6:.1f}",
                  f"{(prof['model_s'] - calls) * 1e6:.1f}"]  # fmt: skip
        body.append(cells)
    header = (["chain, build"] + [f"{k} us (calls)" for k in kinds]
              + ["calls us", "model us", "gap us"])  # fmt: skip
    return markdown_table(header, body)


def run_per_call(args: argparse.Namespace, log: Callable[[str], None] = print) -> dict:
    """Time every chain on every column, profile ollie's builds; writes per_call.json / .md."""
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    ctx_kwargs = dict(target="llvm", threads=args.threads, trials=0,
                      work_dir=os.path.join(out, "work"), weights="constants",
                      ort_spinning=True)  # fmt: skip
    timing = dict(budget_s=args.budget, min_rounds=args.min_rounds, min_sample_s=args.sample_s,
                  protocol=WARM)
    lengths = {chain: layers(chain, args.length) for chain in args.chains}
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    rows: Dict[str, Dict[str, dict]] = {}
    profiles: Dict[str, dict] = {}
    for chain in args.chains:
        rows[chain], _ = time_chain(chain, args.length, args.columns, ctx_kwargs, timing, log)
        log(f"{chain}: " + ", ".join(f"{c} {r.get('median_s', r.get('status'))}"
                                     for c, r in rows[chain].items()))  # fmt: skip
        for system in PROFILED if args.profile_runs > 0 else ():
            if system == LIBRARY and chain != "conv":
                continue
            profiles[f"{chain} {system}"] = profile_chain(system, chain, args.length, ctx_kwargs,
                                                          args.profile_runs)  # fmt: skip
    text = (f"# Per-call cost: chains of {args.length}, {args.threads} threads "
            f"(started {started}, load average {os.getloadavg()[0]:.1f} at the end)\n\n"
            "Median model time in us (us per layer; ratio to the first column)\n\n"
            + per_call_table(rows, lengths, args.columns) + "\n")
    if profiles:
        text += ("\nCalls by kind, us per run (fastest of "
                 f"{args.profile_runs} runs, net of the instrument)\n\n"
                 + profile_table(profiles) + "\n")
    sweep = None
    if args.serial_sweep:
        worker = Worker("serial sweep", serial_sweep_outcome,
                        dict(channels=args.serial_sweep, rounds=args.min_rounds),
                        env=_environment({}, args.threads))  # fmt: skip
        try:
            sweep = worker.ready()[0]
        except WorkerFailed as err:
            sweep = {"status": "error", "reason": str(err)}
        finally:
            worker.close()
        text += ("\nOne native conv 3x3 C -> C on 1xCx16x16, single-threaded against threaded "
                 f"(median of {args.min_rounds} rounds)\n\n" + serial_sweep_table(sweep) + "\n")
    results = {"config": vars(args), "started": started, "load_avg": os.getloadavg(),
               "chains": rows, "profiles": profiles, "serial_sweep": sweep}  # fmt: skip
    with open(os.path.join(out, "per_call.json"), "w", encoding="utf-8") as f:
        json.dump(results, f, indent=1, default=str)
    with open(os.path.join(out, "per_call.md"), "w", encoding="utf-8") as f:
        f.write(text)
    log(text)
    return results


def build_parser() -> argparse.ArgumentParser:
    """The command line's options."""
    parser = argparse.ArgumentParser(prog="python -m tvm_ollie.bench.per_call",
                                     description=__doc__.split("\n\n")[0])  # fmt: skip
    parser.add_argument("--length", type=int, default=16, help="layers of the conv/eltwise chains")
    parser.add_argument("--chains", nargs="+", default=list(CHAINS), choices=CHAINS)
    parser.add_argument("--columns", nargs="+", default=["ollie", LIBRARY, "tvm", "onnxruntime"],
                        help="systems, each optionally with environment variables of its own "
                             "worker: SYSTEM@KEY=VALUE,KEY=VALUE")  # fmt: skip
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                        help="threads of every runtime (default: all cores)")
    parser.add_argument("--budget", type=float, default=3.0, help="timing seconds per chain")
    parser.add_argument("--min-rounds", type=int, default=15, help="timing rounds at least")
    parser.add_argument("--sample-s", type=float, default=None,
                        help="seconds per sample at least, after untimed warm-up calls "
                        "(default: the warm protocol's, bench/timing.py WARM)")
    parser.add_argument("--profile-runs", type=int, default=20,
                        help="profiled runs of ollie's build per chain (0: no profile)")
    parser.add_argument("--serial-sweep", type=int, nargs="*", default=[], metavar="C",
                        help="also time one native conv C -> C per C single-threaded and "
                             "threaded (the TVM_OLLIE_SERIAL_FLOPS threshold's question)")
    parser.add_argument("--out", default="bench_per_call", help="output directory")
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    """Run the benchmark; 1 when a column failed on some chain."""
    results = run_per_call(build_parser().parse_args(argv))
    failed = [r for chain in results["chains"].values() for r in chain.values()
              if "median_s" not in r]  # fmt: skip
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
