"""Token-budget batches: budget respected, every pair once per epoch, seeded order, little padding."""

from __future__ import annotations

import torch

from model.translation.batching import Example, encode_pairs, make_batches, pad_batch
from model.translation.tokenizer import train_tokenizer, training_sentences
from tests.model.translation.excerpts import DING_PAIRS, HELP_PAIRS, UI_PAIRS


def examples(n: int = 500) -> list[Example]:
    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(2, 60, (n, 2), generator=gen).tolist()
    return [Example(i, [5] * s + [2], [1] + [6] * t + [2]) for i, (s, t) in enumerate(lengths)]


def test_batches_respect_the_token_budget_and_use_every_pair_once():
    exs = examples()
    batches = make_batches(exs, 400, torch.Generator().manual_seed(1))
    assert sorted(ex.index for b in batches for ex in b) == list(range(len(exs)))
    assert all(len(b) * max(ex.size for ex in b) <= 400 for b in batches)


def test_order_is_seeded_and_changes_between_epochs():
    exs = examples()
    first = [[ex.index for ex in b] for b in make_batches(exs, 400, torch.Generator().manual_seed(1))]
    again = [[ex.index for ex in b] for b in make_batches(exs, 400, torch.Generator().manual_seed(1))]
    other = [[ex.index for ex in b] for b in make_batches(exs, 400, torch.Generator().manual_seed(2))]
    assert first == again and first != other


def test_length_bucketing_keeps_padding_low():
    exs = examples(2000)
    batches = make_batches(exs, 800, torch.Generator().manual_seed(0))
    real = sum(ex.size for b in batches for ex in b)
    padded = sum(len(b) * max(ex.size for ex in b) for b in batches)
    assert real / padded > 0.85  # unsorted batches of random lengths 2..60 would waste about 40%


def test_validation_batches_are_deterministic_and_sorted():
    exs = examples()
    batches = make_batches(exs, 400, None)
    sizes = [ex.size for b in batches for ex in b]
    assert sizes == sorted(sizes)


def test_a_pair_longer_than_the_budget_still_gets_its_own_batch():
    exs = [Example(0, [5] * 50 + [2], [1, 6, 2]), Example(1, [5, 2], [1, 6, 2])]
    assert sorted(len(b) for b in make_batches(exs, 20, None)) == [1, 1]


def test_encode_pairs_frames_the_sides_and_counts_long_pairs():
    tok = train_tokenizer(training_sentences(DING_PAIRS + HELP_PAIRS + UI_PAIRS), vocab_size=400)
    pairs = DING_PAIRS[:3] + [("word " * 300, "Wort")]
    kept, dropped = encode_pairs(tok, pairs, max_length=150)
    assert dropped == 1 and [ex.index for ex in kept] == [0, 1, 2]
    assert kept[0].src[-1] == 2 and kept[0].tgt[0] == 1 and kept[0].tgt[-1] == 2
    assert tok.decode(kept[0].tgt) == DING_PAIRS[0][1]


def test_pad_batch_right_pads_both_sides():
    src, tgt = pad_batch([Example(0, [5, 6, 2], [1, 7, 2]), Example(1, [5, 2], [1, 7, 8, 9, 2])], pad_id=0)
    assert src.tolist() == [[5, 6, 2], [5, 2, 0]]
    assert tgt.tolist() == [[1, 7, 2, 0, 0], [1, 7, 8, 9, 2]]
