"""The built-in demos of the ``tvm-ollie`` command.

* :func:`run_demo` (``tvm-ollie demo``, the README's main job): a small convolutional model with
  seeded random weights is built twice, by TVM's default Relax pipeline and by the ollie build
  (``tvm_ollie.pipeline.build``); the outputs are checked against each other and the report of
  per-operator decisions is printed with both builds' median latencies.
* :func:`run_roundtrip` (``tvm-ollie roundtrip``): one conv2d is lifted out of a Relax module into
  an expression, printed, lowered back into a TVM PrimFunc, built for llvm and checked against
  TVM's own build and the reference interpreter.
"""

from __future__ import annotations

import sys
import time
from typing import Any, Optional, TextIO, Tuple

import numpy as np

from .codegen.builder import single_function_module, tensor_var
from .codegen.lower import lower
from .compat import relax, tvm
from .config import OllieConfig, resolve_config
from .frontend.errors import FrontendError
from .frontend.explain import chosen_lines, decision_details, decision_table, summary_line
from .frontend.loader import iter_op_calls
from .frontend.progress import Stages
from .frontend.targets import is_gpu, parse_target
from .ir.interp import evaluate
from .lift import LiftError, lift, lift_relax_call
from .pipeline import build
from .target import kind_name


def conv2d_module(batch: int, channels: int, size: int, filters: int) -> "tvm.IRModule":
    """A Relax module ``main(x, w) = conv2d(x, w, padding=1)`` in NCHW/OIHW."""
    return single_function_module(
        [tensor_var("x", (batch, channels, size, size)),
         tensor_var("w", (filters, channels, 3, 3))],
        lambda bb, x, w: relax.op.nn.conv2d(x, w, strides=1, padding=1))


def demo_model(channels: int = 16, size: int = 32, seed: int = 0) -> "tvm.IRModule":
    """The demo's model: conv3x3 -> relu -> conv3x3 -> relu -> conv-transpose (x2 upsampling).

    NCHW; the weights are seeded random Relax constants, so the only input is ``x`` of shape
    ``(1, channels, size, size)`` and the output is ``(1, channels, 2*size, 2*size)``.
    """
    rng = np.random.default_rng(seed)

    def weight(*shape: int) -> "relax.Constant":
        scale = 1.0 / np.sqrt(np.prod(shape[1:]))
        return relax.const(rng.uniform(-scale, scale, shape).astype("float32"))

    wide = 2 * channels

    def body(bb, x):
        y = bb.emit(relax.op.nn.conv2d(x, weight(channels, channels, 3, 3), padding=1))
        y = bb.emit(relax.op.nn.relu(y))
        y = bb.emit(relax.op.nn.conv2d(y, weight(wide, channels, 3, 3), padding=1))
        y = bb.emit(relax.op.nn.relu(y))
        # conv2d_transpose weights are IOHW: (in_channels, out_channels, kh, kw).
        return relax.op.nn.conv2d_transpose(y, weight(wide, channels, 4, 4), strides=2, padding=1)

    return single_function_module([tensor_var("x", (1, channels, size, size))], body)


def run_demo(
    channels: int = 16,
    size: int = 32,
    target: Optional[str] = None,
    config: Optional[OllieConfig] = None,
    *,
    repeat: int = 20,
    explain: bool = False,
    out: TextIO = sys.stdout,
    progress: bool = True,
    **options: Any,
) -> bool:
    """Build the demo model with TVM and with tvm-ollie, compare, and report.

    Returns whether the optimized build's output matches TVM's (relative error below 1e-4).
    With ``explain`` the rule path of every decision is printed too. The ollie build's options
    are ``config`` (:class:`~tvm_ollie.config.OllieConfig`; default target llvm), overridden
    by ``target`` and ``options`` (its fields: ``trials``, ``max_depth``, ``search_time_s``...)
    when given.
    """

    cfg = resolve_config(config, target=target, **options)
    raw = cfg.target if cfg.target is not None else "llvm"
    tgt, note = parse_target(raw) if isinstance(raw, str) else (tvm.target.Target(raw), "")
    if note:
        print(f"note: {note}", file=out)
    dev = _device(tgt)
    mod = demo_model(channels, size)
    x = np.random.default_rng(1).uniform(-1, 1, (1, channels, size, size)).astype("float32")
    print(f"demo model: conv3x3 -> relu -> conv3x3 -> relu -> conv-transpose, input "
          f"float32[1, {channels}, {size}, {size}], target {kind_name(tgt)}", file=out)

    with Stages(["TVM build", "ollie build", "run and time"], enabled=progress) as stages:
        start = time.perf_counter()
        base_ex = tvm.compile(mod, target=tgt)
        base_build_s = time.perf_counter() - start
        stages.next()
        start = time.perf_counter()
        ollie_ex, report = build(mod, config=cfg.replace(target=tgt))
        ollie_build_s = time.perf_counter() - start
        stages.next()
        ref, got, base_ms, ollie_ms = _compare_runs(base_ex, ollie_ex, dev, x, repeat)

    decisions = list(report.decisions)
    print(f"\n{summary_line(decisions)} (search {getattr(report, 'search_s', 0.0):.1f} s, "
          f"tuning {getattr(report, 'tuning_s', 0.0):.1f} s)", file=out)
    if report.budget is not None and report.budget.total:
        print(report.budget.to_text(), file=out)
    if decisions:
        print(decision_table(decisions), file=out)
        print("", file=out)
        print(decision_details(decisions) if explain else chosen_lines(decisions), file=out)
    err = float(np.max(np.abs(got - ref)) / max(1e-12, float(np.max(np.abs(ref)))))
    ok = bool(np.isfinite(err) and err < 1e-4 and got.shape == ref.shape)
    print(f"\noutput {list(got.shape)}: max relative error vs TVM's build {err:.2e} "
          f"[{'ok' if ok else 'MISMATCH'}]", file=out)
    print(f"build time: TVM {base_build_s:.1f} s, ollie {ollie_build_s:.1f} s", file=out)
    if report.search_note:
        print(report.search_note, file=out)
    print(f"derivations: {report.derivations_text()}; {report.compile_profile}", file=out)
    print(f"latency (median of {repeat}): TVM {base_ms:.3f} ms, ollie {ollie_ms:.3f} ms, "
          f"speedup {base_ms / ollie_ms:.2f}x", file=out)
    print("demo " + ("passed" if ok else "FAILED"), file=out)
    return ok


