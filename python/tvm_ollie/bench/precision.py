"""Float16 against float32 builds of zoo models: error and latency.

``python -m tvm_ollie.bench.precision --models resnet18 csrnet fsrcnn`` builds each model (quick
size) with the ollie pass in float32 and in float16 (``build(..., dtype="float16")``: TVM's
``ToMixedPrecision``, then the pass) and, as the baseline of the float16 numbers, plain TVM on
the same float16 module. Every build runs on the model's example inputs; errors are against the
float32 ollie build (max absolute, and max absolute relative to the largest magnitude of the
float32 output), latencies are medians of the Relax VM's ``time_evaluator``. CPU (llvm) only:
x86 CPUs without float16 arithmetic convert on every operation, so float16 may well be slower
there; the numbers say so rather than assume.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from typing import List, Optional, Sequence

import numpy as np

from ..compat import relax, tvm
from ..config import DEFAULTS
from ..models.export import to_relax
from ..models.registry import get_model
from ..pipeline import build
from ..transform.precision import to_precision
from ..tune.measure import time_main

__all__ = ["PrecisionRow", "compare_precision", "main"]

#: Conv models of the zoo measured by default.
DEFAULT_MODELS = ("resnet18", "csrnet", "fsrcnn")


@dataclasses.dataclass
class PrecisionRow:
    """One build of one model."""

    model: str
    build: str  # "ollie-fp32", "ollie-fp16", "tvm-fp16"
    latency_ms: float
    max_abs_err: float
    rel_err: float  # max abs error / max |fp32 output|
    rewritten: int  # operators the pass replaced
    compile_s: float

    def line(self) -> str:
        """One Markdown table row."""
        return (f"| {self.model} | {self.build} | {self.latency_ms:.3f} | {self.max_abs_err:.3g} "
                f"| {self.rel_err:.3g} | {self.rewritten} | {self.compile_s:.1f} |")


HEADER = ("| model | build | median latency (ms) | max abs err vs ollie-fp32 | rel err | "
          "rewritten ops | compile (s) |\n|---|---|---|---|---|---|---|")


def _run(ex, args: Sequence[np.ndarray], repeat: int):
    vm = relax.VirtualMachine(ex, tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(a) for a in args])
    out = out[0] if not hasattr(out, "numpy") else out
    value = out.numpy().astype(np.float64)
    seconds = time_main(ex, args, number=1, repeat=repeat)
    return value, seconds * 1e3


def compare_precision(model: str, repeat: int = 20,
                      search_time_s: float = DEFAULTS.search_time_s,
                      quick: bool = True) -> List[PrecisionRow]:
    """The three builds of ``model`` (see the module docstring)."""

    spec = get_model(model, quick=quick)
    mod, params = to_relax(spec)
    args = [x.numpy() for x in spec.example_inputs] + [p.numpy() for p in params]
    rows, ref = [], None
    for label, dtype in (("ollie-fp32", "float32"), ("ollie-fp16", "float16"),
                         ("tvm-fp16", "float16")):
        t0 = time.perf_counter()
        if label.startswith("ollie"):
            ex, report = build(mod, target="llvm", dtype=dtype, search_time_s=search_time_s)
            rewritten = len(report.rewritten)
        else:
            ex, rewritten = tvm.compile(to_precision(mod, dtype), target="llvm"), 0
        compile_s = time.perf_counter() - t0
        value, latency = _run(ex, args, repeat)
        if ref is None:
            ref = value
        err = float(np.max(np.abs(value - ref)))
        scale = float(np.max(np.abs(ref))) or 1.0
        rows.append(PrecisionRow(model, label, latency, err, err / scale, rewritten, compile_s))
    return rows


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Print the table for ``--models``."""
    parser = argparse.ArgumentParser(prog="python -m tvm_ollie.bench.precision",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS))
    parser.add_argument("--repeat", type=int, default=20, help="timed runs per build")
    parser.add_argument("--search-time", type=float, default=DEFAULTS.search_time_s,
                        help="derivation time per model build (seconds)")
    parser.add_argument("--full", action="store_true", help="paper sizes instead of quick ones")
    args = parser.parse_args(argv)
    print(HEADER, flush=True)
    for model in args.models:
        for row in compare_precision(model, args.repeat, args.search_time, not args.full):
            print(row.line(), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
