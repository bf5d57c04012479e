"""Autoregressive decoding over the translator's two graphs, in numpy only (no torch).

The encoder runs once per batch; the decoder runs one step per generated token against a key/value
cache. Both are plain callables from input names to output names (an onnxruntime session wrapped
by :func:`session_fn`, or the PyTorch model wrapped the same way by the exporter's parity check), so
the loop the service runs is the loop the export was verified with.

Names and layouts (``export/translator.py`` writes them into the manifest):

- encoder: ``src_ids`` (B, S) int64, ``src_mask`` (B, S) bool -> ``memory`` (B, S, D),
  ``cross_keys``/``cross_values`` (L, B, H, S, Dh), ``encoder_attentions`` (B, Le, H, S, S)
- decoder: ``tokens``/``positions`` (B, 1) int64, ``past_keys``/``past_values`` (L, B, H, T, Dh),
  ``cache_mask`` (B, T) bool, ``cross_keys``/``cross_values``, ``src_mask`` -> ``log_probs`` (B, V),
  ``present_keys``/``present_values`` (L, B, H, T+1, Dh), ``self_attentions`` (B, L, H, T+1),
  ``cross_attentions`` (B, L, H, S)

Sequences that finish leave the batch at once (their rows are dropped from every array), so a long
sentence never makes the short ones in its batch pay for its extra steps.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

Graph = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]


def session_fn(session) -> Graph:
    """An onnxruntime ``InferenceSession`` as a name -> array callable."""
    names = [o.name for o in session.get_outputs()]
    return lambda feeds: dict(zip(names, session.run(names, feeds)))


@dataclass(frozen=True)
class DecoderSpec:
    layers: int
    heads: int
    head_dim: int
    pad_id: int = 0
    bos_id: int = 1
    eos_id: int = 2
    max_positions: int = 512

    def max_length(self, source_length: int) -> int:
        """Generation limit for a source of this many tokens (eos included)."""
        return max(1, min(self.max_positions, int(source_length * 1.5) + 10))


@dataclass
class Hypothesis:
    tokens: list[int]  # generated ids, eos excluded
    score: float  # sum of token log-probabilities (eos included when it was produced)
    finished: bool  # produced eos (False: stopped by the length limit)
    step_log_probs: list[np.ndarray] = field(default_factory=list)  # per step (V,), only when recorded


def pad_sources(sources: Sequence[Sequence[int]], pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    if not sources or any(len(s) == 0 for s in sources):
        raise ValueError("every source needs at least one token (its eos)")
    ids = np.full((len(sources), max(len(s) for s in sources)), pad_id, dtype=np.int64)
    for row, s in enumerate(sources):
        ids[row, : len(s)] = s
    return ids, ids != pad_id


class _Batch:
    """The decoder's per-row state; ``keep(rows)`` drops finished rows, ``take(rows)`` reorders beams."""

    def __init__(self, spec: DecoderSpec, cross_keys: np.ndarray, cross_values: np.ndarray, src_mask: np.ndarray) -> None:
        n = src_mask.shape[0]
        self.cross_keys, self.cross_values, self.src_mask = cross_keys, cross_values, src_mask
        empty = np.zeros((spec.layers, n, spec.heads, 0, spec.head_dim), dtype=cross_keys.dtype)
        self.past_keys, self.past_values = empty, empty.copy()
        self.cache_mask = np.zeros((n, 0), dtype=bool)

    def take(self, rows: np.ndarray) -> None:
        self.cross_keys, self.cross_values = self.cross_keys[:, rows], self.cross_values[:, rows]
        self.past_keys, self.past_values = self.past_keys[:, rows], self.past_values[:, rows]
        self.src_mask, self.cache_mask = self.src_mask[rows], self.cache_mask[rows]

    def step(self, decoder: Graph, tokens: np.ndarray, position: int) -> dict[str, np.ndarray]:
        out = decoder({
            "tokens": tokens[:, None].astype(np.int64),
            "positions": np.full((len(tokens), 1), position, dtype=np.int64),
            "past_keys": self.past_keys, "past_values": self.past_values, "cache_mask": self.cache_mask,
            "cross_keys": self.cross_keys, "cross_values": self.cross_values, "src_mask": self.src_mask,
        })  # fmt: skip
        self.past_keys, self.past_values = out["present_keys"], out["present_values"]
        self.cache_mask = np.ones((len(tokens), self.past_keys.shape[3]), dtype=bool)
        return out


