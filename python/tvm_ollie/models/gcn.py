"""Global Convolutional Network ("Large Kernel Matters", Peng et al., arXiv 1703.02719).

Not a graph network: semantic segmentation with large separable kernels. Faithful to the paper's
structure, simplified in the backbone: a ResNet-18 trunk (the paper uses ResNet-152) gives four
feature maps; each goes through a GCN module (``k x 1`` then ``1 x k`` in one branch, ``1 x k``
then ``k x 1`` in the other, summed; no ReLU, as in the paper) and a Boundary Refinement block;
the maps are merged coarse to fine with ConvTranspose2d (x2) upsampling, then two more
ConvTranspose2d + BR stages bring the score map back to the input size.
"""

from __future__ import annotations

import torch
from torch import nn

from .registry import register
from .resnet import ResNetTrunk


class GlobalConv(nn.Module):
    """The GCN module: two separable large-kernel branches, summed."""

    def __init__(self, c_in: int, c_out: int, k: int):
        super().__init__()
        p = k // 2
        self.left = nn.Sequential(
            nn.Conv2d(c_in, c_out, (k, 1), padding=(p, 0)),
            nn.Conv2d(c_out, c_out, (1, k), padding=(0, p)),
        )
        self.right = nn.Sequential(
            nn.Conv2d(c_in, c_out, (1, k), padding=(0, p)),
            nn.Conv2d(c_out, c_out, (k, 1), padding=(p, 0)),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.left(x) + self.right(x)


class BoundaryRefine(nn.Module):
    """BR block: residual branch conv3x3 - ReLU - conv3x3."""

    def __init__(self, c: int):
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv2(torch.relu(self.conv1(x)))


class GCNSegmenter(nn.Module):
    """ResNet trunk + GCN/BR per stage + deconvolution merging to full resolution."""

    def __init__(self, widths, num_classes: int, k: int, blocks=(2, 2, 2, 2)):
        super().__init__()
        self.trunk = ResNetTrunk(widths, blocks)
        self.gcn = nn.ModuleList([GlobalConv(w, num_classes, k) for w in widths])
        self.br = nn.ModuleList([BoundaryRefine(num_classes) for _ in widths])
        self.merge_br = nn.ModuleList([BoundaryRefine(num_classes) for _ in range(len(widths))])
        n_up = len(widths) - 1 + 2
        self.up = nn.ModuleList(
            [nn.ConvTranspose2d(num_classes, num_classes, 4, 2, 1) for _ in range(n_up)]
        )
        self.final_br = BoundaryRefine(num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = self.trunk(x)
        scores = [br(gcn(f)) for f, gcn, br in zip(features, self.gcn, self.br)]
        y = scores[-1]
        up = 0
        for i in range(len(scores) - 2, -1, -1):
            y = self.merge_br[i](self.up[up](y) + scores[i])
            up += 1
        y = self.merge_br[-1](self.up[up](y))
        return self.final_br(self.up[up + 1](y))


@register(
    "gcn",
    paper="ollie",
    description="GCN (k=15) on a ResNet-18 trunk, 21 classes, 3x224x224 "
    "(quick: widths /4, one block per stage, k=7, 3x64x64)",
    paper_batches=(1, 16),
)
def build_gcn(quick: bool, batch: int):
    """Paper input 3x224x224 with k=15 (the paper's best kernel size)."""
    if quick:
        model = GCNSegmenter([16, 32, 64, 128], 21, 7, blocks=(1, 1, 1, 1))
        return model, (torch.randn(batch, 3, 64, 64),)
    return GCNSegmenter([64, 128, 256, 512], 21, 15), (torch.randn(batch, 3, 224, 224),)
