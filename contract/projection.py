"""Where inline markup and unplaced spans go in a translation: projected through the word alignment.

The decoder's cross-attention says which source tokens each target token was made from
(:class:`Alignment` picks the layer, heads and step that say it best; the manifest may name its own).
:func:`inserts` turns that into the places where the plan's elements (``contract/markup.py``) open and
close, on the translation's token boundaries, whole German words at a time:

- an element wraps the densest run of target tokens linked to the source tokens it wrapped (target →
  source links, each target token to the source token it attends to most; linked inside counts +1,
  linked elsewhere -1; where none lands inside, the other way: the target tokens that attend most to the
  wrapped source tokens), widened to the words they are part of;
- a sentinel is aligned to itself: an element that wraps nothing but spans the model carried over wraps
  exactly those;
- a point (``<img/>``, an empty pair, a span the search left unplaced) goes after the words aligned to
  the source token before it (before those of the token after it, at the start);
- the ranges are then made to nest as the source's did (:func:`contract.markup.nest`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from contract.markup import nest
from contract.placeholders import Masked, spacing
from contract.tokenizer import normalize_text

WORD_START = "\u2581"


@dataclass(frozen=True)
class Alignment:
    """How to read a word alignment off a (layers, heads, target, source) cross-attention map: the mean of
    ``heads`` (None: all) of ``layers`` (None: all), read at the step ``shift`` after the one that emitted the
    token (0: that step; 1: the step that was fed it)."""

    layers: tuple[int, ...] | None = None
    heads: tuple[int, ...] | None = None
    shift: int = 0

    @classmethod
    def of(cls, spec) -> Alignment:
        """From a manifest's ``decoding.alignment`` (None: every layer and head)."""
        if spec is None:
            return cls()
        return cls(tuple(spec.layers) if spec.layers else None, tuple(spec.heads) if spec.heads else None, spec.shift)

    def probs(self, cross: np.ndarray, tokens: int) -> np.ndarray:
        """(tokens, source) attention of each emitted token over the source."""
        m = cross if self.layers is None else cross[list(self.layers)]
        m = (m if self.heads is None else m[:, list(self.heads)]).mean(axis=(0, 1))
        rows = np.minimum(np.arange(tokens) + self.shift, m.shape[0] - 1)
        return m[rows]


EVERY_HEAD = Alignment()


def masked_positions(masked: Masked | None, text: str) -> list[int]:
    """For each position of the masked text (its length included), the position of ``text`` it stands for."""
    if masked is None:
        return list(range(len(text) + 1))
    out: list[int] = []
    cursor = 0
    for span, sentinel, (left, right) in zip(masked.spans, masked.sentinels, masked.glued):
        out += range(cursor, span.start)
        space_left, space_right = spacing(text, span, left, right)
        out += [span.start] * (int(space_left) + 1) + [span.end] * (len(sentinel) - 1 + int(space_right))
        cursor = span.end
    out += range(cursor, len(text) + 1)
    return out


def source_spans(tokenizer, ids: Sequence[int], masked: Masked | None, text: str) -> list[tuple[int, int]]:
    """The characters of ``text`` each source token (eos excluded) stands for, as (start, end)."""
    shown = masked.text if masked is not None else text
    ids = [i for i in ids if i != tokenizer.eos_id]
    ends = [len(tokenizer.decode(ids[: k + 1])) for k in range(len(ids))]
    pieces = tokenizer.pieces(ids)
    starts = [0] + ends[:-1]
    starts = [s + (k > 0 and p.startswith(WORD_START)) for k, (s, p) in enumerate(zip(starts, pieces))]
    to_text = masked_positions(masked, text)
    scale = len(shown) / max(1, len(normalize_text(shown)))  # 1 unless normalising changed the length
    at = lambda j: to_text[min(len(to_text) - 1, round(j * scale))]
    return [(at(s), at(e)) for s, e in zip(starts, ends)]


