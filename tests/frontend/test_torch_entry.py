"""PyTorch entry points: ``from_torch``, ``compile_torch`` and the ``torch.compile`` backend.

Every path is checked against eager PyTorch at a tight tolerance. The ollie pass runs with the
tests' fixed calibration and a small search budget; zoo models are ``slow``.
"""

import os
import sys
import textwrap
import warnings

import numpy as np
import pytest
import tvm
from tvm import relax

torch = pytest.importorskip("torch")

import tvm_ollie  # noqa: E402
from tvm_ollie.frontend import torch_backend  # noqa: E402
from tvm_ollie.frontend.loader import load_module  # noqa: E402
from tvm_ollie.frontend.torch_entry import TorchImportError, compile_torch  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "transform"))
import small_models as sm  # noqa: E402
import torch_models as tm  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::DeprecationWarning")
#: The pass's options in these tests: reproducible decisions, a short search.
OPTS = dict(max_depth=2, search_time_s=2.0, calibration=sm.LLVM_CALIB)
RTOL = ATOL = 1e-5


def eager(module, *inputs):
    with torch.no_grad():
        return module(*inputs)


def test_from_torch_binds_weights_and_matches_eager():
    module, x = tm.seeded(tm.TinyConvNet)
    mod = tvm_ollie.from_torch(module, (x,))
    assert len(mod["main"].params) == 1  # the weights are constants, not parameters
    ex = tvm.compile(mod, "llvm")  # the ollie pipeline runs in the compile_torch test
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x.numpy()))
    np.testing.assert_allclose(out.numpy(), eager(module, x).numpy(), rtol=RTOL, atol=ATOL)


def test_from_torch_keeps_params_as_tvm_does():
    module, x = tm.seeded(tm.TinyConvNet)
    mod = tvm_ollie.from_torch(module, (x,), keep_params_as_input=True)
    mod, params = relax.frontend.detach_params(mod)
    assert len(params["main"]) == 4 and len(mod["main"].params) == 5


def test_compile_torch_is_zero_copy_and_matches_eager():
    module, x = tm.seeded(tm.TinyConvNet)
    compiled = compile_torch(module, (x,), **OPTS)
    out = compiled(x)
    assert isinstance(out, torch.Tensor)
    torch.testing.assert_close(out, eager(module, x), rtol=RTOL, atol=ATOL)
    assert len(list(compiled.report.decisions)) >= 1  # the pass saw the conv and the matmul


def test_dlpack_exchange_shares_memory():
    from tvm_ollie.frontend.torch_entry import from_tvm, to_tvm

    x = torch.zeros(2, 3)
    view = to_tvm(x)
    x[1, 2] = 42.0
    assert view.numpy()[1, 2] == 42.0
    back = from_tvm(view)
    assert back.data_ptr() == x.data_ptr()


def test_from_torch_rejects_what_torch_export_cannot_trace():
    class DataDependent(torch.nn.Module):
        def forward(self, x):
            return x * 2 if x.sum() > 0 else x - 1

    with pytest.raises(TorchImportError, match="torch.export failed"):
        tvm_ollie.from_torch(DataDependent(), (torch.ones(2),))


@pytest.fixture(autouse=True, scope="module")
def _registered():
    # ``import tvm_ollie`` registers the backend only when torch was imported first; an
    # installed package is found through its entry point. Either way the name must resolve.
    torch_backend.register()


def test_backend_registered_under_its_name():
    from torch._dynamo import list_backends

    assert "tvm_ollie" in list_backends()


def test_entry_point_names_the_backend():
    import tomllib

    root = os.path.join(os.path.dirname(__file__), "..", "..")
    with open(os.path.join(root, "pyproject.toml"), "rb") as file:
        points = tomllib.load(file)["project"]["entry-points"]["torch_dynamo_backends"]
    module, _, attr = points["tvm_ollie"].partition(":")
    import importlib

    assert getattr(importlib.import_module(module), attr) is torch_backend.tvm_ollie_backend


def _compile_backend(module, x):
    torch._dynamo.reset()
    before = dict(torch_backend.STATS)
    compiled = torch.compile(module, backend="tvm_ollie", options=dict(OPTS))
    with torch.no_grad():
        out = compiled(x)
    counts = {k: torch_backend.STATS[k] - before[k] for k in before}
    return out, counts


def test_torch_compile_backend_matches_eager():
    module, x = tm.seeded(tm.TinyConvNet)
    out, counts = _compile_backend(module, x)
    assert counts == {"compiled": 1, "eager": 0}
    torch.testing.assert_close(out, eager(module, x), rtol=RTOL, atol=ATOL)


def test_torch_compile_graph_break(capsys):
    module, x = tm.seeded(tm.TinyConvNet, graph_break=True)
    out, counts = _compile_backend(module, x)
    assert counts["compiled"] == 2  # the graphs before and after the print
    assert "graph break" in capsys.readouterr().out
    torch.testing.assert_close(out, eager(module, x), rtol=RTOL, atol=ATOL)


