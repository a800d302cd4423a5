"""SegFormer-B0 (Xie et al., 2021), the Korch paper's Segformer, with random weights.

Encoder: Mix Transformer B0 (widths 32/64/160/256, depths 2/2/2/2, heads 1/2/5/8, spatial
reduction ratios 8/4/2/1, overlapping patch embeddings 7x7/4 then 3x3/2, Mix-FFN with a 3x3
depthwise conv and GELU, pre-LayerNorm blocks). Decoder: the all-MLP head (per-stage linear
projection to 256, bilinear upsampling to 1/4 resolution, concat, 1x1 fuse conv + BN + ReLU,
150-class 1x1 classifier), as in ``segformer-b0-finetuned-ade-512-512`` (logits at 1/4 size).
Simplified: no dropout/drop-path (inference), weights random.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from .registry import register


class EfficientSelfAttention(nn.Module):
    """Multi-head attention whose keys/values come from a spatially reduced map."""

    def __init__(self, dim: int, heads: int, sr: int):
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.q = nn.Linear(dim, dim)
        self.kv = nn.Linear(dim, 2 * dim)
        self.proj = nn.Linear(dim, dim)
        self.sr = nn.Conv2d(dim, dim, sr, sr) if sr > 1 else None
        self.norm = nn.LayerNorm(dim) if sr > 1 else None

    def forward(self, x: torch.Tensor, h: int, w: int) -> torch.Tensor:
        b, n, c = x.shape
        q = self.q(x).reshape(b, n, self.heads, self.head_dim).permute(0, 2, 1, 3)
        if self.sr is not None:
            x = x.permute(0, 2, 1).reshape(b, c, h, w)
            x = self.norm(self.sr(x).reshape(b, c, -1).permute(0, 2, 1))
        kv = self.kv(x).reshape(b, -1, 2, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        scores = torch.matmul(q, kv[0].transpose(-1, -2)) * (self.head_dim**-0.5)
        out = torch.matmul(torch.softmax(scores, dim=-1), kv[1])
        return self.proj(out.permute(0, 2, 1, 3).reshape(b, n, c))


class MixFFN(nn.Module):
    """Linear, 3x3 depthwise conv on the token map, GELU, linear."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.dw = nn.Conv2d(hidden, hidden, 3, padding=1, groups=hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor, h: int, w: int) -> torch.Tensor:
        b, n, _ = x.shape
        y = self.fc1(x)
        y = self.dw(y.permute(0, 2, 1).reshape(b, -1, h, w)).reshape(b, -1, n).permute(0, 2, 1)
        return self.fc2(F.gelu(y))


class MixBlock(nn.Module):
    """Pre-LN transformer block with efficient attention and Mix-FFN."""

    def __init__(self, dim: int, heads: int, sr: int):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = EfficientSelfAttention(dim, heads, sr)
        self.ffn = MixFFN(dim, 4 * dim)

    def forward(self, x: torch.Tensor, h: int, w: int) -> torch.Tensor:
        x = x + self.attn(self.ln1(x), h, w)
        return x + self.ffn(self.ln2(x), h, w)


class MixStage(nn.Module):
    """Overlapping patch embedding, blocks, LayerNorm; returns an NCHW map."""

    def __init__(self, c_in, dim, patch, stride, depth, heads, sr):
        super().__init__()
        self.embed = nn.Conv2d(c_in, dim, patch, stride, patch // 2)
        self.embed_norm = nn.LayerNorm(dim)
        self.blocks = nn.ModuleList([MixBlock(dim, heads, sr) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        b, c, h, w = x.shape
        x = self.embed_norm(x.flatten(2).permute(0, 2, 1))
        for block in self.blocks:
            x = block(x, h, w)
        return self.norm(x).permute(0, 2, 1).reshape(b, c, h, w)


class Segformer(nn.Module):
    """MiT encoder + all-MLP decoder."""

    def __init__(self, widths, heads, srs, depths, decoder_dim, num_classes):
        super().__init__()
        stages, c_in = [], 3
        for i, (dim, head, sr, depth) in enumerate(zip(widths, heads, srs, depths)):
            patch, stride = (7, 4) if i == 0 else (3, 2)
            stages.append(MixStage(c_in, dim, patch, stride, depth, head, sr))
            c_in = dim
        self.stages = nn.ModuleList(stages)
        self.mlps = nn.ModuleList([nn.Linear(w, decoder_dim) for w in widths])
        self.fuse = nn.Conv2d(len(widths) * decoder_dim, decoder_dim, 1, bias=False)
        self.fuse_bn = nn.BatchNorm2d(decoder_dim)
        self.classifier = nn.Conv2d(decoder_dim, num_classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = []
        for stage in self.stages:
            x = stage(x)
            features.append(x)
        size = features[0].shape[2:]
        maps = []
        for feat, mlp in zip(features, self.mlps):
            b, _, h, w = feat.shape
            y = mlp(feat.flatten(2).permute(0, 2, 1)).permute(0, 2, 1).reshape(b, -1, h, w)
            maps.append(F.interpolate(y, size=size, mode="bilinear", align_corners=False))
        y = torch.relu(self.fuse_bn(self.fuse(torch.cat(maps[::-1], 1))))
        return self.classifier(y)


@register(
    "segformer",
    paper="korch",
    description="SegFormer-B0 (MiT-B0 + all-MLP decoder, 150 classes) on 3x512x512 "
    "(quick: half widths, one block per stage, decoder 64, 19 classes, 3x64x64)",
)
def build_segformer(quick: bool, batch: int):
    """Paper size 512x512 (ADE20K B0)."""
    heads, srs, depths = [1, 2, 5, 8], [8, 4, 2, 1], [2, 2, 2, 2]
    if quick:
        model = Segformer([16, 32, 80, 128], heads, srs, [1, 1, 1, 1], 64, 19)
        return model, (torch.randn(batch, 3, 64, 64),)
    model = Segformer([32, 64, 160, 256], heads, srs, depths, 256, 150)
    return model, (torch.randn(batch, 3, 512, 512),)
