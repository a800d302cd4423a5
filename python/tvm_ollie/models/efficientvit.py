"""EfficientViT-B0 (Cai et al., "EfficientViT: Multi-Scale Linear Attention", ICCV 2023).

The Korch paper evaluates an EfficientViT backbone (MBConv stages, then ReLU linear-attention
stages) with a classification head on 1x3x2048x2048; its exact model is not public, so this is
the smallest published variant, B0 (widths 8/16/32/64/128, depths 1/2/2/2/2, head dim 16,
Hardswish), with its classification head, at Korch's input size:

* stem: conv 3x3/2 + one depthwise-separable residual block;
* stages 1-2: MBConv (expand 4) blocks, the first of each with stride 2;
* stages 3-4: a strided MBConv, then EfficientViT blocks: LiteMLA (1x1 qkv, a 5x5 depthwise +
  grouped 1x1 multi-scale branch, ReLU linear attention, 1x1 projection + BN) and an MBConv;
* head: 1x1 conv to 1024, global pool, linear 1280 with LayerNorm, linear 1000.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from .registry import register


def _conv(c_in, c_out, k=1, stride=1, groups=1, bias=False, bn=True, act=True):
    layers = [nn.Conv2d(c_in, c_out, k, stride, k // 2, groups=groups, bias=bias)]
    if bn:
        layers.append(nn.BatchNorm2d(c_out))
    if act:
        layers.append(nn.Hardswish())
    return nn.Sequential(*layers)


class MBConv(nn.Module):
    """Inverted residual: 1x1 expand (bias, act), 3x3 depthwise (bias, act), 1x1 project + BN."""

    def __init__(self, c_in, c_out, stride=1, expand=4):
        super().__init__()
        mid = c_in * expand
        self.body = nn.Sequential(
            _conv(c_in, mid, 1, bias=True, bn=False),
            _conv(mid, mid, 3, stride, groups=mid, bias=True, bn=False),
            _conv(mid, c_out, 1, act=False),
        )
        self.residual = stride == 1 and c_in == c_out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.body(x)
        return x + y if self.residual else y


class DSConv(nn.Module):
    """Depthwise 3x3 (bias, act) + pointwise 1x1 with BN, residual."""

    def __init__(self, c: int):
        super().__init__()
        self.body = nn.Sequential(
            _conv(c, c, 3, groups=c, bias=True, bn=False), _conv(c, c, 1, act=False)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x)


class LiteMLA(nn.Module):
    """Multi-scale ReLU linear attention (``out = q (k^T [v, 1])``, normalized by the 1 column)."""

    def __init__(self, c: int, head_dim: int = 16, scales=(5,), eps: float = 1e-15):
        super().__init__()
        self.head_dim, self.eps = head_dim, eps
        heads = c // head_dim
        total = heads * head_dim
        self.qkv = nn.Conv2d(c, 3 * total, 1, bias=False)
        width = 3 * total
        self.aggreg = nn.ModuleList(
            [
                nn.Sequential(
                    nn.Conv2d(width, width, k, padding=k // 2, groups=width, bias=False),
                    nn.Conv2d(width, width, 1, groups=3 * heads, bias=False),
                )
                for k in scales
            ]
        )
        self.proj = _conv(total * (1 + len(scales)), c, 1, act=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, _, h, w = x.shape
        qkv = self.qkv(x)
        qkv = torch.cat([qkv] + [op(qkv) for op in self.aggreg], 1)
        qkv = qkv.reshape(b, -1, 3 * self.head_dim, h * w).transpose(-1, -2)
        d = self.head_dim
        q, k, v = torch.relu(qkv[..., :d]), torch.relu(qkv[..., d : 2 * d]), qkv[..., 2 * d :]
        v = F.pad(v, (0, 1), value=1.0)
        out = torch.matmul(q, torch.matmul(k.transpose(-1, -2), v))
        out = out[..., :-1] / (out[..., -1:] + self.eps)
        return self.proj(out.transpose(-1, -2).reshape(b, -1, h, w))


class EfficientViTBlock(nn.Module):
    """LiteMLA context module and MBConv local module, both residual."""

    def __init__(self, c: int, head_dim: int):
        super().__init__()
        self.context = LiteMLA(c, head_dim)
        self.local = MBConv(c, c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.context(x)
        return self.local(x)


class EfficientViT(nn.Module):
    """EfficientViT backbone + classification head."""

    def __init__(self, widths, depths, head_dim, head_widths, num_classes):
        super().__init__()
        layers = [_conv(3, widths[0], 3, 2)] + [DSConv(widths[0]) for _ in range(depths[0])]
        c_in = widths[0]
        for width, depth in zip(widths[1:3], depths[1:3]):
            for i in range(depth):
                layers.append(MBConv(c_in, width, 2) if i == 0 else MBConv(width, width, 1))
            c_in = width
        for width, depth in zip(widths[3:], depths[3:]):
            layers.append(MBConv(c_in, width, 2))
            layers += [EfficientViTBlock(width, head_dim) for _ in range(depth)]
            c_in = width
        self.backbone = nn.Sequential(*layers)
        self.head_conv = _conv(c_in, head_widths[0], 1)
        self.fc1 = nn.Linear(head_widths[0], head_widths[1], bias=False)
        self.ln = nn.LayerNorm(head_widths[1])
        self.fc2 = nn.Linear(head_widths[1], num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.head_conv(self.backbone(x)).mean(dim=(2, 3))
        return self.fc2(F.hardswish(self.ln(self.fc1(x))))


@register(
    "efficientvit",
    paper="korch",
    description="EfficientViT-B0 with classification head on 3x2048x2048 (Korch's input size) "
    "(quick: one block per stage, 3x64x64, head 256/320, 100 classes)",
)
def build_efficientvit(quick: bool, batch: int):
    """B0 widths/depths; paper input 2048x2048."""
    widths, depths = [8, 16, 32, 64, 128], [1, 2, 2, 2, 2]
    if quick:
        model = EfficientViT(widths, [1, 1, 1, 1, 1], 16, (256, 320), 100)
        return model, (torch.randn(batch, 3, 64, 64),)
    model = EfficientViT(widths, depths, 16, (1024, 1280), 1000)
    return model, (torch.randn(batch, 3, 2048, 2048),)
