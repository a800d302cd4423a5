"""Wall time of MetaSchedule tuning through TVM's RPC tracker, with 1 and with 2 local servers.

Tunes one conv2d (1x64x56x56 data, 64 3x3 filters, pad 1) for llvm with ``--trials`` trials,
measuring through a :class:`tvm_ollie.tune.LocalCluster` (tracker and servers on 127.0.0.1)
once per server count, each time in a fresh work directory. Prints one line per run: servers,
trials, wall seconds of the tuning (the cluster start is timed apart), the tuned kernel's remote
median time, and the trials each server measured (from its log).

On one machine the servers share its cores, so two servers are not expected to be faster; the
run shows that the path works and what it costs.

    PYTHONPATH=python python scripts/rpc_tuning_wall.py --trials 64
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import time

from tvm_ollie.compat import relax
from tvm_ollie.codegen.builder import single_function_module, tensor_var
from tvm_ollie.tune import LocalCluster, Tuner, compile_module, random_args, time_main


def conv_module():
    """conv2d 1x64x56x56 * 64x64x3x3, pad 1."""
    return single_function_module(
        [tensor_var("x", (1, 64, 56, 56)), tensor_var("w", (64, 64, 3, 3))],
        lambda bb, x, w: relax.op.nn.conv2d(x, w, padding=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=64)
    parser.add_argument("--servers", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    mod = conv_module()
    inputs = random_args(mod["main"])
    for n in args.servers:
        t0 = time.perf_counter()
        with LocalCluster(n, key=f"wall-{n}") as cluster:
            started = time.perf_counter() - t0
            cfg = cluster.config(workers=n)
            tuner = Tuner("llvm", tempfile.mkdtemp(prefix=f"ollie_wall{n}_"), rpc=cfg)
            t1 = time.perf_counter()
            ex = compile_module(mod, "llvm", tuner, trials=args.trials)
            tuning = time.perf_counter() - t1
            loads = cluster.loads()
            kernel = time_main(ex, inputs, rpc=cfg, target="llvm")
        print(f"servers={n} trials={args.trials} tuning_wall_s={tuning:.1f} "
              f"cluster_start_s={started:.1f} tuned_remote_ms={kernel * 1e3:.3f} "
              f"measured_per_server={[loads[i] for i in sorted(loads)]}", flush=True)


if __name__ == "__main__":
    main()
