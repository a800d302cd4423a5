"""Deployment: a compiled Relax library that calls the native kernels runs in a fresh process
that loads it with tvm_ollie.runtime.load_module (and never imports the pass itself)."""

import os
import subprocess
import sys

import numpy as np
import pytest

from tvm_ollie import native

CHILD = r"""
import sys
import numpy as np
import tvm
from tvm_ollie.runtime import load_module

lib = load_module(sys.argv[1])
vm = tvm.relax.VirtualMachine(lib, tvm.cpu())
data = np.load(sys.argv[2])
out = vm["main"](tvm.runtime.tensor(data["a"]), tvm.runtime.tensor(data["b"]),
                 tvm.runtime.tensor(data["bias"])).numpy()
np.testing.assert_allclose(out, data["ref"], rtol=1e-4, atol=1e-4)
print("DEPLOY_OK")
"""


def test_exported_library_runs_in_fresh_process(tmp_path):
    if not native.available():
        pytest.skip(f"native library unavailable: {native.unavailable_reason()}")
    import tvm
    from tvm import relax

    bb = relax.BlockBuilder()
    a = relax.Var("a", relax.TensorType((8, 16), "float32"))
    b = relax.Var("b", relax.TensorType((16, 4), "float32"))
    bias = relax.Var("bias", relax.TensorType((4,), "float32"))
    with bb.function("main", [a, b, bias]):
        with bb.dataflow():
            y = bb.emit(relax.call_dps_packed(native.MATMUL,
                                              [tvm.ir.StringImm("bias=1;act=relu"), a, b, bias],
                                              relax.TensorType((8, 4), "float32")))
            z = bb.emit_output(relax.op.add(y, y))  # a TVM kernel after the library call
        bb.emit_func_output(z)
    ex = tvm.compile(bb.get(), target="llvm")
    path = str(tmp_path / "mm.so")
    ex.export_library(path)
    rng = np.random.default_rng(0)
    av = rng.standard_normal((8, 16)).astype("float32")
    bv = rng.standard_normal((16, 4)).astype("float32")
    biasv = rng.standard_normal(4).astype("float32")
    ref = 2 * np.maximum(av @ bv + biasv, 0)
    np.savez(tmp_path / "data.npz", a=av, b=bv, bias=biasv, ref=ref)
    res = subprocess.run([sys.executable, "-c", CHILD, path, str(tmp_path / "data.npz")],
                         capture_output=True, text=True, timeout=300, env=dict(os.environ),
                         check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "DEPLOY_OK" in res.stdout
