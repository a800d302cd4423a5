"""ResNet-18 (He et al., 2016), written out here (no torchvision).

Standard ImageNet ResNet-18: 7x7/2 stem, max-pool, four stages of two BasicBlocks (64, 128,
256, 512 channels), global average pool and a 1000-way linear layer. BatchNorm is kept (eval
mode), as in the ONNX model OLLIE used.
"""

from __future__ import annotations

import torch
from torch import nn

from .registry import register


class BasicBlock(nn.Module):
    """Two 3x3 conv-BN layers with an identity (or 1x1 strided projection) shortcut."""

    def __init__(self, c_in: int, c_out: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.down = None
        if stride != 1 or c_in != c_out:
            self.down = nn.Sequential(
                nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return torch.relu(y + (x if self.down is None else self.down(x)))


class ResNetTrunk(nn.Module):
    """Stem and the four stages; ``forward`` returns the four stage outputs (for GCN too)."""

    def __init__(self, widths, blocks=(2, 2, 2, 2)):
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, widths[0], 7, 2, 3, bias=False),
            nn.BatchNorm2d(widths[0]),
            nn.ReLU(),
            nn.MaxPool2d(3, 2, 1),
        )
        stages, c_in = [], widths[0]
        for i, (width, count) in enumerate(zip(widths, blocks)):
            layers = [BasicBlock(c_in, width, 1 if i == 0 else 2)]
            layers += [BasicBlock(width, width, 1) for _ in range(count - 1)]
            stages.append(nn.Sequential(*layers))
            c_in = width
        self.stages = nn.ModuleList(stages)

    def forward(self, x: torch.Tensor):
        x = self.stem(x)
        features = []
        for stage in self.stages:
            x = stage(x)
            features.append(x)
        return features


class ResNet(nn.Module):
    """Trunk + global average pool + linear classifier."""

    def __init__(self, widths, num_classes: int = 1000):
        super().__init__()
        self.trunk = ResNetTrunk(widths)
        self.fc = nn.Linear(widths[-1], num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.trunk(x)[-1]
        return self.fc(torch.flatten(x.mean(dim=(2, 3)), 1))


@register(
    "resnet18",
    paper="ollie",
    description="ResNet-18 on 3x224x224 (quick: widths /4, 3x64x64, 100 classes)",
    paper_batches=(1, 16),
)
def build_resnet18(quick: bool, batch: int):
    """Paper size 224x224; quick uses quarter widths on 64x64."""
    if quick:
        return ResNet([16, 32, 64, 128], 100), (torch.randn(batch, 3, 64, 64),)
    return ResNet([64, 128, 256, 512], 1000), (torch.randn(batch, 3, 224, 224),)
