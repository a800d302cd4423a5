"""Does GNU OpenMP's spin-wait after a oneDNN call slow the TVM kernels that run right after it?

Builds one Relax module: a native matmul (oneDNN, OpenMP threads) followed by TVM elementwise
kernels on its output (TVM's own thread pool), and times it with the Relax VM in fresh
processes, with ``OMP_WAIT_POLICY`` unset (libgomp spins ~300k iterations after a parallel
region) and with ``OMP_WAIT_POLICY=PASSIVE`` (workers sleep at once). The policy is read when
libgomp starts, so each setting needs its own process.

    python scripts/native_omp_wait.py [--threads 2] [--rounds 30] [--tvm-spin-count 0]
"""

import argparse
import json
import os
import subprocess
import sys

CHILD = r"""
import json, statistics, sys, time
import numpy as np
import tvm
from tvm import relax
import tvm_ollie.native as native
assert native.load(), native.unavailable_reason()
n, rounds = int(sys.argv[1]), int(sys.argv[2])

def build(parts):
    bb = relax.BlockBuilder()
    a = relax.Var("a", relax.TensorType((n, n), "float32"))
    b = relax.Var("b", relax.TensorType((n, n), "float32"))
    c = relax.Var("c", relax.TensorType((n, n), "float32"))
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
    ex = tvm.compile(bb.get(), target=tvm.target.Target({"kind": "llvm", "num-cores": 2}))
    return relax.VirtualMachine(ex, tvm.cpu())["main"]

args = [tvm.runtime.tensor(np.random.rand(n, n).astype("float32")) for _ in range(3)]
fns = {k: build(k) for k in ("mm", "ew", "mm+ew")}
res = {}
for k, f in fns.items():
    for _ in range(5):
        f(*args)
times = {k: [] for k in fns}
for r in range(rounds):
    for k, f in fns.items():
        t = time.perf_counter(); f(*args); times[k].append(time.perf_counter() - t)
print(json.dumps({k: statistics.median(v) * 1e3 for k, v in times.items()}))
"""


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=int(os.environ.get("TVM_NUM_THREADS", 2)))
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--sizes", default="256,512")
    parser.add_argument("--policies", default="unset,ACTIVE,PASSIVE")
    parser.add_argument("--tvm-spin-count", default=None,
                        help="TVM_THREAD_POOL_SPIN_COUNT for the children (default: TVM's)")
    opts = parser.parse_args()
    rows = []
    for n in map(int, opts.sizes.split(",")):
        for policy in opts.policies.split(","):
            env = dict(os.environ, TVM_NUM_THREADS=str(opts.threads))
            env.pop("TVM_THREAD_POOL_SPIN_COUNT", None)
            if opts.tvm_spin_count is not None:
                env["TVM_THREAD_POOL_SPIN_COUNT"] = opts.tvm_spin_count
            env.pop("OMP_WAIT_POLICY", None)
            env["TVM_OLLIE_OMP_WAIT_POLICY"] = "unset"
            if policy != "unset":
                env["OMP_WAIT_POLICY"] = policy
            out = subprocess.run([sys.executable, "-c", CHILD, str(n), str(opts.rounds)], env=env,
                                 check=True, capture_output=True, text=True).stdout
            rows.append((n, policy, json.loads(out.strip().splitlines()[-1])))
    print("| n | OMP_WAIT_POLICY | matmul (ms) | 4 TVM elementwise (ms) "
          "| matmul + elementwise (ms) |")
    print("|---|---|---|---|---|")
    for n, policy, t in rows:
        print(f"| {n} | {policy} | {t['mm']:.3f} | {t['ew']:.3f} | {t['mm+ew']:.3f} |")


if __name__ == "__main__":
    main()
