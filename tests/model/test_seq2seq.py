"""The encoder-decoder Transformer: masks, positions, shapes, cached decoding, and learning to translate."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from model.seq2seq import (
    Seq2Seq,
    Seq2SeqConfig,
    causal_mask,
    decoder_mask,
    greedy_decode,
    key_mask,
    padding_mask,
    sinusoidal,
)

SMALL = {
    "vocab_size": 40,
    "dim": 32,
    "encoder_layers": 2,
    "decoder_layers": 2,
    "heads": 4,
    "ffn_dim": 64,
    "dropout": 0.0,
}


def small(**kw) -> Seq2Seq:
    torch.manual_seed(0)
    return Seq2Seq(Seq2SeqConfig(**{**SMALL, **kw})).eval()


def batch() -> torch.Tensor:
    src = torch.randint(4, 40, (3, 7), generator=torch.Generator().manual_seed(1))
    src[1, 4:] = 0  # a shorter sentence, right-padded
    src[:, -1] = torch.where(src[:, -1] == 0, 0, 2)
    src[1, 3] = 2
    return src


def test_masks_are_pure_functions_of_ids_and_lengths():
    ids = torch.tensor([[5, 6, 2, 0], [7, 2, 0, 0]])
    assert padding_mask(ids).tolist() == [[True, True, True, False], [True, True, False, False]]
    assert key_mask(padding_mask(ids)).shape == (2, 1, 1, 4)
    assert causal_mask(3)[0, 0].tolist() == [[True, False, False], [True, True, False], [True, True, True]]
    m = decoder_mask(padding_mask(ids))
    assert m.shape == (2, 1, 4, 4)
    assert m[1, 0, 3].tolist() == [True, True, False, False]  # causal and no padded keys
    assert m[0, 0, 1].tolist() == [True, True, False, False]


def test_sinusoidal_positions_follow_the_definition():
    pe = sinusoidal(torch.tensor([[0, 1, 7]]), 8)
    assert pe.shape == (1, 3, 8)
    for j, pos in enumerate([0, 1, 7]):
        for i in range(4):
            angle = pos / 10000 ** (2 * i / 8)
            assert pe[0, j, i].item() == pytest.approx(math.sin(angle), abs=1e-6)
            assert pe[0, j, 4 + i].item() == pytest.approx(math.cos(angle), abs=1e-6)


def test_config_validation_and_round_trip():
    cfg = Seq2SeqConfig(**SMALL, norm="post")
    assert Seq2SeqConfig.from_dict({**cfg.to_dict(), "unknown": 1}) == cfg
    with pytest.raises(ValueError, match="divisible"):
        Seq2SeqConfig(dim=30, heads=4)
    with pytest.raises(ValueError, match="norm"):
        Seq2SeqConfig(norm="sandwich")


def test_embeddings_are_shared_and_tied_unless_asked_otherwise():
    m = small()
    assert m.out.weight is m.tgt_embed.weight is m.src_embed.weight
    m = small(tie_embeddings=False, share_embeddings=False)
    assert m.out.weight is not m.tgt_embed.weight and m.tgt_embed is not m.src_embed
    assert small().num_parameters() < m.num_parameters()


@pytest.mark.parametrize("norm", ["pre", "post"])
def test_shapes_and_attention_probabilities(norm):
    m, src = small(norm=norm), batch()
    mask = padding_mask(src)
    memory, attn = m.encode(src, mask, return_attention=True)
    assert memory.shape == (3, 7, 32) and attn.shape == (3, 2, 4, 7, 7)
    assert torch.allclose(attn.sum(-1), torch.ones(3, 2, 4, 7), atol=1e-5)
    assert attn[1, :, :, :, 4:].abs().max() == 0  # padded source keys get no attention
    tgt = torch.tensor([[1, 5, 6], [1, 7, 0], [1, 8, 9]])
    logits, cross = m.decode(tgt, memory, mask, return_attention=True)
    assert logits.shape == (3, 3, 40) and cross.shape == (3, 2, 4, 3, 7)
    assert cross[1, :, :, :, 4:].abs().max() == 0
    cross_k, cross_v = m.cross_kv(memory)
    assert cross_k.shape == cross_v.shape == (2, 3, 4, 7, 8)


def test_padding_does_not_change_a_sentence():
    m, src = small(), batch()
    alone = src[1:2, :4]
    mem_alone, _ = m.encode(alone, padding_mask(alone))
    mem_batch, _ = m.encode(src, padding_mask(src))
    assert torch.allclose(mem_alone[0], mem_batch[1, :4], atol=1e-5)


@pytest.mark.parametrize("norm", ["pre", "post"])
def test_decode_step_matches_the_full_decoder_at_every_position(norm):
    m, src = small(norm=norm), batch()
    mask = padding_mask(src)
    memory, _ = m.encode(src, mask)
    cross_k, cross_v = m.cross_kv(memory)
    tgt = torch.tensor([[1, 5, 6, 7], [1, 8, 9, 10], [1, 11, 12, 13]])
    full = m.decode(tgt, memory, mask)[0].log_softmax(-1)
    past_k, past_v, cache = m.empty_cache(3)
    for t in range(4):
        log_probs, past_k, past_v, self_p, cross_p = m.decode_step(
            tgt[:, t : t + 1], torch.full((3, 1), t), past_k, past_v, cache, cross_k, cross_v, mask
        )
        cache = torch.ones(3, t + 1, dtype=torch.bool)
        assert torch.allclose(log_probs, full[:, t], atol=1e-5)
        assert (
            past_k.shape == (2, 3, 4, t + 1, 8) and self_p.shape == (3, 2, 4, t + 1) and cross_p.shape == (3, 2, 4, 7)
        )
        assert torch.allclose(self_p.sum(-1), torch.ones(3, 2, 4), atol=1e-5)


def test_cache_mask_hides_cached_positions():
    """A masked cache slot is ignored: left-padding a cache with a masked junk entry changes nothing."""
    m, src = small(), batch()
    mask = padding_mask(src)
    cross_k, cross_v = m.cross_kv(m.encode(src, mask)[0])
    past_k, past_v, cache = m.empty_cache(3)
    tok, pos = torch.ones(3, 1, dtype=torch.long), torch.zeros(3, 1, dtype=torch.long)
    clean = m.decode_step(tok, pos, past_k, past_v, cache, cross_k, cross_v, mask)
    junk = torch.randn(2, 3, 4, 1, 8)
    noisy = m.decode_step(tok, pos, junk, junk, torch.zeros(3, 1, dtype=torch.bool), cross_k, cross_v, mask)
    assert torch.allclose(clean[0], noisy[0], atol=1e-5)
    assert noisy[3][..., 0].abs().max() == 0  # no probability on the masked slot


@pytest.mark.parametrize("norm", ["pre", "post"])
def test_cached_and_uncached_greedy_decoding_agree(norm):
    m, src = small(norm=norm), batch()
    assert greedy_decode(m, src, 12) == greedy_decode(m, src, 12, use_cache=False)


def test_a_tiny_model_learns_a_handful_of_pairs_exactly():
    """Overfit six 'sentences' (reverse the tokens, shift the ids) to exact greedy output."""
    torch.manual_seed(0)
    m = Seq2Seq(Seq2SeqConfig(**{**SMALL, "vocab_size": 24, "dim": 64, "ffn_dim": 128}))
    gen = torch.Generator().manual_seed(3)
    sources = [torch.randint(4, 14, (n,), generator=gen).tolist() for n in (3, 4, 5, 5, 6, 4)]
    targets = [[t + 10 for t in reversed(s)] for s in sources]
    src = torch.tensor([s + [2] + [0] * (6 - len(s)) for s in sources])
    tgt = torch.tensor([[1] + t + [2] + [0] * (6 - len(t)) for t in targets])
    opt = torch.optim.AdamW(m.parameters(), lr=3e-3)
    for _ in range(300):
        m.train()
        logits = m(src, tgt[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1), tgt[:, 1:].flatten(), ignore_index=0)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if loss.item() < 0.01:
            break
    assert greedy_decode(m, src, 10) == targets
