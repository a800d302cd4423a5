"""Small Relax models for the pass tests (random weights are supplied at run time)."""

import numpy as np
import tvm
from tvm import relax

from tvm_ollie.codegen.builder import single_function_module as _module
from tvm_ollie.codegen.builder import tensor_var as _var
from tvm_ollie.tune.calibrate import EFFICIENCY, Calibration

#: A fixed calibration on llvm with the GPU efficiency table (GEMMs beat direct convolutions):
#: decisions in tests must not depend on the machine's load, and must rewrite something.
LLVM_CALIB = Calibration("llvm", 1e11, 2e10, dict(EFFICIENCY["cuda"]), "given")


def conv3x3():
    """One conv2d 3x3, pad 1: 1x8x8x8 data, 16 filters."""
    return _module([_var("x", (1, 8, 8, 8)), _var("w", (16, 8, 3, 3))],
                   lambda bb, x, w: relax.op.nn.conv2d(x, w, padding=1))


def conv1x1():
    """One pointwise conv2d (a matmul in disguise)."""
    return _module([_var("x", (1, 16, 6, 6)), _var("w", (8, 16, 1, 1))],
                   lambda bb, x, w: relax.op.nn.conv2d(x, w))


def conv_stack():
    """conv3x3 -> relu -> conv3x3 (same signature twice) -> conv1x1."""

    def body(bb, x, w1, w2, w3, w4):
        y = bb.emit(relax.op.nn.relu(relax.op.nn.conv2d(x, w1, padding=1)))
        y = bb.emit(relax.op.nn.conv2d(y, w2, padding=1))
        y = bb.emit(relax.op.nn.conv2d(y, w3, padding=1))
        return relax.op.nn.conv2d(y, w4)

    return _module([_var("x", (1, 4, 8, 8)), _var("w1", (8, 4, 3, 3)), _var("w2", (8, 8, 3, 3)),
                    _var("w3", (8, 8, 3, 3)), _var("w4", (4, 8, 1, 1))], body)


def conv_transpose_stack():
    """conv2d_transpose (stride 2) -> relu -> conv2d_transpose (stride 1) -> conv3x3."""

    def body(bb, x, k1, k2, w):
        y = bb.emit(relax.op.nn.relu(relax.op.nn.conv2d_transpose(x, k1, strides=2, padding=1)))
        y = bb.emit(relax.op.nn.conv2d_transpose(y, k2, padding=1))
        return relax.op.nn.conv2d(y, w, padding=1)

    return _module([_var("x", (1, 8, 4, 4)), _var("k1", (8, 4, 4, 4)), _var("k2", (4, 4, 3, 3)),
                    _var("w", (4, 4, 3, 3))], body)


def mlp():
    """Two matmul + bias + relu layers."""

    def body(bb, x, w1, b1, w2):
        h = bb.emit(relax.op.nn.relu(relax.op.add(relax.op.matmul(x, w1), b1)))
        return relax.op.matmul(h, w2)

    return _module([_var("x", (4, 32)), _var("w1", (32, 64)), _var("b1", (64,)),
                    _var("w2", (64, 16))], body)


def bmm_block():
    """Attention-like batched matmuls: (q @ k^T) @ v."""

    def body(bb, q, k, v):
        s = bb.emit(relax.op.matmul(q, relax.op.permute_dims(k, [0, 2, 1])))
        return relax.op.matmul(s, v)

    return _module([_var("q", (2, 8, 16)), _var("k", (2, 8, 16)), _var("v", (2, 8, 16))], body)


MODELS = {"conv_stack": conv_stack, "conv_transpose_stack": conv_transpose_stack, "mlp": mlp,
          "bmm_block": bmm_block}


def random_inputs(mod, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal([int(s) for s in p.ty.shape]).astype("float32")
            for p in mod["main"].params]


def run(ex, args, dev=None):
    dev = dev or tvm.cpu()
    vm = relax.VirtualMachine(ex, dev)
    return vm["main"](*[tvm.runtime.tensor(a, dev) for a in args]).numpy()


def assert_close(got, ref, rtol=1e-4):
    scale = max(float(np.max(np.abs(ref))), 1e-6)
    err = float(np.max(np.abs(got.astype(np.float64) - ref)))
    assert got.shape == ref.shape
    assert err <= rtol * scale, f"max abs err {err} vs scale {scale}"


def ops_in(mod, name="main"):
    """Names of the Relax ops/PrimFuncs called in a function (call_tir callees by name)."""
    found = []

    def visit(e):
        if isinstance(e, relax.Call):
            if isinstance(e.op, tvm.ir.Op):
                if e.op.name == "relax.call_tir":
                    found.append("call_tir:" + e.args[0].name_hint)
                else:
                    found.append(e.op.name)

    relax.analysis.post_order_visit(mod[name].body, visit)
    return found
