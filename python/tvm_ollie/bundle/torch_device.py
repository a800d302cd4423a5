"""PyTorch on the bundle's device: the same models, eager and ``torch.compile``, timed there.

A standalone script (Python's standard library, numpy and PyTorch; no TVM, no tvm-ollie) that
a bundle carries as ``torch_device.py`` with a copy of the zoo's model definitions (``zoo/``):
where the device has PyTorch with CUDA, ``python3 torch_device.py`` builds each model of the
bundle's manifest with the zoo's seeded weights and inputs, times it as the runner times the
compiled models (3 warm-up calls, median of 20, each synchronized), checks its outputs against
the bundle's CPU references with the runner's tolerance, and prints rows in the runner's table
format (systems ``torch`` and, with ``--compile``, ``torch.compile`` with its compile seconds).
float32 throughout: TF32 is turned off for matmuls and convolutions, as in the compiled models.
"""

import argparse
import os
import sys
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))

#: The bundle's operator cases as PyTorch functions of their inputs.
OPERATORS = {
    "conv3x3_512": lambda x, w: torch.nn.functional.conv2d(x, w, padding=1),
    "convtranspose": lambda x, k: torch.nn.functional.conv_transpose2d(x, k, stride=2,
                                                                       padding=1),
}


def read_manifest(path):
    """``[(name, inputs, outputs)]`` with ``(file, dtype, shape)`` tensors, from manifest.txt."""
    models = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            parts = line.split()
            if not parts:
                continue
            if parts[0] == "model":
                models.append((parts[1], float(parts[2]), float(parts[3]), [], []))
            elif parts[0] in ("input", "output") and models:
                shape = () if parts[3] == "-" else tuple(int(d) for d in parts[3].split(","))
                models[-1][3 if parts[0] == "input" else 4].append((parts[1], parts[2], shape))
    return models


def load(tensor):
    """A bundle tensor file as a numpy array."""
    path, dtype, shape = tensor
    return np.fromfile(os.path.join(HERE, path), dtype=np.dtype(dtype).newbyteorder("<")
                       ).reshape(shape)


def flatten(value):
    """Tensors of a result, tuples and lists flattened, in order."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for v in value.values() for t in flatten(v)]
    return [t for v in value for t in flatten(v)]


def zoo_callable(name, device):
    """``(fn, args)`` of a zoo case (``<model>-<quick|full>-b<batch>``)."""
    if HERE not in sys.path:
        sys.path.insert(0, HERE)
    from zoo.registry import get_model  # pylint: disable=import-outside-toplevel,import-error
    model, size, batch = name.rsplit("-", 2)
    spec = get_model(model, quick=size == "quick", batch=int(batch[1:]))
    module = spec.module.to(device)
    return module, [x.to(device) for x in spec.example_inputs]


def case_callable(name, inputs, device):
    """``(fn, args)`` of a bundle case: an operator case on its stored inputs, or a zoo
    model."""
    if name in OPERATORS:
        return OPERATORS[name], [torch.from_numpy(load(t).copy()).to(device) for t in inputs]
    return zoo_callable(name, device)


def check(outputs, refs, rtol, atol):
    """``(ok, max_abs, rel)`` with the runner's rule ``|out - ref| <= atol * max|ref| + rtol *
    |ref|``."""
    if len(outputs) != len(refs):
        return False, float("nan"), float("nan")
    ok, max_abs, rel = True, 0.0, 0.0
    for out, ref_file in zip(outputs, refs):
        ref = load(ref_file).astype(np.float64)
        got = out.detach().float().cpu().numpy().astype(np.float64).reshape(ref.shape)
        scale = float(np.abs(ref).max()) or 1.0
        err = np.abs(got - ref)
        ok = ok and bool(np.all(err <= atol * scale + rtol * np.abs(ref)))
        max_abs = max(max_abs, float(err.max()))
        rel = max(rel, float(err.max()) / scale)
    return ok, max_abs, rel


def synchronize(device):
    """Wait for the device's queued work (nothing to wait for on the CPU)."""
    if device == "cuda":
        torch.cuda.synchronize()


def timed(fn, args, warmup, repeat, device):
    """Median and fastest milliseconds of one synchronized call."""
    with torch.no_grad():
        for _ in range(warmup):
            fn(*args)
        synchronize(device)
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            fn(*args)
            synchronize(device)
            times.append((time.perf_counter() - t0) * 1e3)
    return float(np.median(times)), float(min(times))


def row(name, system, median, fastest, max_abs, rel, status):
    """One line of the runner's table."""
    return (f"{name:<22} {system:<8} {median:10.4f} {fastest:10.4f} {max_abs:10.3g} "
            f"{rel:10.3g}  {status}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compile", action="store_true", help="also time torch.compile")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--device", default="cuda", help="cuda, or cpu (a local check)")
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    where = torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu"
    print(f"# torch {torch.__version__}, {where}", flush=True)
    failures = 0
    for name, rtol, atol, inputs, outputs in read_manifest(os.path.join(HERE, "manifest.txt")):
        if not outputs:  # (candidate and calibration entries: no reference, not a model)
            continue
        try:
            fn, fargs = case_callable(name, inputs, args.device)
            systems = [("torch", fn)]
            if args.compile:
                systems.append(("torch.compile", torch.compile(fn)))
            for system, f in systems:
                t0 = time.perf_counter()
                with torch.no_grad():
                    result = flatten(f(*fargs))
                synchronize(args.device)
                first_s = time.perf_counter() - t0
                ok, max_abs, rel = check(result, outputs, rtol, atol)
                median, fastest = timed(f, fargs, args.warmup, args.repeat, args.device)
                failures += 0 if ok else 1
                note = f" (first call {first_s:.1f} s)" if system != "torch" else ""
                print(row(name, system, median, fastest, max_abs, rel,
                          ("ok" if ok else "MISMATCH") + note), flush=True)
        except Exception as err:  # pylint: disable=broad-except
            failures += 1
            print(row(name, "torch", float("nan"), float("nan"), float("nan"), float("nan"),
                      f"FAILED: {type(err).__name__}: {str(err)[:120]}"), flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
