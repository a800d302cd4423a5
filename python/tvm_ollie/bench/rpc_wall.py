"""Wall time of MetaSchedule tuning through TVM's RPC tracker, with 1 and with 2 local servers.

    TVM_NUM_THREADS=2 python -m tvm_ollie.bench.rpc_wall [--trials 64] [--servers 1 2]
        [--channels 64] [--size 56]

Tunes one conv2d (``1 x C x S x S`` data, ``C`` 3x3 filters, pad 1; by default 1x64x56x56 and
64 filters) for llvm with ``--trials`` trials, every trial measured through a
:class:`tvm_ollie.tune.LocalCluster` (a tracker and servers on 127.0.0.1), once per server
count, each time in a fresh work directory. Prints a table: servers, trials, wall seconds of the
tuning (the cluster start is timed apart), the trials each server measured (from its log) and
the tuned kernel's remote median time.

On one machine the servers share its cores, so two servers are not expected to be faster; the
run shows that the path works and what it costs. Needs ``tornado`` (the ``rpc`` extra).
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from typing import List, Optional, Sequence

from ..compat import relax, tvm
from ..frontend.builder import single_function_module, tensor_var
from ..tune import LocalCluster, RPCError, Tuner, compile_module, random_args, time_main
from .table import markdown_table


def conv_module(channels: int = 64, size: int = 56) -> "tvm.IRModule":
    """conv2d ``1 x channels x size x size`` * ``channels x channels x 3 x 3``, pad 1."""
    return single_function_module(
        [tensor_var("x", (1, channels, size, size)), tensor_var("w", (channels, channels, 3, 3))],
        lambda bb, x, w: relax.op.nn.conv2d(x, w, padding=1))


def tune_once(mod: "tvm.IRModule", inputs, servers: int, trials: int) -> List[str]:
    """Tune ``mod`` through ``servers`` local servers; the table row of the run."""
    t0 = time.perf_counter()
    with LocalCluster(servers, key=f"wall-{servers}") as cluster, \
            tempfile.TemporaryDirectory(prefix=f"ollie_wall{servers}_") as work_dir:
        started = time.perf_counter() - t0
        cfg = cluster.config(workers=servers)
        tuner = Tuner("llvm", work_dir, rpc=cfg)
        t1 = time.perf_counter()
        ex = compile_module(mod, "llvm", tuner, trials=trials)
        tuning = time.perf_counter() - t1
        loads = cluster.loads()
        kernel = time_main(ex, inputs, rpc=cfg, target="llvm")
    per_server = ", ".join(str(loads[i]) for i in sorted(loads))
    return [str(servers), str(trials), f"{tuning:.1f}", f"{started:.1f}", per_server,
            f"{kernel * 1e3:.3f}"]


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Print one Markdown table, a row per server count; 2 when the tracker cannot run."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=64, help="MetaSchedule trials")
    parser.add_argument("--servers", type=int, nargs="+", default=[1, 2],
                        help="server counts, one run each")
    parser.add_argument("--channels", type=int, default=64, help="conv channels C")
    parser.add_argument("--size", type=int, default=56, help="conv data height and width S")
    opts = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    mod = conv_module(opts.channels, opts.size)
    inputs = random_args(mod["main"])
    rows = []
    for servers in opts.servers:
        try:
            rows.append(tune_once(mod, inputs, servers, opts.trials))
        except RPCError as err:
            print(f"rpc_wall: {err}", file=sys.stderr)
            return 2
        print(f"servers={servers}: done", flush=True)
    print(f"\n### MetaSchedule through the RPC tracker, conv2d 1x{opts.channels}x{opts.size}"
          f"x{opts.size}, 3x3, {opts.channels} filters\n")
    print(markdown_table(["servers (RPCRunner workers)", "trials", "tuning wall (s)",
                          "cluster start (s)", "trials measured per server",
                          "tuned kernel (remote, ms)"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
