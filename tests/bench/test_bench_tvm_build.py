"""TVM builds: default pipeline, and reuse of a recorded tuning database."""

import json
import os

import numpy as np
import pytest
import tvm
from tvm import relax

from tvm_ollie.bench.tvm_build import build_tvm, database_key, make_target


def _tiny():
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 8), "float32"))
    w = relax.Var("w", relax.TensorType((8, 3), "float32"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.relu(relax.op.matmul(x, w)))
        bb.emit_func_output(out)
    return bb.get()


def _run(ex, *arrays):
    vm = relax.VirtualMachine(ex, tvm.cpu())
    return vm["main"](*[tvm.runtime.tensor(a) for a in arrays]).numpy()


def test_targets():
    assert make_target("llvm", 3).kind.name == "llvm"
    assert int(make_target("llvm", 3).attrs["num-cores"]) == 3
    assert make_target("cuda", 1).kind.name == "cuda"
    with pytest.raises(ValueError):
        make_target("vulkan", 1)


def test_default_build_is_correct():
    x, w = np.random.rand(4, 8).astype("float32"), np.random.rand(8, 3).astype("float32")
    build = build_tvm(_tiny(), make_target("llvm", 1), trials=0)
    assert build.trials == 0 and build.tune_s == 0.0
    np.testing.assert_allclose(_run(build.executable, x, w), np.maximum(x @ w, 0), rtol=1e-5)


def test_recorded_database_is_reused_without_tuning(tmp_path):
    mod = _tiny()
    work = tmp_path / "db"
    os.makedirs(work)
    target = make_target("llvm", 1)
    marker = {"hash": database_key(mod, target), "trials": 8}
    (work / "tuned.json").write_text(json.dumps(marker))
    build = build_tvm(mod, target, trials=8, work_dir=str(work))
    assert build.reused_db and build.trials == 8
    x, w = np.random.rand(4, 8).astype("float32"), np.random.rand(8, 3).astype("float32")
    np.testing.assert_allclose(_run(build.executable, x, w), np.maximum(x @ w, 0), rtol=1e-5)
    with pytest.raises(ValueError):
        build_tvm(mod, make_target("llvm", 1), trials=4, work_dir=None)


@pytest.mark.tuning
def test_tuning_runs_once_then_reuses(tmp_path):
    mod, target = _tiny(), make_target("llvm", 2)
    first = build_tvm(mod, target, trials=4, work_dir=str(tmp_path))
    assert not first.reused_db and first.trials == 4 and first.tune_s > 0
    assert any(name.endswith(".json") and name != "tuned.json" for name in os.listdir(tmp_path))
    second = build_tvm(mod, target, trials=4, work_dir=str(tmp_path))
    assert second.reused_db and second.tune_s < first.tune_s
    x, w = np.random.rand(4, 8).astype("float32"), np.random.rand(8, 3).astype("float32")
    np.testing.assert_allclose(_run(second.executable, x, w), np.maximum(x @ w, 0), rtol=1e-5)
