"""FSRCNN (Dong et al., 2016) as coded in OLLIE's model list.

Conv5x5 1->56, 1x1 56->12, four Conv3x3 12->12, 1x1 12->56, ReLU after each stage as in the
OLLIE digest (the original network uses PReLU), then ConvTranspose 9x9 56->1 with stride 1 and
padding 3 (OLLIE passes no stride, so the "upscaling" layer keeps the size and adds 2 pixels:
32x32 in, 34x34 out). Input NCHW ``[bs, 1, 32, 32]`` (OLLIE: NHWC ``[bs, 32, 32, 1]``).
"""

from __future__ import annotations

import torch
from torch import nn

from .registry import register


class FSRCNN(nn.Module):
    """FSRCNN with feature width ``d``, shrink width ``s`` and ``m`` mapping layers."""

    def __init__(self, d: int = 56, s: int = 12, m: int = 4):
        super().__init__()
        self.feature = nn.Conv2d(1, d, 5, padding=2)
        self.shrink = nn.Conv2d(d, s, 1)
        self.mapping = nn.ModuleList([nn.Conv2d(s, s, 3, padding=1) for _ in range(m)])
        self.expand = nn.Conv2d(s, d, 1)
        self.deconv = nn.ConvTranspose2d(d, 1, 9, stride=1, padding=3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.feature(x))
        x = torch.relu(self.shrink(x))
        for conv in self.mapping:
            x = conv(x)
        x = torch.relu(x)
        x = torch.relu(self.expand(x))
        return self.deconv(x)


@register(
    "fsrcnn",
    paper="ollie",
    description="FSRCNN d=56 s=12 m=4 on 1x32x32 (quick: 1x16x16)",
    paper_batches=(1, 16),
)
def build_fsrcnn(quick: bool, batch: int):
    """The paper size is 32x32; the quick size halves the image."""
    size = 16 if quick else 32
    return FSRCNN(), (torch.randn(batch, 1, size, size),)
