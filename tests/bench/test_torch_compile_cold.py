"""The benchmark's torch.compile builds cold: each model in inductor caches of its own."""

import os
import types

import pytest

from tvm_ollie.bench.systems import BenchContext, fresh_inductor_cache, get_system

torch = pytest.importorskip("torch")


def test_the_inductor_cache_is_a_new_directory_inside_and_restored_after(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "shared"))
    seen = []
    for _ in range(2):
        with fresh_inductor_cache(str(tmp_path / "model")):
            seen.append((os.environ["TORCHINDUCTOR_CACHE_DIR"], os.environ["TRITON_CACHE_DIR"]))
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "shared")
    (first, triton), (second, _) = seen
    assert first != second  # a new directory each time: nothing read back
    assert os.path.dirname(first) == str(tmp_path / "model")
    assert triton.startswith(first)
    assert os.path.isdir(first) and os.path.isdir(second)  # kept after the context


@pytest.mark.slow
def test_each_model_compiles_in_its_own_cache(tmp_path, monkeypatch):
    shared = tmp_path / "shared"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(shared))
    ctx = BenchContext(target="llvm", threads=1, work_dir=str(tmp_path / "work"))
    prepare = get_system("torch_compile").prepare
    dirs = []
    for key in ("tiny-a", "tiny-b"):
        torch.manual_seed(0)
        spec = types.SimpleNamespace(key=key, module=torch.nn.Sequential(
            torch.nn.Linear(8, 8), torch.nn.ReLU()).eval(), example_inputs=[torch.randn(2, 8)])
        prepared = prepare(spec, ctx)
        assert prepared.compile_s > 0
        inductor = os.path.join(ctx.model_dir(spec, "torch_compile"), "inductor")
        (fresh,) = os.listdir(inductor)
        files = [f for _, _, names in os.walk(os.path.join(inductor, fresh)) for f in names]
        assert files  # the model's compiled kernels were written there
        dirs.append(fresh)
    assert not shared.exists() or not any(shared.iterdir())  # nothing in the shared cache
