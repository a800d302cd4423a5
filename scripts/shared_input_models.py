"""Models for ``tvm-ollie explain`` that show groups of projections sharing an input.

``bert_separate_qkv``: one BERT encoder layer written as HuggingFace writes it (separate
``query``/``key``/``value`` linears; the zoo's ``bert`` already fuses them into one linear).
``bert``, ``segformer``: the zoo models at quick sizes. Each returns ``(mod, {"main": params})``:
the CLI binds the weights as constants, so a concatenation of weights folds at compile time.

    tvm-ollie explain scripts/shared_input_models.py:bert_separate_qkv
"""

from __future__ import annotations


def _zoo(name: str, quick: bool = True):
    from tvm_ollie.models.export import to_relax  # pylint: disable=import-outside-toplevel
    from tvm_ollie.models.registry import get_model  # pylint: disable=import-outside-toplevel

    mod, params = to_relax(get_model(name, quick=quick))
    return mod, {"main": params}


def bert():
    """The zoo's BERT layer (fused QKV projection), quick size."""
    return _zoo("bert")


def segformer():
    """The zoo's Segformer (q and kv projections of the last stage share their input)."""
    return _zoo("segformer")


def bert_separate_qkv(seq: int = 32, hidden: int = 128, heads: int = 2, ffn: int = 512):
    """One post-LN BERT layer with separate Q/K/V linears (quick size by default)."""
    # pylint: disable=import-outside-toplevel
    import torch
    from torch import nn

    from tvm_ollie.models.export import to_relax
    from tvm_ollie.models.registry import ModelSpec

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.q, self.k, self.v = (nn.Linear(hidden, hidden) for _ in range(3))
            self.proj, self.fc1, self.fc2 = (nn.Linear(hidden, hidden),
                                             nn.Linear(hidden, ffn), nn.Linear(ffn, hidden))
            self.ln1, self.ln2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)

        def forward(self, x):
            b, n, _ = x.shape

            def heads_of(t):
                return t.reshape(b, n, heads, hidden // heads).permute(0, 2, 1, 3)

            q, k, v = heads_of(self.q(x)), heads_of(self.k(x)), heads_of(self.v(x))
            att = torch.softmax(q @ k.transpose(-1, -2) * (hidden // heads) ** -0.5, dim=-1)
            ctx = (att @ v).permute(0, 2, 1, 3).reshape(b, n, hidden)
            x = self.ln1(x + self.proj(ctx))
            return self.ln2(x + self.fc2(nn.functional.gelu(self.fc1(x))))

    torch.manual_seed(0)
    spec = ModelSpec("bert_separate_qkv", Layer().eval(), (torch.randn(1, seq, hidden),), True,
                     1, "extra", "BERT layer with separate Q/K/V linears")
    mod, params = to_relax(spec)
    return mod, {"main": params}
