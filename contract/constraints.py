"""Constrained search: a hypothesis emits each of its request's sentinels exactly once, in an allowed order.

A request whose text had protected spans (``contract/placeholders.py``) carries a :class:`Constraint`:
for each span, the token ids that spell its sentinel (one piece, with or without the word-start mark)
and the spans that must come before it. Before the search reads a step's log-probs, :func:`apply`
sets to ``-inf``, in each of the request's rows:

- every sentinel already placed in that row's hypothesis (no sentinel twice), and every sentinel
  whose predecessors are not all placed yet (order);
- end of sentence while a sentinel is missing, unless ending is what the model wants most (the row's
  best token): a hypothesis that does not want a span would otherwise ramble on until the length limit
  forces it in. A span left out so is placed by the word alignment (``contract/projection.py``);
- every piece holding a character that starts a protected span (``%``, ``{``, ``}``, ``<``, ``>``,
  ``&``, ``\\``) when the masked source has no such character: the model cannot write a placeholder of
  its own (no invented ``%n``);
- right after a sentinel whose span stood apart in the source (``%d files``), every piece that would go on
  with the same word or glue one to it with a hyphen (``Q`` + ``ie``, ``%d-Dateien``): a sentinel is a word
  of its own, as masking wrote it;
- once a hypothesis lacking a span is longer than ``LATE_BUDGET`` times its source
  (``contract/decoding.py``), every token but the sentinels that may come next and the end: it places one
  now or ends, its spans left to the alignment;
- and, when the tokens a hypothesis may still emit are no more than the sentinels it lacks, every
  token but those sentinels (so the length limit cannot cut one off).

The search then ranks what is left as it always does, with the model's own log-probs, so a request
without a constraint decodes exactly as before, and greedy, beam search, n-best, streaming and both
decoding paths (host and device-resident) share this one rule. A hypothesis records what it has
placed as a bit set (``Hypothesis.placed``), carried from parent to child.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

GUARDED = "%{}<>&\\"  # characters that start a protected span


@dataclass(frozen=True)
class SentinelVocabulary:
    """A tokenizer's sentinels (strings each spelt by one piece) and the pieces holding guarded characters."""

    sentinels: tuple[str, ...]  # in the order masking uses them
    ids: tuple[tuple[int, ...], ...]  # per sentinel, the pieces that spell it
    guarded: dict[str, np.ndarray]  # per guarded character, the ids of the pieces that contain it
    continuing: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))  # pieces inside a word

    @classmethod
    def build(cls, tokenizer, candidates: Sequence[str]) -> SentinelVocabulary:
        """The candidates that the tokenizer has a piece for (with or without ``▁``), and the guarded pieces.

        ``tokenizer``: :class:`contract.tokenizer.Tokenizer` or ``SentencePiecePair`` (``pieces``, ``piece_to_id``,
        ``vocab_size``, ``encode``)."""
        sentinels, ids = [], []
        for s in candidates:
            spelt = {tokenizer.piece_to_id(p) for p in (s, "\u2581" + s)} - {tokenizer.unk_id}
            spelt = {i for i in spelt if tokenizer.pieces([i])[0].lstrip("\u2581") == s}
            if spelt:
                sentinels.append(s)
                ids.append(tuple(sorted(spelt)))
        control = set(tokenizer.special.as_dict().values())  # </s> is no tag
        surface = [
            "" if i in control else _surface(p) for i, p in enumerate(tokenizer.pieces(range(tokenizer.vocab_size)))
        ]
        guarded = {c: np.array([i for i, t in enumerate(surface) if c in t], dtype=np.int64) for c in GUARDED}
        continuing = np.array([i for i, t in enumerate(surface) if t[:1].isalnum() or t[:1] == "-"], dtype=np.int64)
        return cls(tuple(sentinels), tuple(ids), guarded, continuing)


def _surface(piece: str) -> str:
    """The text a piece stands for: a byte-fallback piece ``<0x25>`` is ``%``."""
    if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
        try:
            return chr(int(piece[3:5], 16))
        except ValueError:
            return piece
    return piece


