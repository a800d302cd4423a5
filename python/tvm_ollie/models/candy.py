"""Candy: the fast neural style transfer network (Johnson et al., 2016) of the ONNX model zoo.

The Korch paper runs ``candy-9.onnx`` (1x3x224x224); this is the same architecture (PyTorch
examples' ``TransformerNet``) with random weights: reflection-padded convs 9x9 (3->32), 3x3/2
(32->64), 3x3/2 (64->128), each with affine InstanceNorm and ReLU; five residual blocks;
two nearest-neighbour x2 upsample + conv 3x3 layers with InstanceNorm and ReLU; a final 9x9 conv
back to RGB.
"""

from __future__ import annotations

import torch
from torch import nn

from .registry import register


class ConvIN(nn.Module):
    """Optional x2 nearest upsample, reflection pad, conv, optional InstanceNorm and ReLU."""

    def __init__(self, c_in, c_out, k, stride=1, upsample=False, norm=True, relu=True):
        super().__init__()
        self.upsample = upsample
        self.pad = nn.ReflectionPad2d(k // 2)
        self.conv = nn.Conv2d(c_in, c_out, k, stride)
        self.norm = nn.InstanceNorm2d(c_out, affine=True) if norm else None
        self.relu = relu

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.upsample:
            x = nn.functional.interpolate(x, scale_factor=2, mode="nearest")
        x = self.conv(self.pad(x))
        if self.norm is not None:
            x = self.norm(x)
        return torch.relu(x) if self.relu else x


class ResidualBlock(nn.Module):
    """conv-IN-ReLU-conv-IN plus the identity."""

    def __init__(self, c: int):
        super().__init__()
        self.a = ConvIN(c, c, 3)
        self.b = ConvIN(c, c, 3, relu=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.b(self.a(x))


class TransformerNet(nn.Module):
    """The style-transfer network with base width ``w`` (32 in the original)."""

    def __init__(self, w: int = 32, n_res: int = 5):
        super().__init__()
        self.down = nn.Sequential(
            ConvIN(3, w, 9), ConvIN(w, 2 * w, 3, 2), ConvIN(2 * w, 4 * w, 3, 2)
        )
        self.res = nn.Sequential(*[ResidualBlock(4 * w) for _ in range(n_res)])
        self.up = nn.Sequential(
            ConvIN(4 * w, 2 * w, 3, upsample=True),
            ConvIN(2 * w, w, 3, upsample=True),
            ConvIN(w, 3, 9, norm=False, relu=False),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.up(self.res(self.down(x)))


@register(
    "candy",
    paper="korch",
    description="fast style transfer (InstanceNorm, 5 residual blocks) on 3x224x224 "
    "(quick: width 8, 2 residual blocks, 3x64x64)",
)
def build_candy(quick: bool, batch: int):
    """Paper size 224x224, base width 32."""
    if quick:
        return TransformerNet(8, n_res=2), (torch.randn(batch, 3, 64, 64),)
    return TransformerNet(32), (torch.randn(batch, 3, 224, 224),)