@dataclass
class SentenceAlignment:
    """One translated sentence as projection sees it: its source tokens' characters in the plain text, its
    target pieces, and the links between them."""

    offset: int  # where the sentence starts in the plain text
    source: list[tuple[int, int]]  # per source token, its characters (plain-text positions)
    pieces: list[str]  # the target tokens' pieces
    links: list[int | None]  # per target token, the source token it comes from (None: eos or nothing)
    best: list[int]  # per source token, the target token that attends to it most (-1: no target token)
    same: dict[int, int] = field(default_factory=dict)  # source sentinel -> the target token that is the same one

    @classmethod
    def build(
        cls, offset: int, source: list[tuple[int, int]], pieces: list[str], probs: np.ndarray, same: dict[int, int]
    ) -> SentenceAlignment:
        """From ``probs`` (target tokens, source tokens + eos) and ``same``: target token -> the source token
        holding the same sentinel."""
        n, s = len(pieces), len(source)
        links: list[int | None] = []
        for r in range(n):
            k = int(np.argmax(probs[r])) if probs.shape[1] else s
            links.append(same.get(r, k if k < s else None))
        best = [int(np.argmax(probs[:, k])) if n else -1 for k in range(s)]
        for r, k in same.items():
            best[k] = r
        back = {k: r for r, k in same.items()}
        return cls(offset, [(a + offset, b + offset) for a, b in source], pieces, links, best, back)


def _word_start(pieces: list[str], r: int, first: int) -> int:
    while r > first and not pieces[r].startswith(WORD_START) and _continues(pieces[r - 1], pieces[r]):
        r -= 1
    return r


def _word_end(pieces: list[str], r: int, last: int) -> int:
    """The boundary after token ``r`` widened over the rest of its word."""
    while r + 1 < last and not pieces[r + 1].startswith(WORD_START) and _continues(pieces[r], pieces[r + 1]):
        r += 1
    return r + 1


def _continues(before: str, after: str) -> bool:
    """Whether ``after`` goes on the word ``before`` belongs to: letters or digits on both sides, or joined by a
    hyphen (``Medien-Ausgabe``)."""
    a, b = before.lstrip(WORD_START)[-1:], after[:1]
    return (a.isalnum() or a == "-") and (b.isalnum() or b == "-") and not a == b == "-"


Inserts = dict[int, tuple[list[str], list[str]]]  # token boundary -> (before its space, after it)


