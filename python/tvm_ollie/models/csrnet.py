"""CSRNet back end (Li et al., 2018): the dilated convolutions OLLIE benchmarks.

Six Conv3x3 with dilation 2 (512, 512, 512, 256, 128, 64 channels, ReLU after each) and the 1x1
density-map output conv, on a ``[bs, 512, 14, 14]`` feature map (the VGG front end is omitted,
as in OLLIE).
"""

from __future__ import annotations

import torch
from torch import nn

from .registry import register


class CSRNetBackend(nn.Module):
    """Dilated 3x3 convs with ReLU, then a 1x1 conv to one channel."""

    def __init__(self, widths):
        super().__init__()
        pairs = zip(widths[:-1], widths[1:])
        self.convs = nn.ModuleList([nn.Conv2d(a, b, 3, padding=2, dilation=2) for a, b in pairs])
        self.output = nn.Conv2d(widths[-1], 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for conv in self.convs:
            x = torch.relu(conv(x))
        return self.output(x)


@register(
    "csrnet",
    paper="ollie",
    description="6 dilated (d=2) Conv3x3 on 512x14x14 + 1x1 output (quick: widths /8, 7x7)",
    paper_batches=(1, 16),
)
def build_csrnet(quick: bool, batch: int):
    """Paper size 512x14x14; quick divides channels by 8 and halves the map."""
    widths = [512, 512, 512, 512, 256, 128, 64]
    size = 14
    if quick:
        widths, size = [w // 8 for w in widths], 7
    return CSRNetBackend(widths), (torch.randn(batch, widths[0], size, size),)
