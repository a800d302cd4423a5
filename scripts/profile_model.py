"""Per-kernel time of a zoo model built by the pass, as the user's ONNX path builds it.

Exports the quick model to ONNX (opset 17), loads it as the CLI does, builds it with ``trials=0``
and runs it on the Relax VM with an instrument that times every call (native kernels, TVM
kernels, VM builtins): where a model's time goes in the model, which can differ from what the
pass measured for each unit alone (an epilogue folded afterwards, cache effects). Also prints the
median of the whole model and of eager PyTorch, interleaved in the same process.

    TVM_NUM_THREADS=1 OMP_NUM_THREADS=1 python scripts/profile_model.py dcgan [--runs 20]
"""

import argparse
import logging
import os
import tempfile
import time

import torch
import tvm
from tvm import relax

from tvm_ollie.bench.user_path import _export
from tvm_ollie.frontend.loader import load_module
from tvm_ollie.models.registry import get_model
from tvm_ollie.pipeline import build


def _median_ms(fn, runs):
    fn()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2] * 1e3


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("model")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--time-budget", type=float, default=5.0)
    args = parser.parse_args()
    logging.getLogger("tvm_ollie").setLevel(logging.ERROR)
    torch.set_num_threads(int(os.environ.get("TVM_NUM_THREADS", "1")))
    spec = get_model(args.model, quick=True)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, f"{args.model}.onnx")
        _export(spec, path, 17, False)
        shapes = [f"input{i}={','.join(map(str, t.shape))}"
                  for i, t in enumerate(spec.example_inputs)]
        mod = load_module(path, shapes)
    start = time.perf_counter()
    ex, rep = build(mod, "llvm", trials=0, time_budget_s=args.time_budget)
    print(f"build {time.perf_counter() - start:.1f} s")
    print(rep.to_text())
    dev = tvm.cpu()
    inputs = [tvm.runtime.tensor(t.numpy()) for t in spec.example_inputs]
    vm = relax.VirtualMachine(ex, dev)
    main_fn = vm["main"]

    def eager():
        with torch.no_grad():
            spec.module(*spec.example_inputs)

    for _ in range(2):  # interleaved rounds
        print(f"ollie median {_median_ms(lambda: main_fn(*inputs), args.runs):.3f} ms, "
              f"eager median {_median_ms(eager, args.runs):.3f} ms")
    started, spent = {}, {}

    def instrument(func, name, before, ret, *call_args):  # pylint: disable=unused-argument
        if before:
            started[name] = time.perf_counter()
            return
        out = call_args[-1] if call_args else None
        key = f"{name} {tuple(out.shape)}" if hasattr(out, "shape") else name
        spent.setdefault(key, []).append(time.perf_counter() - started[name])

    vm.set_instrument(instrument)
    for _ in range(args.runs):
        main_fn(*inputs)
    print("per call, us (median over runs; total per run):")
    for key, times in sorted(spent.items(), key=lambda kv: -sum(kv[1])):
        times = sorted(times)
        print(f"  {sum(times) / args.runs * 1e6:9.1f} total  {times[len(times) // 2] * 1e6:9.1f}"
              f" median  x{len(times) // args.runs}  {key}")


if __name__ == "__main__":
    main()