def test_torch_compile_unsupported_op_falls_back_to_eager():
    module, x = tm.seeded(tm.TinyConvNet, unsupported=True)
    torch_backend._WARNED.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out, counts = _compile_backend(module, x)
    assert counts == {"compiled": 0, "eager": 1}
    messages = [str(w.message) for w in caught if "tvm_ollie" in str(w.message)]
    assert len(messages) == 1 and "special_i1" in messages[0]
    torch.testing.assert_close(out, eager(module, x), rtol=0, atol=0)


def _wrong_importer(monkeypatch, name):
    """TVM's importer ``name`` returning a module that adds 1 to the right answer (a
    mistranslated operator, as TVM's ``from_fx`` did on the Longformer zoo model)."""
    import tvm.relax.frontend.torch as frontend

    real = getattr(frontend, name)
    made = []

    def wrong(*args, **kwargs):
        orig = real(*args, **kwargs)["main"]
        bb = relax.BlockBuilder()
        inner = bb.add_func(orig.without_attr("global_symbol"), "imported")
        params = [relax.Var(p.name, p.ty) for p in orig.params]
        one = relax.const(1.0, "float32")
        with bb.function("main", params):
            res = bb.emit(relax.Call(inner, params))
            if isinstance(res.ty, relax.TupleType):
                out = relax.Tuple([bb.emit(relax.op.add(relax.TupleGetItem(res, i), one))
                                   for i in range(len(res.ty.fields))])
            else:
                out = relax.op.add(res, one)
            bb.emit_func_output(out)
        made.append(name)
        return bb.get()

    monkeypatch.setattr(frontend, name, wrong)
    return made


def test_torch_compile_skips_an_importer_that_computes_something_else(monkeypatch):
    module, x = tm.seeded(tm.TinyConvNet)
    made = _wrong_importer(monkeypatch, "from_fx")
    out, counts = _compile_backend(module, x)
    assert made == ["from_fx"]  # the wrong module was made, built, and not used
    assert counts == {"compiled": 1, "eager": 0}  # through torch.export instead
    torch.testing.assert_close(out, eager(module, x), rtol=RTOL, atol=ATOL)


def test_torch_compile_never_returns_a_wrong_graph(monkeypatch):
    module, x = tm.seeded(tm.TinyConvNet)
    _wrong_importer(monkeypatch, "from_fx")
    _wrong_importer(monkeypatch, "from_exported_program")
    torch_backend._WARNED.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out, counts = _compile_backend(module, x)
    assert counts == {"compiled": 0, "eager": 1}
    messages = [str(w.message) for w in caught if "tvm_ollie" in str(w.message)]
    assert len(messages) == 1 and "differs from eager" in messages[0], messages
    torch.testing.assert_close(out, eager(module, x), rtol=0, atol=0)


def test_python_factory_returning_module_and_inputs(tmp_path):
    (tmp_path / "model.py").write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        import torch_models as tm

        def factory():
            module, x = tm.seeded(tm.TinyConvNet)
            return module, (x,)
    """))
    mod = load_module(f"{tmp_path / 'model.py'}:factory")
    module, x = tm.seeded(tm.TinyConvNet)
    ex = tvm.compile(mod, "llvm")
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x.numpy()))
    np.testing.assert_allclose(out.numpy(), eager(module, x).numpy(), rtol=RTOL, atol=ATOL)


@pytest.mark.slow
def test_cli_compile_python_factory(tmp_path, capsys):
    from tvm_ollie.cli import main

    (tmp_path / "model.py").write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        import torch_models as tm

        def factory():
            module, x = tm.seeded(tm.TinyConvNet)
            return module, (x,)
    """))
    out = str(tmp_path / "m.so")
    assert main(["compile", f"{tmp_path / 'model.py'}:factory", "-o", out,
                 "--search-time", "2"]) == 0
    assert os.path.exists(out)


ZOO = ["fsrcnn", "resnet18", "candy"]


@pytest.mark.slow
@pytest.mark.parametrize("name", ZOO)
def test_zoo_from_torch(name):
    from tvm_ollie.models.registry import get_model

    spec = get_model(name, quick=True)
    compiled = compile_torch(spec.module, spec.example_inputs, **OPTS)
    torch.testing.assert_close(compiled(*spec.example_inputs), eager(spec.module,
                               *spec.example_inputs), rtol=1e-4, atol=1e-4)  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("name", ZOO)
def test_zoo_torch_compile(name):
    from tvm_ollie.models.registry import get_model

    spec = get_model(name, quick=True)
    out, counts = _compile_backend(spec.module, spec.example_inputs[0])
    assert counts["eager"] == 0
    torch.testing.assert_close(out, eager(spec.module, *spec.example_inputs), rtol=1e-4,
                               atol=1e-4)