def _device(target: "tvm.target.Target") -> "tvm.runtime.Device":
    dev = tvm.cuda(0) if is_gpu(target) else tvm.cpu(0)
    if not dev.exist:
        raise FrontendError(f"the demo runs what it builds, and there is no {dev} here")
    return dev


def _compare_runs(base_ex, ollie_ex, dev, x: np.ndarray,
                  repeat: int) -> Tuple[np.ndarray, np.ndarray, float, float]:
    """Outputs of both builds, and their median latencies (ms) timed in alternating rounds so
    that a busy moment of the machine does not favour either build."""
    runs = []
    for ex in (base_ex, ollie_ex):
        vm = relax.VirtualMachine(ex, dev)
        arg = tvm.runtime.tensor(x, dev)
        output = vm["main"](arg).numpy()
        vm.set_input("main", arg)
        timer = vm.time_evaluator("invoke_stateful", dev, number=1, repeat=1, min_repeat_ms=0)
        runs.append((output, timer, []))
    for _ in range(repeat):
        for _, timer, times in runs:
            times.append(float(timer("main").median) * 1e3)
    (ref, _, base_times), (got, _, ollie_times) = runs
    return ref, got, float(np.median(base_times)), float(np.median(ollie_times))


def _median_ms(func, *args, repeat: int = 5) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        func(*args)
        times.append((time.perf_counter() - start) * 1e3)
    return float(np.median(times))


def run_roundtrip(batch: int = 1, channels: int = 64, size: int = 14, filters: int = 64,
             out: TextIO = sys.stdout) -> bool:
    """Run the round trip and print what happens; returns whether every check passed."""

    mod = conv2d_module(batch, channels, size, filters)
    (_, _, call), = [c for c in iter_op_calls(mod) if c[2].op.name == "relax.nn.conv2d"]
    expr = lift(call, mod)
    print("lifted relax.nn.conv2d:", file=out)
    print("  " + str(expr), file=out)

    rng = np.random.default_rng(0)
    inputs = {t.name: rng.uniform(-1, 1, t.shape).astype(t.dtype) for t in expr.inputs}

    start = time.perf_counter()
    ref_tvm = _run_relax(mod, [inputs["x"], inputs["w"]])
    t_tvm = time.perf_counter() - start
    start = time.perf_counter()
    func = tvm.compile(tvm.IRModule({"conv": lower(expr, name="conv")}), target="llvm")
    t_build = time.perf_counter() - start
    args = [tvm.runtime.tensor(inputs[t.name]) for t in expr.inputs]
    result = tvm.runtime.tensor(np.zeros(expr.shape, expr.dtype))
    func["conv"](*args, result)
    ours = result.numpy()
    start = time.perf_counter()
    interp = evaluate(expr, inputs)
    t_interp = time.perf_counter() - start

    ok = True
    for label, ref in (("TVM's own build", ref_tvm), ("reference interpreter", interp)):
        err = float(np.max(np.abs(ours - ref)) / max(1e-12, float(np.max(np.abs(ref)))))
        status = "ok" if err < 1e-5 else "MISMATCH"
        ok &= status == "ok"
        print(f"lowered expression vs {label}: max relative error {err:.2e} [{status}]", file=out)
    print(f"times: TVM build+run {t_tvm:.2f} s, lowered build {t_build:.2f} s, "
          f"interpreter {t_interp * 1e3:.1f} ms, lowered kernel "
          f"{_median_ms(func['conv'], *args, result):.2f} ms (untuned)", file=out)
    print("demo " + ("passed" if ok else "FAILED"), file=out)
    return ok


def _run_relax(mod: "tvm.IRModule", args) -> np.ndarray:
    ex = tvm.compile(mod, target="llvm")
    vm = relax.VirtualMachine(ex, tvm.cpu())
    return vm["main"](*[tvm.runtime.tensor(a) for a in args]).numpy()


def print_lifted_ops(mod: "tvm.IRModule", out: TextIO = sys.stdout) -> None:
    """Print every operator of ``mod`` with its expression, or why it cannot be lifted."""

    for func_name, var, call in iter_op_calls(mod):
        try:
            text = str(lift_relax_call(call, mod))
        except LiftError as err:
            text = f"(not lifted: {err})"
        print(f"{func_name}/{var.name} = {call.op.name}: {text}", file=out)