def inserts(
    elements: Sequence, sentences: list[SentenceAlignment], points: Sequence[tuple[int, int, str]] = ()
) -> list[Inserts]:
    """Per sentence, token boundary -> what to insert there, in order, before the space that starts the next word
    (closing tags, unplaced spans) and after it (opening tags, void elements), for ``elements`` (their
    ``open``/``close`` and plain-text ``start``/``end``) and ``points`` (plain-text position, sentence, marker)."""
    starts, total = [], 0
    for s in sentences:
        starts.append(total)
        total += len(s.pieces)
    pieces = [p for s in sentences for p in s.pieces]
    owner = [i for i, s in enumerate(sentences) for _ in s.pieces]
    bounds = [(starts[i], starts[i] + len(s.pieces)) for i, s in enumerate(sentences)]
    source = [(i, k, a, b) for i, s in enumerate(sentences) for k, (a, b) in enumerate(s.source)]
    links = [k for s in sentences for k in s.links]

    def targets(i: int, k: int) -> list[int]:
        """The target tokens (global) linked to source token ``k`` of sentence ``i``, else the one attending most."""
        linked = [r for r, x in enumerate(sentences[i].links) if x == k] or [sentences[i].best[k]]
        return [starts[i] + r for r in linked if r >= 0]

    def after_source(pos: int, at: int | None = None) -> int:
        """The target boundary where something standing at plain-text ``pos`` goes."""
        mine = [(i, k, (a + b) / 2 <= pos) for i, k, a, b in source if at is None or i == at]
        for i, k, _ in reversed([m for m in mine if m[2]]):  # after the words of the source token before it
            if linked := targets(i, k):
                return _word_end(pieces, max(linked), bounds[owner[max(linked)]][1])
        for i, k, _ in (m for m in mine if not m[2]):  # at the start: before those of the token after it
            if linked := targets(i, k):
                return _word_start(pieces, min(linked), bounds[owner[min(linked)]][0])
        return starts[at] if at is not None else 0

    ranges = []
    for e in elements:
        inside = {(i, k) for i, k, a, b in source if e.start <= (a + b) / 2 < e.end}
        linked = [starts[i] + r for i, s in enumerate(sentences) for r, k in enumerate(s.links) if (i, k) in inside]
        exact = [starts[i] + sentences[i].same[k] for i, k in inside if k in sentences[i].same]
        if inside and len(exact) == len(inside):  # it wraps placeholders only: exactly where they went
            lo, hi = min(exact), max(exact)
        elif linked:
            lo, hi = _densest(
                [1 if (owner[g], k) in inside else -1 if k is not None else 0 for g, k in enumerate(links)]
            )
        else:
            linked = [starts[i] + sentences[i].best[k] for i, k in inside if sentences[i].best[k] >= 0]
            lo, hi = (min(linked), max(linked)) if linked else (0, -1)
        if e.start == e.end or hi < lo:
            g = after_source(e.start)
            ranges.append((g, g))
            continue
        ranges.append((_word_start(pieces, lo, bounds[owner[lo]][0]), _word_end(pieces, hi, bounds[owner[hi]][1])))
    ranges = nest(ranges, [e.parent for e in elements])
    events: dict[int, list[tuple[str, bool | None]]] = {}  # boundary -> (tag text, closing; None: a point), in order
    children: dict[int | None, list[int]] = {}
    for n, e in enumerate(elements):
        children.setdefault(e.parent, []).append(n)

    def emit(parent: int | None) -> None:  # depth first, siblings by their ranges: the tags in document order
        for n in sorted(children.get(parent, []), key=lambda n: (ranges[n], n)):
            (lo, hi), e = ranges[n], elements[n]
            if lo == hi and n not in children:
                events.setdefault(lo, []).append((e.open + e.close, None))
                continue
            events.setdefault(lo, []).append((e.open, False))
            emit(n)
            events.setdefault(hi, []).append((e.close, True))

    emit(None)
    out: list[Inserts] = [{} for _ in sentences]

    def put(g: int, i: int, text: str, opening: bool) -> None:
        local = min(max(g - bounds[i][0], 0), bounds[i][1] - bounds[i][0])
        out[i].setdefault(local, ([], []))[int(opening)].append(text)

    for g, items in events.items():  # up to the last closing tag, before the next word's space; the rest after
        last = max((k for k, (_, closing) in enumerate(items) if closing), default=-1)
        for k, (text, _) in enumerate(items):
            put(g, _sentence_of(g, bounds, k > last), text, k > last)
    for pos, sentence, marker in points:  # a span's mark stays in its own sentence, where it is restored
        put(after_source(pos, sentence), sentence, " " + marker, False)
    return out


def _densest(scores: list[int]) -> tuple[int, int]:
    """The first and last index of the contiguous run with the highest sum (the tokens an element wraps: those
    linked inside it, less those linked elsewhere)."""
    best, lo, hi, total, start = -(1 << 30), 0, 0, 0, 0
    for i, v in enumerate(scores):
        if total <= 0:
            total, start = 0, i
        total += v
        if total > best:
            best, lo, hi = total, start, i
    return lo, hi


def _sentence_of(g: int, bounds: list[tuple[int, int]], opening: bool) -> int:
    """The sentence a global boundary belongs to: an opening tag to the sentence it starts, a closing one to the
    sentence it ends."""
    for i, (a, b) in enumerate(bounds):
        if (a <= g < b) if opening else (a < g <= b):
            return i
    return len(bounds) - 1 if opening or g > 0 else 0
