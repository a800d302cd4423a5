"""InfoGAN and DCGAN generators: stacks of ConvTranspose2d (the OLLIE paper's GAN models).

OLLIE's code feeds NHWC ``[bs, 1, 1, 228]`` (InfoGAN) and ``[bs, 1, 1, 100]`` (DCGAN); PyTorch
convolutions are NCHW, so the same latent vector enters as ``[bs, 228, 1, 1]`` /
``[bs, 100, 1, 1]``. The layer list follows the OLLIE digest: ReLU between layers, Tanh last,
no normalization.
"""

from __future__ import annotations

import torch
from torch import nn

from .registry import register


class TConvGenerator(nn.Module):
    """A chain of ConvTranspose2d layers with ReLU between them and Tanh at the end.

    Parameters
    ----------
    layers : list of (in_channels, out_channels, kernel, stride, padding)
        One tuple per transposed convolution.
    """

    def __init__(self, layers):
        super().__init__()
        convs = [nn.ConvTranspose2d(c_in, c_out, k, s, p) for c_in, c_out, k, s, p in layers]
        self.convs = nn.ModuleList(convs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, conv in enumerate(self.convs):
            x = conv(x)
            x = torch.tanh(x) if i == len(self.convs) - 1 else torch.relu(x)
        return x


def _scaled(widths, quick: bool, factor: int = 8):
    """Channel widths divided by ``factor`` in quick mode (at least 4, the 3 RGB kept)."""
    if not quick:
        return list(widths)
    return [w if w <= 3 else max(4, w // factor) for w in widths]


@register(
    "infogan",
    paper="ollie",
    description="5 ConvTranspose2d, latent 228 -> 3x32x32 (quick: widths /8)",
    paper_batches=(1, 16),
)
def build_infogan(quick: bool, batch: int):
    """InfoGAN generator: 228 -> 448 (k2 s1 p0) -> 256 -> 128 -> 64 -> 3 (k4 s2 p1)."""
    c = _scaled([228, 448, 256, 128, 64, 3], quick)
    layers = [(c[0], c[1], 2, 1, 0)] + [(c[i], c[i + 1], 4, 2, 1) for i in range(1, 5)]
    return TConvGenerator(layers), (torch.randn(batch, c[0], 1, 1),)


@register(
    "dcgan",
    paper="ollie",
    description="5 ConvTranspose2d, latent 100 -> 3x64x64 (quick: widths /8)",
    paper_batches=(1, 16),
)
def build_dcgan(quick: bool, batch: int):
    """DCGAN generator: 100 -> 512 (k4 s1 p0) -> 256 -> 128 -> 64 -> 3 (k4 s2 p1)."""
    c = _scaled([100, 512, 256, 128, 64, 3], quick)
    layers = [(c[0], c[1], 4, 1, 0)] + [(c[i], c[i + 1], 4, 2, 1) for i in range(1, 5)]
    return TConvGenerator(layers), (torch.randn(batch, c[0], 1, 1),)
