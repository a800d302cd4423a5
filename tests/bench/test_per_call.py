"""The per-call benchmark (``python -m tvm_ollie.bench.per_call``): its chains, columns, the
library column's module, its tables, and one run on a 2-layer chain."""

import numpy as np
import pytest

from tvm_ollie import native
from tvm_ollie.bench import per_call
from tvm_ollie.compat import relax, tvm

needs_native = pytest.mark.skipif(
    not native.available(), reason=f"native library unavailable: {native.unavailable_reason()}")


def test_columns_name_a_system_and_its_environment():
    assert per_call.parse_column("tvm") == ("tvm", {})
    assert per_call.parse_column("ollie@OMP_WAIT_POLICY=ACTIVE,GOMP_SPINCOUNT=0") == (
        "ollie", {"OMP_WAIT_POLICY": "ACTIVE", "GOMP_SPINCOUNT": "0"})
    with pytest.raises(ValueError, match="KEY=VALUE"):
        per_call.parse_column("ollie@ACTIVE")
    ctx = {"work_dir": "/w", "threads": 2}
    assert per_call.column_context("ollie", ctx) is ctx
    own = per_call.column_context("ollie@TVM_OLLIE_NATIVE_LIB=/a/b.so", ctx)
    assert own["work_dir"].startswith("/w/columns/") and "/a/" not in own["work_dir"][3:]


def test_chains_have_their_layers_and_keys():
    conv = per_call.chain_spec("conv", 3)
    assert len(conv.module.convs) == 3 and conv.input_shapes == [(1, 8, 16, 16)]
    assert conv.key == "conv3-quick-b1"
    assert per_call.chain_spec("empty", 5).input_shapes == [(1, 8)]
    assert [per_call.layers(c, 4) for c in per_call.CHAINS] == [4, 4, 1]
    with pytest.raises(ValueError):
        per_call.chain_spec("conv", 0)


@needs_native
def test_library_column_calls_the_native_conv_per_layer_and_matches_torch():
    import torch

    spec = per_call.chain_spec("conv", 2)
    mod = per_call.library_chain_module(spec)
    assert str(mod).count(native.CONV2D) == 2
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    out = vm["main"](tvm.runtime.tensor(spec.example_inputs[0].numpy())).numpy()
    with torch.inference_mode():
        ref = spec.module(*spec.example_inputs).numpy()
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)


def test_tables_show_per_layer_times_ratios_and_gaps():
    rows = {"conv": {"ollie": {"median_s": 160e-6}, "tvm": {"median_s": 80e-6},
                     "onnxruntime": {"status": "error"}}}
    text = per_call.per_call_table(rows, {"conv": 16}, ["ollie", "tvm", "onnxruntime"])
    assert "| conv (16) | 160.0 (10.0/layer) | 80.0 (5.0/layer, 0.50x) | error |" in text
    prof = {"conv ollie": {"model_s": 100e-6, "kinds": [("library conv", 16, 60e-6),
                                                        ("VM alloc/free", 3, 10e-6)]},
            "conv library": {"status": "error", "reason": "boom"}}
    table = per_call.profile_table(prof)
    assert "| conv ollie | 60.0 (16) | 10.0 (3) | 70.0 | 100.0 | 30.0 |" in table
    assert "boom" in table


@needs_native
@pytest.mark.slow
def test_runs_on_a_two_layer_chain(tmp_path, capsys):
    args = ["--length", "2", "--chains", "conv", "--columns", "library", "tvm",
            "--threads", "1", "--budget", "0.05", "--min-rounds", "2", "--profile-runs", "2",
            "--out", str(tmp_path)]  # fmt: skip
    assert per_call.main(args) == 0
    out = capsys.readouterr().out
    assert "| conv (2) |" in out and "/layer" in out
    assert "| conv library |" in out and "| conv ollie |" in out
    assert (tmp_path / "per_call.json").exists() and (tmp_path / "per_call.md").exists()


@needs_native
def test_serial_sweep_times_both_sides_of_the_threshold():
    if not native.provides(native.SET_SERIAL_FLOPS):
        pytest.skip("the loaded native library has no serial threshold")
    before = native.get_serial_flops()
    result, run, outputs = per_call.serial_sweep_outcome([4], rounds=1)
    assert run is None and outputs is None and native.get_serial_flops() == before
    (row,) = result["rows"]
    assert row["channels"] == 4 and row["serial_s"] > 0 and row["threaded_s"] > 0
    assert "| 4 | 0.07 |" in per_call.serial_sweep_table(result)