@dataclass(eq=False)
class Constraint:
    """What one request's hypotheses must emit: ``spans[i]``'s sentinel, spelt by any of ``ids[i]``, once each,
    after every span of ``after[i]``."""

    ids: tuple[tuple[int, ...], ...]
    after: tuple[tuple[int, ...], ...]
    banned: np.ndarray  # never allowed (guarded pieces the masked source has no use for)
    eos: int
    continuing: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))  # not after a sentinel
    apart: tuple[bool, ...] = ()  # per span, whether the source set it apart from what follows (default: all)
    span_of: dict[int, int] = field(init=False, repr=False)  # token id -> the span whose sentinel it spells
    _masks: dict[tuple[int, int, bool], np.ndarray] = field(init=False, repr=False, default_factory=dict)

    def __post_init__(self) -> None:
        self.span_of = {t: i for i, ids in enumerate(self.ids) for t in ids}
        self.complete = (1 << len(self.ids)) - 1
        self.apart = self.apart or (True,) * len(self.ids)

    @classmethod
    def for_text(
        cls, masked_text: str, sentinels: Sequence[str], vocabulary: SentinelVocabulary, after, eos: int, apart=()
    ) -> Constraint:
        """The constraint of a masked sentence whose spans use ``sentinels`` (in span order); ``apart``: per span,
        whether whitespace or the end followed it in the source."""
        index = {s: i for i, s in enumerate(vocabulary.sentinels)}
        ids = tuple(vocabulary.ids[index[s]] for s in sentinels)
        parts = [vocabulary.guarded[c] for c in GUARDED if c not in masked_text]
        banned = np.unique(np.concatenate(parts)) if parts else np.empty(0, dtype=np.int64)
        return cls(ids, tuple(tuple(a) for a in after), banned, eos, vocabulary.continuing, tuple(apart))

    def placed(self, state: int, token: int) -> int:
        """The set of placed spans after ``token``."""
        span = self.span_of.get(token)
        return state if span is None else state | (1 << span)

    def missing(self, state: int) -> int:
        return len(self.ids) - state.bit_count()

    def disallowed(self, state: int, forced: int, glued: bool = False) -> np.ndarray:
        """The ids a row in ``state`` may not emit now (``forced``, :data:`NOW` or :data:`LATE`: the ones it may;
        ``glued``: the row's last token was the sentinel of a span set apart)."""
        key = (state, forced, glued)
        if key not in self._masks:
            ready, waiting = [], []
            for i, ids in enumerate(self.ids):
                placed = state >> i & 1
                if not placed and all(state >> j & 1 for j in self.after[i]):
                    ready += ids
                else:
                    waiting += ids
            if forced:  # only the sentinels that can come next (and, past the budget, the end)
                self._masks[key] = np.array(sorted(ready + ([self.eos] if forced == LATE else [])), dtype=np.int64)
            else:
                extra = [self.eos] if state != self.complete else []
                parts = [self.banned, np.array(waiting + extra, dtype=np.int64)] + ([self.continuing] if glued else [])
                self._masks[key] = np.unique(np.concatenate(parts))
        return self._masks[key]


NOW, LATE = 1, 2  # must place a sentinel now (the length limit is near); place one or end (past the budget)
Limit = tuple[list[int], "Constraint", int, int, bool]  # rows, constraint, placed set, 0/NOW/LATE, glued


def apply(log_probs: np.ndarray, limits: Sequence[Limit]) -> None:
    """Set what each row may not emit to ``-inf`` in ``log_probs``, in place. A limit covers the rows of one
    request whose hypotheses have placed the same spans: (those rows, the request's constraint, the placed
    set, whether they must place a sentinel now, whether their last token was a sentinel)."""
    flat, width, ending = [], log_probs.shape[1], []
    for where, constraint, state, must, glued in limits:
        banned = constraint.disallowed(state, must, glued)
        if must:
            for row in where:
                keep = log_probs[row, banned].copy()  # here: the sentinels that may come next
                log_probs[row] = -np.inf
                log_probs[row, banned] = keep
            continue
        if state != constraint.complete:  # a row whose best token is eos may end with spans missing
            eos = constraint.eos
            ending += [(row, eos, log_probs[row, eos]) for row in where if log_probs[row, eos] >= log_probs[row].max()]
        flat.append(banned + where[0] * width if len(where) == 1 else np.add.outer(np.array(where) * width, banned))
    if flat:
        log_probs.put(np.concatenate([f.ravel() for f in flat]), -np.inf)  # flat indices, in place
    for row, eos, value in ending:
        log_probs[row, eos] = value
