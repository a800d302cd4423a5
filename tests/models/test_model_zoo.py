"""The model zoo: every model builds at quick size, runs in torch and imports into Relax."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tvm_ollie.models import get_model, list_models, paper_batches, to_relax  # noqa: E402

EXPECTED = {
    "infogan", "dcgan", "fsrcnn", "gcn", "resnet18", "csrnet", "longformer",
    "candy", "yolox", "segformer", "efficientvit", "bert",
}  # fmt: skip


def test_registry_has_every_paper_model():
    assert set(list_models()) == EXPECTED
    assert paper_batches("infogan") == (1, 16)
    assert paper_batches("candy") == (1,)


def test_unknown_model_raises():
    with pytest.raises(KeyError, match="unknown model"):
        get_model("vgg")
    with pytest.raises(ValueError):
        get_model("dcgan", quick=True, batch=0)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_quick_model_runs_in_torch_and_imports_into_relax(name):
    spec = get_model(name, quick=True)
    assert spec.quick and spec.batch == 1 and spec.name == name
    with torch.no_grad():
        out = spec.module(*spec.example_inputs)
    assert torch.isfinite(out).all()
    assert out.shape[0] == 1
    mod, params = to_relax(spec)
    main = mod["main"]
    # main(*inputs, *weights): the weights are exactly the module's parameters and buffers used.
    assert len(main.params) == len(spec.example_inputs) + len(params)
    for var, x in zip(main.params, spec.example_inputs):
        assert tuple(int(v) for v in var.ty.shape.values) == tuple(x.shape)
    out_shape = tuple(int(v) for v in main.body.body.ty.shape.values)
    assert out_shape == tuple(out.shape)


def test_models_are_seeded():
    a, b = get_model("csrnet", quick=True), get_model("csrnet", quick=True)
    c = get_model("csrnet", quick=True, seed=1)
    assert torch.equal(a.example_inputs[0], b.example_inputs[0])
    for pa, pb in zip(a.module.parameters(), b.module.parameters()):
        assert torch.equal(pa, pb)
    assert not torch.equal(a.example_inputs[0], c.example_inputs[0])


def test_batch_option():
    spec = get_model("dcgan", quick=True, batch=2)
    assert spec.input_shapes == [(2, 12, 1, 1)]
    with torch.no_grad():
        assert spec.module(*spec.example_inputs).shape == (2, 3, 64, 64)
    assert spec.key == "dcgan-quick-b2"


def test_paper_sizes_match_the_papers():
    """Shapes only (building the full models is cheap; running them is not)."""
    shapes = {
        "infogan": [(1, 228, 1, 1)], "dcgan": [(1, 100, 1, 1)], "fsrcnn": [(1, 1, 32, 32)],
        "gcn": [(1, 3, 224, 224)], "resnet18": [(1, 3, 224, 224)], "csrnet": [(1, 512, 14, 14)],
        "longformer": [(1, 10000, 512)], "candy": [(1, 3, 224, 224)],
        "yolox": [(1, 3, 416, 416)], "segformer": [(1, 3, 512, 512)],
        "efficientvit": [(1, 3, 2048, 2048)], "bert": [(1, 128, 768)],
    }  # fmt: skip
    for name, expected in shapes.items():
        assert get_model(name).input_shapes == expected, name
    layer = get_model("longformer").module
    att = layer.attention
    assert (att.heads, att.head_dim, att.window, att.dilation) == (8, 64, 1000, 4)
    assert att.band == "chunked"  # the gather form would need 41 GB here


@pytest.mark.parametrize("name", ["infogan", "csrnet", "bert"])
def test_tvm_default_build_matches_torch(name):
    import tvm
    from tvm import relax

    spec = get_model(name, quick=True)
    mod, params = to_relax(spec)
    target = tvm.target.Target("llvm")
    ex = tvm.compile(mod, target=target, relax_pipeline=relax.get_default_pipeline(target))
    vm = relax.VirtualMachine(ex, tvm.cpu())
    inputs = [tvm.runtime.tensor(x.numpy()) for x in spec.example_inputs]
    out = vm["main"](*inputs, *params).numpy()
    with torch.no_grad():
        ref = spec.module(*spec.example_inputs).numpy()
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())


def test_onnx_export_runs_in_onnxruntime(tmp_path):
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    from tvm_ollie.bench.check import as_numpy_list
    from tvm_ollie.bench.systems import ort_runner
    from tvm_ollie.models import to_onnx

    spec = get_model("infogan", quick=True)
    path = to_onnx(spec, str(tmp_path / "sub" / "m.onnx"))
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    out = session.run(None, {"input0": spec.example_inputs[0].numpy()})[0]
    (bound,) = as_numpy_list(ort_runner(session, spec.example_inputs)())  # the benchmark's path
    np.testing.assert_array_equal(bound, out)
    with torch.no_grad():
        ref = spec.module(*spec.example_inputs).numpy()
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-5)
