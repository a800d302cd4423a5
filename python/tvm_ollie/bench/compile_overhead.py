"""``python -m tvm_ollie.bench.compile_overhead``: where a ``torch.compile`` call's time goes.

For each zoo model at its quick size, ``torch.compile(model, backend="tvm_ollie")`` is built
with the weights frozen (the default) and, with ``--unfrozen``, also with
``options={"freeze": False}`` (the weights as graph inputs, as before freezing). Per variant and
graph it prints how many graph inputs were frozen, then the time per call of three layers,
measured in interleaved rounds (min and median over rounds):

* ``vm``: the Relax VM's ``main`` alone, on fixed TVM tensors;
* ``backend``: the function the backend hands dynamo (guard of the frozen weights, DLPack in and
  out, the VM);
* ``compiled``: the whole ``torch.compile``-d module (dynamo's guards and wrappers on top);

and eager PyTorch. The clock is the process's CPU time by default (``--clock wall`` for wall
time): on a shared machine other processes' load disturbs it much less.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import time
import warnings
from typing import Callable, Dict, List, Optional, Sequence

from ..frontend import torch_backend
from ..frontend.torch_entry import to_tvm
from ..models.registry import get_model

CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def per_call_ms(fn: Callable[[], object], calls: int, clock: Callable[[], float]) -> float:
    """Mean milliseconds of ``fn()`` over ``calls`` calls after one untimed call."""
    fn()
    start = clock()
    for _ in range(calls):
        fn()
    return (clock() - start) / calls * 1e3


def variant(spec, freeze: bool, opts: dict) -> Dict[str, Callable[[], object]]:
    """Compile ``spec.module`` with the backend; the timed layers of its first graph."""
    # pylint: disable=import-outside-toplevel
    # lazy: torch is a heavy, optional dependency
    import torch

    graphs = []

    def backend(gm, example_inputs):
        fn = torch_backend.tvm_ollie_backend(gm, example_inputs, dict(opts, freeze=freeze))
        graphs.append((list(example_inputs), fn))
        return fn

    torch._dynamo.reset()  # pylint: disable=protected-access
    compiled = torch.compile(spec.module, backend=backend, dynamic=False)
    with torch.no_grad():
        compiled(*spec.example_inputs)
    layers = {}
    for k, (inputs, fn) in enumerate(graphs):
        frozen = getattr(fn, "frozen", None)
        if frozen is None:
            print(f"  graph {k}: runs in eager PyTorch", file=sys.stderr)
            continue
        print(f"  freeze={freeze} graph {k}: {len(inputs)} inputs, {frozen.count} frozen",
              file=sys.stderr)
        if k == 0:
            args = [to_tvm(inputs[i]) for i in frozen.live]
            layers["vm"] = lambda main=fn.main, args=args: main(*args)
            layers["backend"] = lambda fn=fn, inputs=inputs: fn(*inputs)
    layers["compiled"] = lambda: compiled(*spec.example_inputs)
    return layers


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Command line (see the module docstring)."""
    parser = argparse.ArgumentParser(prog="python -m tvm_ollie.bench.compile_overhead",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["fsrcnn"], help="zoo models")
    parser.add_argument("--unfrozen", action="store_true",
                        help="also the weights as graph inputs (options={'freeze': False})")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=50, help="calls per round and layer")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="cpu")
    parser.add_argument("--search-time", type=float, default=2.0,
                        help="derivation time per build (seconds)")
    args = parser.parse_args(argv)
    # pylint: disable=import-outside-toplevel
    # lazy: torch is a heavy, optional dependency
    import torch

    logging.getLogger("tvm_ollie").setLevel(logging.ERROR)
    warnings.simplefilter("ignore")
    torch.set_num_threads(int(os.environ.get("TVM_NUM_THREADS", "1")))
    clock = CLOCKS[args.clock]
    for name in args.models:
        spec = get_model(name, quick=True)
        layers: Dict[str, Callable[[], object]] = {}
        for freeze in ((True, False) if args.unfrozen else (True,)):
            for layer, fn in variant(spec, freeze, dict(search_time_s=args.search_time)).items():
                layers[f"freeze={freeze} {layer}"] = fn
        layers["eager"] = lambda spec=spec: spec.module(*spec.example_inputs)
        times: Dict[str, List[float]] = {k: [] for k in layers}
        with torch.no_grad():
            for _ in range(args.rounds):
                for key, fn in layers.items():
                    times[key].append(per_call_ms(fn, args.calls, clock))
        for key, values in times.items():
            print(f"{name} {key:<24} min {min(values):.3f} ms  median "
                  f"{statistics.median(values):.3f} ms ({args.clock})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
