"""Token-budget batches with length bucketing for the translator's training.

A batch holds as many pairs as fit in ``max_tokens`` *padded* positions (pairs × the longest side
in the batch), so short sentences travel in large batches and long ones in small batches, and
sorting by length inside large shuffled pools keeps padding low while every epoch still sees a
different order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from contract.tokenizer import Tokenizer


@dataclass(frozen=True)
class Example:
    index: int  # position in the pair list it came from
    src: list[int]  # source pieces + eos
    tgt: list[int]  # bos + target pieces + eos

    @property
    def size(self) -> int:
        return max(len(self.src), len(self.tgt) - 1)


def encode_pairs(tok: Tokenizer, pairs: Sequence[tuple[str, str]], max_length: int) -> tuple[list[Example], int]:
    """Tokenise pairs; those with a side longer than ``max_length`` are left out and counted."""
    sources = tok.encode_batch([s for s, _ in pairs], add_eos=True)
    targets = tok.encode_batch([t for _, t in pairs], add_bos=True, add_eos=True)
    examples = [Example(i, s, t) for i, (s, t) in enumerate(zip(sources, targets))]
    kept = [ex for ex in examples if len(ex.src) <= max_length and len(ex.tgt) <= max_length + 1]
    return kept, len(examples) - len(kept)


def make_batches(
    examples: Sequence[Example], max_tokens: int, gen: torch.Generator | None, pool: int = 100
) -> list[list[Example]]:
    """Split into batches of at most ``max_tokens`` padded positions.

    With a generator: shuffle, sort by length within pools of ``pool`` average batches, then shuffle
    the batches. Without one (validation): sort everything by length, deterministic order.
    """
    if gen is None:
        order = sorted(range(len(examples)), key=lambda i: examples[i].size)
    else:
        perm = torch.randperm(len(examples), generator=gen).tolist()
        mean_size = max(1.0, sum(ex.size for ex in examples) / max(1, len(examples)))
        chunk = max(1, int(pool * max_tokens / mean_size))
        order = [
            i for c in range(0, len(perm), chunk) for i in sorted(perm[c : c + chunk], key=lambda i: examples[i].size)
        ]
    batches, current, longest = [], [], 0
    for i in order:
        ex = examples[i]
        if current and (len(current) + 1) * max(longest, ex.size) > max_tokens:
            batches.append(current)
            current, longest = [], 0
        current.append(ex)
        longest = max(longest, ex.size)
    if current:
        batches.append(current)
    if gen is not None:
        batches = [batches[i] for i in torch.randperm(len(batches), generator=gen).tolist()]
    return batches


def pad_batch(batch: Sequence[Example], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, S) source and (B, T) target ids, right-padded with ``pad_id``."""
    s, t = max(len(ex.src) for ex in batch), max(len(ex.tgt) for ex in batch)
    src = torch.full((len(batch), s), pad_id, dtype=torch.long)
    tgt = torch.full((len(batch), t), pad_id, dtype=torch.long)
    for row, ex in enumerate(batch):
        src[row, : len(ex.src)] = torch.tensor(ex.src)
        tgt[row, : len(ex.tgt)] = torch.tensor(ex.tgt)
    return src, tgt
