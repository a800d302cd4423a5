"""Both formulations of the dilated band attention equal the G2BMM/GBMM definition."""

import pytest

torch = pytest.importorskip("torch")

from tvm_ollie.models.longformer import DilatedBandAttention, LongformerLayer  # noqa: E402


def _reference(att, x, window, dilation):
    """Loop-by-definition G2BMM -> softmax -> GBMM with zero-padded keys."""
    b, seq, hidden = x.shape
    q = att._heads(att.q(x)) * att.head_dim**-0.5
    k, v = att._heads(att.k(x)), att._heads(att.v(x))
    scores = torch.zeros(b, att.heads, seq, 2 * window + 1)
    for m in range(seq):
        for w in range(2 * window + 1):
            key = m + dilation * (w - window)
            if 0 <= key < seq:
                scores[:, :, m, w] = (q[:, :, m] * k[:, :, key]).sum(-1)
    probs = scores.softmax(-1)
    out = torch.zeros_like(q)
    for m in range(seq):
        for w in range(2 * window + 1):
            key = m + dilation * (w - window)
            if 0 <= key < seq:
                out[:, :, m] += probs[:, :, m, w, None] * v[:, :, key]
    return out.permute(0, 2, 1, 3).reshape(b, seq, hidden)


@pytest.mark.parametrize("seq,window,dilation", [(48, 5, 4), (40, 7, 2), (36, 12, 3), (30, 3, 1)])
@pytest.mark.parametrize("band", ["gather", "chunked"])
def test_band_attention_matches_definition(seq, window, dilation, band):
    torch.manual_seed(0)
    att = DilatedBandAttention(16, 2, seq, window, dilation, band).eval()
    x = torch.randn(2, seq, 16)
    with torch.no_grad():
        expected = _reference(att, x, window, dilation)
        torch.testing.assert_close(att(x), expected, rtol=1e-5, atol=1e-5)


def test_auto_picks_by_memory_and_rejects_bad_options():
    assert LongformerLayer(32, 4, 64, 4, 4).attention.band == "gather"
    assert LongformerLayer(512, 8, 10000, 1000, 4).attention.band == "chunked"
    with pytest.raises(ValueError):
        DilatedBandAttention(32, 4, 64, 4, 4, "banded")
    with pytest.raises(ValueError):
        DilatedBandAttention(32, 4, 66, 4, 4, "chunked")  # seq not divisible by dilation