def greedy(
    encoder: Graph, decoder: Graph, sources: Sequence[Sequence[int]], spec: DecoderSpec, record: bool = False
) -> list[Hypothesis]:
    """Greedy decoding of a batch of tokenised sources (each ending with eos)."""
    ids, mask = pad_sources(sources, spec.pad_id)
    enc = encoder({"src_ids": ids, "src_mask": mask})
    state = _Batch(spec, enc["cross_keys"], enc["cross_values"], mask)
    hyps = [Hypothesis([], 0.0, False) for _ in sources]
    limits = np.array([spec.max_length(len(s)) for s in sources])
    rows = np.arange(len(sources))  # original index of each live row
    tokens = np.full(len(sources), spec.bos_id, dtype=np.int64)
    t = 0
    while len(rows):
        log_probs = state.step(decoder, tokens, t)["log_probs"]
        nxt = log_probs.argmax(-1)
        live = []
        for j, r in enumerate(rows):
            h, tok = hyps[r], int(nxt[j])
            h.score += float(log_probs[j, tok])
            if record:
                h.step_log_probs.append(log_probs[j].copy())
            if tok == spec.eos_id:
                h.finished = True
                continue
            h.tokens.append(tok)
            if len(h.tokens) < limits[r]:
                live.append(j)
        t += 1
        if len(live) < len(rows):
            keep = np.array(live, dtype=np.int64)
            state.take(keep)
            rows, nxt = rows[keep], nxt[keep]
        tokens = nxt
    return hyps


def beam_search(
    encoder: Graph, decoder: Graph, sources: Sequence[Sequence[int]], spec: DecoderSpec,
    beam: int = 4, length_penalty: float = 1.0,
) -> list[Hypothesis]:  # fmt: skip
    """Beam search; finished hypotheses are ranked by score / length**length_penalty.

    A sentence stops when it holds ``beam`` finished hypotheses or reaches its length limit;
    its rows then leave the batch.
    """
    if beam < 1:
        raise ValueError("beam must be >= 1")
    ids, mask = pad_sources(sources, spec.pad_id)
    enc = encoder({"src_ids": ids, "src_mask": mask})
    expand = np.repeat(np.arange(len(sources)), beam)
    state = _Batch(spec, enc["cross_keys"][:, expand], enc["cross_values"][:, expand], mask[expand])
    limits = [spec.max_length(len(s)) for s in sources]
    live: dict[int, list[tuple[list[int], float]]] = {i: [([], 0.0)] + [([], -np.inf)] * (beam - 1) for i in range(len(sources))}
    done: dict[int, list[Hypothesis]] = {i: [] for i in range(len(sources))}
    order = list(range(len(sources)))  # sentence of each block of `beam` rows
    tokens = np.full(len(sources) * beam, spec.bos_id, dtype=np.int64)
    t = 0
    while order:
        log_probs = state.step(decoder, tokens, t)["log_probs"]
        vocab = log_probs.shape[1]
        t += 1
        next_order, next_rows, next_tokens = [], [], []
        for block, s in enumerate(order):
            scores = np.array([score for _, score in live[s]])[:, None] + log_probs[block * beam : (block + 1) * beam]
            flat = scores.ravel()
            top = np.argpartition(-flat, min(2 * beam, flat.size - 1))[: 2 * beam]
            new_live = []
            for c in top[np.argsort(-flat[top])]:
                if not np.isfinite(flat[c]):
                    break
                b, tok = divmod(int(c), vocab)
                prefix = live[s][b][0]
                if tok == spec.eos_id:
                    if len(done[s]) < beam:
                        done[s].append(Hypothesis(prefix, float(flat[c]), True))
                elif len(new_live) < beam:
                    new_live.append((prefix + [tok], float(flat[c]), b))
                if len(new_live) == beam and len(done[s]) >= beam:
                    break
            if len(done[s]) >= beam or t >= limits[s] or not new_live:
                if not done[s]:
                    done[s] = [Hypothesis(p, sc, False) for p, sc, _ in new_live]
                continue
            new_live += [(new_live[0][0], -np.inf, new_live[0][2])] * (beam - len(new_live))
            live[s] = [(p, sc) for p, sc, _ in new_live]
            next_order.append(s)
            next_rows += [block * beam + b for _, _, b in new_live]
            next_tokens += [p[-1] for p, _, _ in new_live]
        order = next_order
        if order:
            state.take(np.array(next_rows, dtype=np.int64))
            tokens = np.array(next_tokens, dtype=np.int64)
    return [max(done[i], key=lambda h: h.score / max(1, len(h.tokens) + h.finished) ** length_penalty) for i in range(len(sources))]
