"""A model the pass put on native kernels, exported, then run in a fresh process with only
``tvm_ollie.runtime.load_module`` (no pass, no compiler entry point)."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tvm

import small_models as sm
from tvm_ollie import native
from tvm_ollie.pipeline import build

from test_decide import OPTS, FakeTimer  # noqa: E402  pylint: disable=wrong-import-position

pytestmark = pytest.mark.skipif(not native.load(), reason="native library not loaded")

RUNNER = textwrap.dedent("""
    import sys
    import numpy as np
    import tvm
    from tvm import relax
    from tvm_ollie.runtime import load_module
    lib = load_module(sys.argv[1])
    data = np.load(sys.argv[2])
    vm = relax.VirtualMachine(lib, tvm.cpu())
    args = [tvm.runtime.tensor(data[f"arg{k}"]) for k in range(len(data.files) - 1)]
    out = vm["main"](*args).numpy()
    err = float(np.max(np.abs(out - data["expected"])))
    print("max abs err", err)
    sys.exit(0 if err < 1e-4 * max(1.0, float(np.max(np.abs(data["expected"])))) else 3)
""")


@pytest.mark.slow  # a derivation, an export and a second interpreter (about a minute)
def test_exported_native_model_runs_in_a_fresh_process(tmp_path):
    mod = sm.conv_stack()
    timer = FakeTimer({"original [native]": 1e-3}, default=8e-3)
    ex, report = build(mod, target="llvm", derive=False, timer=timer, **OPTS)
    assert all(d.chosen == "original [native]" for d in report.decisions)
    args = sm.random_inputs(mod, seed=7)
    expected = sm.run(tvm.compile(mod, target="llvm"), args)
    lib_path = str(tmp_path / "model.so")
    ex.export_library(lib_path)
    data = str(tmp_path / "data.npz")
    np.savez(data, expected=expected, **{f"arg{k}": a for k, a in enumerate(args)})
    script = tmp_path / "runner.py"
    script.write_text(RUNNER)
    env = dict(os.environ)
    proc = subprocess.run([sys.executable, str(script), lib_path, data], env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "max abs err" in proc.stdout
    # plain TVM without the native library cannot run it: the kernels really are native calls
    plain = textwrap.dedent("""
        import sys
        import numpy as np
        import tvm
        from tvm import relax
        vm = relax.VirtualMachine(tvm.runtime.load_module(sys.argv[1]), tvm.cpu())
        data = np.load(sys.argv[2])
        vm["main"](*[tvm.runtime.tensor(data[f"arg{k}"]) for k in range(len(data.files) - 1)])
    """)
    proc = subprocess.run([sys.executable, "-c", plain, lib_path, data], env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    # (the VM names the first native function it cannot find: the planned memory's builtin,
    # on by default, or the convolution)
    missing = ("tvm_ollie.cpu.conv2d", "tvm_ollie.vm.cached_alloc")
    assert proc.returncode != 0 and any(name in proc.stderr for name in missing), \
        proc.stderr[-2000:]
