"""One Longformer layer with dilated sliding-window attention (the OLLIE paper's Longformer).

As in OLLIE's model: Q/K/V projections, G2BMM (banded ``Q K^T``), Softmax, GBMM (banded
``P V``), two FFN matmul+ReLU layers and a residual add. With window ``W`` (one side) and
dilation ``D``, for query ``m`` and band position ``w in [0, 2W]``::

    scores[b, h, m, w] = sum_k Q[b, h, m, k] * K[b, h, m + D * (w - W), k]
    out[b, h, m, n]    = sum_w P[b, h, m, w] * V[b, h, m + D * (w - W), n]

Keys outside the sequence read zero (OLLIE's G2BMM/GBMM zero padding; there is no -inf mask).

Two exact formulations of the banded products, both plain gather/pad/reshape/einsum ops that
``torch.export`` and the ONNX exporter handle:

* ``"gather"`` builds the ``[n, 2W+1]`` key index and gathers keys per query. It is the literal
  definition but materializes ``n * (2W+1) * head_dim`` values (41 GB at the paper's size).
* ``"chunked"`` splits the sequence by residue mod ``D`` (which turns the dilated band into an
  ordinary one), cuts it into chunks of ``C`` queries, multiplies each chunk by its ``C + 2W``
  keys and extracts (or re-inserts) the band with a pad-and-reshape skew. It computes
  ``(C + 2W) / (2W + 1)`` times the band's FLOPs and needs no large gather.

``"auto"`` picks ``"gather"`` when the gathered keys fit in 256 MiB.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from .registry import register

_GATHER_LIMIT_BYTES = 256 << 20


def _gather_index(n: int, window: int, dilation: int) -> torch.Tensor:
    """``idx[m, w] = m + D * w``: key positions in a sequence padded by ``D * W`` on each side."""
    return torch.arange(n)[:, None] + dilation * torch.arange(2 * window + 1)[None, :]


def _chunk_index(n_chunks: int, chunk: int, window: int) -> torch.Tensor:
    """``idx[c, j] = c * C + j``: the ``C + 2W`` keys that chunk ``c`` needs (keys padded by W)."""
    return (torch.arange(n_chunks) * chunk)[:, None] + torch.arange(chunk + 2 * window)[None, :]


class DilatedBandAttention(nn.Module):
    """Multi-head attention restricted to a dilated band (G2BMM -> Softmax -> GBMM)."""

    def __init__(self, hidden: int, heads: int, seq: int, window: int, dilation: int, band: str):
        super().__init__()
        if hidden % heads:
            raise ValueError("hidden must be divisible by heads")
        self.heads, self.window, self.dilation = heads, window, dilation
        self.head_dim = hidden // heads
        self.q = nn.Linear(hidden, hidden)
        self.k = nn.Linear(hidden, hidden)
        self.v = nn.Linear(hidden, hidden)
        if band == "auto":
            gathered = seq * (2 * window + 1) * self.head_dim * heads * 4
            band = "gather" if gathered <= _GATHER_LIMIT_BYTES else "chunked"
        if band not in ("gather", "chunked"):
            raise ValueError(f"band must be 'gather', 'chunked' or 'auto', got {band!r}")
        self.band = band
        if band == "gather":
            self.register_buffer("index", _gather_index(seq, window, dilation), persistent=False)
        else:
            if seq % dilation:
                raise ValueError("the chunked band needs seq divisible by dilation")
            length = seq // dilation
            self.chunk = max(1, min(length, window // 4 if window >= 4 else window))
            self.n_chunks = -(-length // self.chunk)
            idx = _chunk_index(self.n_chunks, self.chunk, window)
            self.register_buffer("index", idx, persistent=False)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        b, n, _ = x.shape
        return x.reshape(b, n, self.heads, self.head_dim).permute(0, 2, 1, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, hidden = x.shape
        q = self._heads(self.q(x)) * (self.head_dim**-0.5)
        k, v = self._heads(self.k(x)), self._heads(self.v(x))
        if self.band == "gather":
            out = self._gather_attention(q, k, v)
        else:
            out = self._chunked_attention(q, k, v)
        return out.permute(0, 2, 1, 3).reshape(b, n, hidden)

    def _gather_attention(self, q, k, v):
        pad = self.dilation * self.window
        keys = F.pad(k, (0, 0, pad, pad))[:, :, self.index]
        scores = torch.einsum("bhmk,bhmwk->bhmw", q, keys)  # G2BMM
        probs = torch.softmax(scores, dim=-1)
        values = F.pad(v, (0, 0, pad, pad))[:, :, self.index]
        return torch.einsum("bhmw,bhmwk->bhmk", probs, values)  # GBMM

    def _chunked_attention(self, q, k, v):
        d = self.dilation
        q, k, v = (_split_residues(t, d) for t in (q, k, v))
        scores = self._band_scores(q, k)  # G2BMM on each residue class
        probs = torch.softmax(scores, dim=-1)
        return _merge_residues(self._band_apply(probs, v))  # GBMM

    def _band_scores(self, q, k):
        """Non-dilated G2BMM over ``[..., L, dk]`` via chunked einsum and the skew trick."""
        length, w, c, nc = q.shape[-2], self.window, self.chunk, self.n_chunks
        extra = nc * c - length
        lead = q.shape[:-2]
        qc = F.pad(q, (0, 0, 0, extra)).reshape(*lead, nc, c, q.shape[-1])
        keys = F.pad(k, (0, 0, w, w + extra))[..., self.index, :]
        block = torch.einsum("...ctk,...cjk->...ctj", qc, keys)  # [.., nc, C, C+2W]
        flat = F.pad(block.reshape(*lead, nc, c * (c + 2 * w)), (0, c))
        band = flat.reshape(*lead, nc, c, c + 2 * w + 1)[..., : 2 * w + 1]
        return band.reshape(*lead, nc * c, 2 * w + 1)[..., :length, :]

    def _band_apply(self, probs, v):
        """Non-dilated GBMM: re-insert the band into ``[C, C+2W]`` blocks, then einsum."""
        length, w, c, nc = probs.shape[-2], self.window, self.chunk, self.n_chunks
        extra = nc * c - length
        lead = probs.shape[:-2]
        p = F.pad(probs, (0, c, 0, extra)).reshape(*lead, nc, c * (c + 2 * w + 1))
        block = p[..., : c * (c + 2 * w)].reshape(*lead, nc, c, c + 2 * w)
        values = F.pad(v, (0, 0, w, w + extra))[..., self.index, :]
        out = torch.einsum("...ctj,...cjn->...ctn", block, values)
        return out.reshape(*lead, nc * c, v.shape[-1])[..., :length, :]


def _split_residues(x: torch.Tensor, d: int) -> torch.Tensor:
    """``[b, h, n, k] -> [b, h, d, n/d, k]`` with ``out[.., r, i, :] = x[.., d*i + r, :]``."""
    b, h, n, k = x.shape
    return x.reshape(b, h, n // d, d, k).transpose(2, 3)


def _merge_residues(x: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`_split_residues`."""
    b, h, d, length, k = x.shape
    return x.transpose(2, 3).reshape(b, h, length * d, k)


class LongformerLayer(nn.Module):
    """Dilated band attention, then FFN (two Linear+ReLU) with a residual add."""

    def __init__(self, hidden, heads, seq, window, dilation, band="auto"):
        super().__init__()
        self.attention = DilatedBandAttention(hidden, heads, seq, window, dilation, band)
        self.ffn1 = nn.Linear(hidden, hidden)
        self.ffn2 = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.attention(x)
        return a + torch.relu(self.ffn2(torch.relu(self.ffn1(a))))


@register(
    "longformer",
    paper="ollie",
    description="Longformer layer seq 10000, hidden 512, 8 heads, window 1000, dilation 4 "
    "(chunked band); quick: seq 256, hidden 128, 4 heads, window 16 (gather band)",
    paper_batches=(1, 16),
)
def build_longformer(quick: bool, batch: int):
    """Paper size: seq 10000, hidden 512, 8 heads, W=1000, D=4."""
    if quick:
        seq, hidden, heads, window = 256, 128, 4, 16
    else:
        seq, hidden, heads, window = 10000, 512, 8, 1000
    layer = LongformerLayer(hidden, heads, seq, window, dilation=4)
    return layer, (torch.randn(batch, seq, hidden),)
