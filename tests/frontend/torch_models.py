"""Tiny PyTorch models for the ONNX-export and PyTorch entry-point tests (seeded weights).

They compile in seconds; the zoo models (``tvm_ollie.models``) run in the ``slow`` tests.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

#: The shape every tiny model is exported and run at (height != width on purpose).
X_SHAPE = (1, 3, 8, 12)


class TinyConvNet(nn.Module):
    """conv3x3 -> relu -> global mean -> linear; optionally a graph break or an odd operator.

    ``graph_break``: a ``print`` in ``forward`` (TorchDynamo splits the graph there);
    ``unsupported``: ``torch.special.i1``, which TVM's FX importer has no converter for.
    """

    def __init__(self, graph_break: bool = False, unsupported: bool = False):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.fc = nn.Linear(4, 5)
        self.graph_break = graph_break
        self.unsupported = unsupported

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.conv(x))
        if self.graph_break:
            print("tiny model: graph break")
        if self.unsupported:
            y = torch.special.i1(y)
        return self.fc(y.mean((2, 3)))


class ShapeChainNet(nn.Module):
    """What exporters turn into shape arithmetic on dynamic H/W.

    ``reshape(b, c, h * w)`` becomes ``Shape -> Gather -> Mul -> Unsqueeze -> Concat ->
    Reshape``; ``interpolate(size=(2h, 2w))`` a ``Resize`` whose sizes come from ``Shape`` (with
    an empty ``scales`` tensor at opset 11); ``F.pad`` of a computed amount a dynamic ``Pad``.
    """

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.fc = nn.Linear(4, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.conv(x))
        b, c, h, w = y.shape
        y = F.interpolate(y, size=(h * 2, w * 2), mode="nearest")
        y = F.pad(y, (0, (4 - y.shape[-1] % 4) % 4 + 1))
        y = y.reshape(b, c, -1).mean(-1)
        return self.fc(y)


def seeded(module_type, *args, seed: int = 0, **kwargs):
    """``module_type(*args, **kwargs)`` with seeded weights, in eval mode, and a seeded input."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        module = module_type(*args, **kwargs).eval()
        x = torch.randn(*X_SHAPE)
    return module, x


def export_onnx(module, inputs, path: str, opset: int, dynamo: bool) -> str:
    """Export with every input's batch/height/width dynamic, by either exporter."""
    names = [f"input{i}" for i in range(len(inputs))]
    with torch.no_grad():
        if dynamo:
            dims = tuple({i: torch.export.Dim.AUTO for i in range(t.dim())} for t in inputs)
            torch.onnx.export(module, tuple(inputs), path, input_names=names,
                              opset_version=opset, dynamo=True, dynamic_shapes=dims,
                              external_data=False, verbose=False)
        else:
            axes = {n: {0: "batch", 2: "height", 3: "width"} if t.dim() == 4 else {0: "batch"}
                    for n, t in zip(names, inputs)}
            torch.onnx.export(module, tuple(inputs), path, input_names=names,
                              opset_version=opset, dynamo=False, dynamic_axes=axes)
    return path
