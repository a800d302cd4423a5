"""Helpers of the native-kernel tests: calling a kernel directly (tvm-ffi) or through Relax."""

import contextlib
import os

import numpy as np
import pytest

from tvm_ollie import native


def require_native():
    """Skip the calling test when the native library is not loaded, with the reason."""
    if not native.available():
        pytest.skip(f"native library unavailable: {native.unavailable_reason()}")


@contextlib.contextmanager
def two_threads_stall_on():
    """Two native threads, every call parallel (no serial threshold), the stall fallback on; the
    process's settings restored after (and any serial window closed)."""
    flops, threads = native.get_serial_flops(), native.get_num_threads()
    native.set_num_threads(2)  # a real team even on a one-core machine (correctness only)
    native.set_serial_flops(0)
    native.set_stall_fallback(True)
    try:
        yield
    finally:
        native.hold_serial(0)
        native.set_stall_fallback(os.environ.get("TVM_OLLIE_STALL_FALLBACK") != "0")
        native.set_serial_flops(flops)
        native.set_num_threads(threads)


def call_direct(name, attrs, arrays, out_shape):
    """Call global function `name` with (attrs, *arrays, out) and return out (numpy)."""
    import tvm_ffi

    func = tvm_ffi.get_global_func(name)
    out = np.full(out_shape, np.nan, dtype="float32")
    args = [tvm_ffi.from_dlpack(np.ascontiguousarray(a)) for a in arrays]
    func(attrs, *args, tvm_ffi.from_dlpack(out))
    return out


def call_relax(name, attrs, arrays, out_shape):
    """Build a one-call Relax function (call_dps_packed) with tvm.compile and run it on the VM."""
    import tvm
    from tvm import relax

    bb = relax.BlockBuilder()
    params = [relax.Var(f"x{i}", relax.TensorType(a.shape, "float32"))
              for i, a in enumerate(arrays)]
    with bb.function("main", params):
        with bb.dataflow():
            y = bb.emit(
                relax.call_dps_packed(
                    name,
                    [tvm.ir.StringImm(attrs)] + params,
                    relax.TensorType(tuple(out_shape), "float32"),
                )
            )
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    ex = tvm.compile(bb.get(), target="llvm")
    vm = relax.VirtualMachine(ex, tvm.cpu())
    return vm["main"](*[tvm.runtime.tensor(a) for a in arrays]).numpy()


def act_ref(x, act):
    """numpy reference of the activations (float64)."""
    from math import erf, sqrt

    if act == "none":
        return x
    if act == "relu":
        return np.maximum(x, 0)
    if act.startswith("clip_"):
        lo, hi = act[5:].rsplit("_", 1)
        return np.clip(x, float(lo), float(hi))
    if act == "sigmoid":
        return 1 / (1 + np.exp(-x))
    if act == "tanh":
        return np.tanh(x)
    if act == "gelu":
        return 0.5 * x * (1 + np.vectorize(erf)(x / sqrt(2)))
    if act == "gelu_tanh":
        return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))
    if act == "silu":
        return x / (1 + np.exp(-x))
    if act.startswith(("hardswish_", "hardsigmoid_")):
        alpha, beta = (float(v) for v in act.split("_", 1)[1].split("_"))
        gate = np.clip(alpha * x + beta, 0, 1)
        return x * gate if act.startswith("hardswish_") else gate
    if act.startswith("scale_"):
        return float(act[len("scale_"):]) * x
    if act.startswith("leaky_relu_"):
        return np.where(x > 0, x, float(act[len("leaky_relu_"):]) * x)
    raise ValueError(act)


ACTS = ["none", "relu", "clip_0_6", "clip_-0.5_0.25", "sigmoid", "tanh", "gelu", "gelu_tanh",
        "silu"]
#: The activations with parameters (the CPU library's only: the CUDA epilogue lacks them).
PARAM_ACTS = ["hardswish_0.16666667_0.5", "hardsigmoid_0.2_0.5", "hardsigmoid_-0.25_0.75",
              "leaky_relu_0.1", "leaky_relu_1e-02", "scale_0.125", "scale_-2.5"]
