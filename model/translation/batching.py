"""Token-budget batches with length bucketing for the translator's training.

A batch holds as many pairs as fit in ``max_tokens`` *padded* positions (pairs × the longest side
in the batch), so short sentences travel in large batches and long ones in small batches, and
sorting by length inside large shuffled pools keeps padding low while every epoch still sees a
different order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain

import numpy as np
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


def pad_rows(rows: Sequence[Sequence[int]], pad_id: int) -> torch.Tensor:
    """(B, longest) ids, right-padded with ``pad_id``: one vectorised fill, no loop over rows."""
    lengths = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
    out = np.full((len(rows), int(lengths.max())), pad_id, dtype=np.int64)
    out[np.arange(out.shape[1]) < lengths[:, None]] = np.fromiter(chain.from_iterable(rows), dtype=np.int64)
    return torch.from_numpy(out)


def pad_batch(batch: Sequence[Example], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, S) source and (B, T) target ids, right-padded with ``pad_id``."""
    return pad_rows([ex.src for ex in batch], pad_id), pad_rows([ex.tgt for ex in batch], pad_id)


@dataclass(frozen=True)
class Batch:
    """A padded batch where the model runs, and its number of target tokens, counted on the host
    (reading it back from the device would wait for the GPU at every step)."""

    src: torch.Tensor  # (B, S)
    tgt: torch.Tensor  # (B, T): bos + target + eos
    target_tokens: int  # the positions the loss is summed over (T - 1 per row, padding excluded)


def device_batches(batches: Sequence[Sequence[Example]], pad_id: int, device: torch.device) -> list[Batch]:
    """Every batch padded and moved to ``device`` at once, before the steps that use them."""
    out = []
    for batch in batches:
        src, tgt = pad_batch(batch, pad_id)
        if device.type == "cuda":
            src, tgt = src.pin_memory(), tgt.pin_memory()
        out.append(
            Batch(
                src.to(device, non_blocking=True),
                tgt.to(device, non_blocking=True),
                sum(len(ex.tgt) - 1 for ex in batch),
            )
        )
    return out
