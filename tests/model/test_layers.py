import pytest
import torch
import torch.nn.functional as F

from model.layers import Attention


@pytest.fixture
def attn() -> Attention:
    torch.manual_seed(0)
    return Attention(dim=32, heads=4).eval()


def test_probabilities_rows_sum_to_one(attn):
    x = torch.randn(3, 7, 32)
    out, probs = attn(x, return_probs=True)
    assert out.shape == (3, 7, 32)
    assert probs.shape == (3, 4, 7, 7)
    torch.testing.assert_close(probs.sum(-1), torch.ones(3, 4, 7))
    assert (probs >= 0).all()


def test_probabilities_only_when_asked(attn):
    _, probs = attn(torch.randn(2, 5, 32))
    assert probs is None


@pytest.mark.parametrize("masked", [False, True])
def test_matches_scaled_dot_product_attention(attn, masked):
    x = torch.randn(2, 6, 32)
    mask = torch.ones(6, 6, dtype=torch.bool).tril() if masked else None
    q, k, v = (attn.split_heads(proj(x)) for proj in (attn.q, attn.k, attn.v))  # (B, H, T, Dh)
    expected = attn.proj(attn.merge_heads(F.scaled_dot_product_attention(q, k, v, attn_mask=mask)))
    out, _ = attn(x, mask=mask)
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=1e-5)


def test_mask_blocks_positions(attn):
    x = torch.randn(1, 5, 32)
    mask = torch.ones(5, 5, dtype=torch.bool).tril()  # causal
    _, probs = attn(x, mask=mask, return_probs=True)
    assert probs.triu(diagonal=1).abs().max() == 0
    torch.testing.assert_close(probs.sum(-1), torch.ones(1, 4, 5))


def test_cross_attention_shapes(attn):
    out, probs = attn(torch.randn(2, 3, 32), context=torch.randn(2, 9, 32), return_probs=True)
    assert out.shape == (2, 3, 32)
    assert probs.shape == (2, 4, 3, 9)


def test_rejects_indivisible_heads():
    with pytest.raises(ValueError, match="divisible"):
        Attention(dim=30, heads=4)
