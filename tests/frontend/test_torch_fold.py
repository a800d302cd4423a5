"""Batch-norm folding on frozen FX graphs (:mod:`tvm_ollie.frontend.torch_fold`).

The graphs are traced from small modules that call ``torch.conv*`` and ``F.batch_norm`` on
their own tensors, which is the frozen form (``get_attr`` weights) the backend folds. Folded
graphs compute what the original computes; unsafe pairs are left alone.
"""

import pytest

torch = pytest.importorskip("torch")
from torch.nn import functional as F  # noqa: E402

from tvm_ollie.frontend.torch_fold import fold_batch_norms  # noqa: E402


class ConvThenBN(torch.nn.Module):
    """``batch_norm(conv(x))`` with every weight a tensor attribute (a frozen graph)."""

    def __init__(self, transposed=False, bias=True, affine=True, training=False, groups=1,
                 reuse=False):
        super().__init__()
        gen = torch.Generator().manual_seed(0)
        cin, cout = 4, 6
        shape = (cin, cout // groups, 3, 3) if transposed else (cout, cin // groups, 3, 3)
        self.w = torch.randn(shape, generator=gen)
        self.b = torch.randn(cout, generator=gen) if bias else None
        self.mean = torch.randn(cout, generator=gen)
        self.var = torch.rand(cout, generator=gen) + 0.5
        self.gamma = torch.rand(cout, generator=gen) + 0.5 if affine else None
        self.beta = torch.randn(cout, generator=gen) if affine else None
        self.transposed, self.training_bn, self.groups, self.reuse = (
            transposed, training, groups, reuse)

    def forward(self, x):
        if self.transposed:
            y = torch.conv_transpose2d(x, self.w, self.b, 2, 1, 1, self.groups)
        else:
            y = torch.conv2d(x, self.w, self.b, 1, 1, 1, self.groups)
        z = F.batch_norm(y, self.mean, self.var, self.gamma, self.beta, self.training_bn,
                         0.1, 1e-3)
        return torch.relu(z) + (y if self.reuse else 0)


def _traced(**kwargs):
    return torch.fx.symbolic_trace(ConvThenBN(**kwargs))


def _calls(gm, target):
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.target is target]


@pytest.mark.parametrize("kwargs", [
    dict(), dict(bias=False), dict(affine=False), dict(groups=2),
    dict(transposed=True), dict(transposed=True, bias=False),
], ids=["conv", "conv-nobias", "bn-noaffine", "conv-groups", "convT", "convT-nobias"])
def test_folded_graph_computes_the_same(kwargs):
    gm = _traced(**kwargs)
    x = torch.randn(1, 4, 7, 9, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = gm(x)
        assert fold_batch_norms(gm) == 1
        got = gm(x)
    assert not _calls(gm, F.batch_norm)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kwargs", [
    dict(training=True), dict(reuse=True), dict(transposed=True, groups=2),
], ids=["bn-training", "conv-output-reused", "convT-groups"])
def test_unsafe_pairs_are_left_alone(kwargs):
    gm = _traced(**kwargs)
    assert fold_batch_norms(gm) == 0
    assert len(_calls(gm, F.batch_norm)) == 1


def test_weights_that_are_inputs_do_not_fold():
    def f(x, w, mean, var):  # weights as graph inputs: not frozen, nothing known to fold
        return F.batch_norm(torch.conv2d(x, w), mean, var, None, None, False, 0.1, 1e-5)

    gm = torch.fx.symbolic_trace(f)
    assert fold_batch_norms(gm) == 0
