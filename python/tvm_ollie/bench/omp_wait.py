"""Does GNU OpenMP's spin-wait after a oneDNN call slow the TVM kernels that run right after it?

    python -m tvm_ollie.bench.omp_wait [--threads 2] [--rounds 30] [--sizes 256,512]
        [--policies unset,ACTIVE,PASSIVE] [--tvm-spin-count 0]

Builds Relax modules of a native matmul (oneDNN, OpenMP threads), four TVM elementwise kernels
(TVM's own thread pool), and the matmul followed by the elementwise kernels on its output, and
times them with the Relax VM in interleaved rounds (:func:`~.timing.measure_interleaved`, single
calls back to back, no pause: the pause would hide the spinning), medians in ms. Each
``OMP_WAIT_POLICY`` runs in a fresh process (this module with ``--child``), because libgomp reads
the policy when it starts: ``unset`` (libgomp spins ~300k iterations after a parallel region;
the loader's own ``PASSIVE`` default is turned off for it), ``ACTIVE`` and ``PASSIVE`` (workers
sleep at once).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from typing import Dict, List, Optional, Sequence

import numpy as np

from .. import native
from ..compat import relax, tvm
from .table import markdown_table
from .timing import measure_interleaved

#: The three modules of one process, in table order.
PARTS = ("mm", "ew", "mm+ew")


def _build(parts: str, n: int):
    """``main(a, b, c)``: ``a @ b`` on the native matmul (``mm``), then 4x relu(y * c + c)."""

    bb = relax.BlockBuilder()
    a, b, c = (relax.Var(name, relax.TensorType((n, n), "float32")) for name in "abc")
    with bb.function("main", [a, b, c]):
        with bb.dataflow():
            y = a
            if "mm" in parts:
                attrs = tvm.ir.StringImm("lib=onednn")
                y = bb.emit(relax.call_dps_packed(native.MATMUL, [attrs, a, b],
                                                  relax.TensorType((n, n), "float32")))
            if "ew" in parts:
                for _ in range(4):
                    y = bb.emit(relax.op.nn.relu(relax.op.add(relax.op.multiply(y, c), c)))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    threads = int(os.environ.get("TVM_NUM_THREADS", "2"))
    ex = tvm.compile(bb.get(), target=tvm.target.Target({"kind": "llvm", "num-cores": threads}))
    return relax.VirtualMachine(ex, tvm.cpu())["main"]


def child(n: int, rounds: int) -> Dict[str, float]:
    """In this process: ``{part: median ms}`` of the three modules at size ``n``."""

    if not native.load():
        raise RuntimeError(f"native library unavailable: {native.unavailable_reason()}")
    rng = np.random.default_rng(0)
    args = [tvm.runtime.tensor(rng.random((n, n), dtype=np.float32)) for _ in range(3)]
    fns = {part: _build(part, n) for part in PARTS}
    for fn in fns.values():  # four warm-up calls each, besides measure_interleaved's one
        for _ in range(4):
            fn(*args)
    samples = measure_interleaved({k: (lambda f=f: f(*args)) for k, f in fns.items()},
                                  budget_s=math.inf, min_rounds=rounds, max_rounds=rounds,
                                  min_sample_s=0.0, gap_s=0.0)
    return {k: s.median * 1e3 for k, s in samples.items()}


def child_env(policy: str, threads: int, tvm_spin_count: Optional[str]) -> Dict[str, str]:
    """The environment of the process that measures ``policy`` (``unset`` or a policy)."""
    env = dict(os.environ, TVM_NUM_THREADS=str(threads), TVM_OLLIE_OMP_WAIT_POLICY="unset")
    env.pop("TVM_THREAD_POOL_SPIN_COUNT", None)
    env.pop("OMP_WAIT_POLICY", None)
    if tvm_spin_count is not None:
        env["TVM_THREAD_POOL_SPIN_COUNT"] = tvm_spin_count
    if policy != "unset":
        env["OMP_WAIT_POLICY"] = policy
    return env


def run_child(n: int, rounds: int, env: Dict[str, str]) -> Dict[str, float]:
    """Run :func:`child` in a fresh process with ``env``; its ``{part: median ms}``."""
    cmd = [sys.executable, "-m", "tvm_ollie.bench.omp_wait", "--child", str(n), str(rounds)]
    res = subprocess.run(cmd, env=env, check=False, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({res.returncode}): {res.stderr[-2000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Print one Markdown table, a row per size and policy."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=int(os.environ.get("TVM_NUM_THREADS", 2)),
                        help="TVM_NUM_THREADS of the children")
    parser.add_argument("--rounds", type=int, default=30, help="interleaved rounds")
    parser.add_argument("--sizes", default="256,512", help="matrix sizes n, comma-separated")
    parser.add_argument("--policies", default="unset,ACTIVE,PASSIVE",
                        help="OMP_WAIT_POLICY values, comma-separated (unset: none)")
    parser.add_argument("--tvm-spin-count", default=None,
                        help="TVM_THREAD_POOL_SPIN_COUNT for the children (default: TVM's)")
    parser.add_argument("--child", nargs=2, type=int, metavar=("N", "ROUNDS"),
                        help=argparse.SUPPRESS)
    opts = parser.parse_args(argv)
    if opts.child:
        print(json.dumps(child(*opts.child)))
        return 0
    rows: List[List[str]] = []
    for n in map(int, opts.sizes.split(",")):
        for policy in opts.policies.split(","):
            env = child_env(policy, opts.threads, opts.tvm_spin_count)
            t = run_child(n, opts.rounds, env)
            rows.append([str(n), policy] + [f"{t[part]:.3f}" for part in PARTS])
    print(f"### matmul then TVM kernels, ms, median of {opts.rounds} interleaved rounds, "
          f"{opts.threads} threads\n")
    print(markdown_table(["n", "OMP_WAIT_POLICY", "matmul", "4 TVM elementwise",
                          "matmul + elementwise"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
