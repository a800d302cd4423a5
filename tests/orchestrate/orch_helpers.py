"""Small Relax modules and a fixed-roof cost for the orchestration tests."""

from __future__ import annotations

import random

import numpy as np

from tvm_ollie.compat import relax, tvm
from tvm_ollie.codegen.builder import single_function_module, tensor_var
from tvm_ollie.tune.calibrate import EFFICIENCY, Calibration

#: A fixed roof, so decisions do not depend on this machine's load.
CALIB = Calibration("llvm", 1e11, 1e10, dict(EFFICIENCY["llvm"]), "given")


def const(shape, seed=0):
    rng = np.random.default_rng(seed)
    return relax.const(rng.standard_normal(shape).astype("float32") * 0.5)


def random_dag_module(n_nodes: int, seed: int) -> "tvm.IRModule":
    """A chain-free random DAG of elementwise ops on one 4x4 input: each node is ``relu`` of
    one earlier value or ``add`` of two; the last node and some random others are outputs."""
    rnd = random.Random(seed)

    def body(bb, x):
        values = [x]
        for _ in range(n_nodes):
            if rnd.random() < 0.5 or len(values) < 2:
                v = bb.emit(relax.op.nn.relu(rnd.choice(values)))
            else:
                a, b = rnd.sample(values, 2)
                v = bb.emit(relax.op.add(a, b))
            values.append(v)
        extra = [v for v in values[1:-1] if rnd.random() < 0.2]
        outs = extra + [values[-1]]
        return relax.Tuple(outs) if len(outs) > 1 else outs[0]

    return single_function_module([tensor_var("x", (4, 4))], body)


def run(ex, args):
    vm = relax.VirtualMachine(ex, tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(a) for a in args])
    return flatten(out)


def flatten(out):
    if hasattr(out, "numpy"):
        return [out.numpy()]
    res = []
    for o in out:
        res.extend(flatten(o))
    return res


def random_args(mod, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal([int(s) for s in p.ty.shape]).astype("float32")
            for p in mod["main"].params]
