"""Freezing module weights in the ``torch.compile`` backend (``frontend.torch_freeze``).

Which graph inputs are frozen (parameters and buffers; not user inputs, not tensors the graph
writes to, not weights autograd needs), the frozen graph, the guard, and the backend end to end:
weights imported as constants, a changed weight never giving stale results, ``freeze=False``.
"""

import os
import sys
import warnings

import pytest

torch = pytest.importorskip("torch")

from tvm_ollie.frontend import torch_backend  # noqa: E402
from tvm_ollie.frontend.torch_freeze import (  # noqa: E402
    FrozenInputs, freezable_inputs, freeze_graph, mutated_inputs)

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "transform"))
import small_models as sm  # noqa: E402
import torch_models as tm  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::DeprecationWarning")
OPTS = dict(max_depth=2, search_time_s=2.0, calibration=sm.LLVM_CALIB)


class ConvBN(torch.nn.Module):
    """conv -> batch norm -> relu -> global mean: parameters and buffers."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(4)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x))).mean((2, 3))


def _seeded_convbn(train: bool = False):
    torch.manual_seed(0)
    module = ConvBN().train(train)
    with torch.no_grad():  # non-trivial running statistics
        module.bn.running_mean.uniform_(-0.5, 0.5)
        module.bn.running_var.uniform_(0.5, 2.0)
    return module, torch.randn(*tm.X_SHAPE)


def _captured_graph(module, x, grad: bool = False):
    """The FX graph dynamo hands a backend, and its example inputs (nothing compiled)."""
    seen = []

    def capture(gm, example_inputs):
        seen.append((gm, list(example_inputs)))
        return gm.forward

    torch._dynamo.reset()
    with torch.set_grad_enabled(grad):
        torch.compile(module, backend=capture, dynamic=False)(x)
    assert len(seen) == 1
    return seen[0]


def _user_positions(inputs, x):
    return [i for i, t in enumerate(inputs) if t is x]


def test_weights_and_buffers_are_freezable_user_inputs_are_not():
    module, x = _seeded_convbn()
    gm, inputs = _captured_graph(module, x)
    with torch.no_grad():  # as the backend runs: inference
        _, mutated = mutated_inputs(gm, inputs)
        frozen = freezable_inputs(gm, inputs, mutated)
    assert not any(mutated)
    state = {id(t) for t in list(module.parameters()) + list(module.buffers())}
    assert sorted(frozen) == [i for i, t in enumerate(inputs) if id(t) in state]
    assert _user_positions(inputs, x) and not set(_user_positions(inputs, x)) & set(frozen)
    assert len(frozen) >= 6  # conv weight+bias, bn weight+bias+running mean+var


def test_buffers_the_graph_updates_are_not_frozen():
    module, x = _seeded_convbn(train=True)  # batch norm updates its running statistics
    gm, inputs = _captured_graph(module, x)
    mean_before = module.bn.running_mean.clone()
    with torch.no_grad():
        _, mutated = mutated_inputs(gm, inputs)
        frozen = freezable_inputs(gm, inputs, mutated)
    torch.testing.assert_close(module.bn.running_mean, mean_before, rtol=0, atol=0)  # copies
    running = [i for i, t in enumerate(inputs)
               if t is module.bn.running_mean or t is module.bn.running_var]
    assert running and all(mutated[i] for i in running)
    assert not set(running) & set(frozen)
    assert frozen  # the parameters still freeze


def test_weights_that_need_grad_are_not_frozen_with_grad_enabled():
    module, x = _seeded_convbn()
    gm, inputs = _captured_graph(module, x, grad=True)
    mutated = [False] * len(inputs)
    with torch.enable_grad():
        frozen = freezable_inputs(gm, inputs, mutated)
    assert not {i for i, t in enumerate(inputs) if t.requires_grad} & set(frozen)
    with torch.no_grad():  # inference: the same weights freeze
        assert {i for i, t in enumerate(inputs) if t.requires_grad} <= set(
            freezable_inputs(gm, inputs, mutated))


def test_frozen_graph_computes_the_same_without_the_weight_inputs():
    module, x = _seeded_convbn()
    gm, inputs = _captured_graph(module, x)
    with torch.no_grad():
        frozen = freezable_inputs(gm, inputs, [False] * len(inputs))
    frozen_gm = freeze_graph(gm, {i: inputs[i] for i in frozen})
    live = [t for i, t in enumerate(inputs) if i not in frozen]
    assert len([n for n in frozen_gm.graph.nodes if n.op == "placeholder"]) == len(live) == 1
    assert len([n for n in frozen_gm.graph.nodes if n.op == "get_attr"]) == len(frozen)
    with torch.no_grad():
        torch.testing.assert_close(frozen_gm(*live), gm(*inputs), rtol=0, atol=0)
    assert len([n for n in gm.graph.nodes if n.op == "placeholder"]) == len(inputs)  # unchanged


def test_guard_holds_for_the_same_unmodified_tensors_only():
    w, b, x = torch.randn(4, 3), torch.randn(4), torch.randn(2, 3)
    guard = FrozenInputs([w, x, b], [0, 2])
    assert guard.live == (1,) and guard.positions == (0, 2) and guard.count == 2
    assert guard.holds([w, torch.randn(2, 3), b])  # a new user input is fine
    assert not guard.holds([w.clone(), x, b])  # another tensor
    with torch.no_grad():
        b.add_(1.0)  # in place (as load_state_dict or an optimizer step)
    assert not guard.holds([w, x, b])
    guard = FrozenInputs([w, x], [0])
    assert guard.holds([w, x])
    w.data = torch.randn(4, 3)  # same object, other storage
    assert not guard.holds([w, x])


class _Compiled(list):
    """The compiled functions, and the Relax text of each module built (``scripts``)."""


def _compile_capturing(module, monkeypatch, **options):
    """torch.compile with the backend; the arguments of every Relax ``main`` built, and the
    compiled functions dynamo received."""
    built, compiled, scripts = [], _Compiled(), []
    real_build = torch_backend.build

    def build(mod, *args, **kwargs):
        built.append(len(mod["main"].params))
        scripts.append(mod.script(show_meta=False))
        return real_build(mod, *args, **kwargs)

    def backend(gm, example_inputs):
        fn = torch_backend.tvm_ollie_backend(gm, example_inputs, dict(OPTS, **options))
        compiled.append(fn)
        return fn

    monkeypatch.setattr(torch_backend, "build", build)
    torch._dynamo.reset()
    compiled.scripts = scripts
    return torch.compile(module, backend=backend, dynamic=False), built, compiled


def _eager(module, x):
    with torch.no_grad():
        return module(x)


def test_backend_imports_the_weights_as_constants(monkeypatch):
    module, x = _seeded_convbn()
    fn, built, compiled = _compile_capturing(module, monkeypatch)
    with torch.no_grad():
        out = fn(x)
    assert built == [1]  # main(x): every weight is a constant
    assert compiled[0].frozen.count >= 6
    assert "batch_norm" not in compiled.scripts[0]  # folded into the convolution
    torch.testing.assert_close(out, _eager(module, x), rtol=1e-5, atol=1e-5)


def test_changed_weights_never_give_stale_results(monkeypatch):
    module, x = _seeded_convbn()
    fn, _, compiled = _compile_capturing(module, monkeypatch)
    with torch.no_grad():
        fn(x)
        module.conv.weight.mul_(2.0)  # in place, as load_state_dict does
    torch_backend._WARNED.clear()
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        out = fn(x)
    assert any("changed since the graph was compiled" in str(w.message) for w in caught)
    torch.testing.assert_close(out, _eager(module, x), rtol=1e-5, atol=1e-5)


def test_freeze_false_keeps_the_weights_as_inputs(monkeypatch):
    module, x = _seeded_convbn()
    fn, built, compiled = _compile_capturing(module, monkeypatch, freeze=False)
    with torch.no_grad():
        fn(x)
        module.conv.weight.mul_(2.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # runs in TVM, no fallback
        with torch.no_grad():
            out = fn(x)
    assert compiled[0].frozen.count == 0
    assert built[0] == len(compiled[0].frozen.live) >= 7  # x, 4 parameters, mean, var
    torch.testing.assert_close(out, _eager(module, x), rtol=1e-5, atol=1e-5)
