"""Latency of an unrolled recurrent layer: one system per process, timed alone (median); the
table of the recurrent section of ``docs/onnx-operators.md``.

The model: one ``LSTM`` (or ``GRU``/``RNN`` with ``--op``) node, sequence 32, batch 1, input 64,
hidden 128, forward, with bias, from seeded random weights (``onnx.helper``). Systems:

* ``ort``: ONNX Runtime (CPU provider, one intra-op thread);
* ``tvm``: tvm-ollie's loader (the layer unrolled), then TVM's default pipeline
  (``tvm.compile``, untuned);
* ``ollie``: the same import through ``tvm_ollie.build`` (the pass with the native library,
  the default options; ``--no-groups``: without shared-input groups, ``merge_group=1``).

The ``tvm_ollie`` imported decides the importer and the pass (a checkout's, with ``OLLIE_WT``).

    TVM_NUM_THREADS=1 python tests/frontend/rnn_latency.py {ort,tvm,ollie} [--op LSTM]
        [--rounds 1000] [--no-groups]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

SEQ, BATCH, INPUT, HIDDEN = 32, 1, 64, 128
GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}


def recurrent_model(op: str):
    """One forward ``op`` layer with bias, seeded random weights."""
    # pylint: disable=import-outside-toplevel
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    gates = GATES[op]

    def rand(*shape):
        return (rng.standard_normal(shape) * 0.1).astype(np.float32)

    inits = {"W": rand(1, gates * HIDDEN, INPUT), "R": rand(1, gates * HIDDEN, HIDDEN),
             "B": rand(1, 2 * gates * HIDDEN)}  # fmt: skip
    outputs = ["y", "y_h", "y_c"][:3 if op == "LSTM" else 2]
    node = helper.make_node(op, ["x", "W", "R", "B"], outputs, hidden_size=HIDDEN)
    graph = helper.make_graph(
        [node], op.lower(),
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [SEQ, BATCH, INPUT])],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs],
        [numpy_helper.from_array(a, n) for n, a in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def median_ms(fn, rounds: int) -> float:
    """Median of ``rounds`` calls of ``fn`` after 10 warm-up calls, in milliseconds."""
    for _ in range(10):
        fn()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("system", choices=["ort", "tvm", "ollie"])
    parser.add_argument("--op", choices=sorted(GATES), default="LSTM")
    parser.add_argument("--rounds", type=int, default=1000)
    parser.add_argument("--no-groups", action="store_true",
                        help="ollie: no shared-input groups (merge_group=1)")
    args = parser.parse_args()
    # pylint: disable=import-outside-toplevel
    import onnxruntime as ort

    model = recurrent_model(args.op)
    x = np.random.default_rng(1).standard_normal((SEQ, BATCH, INPUT)).astype(np.float32)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = opts.inter_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), opts,
                                providers=["CPUExecutionProvider"])  # fmt: skip
    reference = sess.run(None, {"x": x})
    if args.system == "ort":
        print(f"{args.op} ort {median_ms(lambda: sess.run(None, {'x': x}), args.rounds):.3f} ms")
        return
    import tvm
    from tvm import relax

    import tvm_ollie
    from tvm_ollie.frontend.loader import load_onnx

    mod = load_onnx(model)
    start = time.perf_counter()
    note = ""
    if args.system == "tvm":
        executable = tvm.compile(mod, "llvm")
    else:
        options = {"merge_group": 1} if args.no_groups else {}
        executable, report = tvm_ollie.build(mod, "llvm", **options)
        groups = [r for r in report.regions if " share " in r.contents]
        note = "; groups: " + ", ".join(
            f"{len(r.contents.split(', '))} bindings {'merged' if r.rewritten else 'kept'}"
            for r in groups) if groups else "; no group"  # fmt: skip
    build_s = time.perf_counter() - start
    vm = relax.VirtualMachine(executable, tvm.cpu())
    xt = tvm.runtime.tensor(x)
    error = max(float(np.abs(o.numpy() - r).max()) for o, r in zip(vm["main"](xt), reference))
    ms = median_ms(lambda: vm["main"](xt), args.rounds)
    print(f"{args.op} {args.system} ({os.path.dirname(tvm_ollie.__file__)}) {ms:.3f} ms, "
          f"build {build_s:.1f} s, max error vs ORT {error:.1e}{note}")


if __name__ == "__main__":
    main()
