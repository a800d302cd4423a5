"""YOLOX-nano (Ge et al., 2021), the Korch paper's YOLOX, with random weights.

The nano configuration (depth 0.33, width 0.25, depthwise convs, SiLU) as in the YOLOX
repository: Focus stem, CSPDarknet with SPP, PAFPN neck and the decoupled head, exported with
``decode_in_inference=False`` (Korch's setting): the output is the raw ``[bs, anchors, 85]``
prediction (box 4 + objectness 1 + 80 classes, sigmoid on objectness and classes). Simplified:
BatchNorm stays a separate op (eval mode), no training-time branches.
"""

from __future__ import annotations

import torch
from torch import nn

from .registry import register


class BaseConv(nn.Module):
    """Conv (no bias) + BatchNorm + SiLU."""

    def __init__(self, c_in, c_out, k, stride=1, groups=1):
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, k, stride, (k - 1) // 2, groups=groups, bias=False)
        self.bn = nn.BatchNorm2d(c_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.silu(self.bn(self.conv(x)))


class DWConv(nn.Module):
    """Depthwise k x k BaseConv followed by a pointwise BaseConv."""

    def __init__(self, c_in, c_out, k, stride=1):
        super().__init__()
        self.dconv = BaseConv(c_in, c_in, k, stride, groups=c_in)
        self.pconv = BaseConv(c_in, c_out, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pconv(self.dconv(x))


class Bottleneck(nn.Module):
    """1x1 BaseConv then 3x3 DWConv, with an optional shortcut."""

    def __init__(self, c_in, c_out, shortcut):
        super().__init__()
        self.conv1 = BaseConv(c_in, c_out, 1)
        self.conv2 = DWConv(c_out, c_out, 3)
        self.shortcut = shortcut and c_in == c_out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv2(self.conv1(x))
        return y + x if self.shortcut else y


class CSPLayer(nn.Module):
    """Cross-stage partial layer: two 1x1 branches, bottlenecks on one, concat, 1x1."""

    def __init__(self, c_in, c_out, n, shortcut=True):
        super().__init__()
        hidden = c_out // 2
        self.conv1 = BaseConv(c_in, hidden, 1)
        self.conv2 = BaseConv(c_in, hidden, 1)
        self.m = nn.Sequential(*[Bottleneck(hidden, hidden, shortcut) for _ in range(n)])
        self.conv3 = BaseConv(2 * hidden, c_out, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv3(torch.cat([self.m(self.conv1(x)), self.conv2(x)], 1))


class SPPBottleneck(nn.Module):
    """Spatial pyramid pooling: max-pools 5, 9, 13 (stride 1) concatenated."""

    def __init__(self, c_in, c_out, sizes=(5, 9, 13)):
        super().__init__()
        hidden = c_in // 2
        self.conv1 = BaseConv(c_in, hidden, 1)
        self.pools = nn.ModuleList([nn.MaxPool2d(k, 1, k // 2) for k in sizes])
        self.conv2 = BaseConv(hidden * (len(sizes) + 1), c_out, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv1(x)
        return self.conv2(torch.cat([x] + [pool(x) for pool in self.pools], 1))


class Focus(nn.Module):
    """Space-to-depth (four 2x2 phases stacked on channels), then a 3x3 BaseConv."""

    def __init__(self, c_in, c_out):
        super().__init__()
        self.conv = BaseConv(4 * c_in, c_out, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        phases = [x[..., ::2, ::2], x[..., 1::2, ::2], x[..., ::2, 1::2], x[..., 1::2, 1::2]]
        return self.conv(torch.cat(phases, 1))


class CSPDarknet(nn.Module):
    """Backbone; returns the stride 8, 16 and 32 feature maps."""

    def __init__(self, base: int, depth: int, deep: int):
        super().__init__()
        self.stem = Focus(3, base)
        self.dark2 = nn.Sequential(
            DWConv(base, 2 * base, 3, 2), CSPLayer(2 * base, 2 * base, depth)
        )
        self.dark3 = nn.Sequential(
            DWConv(2 * base, 4 * base, 3, 2), CSPLayer(4 * base, 4 * base, deep)
        )
        self.dark4 = nn.Sequential(
            DWConv(4 * base, 8 * base, 3, 2), CSPLayer(8 * base, 8 * base, deep)
        )
        self.dark5 = nn.Sequential(
            DWConv(8 * base, 16 * base, 3, 2),
            SPPBottleneck(16 * base, 16 * base),
            CSPLayer(16 * base, 16 * base, depth, shortcut=False),
        )

    def forward(self, x: torch.Tensor):
        x = self.dark2(self.stem(x))
        c3 = self.dark3(x)
        c4 = self.dark4(c3)
        return c3, c4, self.dark5(c4)


class PAFPN(nn.Module):
    """Top-down then bottom-up path aggregation over the three backbone maps."""

    def __init__(self, c: int, depth: int):
        super().__init__()
        self.lateral_conv0 = BaseConv(4 * c, 2 * c, 1)
        self.c3_p4 = CSPLayer(4 * c, 2 * c, depth, False)
        self.reduce_conv1 = BaseConv(2 * c, c, 1)
        self.c3_p3 = CSPLayer(2 * c, c, depth, False)
        self.bu_conv2 = DWConv(c, c, 3, 2)
        self.c3_n3 = CSPLayer(2 * c, 2 * c, depth, False)
        self.bu_conv1 = DWConv(2 * c, 2 * c, 3, 2)
        self.c3_n4 = CSPLayer(4 * c, 4 * c, depth, False)

    def forward(self, c3, c4, c5):
        up = nn.functional.interpolate
        fpn0 = self.lateral_conv0(c5)
        f0 = self.c3_p4(torch.cat([up(fpn0, scale_factor=2, mode="nearest"), c4], 1))
        fpn1 = self.reduce_conv1(f0)
        p3 = self.c3_p3(torch.cat([up(fpn1, scale_factor=2, mode="nearest"), c3], 1))
        p4 = self.c3_n3(torch.cat([self.bu_conv2(p3), fpn1], 1))
        p5 = self.c3_n4(torch.cat([self.bu_conv1(p4), fpn0], 1))
        return p3, p4, p5


class DecoupledHead(nn.Module):
    """Per level: 1x1 stem, two 3x3 DWConvs for classes and two for boxes, 1x1 predictors."""

    def __init__(self, in_channels, hidden: int, num_classes: int):
        super().__init__()
        self.stems = nn.ModuleList([BaseConv(c, hidden, 1) for c in in_channels])

        def branch():
            return nn.Sequential(DWConv(hidden, hidden, 3), DWConv(hidden, hidden, 3))

        self.cls_convs = nn.ModuleList([branch() for _ in in_channels])
        self.reg_convs = nn.ModuleList([branch() for _ in in_channels])
        self.cls_preds = nn.ModuleList([nn.Conv2d(hidden, num_classes, 1) for _ in in_channels])
        self.reg_preds = nn.ModuleList([nn.Conv2d(hidden, 4, 1) for _ in in_channels])
        self.obj_preds = nn.ModuleList([nn.Conv2d(hidden, 1, 1) for _ in in_channels])

    def forward(self, features):
        outputs = []
        for i, x in enumerate(features):
            x = self.stems[i](x)
            cls = self.cls_preds[i](self.cls_convs[i](x))
            reg_feat = self.reg_convs[i](x)
            reg, obj = self.reg_preds[i](reg_feat), self.obj_preds[i](reg_feat)
            out = torch.cat([reg, torch.sigmoid(obj), torch.sigmoid(cls)], 1)
            outputs.append(out.flatten(start_dim=2))
        return torch.cat(outputs, dim=2).permute(0, 2, 1)


class YOLOX(nn.Module):
    """Backbone + PAFPN + decoupled head."""

    def __init__(self, base=16, depth=1, deep=3, hidden=64, num_classes=80):
        super().__init__()
        self.backbone = CSPDarknet(base, depth, deep)
        self.neck = PAFPN(4 * base, depth)
        self.head = DecoupledHead([4 * base, 8 * base, 16 * base], hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.neck(*self.backbone(x)))


@register(
    "yolox",
    paper="korch",
    description="YOLOX-nano (depth 0.33, width 0.25, depthwise) on 3x416x416, raw head output "
    "(quick: one bottleneck per CSP layer, 3x64x64)",
)
def build_yolox(quick: bool, batch: int):
    """Paper size 416x416; the quick size keeps the nano widths on 64x64."""
    if quick:
        return YOLOX(deep=1), (torch.randn(batch, 3, 64, 64),)
    return YOLOX(), (torch.randn(batch, 3, 416, 416),)
