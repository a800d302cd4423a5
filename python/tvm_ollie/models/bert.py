"""One BERT-base encoder layer (Devlin et al., 2019): the common transformer reference point.

Post-LN layer: multi-head self-attention written as explicit matmuls (not a fused SDPA op, so
every system and the Relax importer see the same matmul/softmax graph), output projection,
residual + LayerNorm, FFN with GELU, residual + LayerNorm. Paper size: seq 128, hidden 768,
12 heads, FFN 3072.
"""

from __future__ import annotations

import torch
from torch import nn

from .registry import register


class BertLayer(nn.Module):
    """A post-LayerNorm transformer encoder layer."""

    def __init__(self, hidden: int, heads: int, ffn: int):
        super().__init__()
        self.heads, self.head_dim = heads, hidden // heads
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.ln1 = nn.LayerNorm(hidden, eps=1e-12)
        self.fc1 = nn.Linear(hidden, ffn)
        self.fc2 = nn.Linear(ffn, hidden)
        self.ln2 = nn.LayerNorm(hidden, eps=1e-12)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, hidden = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        scores = torch.matmul(q, k.transpose(-1, -2)) * (self.head_dim**-0.5)
        ctx = torch.matmul(torch.softmax(scores, dim=-1), v)
        ctx = ctx.permute(0, 2, 1, 3).reshape(b, n, hidden)
        x = self.ln1(x + self.proj(ctx))
        return self.ln2(x + self.fc2(nn.functional.gelu(self.fc1(x))))


@register(
    "bert",
    paper="extra",
    description="BERT-base encoder layer, seq 128, hidden 768, 12 heads, FFN 3072 "
    "(quick: seq 32, hidden 128, 2 heads, FFN 512)",
)
def build_bert(quick: bool, batch: int):
    """Paper size: BERT-base, seq 128."""
    if quick:
        return BertLayer(128, 2, 512), (torch.randn(batch, 32, 128),)
    return BertLayer(768, 12, 3072), (torch.randn(batch, 128, 768),)
