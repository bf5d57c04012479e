"""A text's way through the translator: accelerator, markup, sentences, protected spans, and back.

:func:`plan_text` turns one input text into the sentences the decoder translates, as rows of the
same batch: the keyboard accelerator is taken out (``contract/placeholders.py``), the markup too
(``contract/markup.py``, or ``contract/html_text.py`` for an HTML document), each segment is cut into
sentences (``contract/sentences.py``), and in each sentence the protected spans are masked by the
model's sentinels and become that sentence's :class:`~contract.constraints.Constraint`. Once decoded,
:func:`place` reads where the markup and any span the search left out go from each sentence's
cross-attention (``contract/projection.py``); :func:`render` writes each sentence's tokens with the
spans in place of their sentinels and the tags at their boundaries, and :meth:`TextPlan.finish` joins
the sentences with the whitespace and markup that separated them in the input and places the
accelerator. The service and the evaluations (``contract/translate_graphs.py``) run the same code.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from contract.constraints import Constraint, SentinelVocabulary
from contract.decoding import Hypothesis
from contract.html_text import html_parts
from contract.markup import Element, Segment, split_markup
from contract.placeholders import (
    Accelerator,
    Masked,
    find_spans,
    mask,
    place_accelerator,
    restore,
    strip_accelerator,
)
from contract.projection import EVERY_HEAD, Alignment, Inserts, SentenceAlignment, inserts, source_spans
from contract.sentences import segments

WORD_START = "\u2581"
_MARK = 0xE000  # private-use characters stand for the spans while a translation is put together

# Sentinels for a model trained without sentinel symbols (translator/3): capital letters the tokenizer
# spells as one piece, which the model copies through like a variable's name. A model trained on masked
# placeholders names its own in its manifest (decoding.sentinels).
LETTER_SENTINELS = tuple("XYZQJKVWUGHNRLMPOFDCTBES")


@dataclass
class Sentence:
    """One sentence of a text: its (masked) text, its token ids, and the constraint its decoding obeys."""

    text: str  # as in the input (accelerator removed)
    source: list[int]  # the masked sentence's ids, eos included
    masked: Masked | None = None  # None: nothing protected
    constraint: Constraint | None = None
    offset: int = 0  # where ``text`` starts in the plan's plain text
    quote: str = ""  # an HTML attribute value's quote, escaped in its translation


@dataclass
class Rendered:
    """A translated sentence: the text with its spans back, and whether each came back exactly once."""

    text: str
    restored: list[bool] = field(default_factory=list)


@dataclass
class TextPlan:
    """The sentences of one text and what goes between them (``gaps[i]`` before sentence i, ``gaps[-1]`` after:
    whitespace, and markup kept verbatim), and the inline markup taken out of them (``elements``, over the plain
    text: the gaps and sentences joined), put back by :func:`contract.projection.inserts`."""

    text: str
    sentences: list[Sentence]
    gaps: list[str]
    accelerator: Accelerator | None
    elements: tuple[Element, ...] = ()
    codes: dict[str, str] = field(default_factory=dict)  # what stands for an HTML code element -> the element
    html: bool = False

    def placeholders(self, restored: Sequence[bool]) -> list[dict]:
        """Every protected span of the text in order, with whether it came back (``restored``: per masked span,
        in order); markup taken out of the sentences or kept between them always does. An HTML document's are
        those of its translated text alone."""
        masked = [s for sentence in self.sentences if sentence.masked for s in sentence.masked.spans]
        if self.html:
            return [
                {"text": s.text, "kind": s.kind, "restored": ok}
                for s, ok in zip(masked, restored)
                if s.text not in self.codes
            ]
        flags, out, k = list(restored), [], 0
        plain = strip_accelerator(self.text)[0] if self.accelerator else self.text
        for span in find_spans(plain):
            if k < len(masked) and masked[k].text == span.text:
                out.append({"text": span.text, "kind": span.kind, "restored": flags[k]})
                k += 1
            elif span.kind == "tag":
                out.append({"text": span.text, "kind": span.kind, "restored": True})
        return out

    def finish(self, rendered: Sequence[Rendered]) -> str:
        """The translation of the whole text from its sentences' translations, in order."""
        parts = [self.gaps[0]]
        for r, s, gap in zip(rendered, self.sentences, self.gaps[1:]):
            parts += [r.text.replace(s.quote, "&quot;" if s.quote == '"' else "&#39;") if s.quote else r.text, gap]
        text = "".join(parts)
        for token, code in self.codes.items():
            text = text.replace(token, code)
        return place_accelerator(text, self.accelerator)


def plan_text(
    text: str, tokenizer, vocabulary: SentinelVocabulary | None, markup: bool = True, html: bool = False
) -> TextPlan:
    """Split ``text`` into sentences and mask each one's protected spans (``vocabulary`` None: mask nothing, and
    leave markup in the text); inline markup is taken out of the sentences (``contract/markup.py``; ``markup``
    False: tags are masked spans like the others, placed by the search). ``html``: ``text`` is an HTML document
    or fragment (``contract/html_text.py``).

    Raises :class:`contract.placeholders.TooManySpans` when a sentence has more spans than free sentinels."""
    codes: dict[str, str] = {}
    if html:
        (parts, codes), plain, accelerator = html_parts(text), text, None
    else:
        plain, accelerator = strip_accelerator(text) if vocabulary is not None else (text, None)
        parts = split_markup(plain) if vocabulary is not None and markup else []
    if not any(isinstance(p, Segment) for p in parts):  # no markup to take out, or no words outside it
        parts = [Segment(plain)] if not html else parts
    texts, offsets, quotes, gaps, elements, gap, at = [], [], [], [], [], "", 0
    for part in parts:
        if isinstance(part, str):
            gap, at = gap + part, at + len(part)
            continue
        cuts = segments(part.plain) or [(0, len(part.plain))]
        shift = len(elements)
        elements += [
            Element(e.open, e.close, e.start + at, e.end + at, None if e.parent is None else e.parent + shift)
            for e in part.elements
        ]
        cursor = 0
        for a, b in cuts:
            gaps.append(gap + part.plain[cursor:a])
            texts.append(part.plain[a:b])
            offsets.append(at + a)
            quotes.append(part.quote)
            gap, cursor = "", b
        gap, at = part.plain[cursor:], at + len(part.plain)
    gaps.append(gap)
    masks = [mask(t, vocabulary.sentinels) if vocabulary is not None else None for t in texts]
    masks = [m if m is not None and m.spans else None for m in masks]
    ids = tokenizer.encode_batch([m.text if m else t for t, m in zip(texts, masks)], add_eos=True)
    sentences = []
    for t, m, source, offset, quote in zip(texts, masks, ids, offsets, quotes):
        constraint = None
        if m is not None:
            after = [s.after for s in m.spans]
            apart = [right is None for _, right in m.glued]
            constraint = Constraint.for_text(m.text, m.sentinels, vocabulary, after, tokenizer.eos_id, apart)
        sentences.append(Sentence(t, source, m, constraint, offset, quote))
    return TextPlan(text, sentences, gaps, accelerator, tuple(elements), codes, html)


def render(tokenizer, tokens: Sequence[int], sentence: Sentence, inserts: Inserts | None = None) -> Rendered:
    """A sentence's generated ids as text, its spans in place of their sentinels, and ``inserts`` (markup, unplaced
    spans' marks: ``contract/projection.py``) at their token boundaries."""
    inserts = inserts or {}
    if sentence.constraint is None and not inserts:
        return Rendered(tokenizer.decode(tokens))
    span_of = sentence.constraint.span_of if sentence.constraint is not None else {}
    pieces = tokenizer.pieces(list(tokens))
    parts: list[str] = []
    run: list[int] = []
    spaced = False  # the next token's word-start space is already written (before an opening tag)

    def flush() -> None:
        nonlocal spaced
        if run:
            text = tokenizer.decode(run)
            if parts and pieces[start].startswith(WORD_START) and text and not spaced:
                text = " " + text
            parts.append(text)
            run.clear()
            spaced = False

    start = 0
    for n in range(len(tokens) + 1):
        if n in inserts:
            flush()
            before, after = inserts[n]
            parts += [b if any(parts) else b.lstrip(" ") for b in before]  # no space before the first word
            if after and n < len(tokens) and pieces[n].startswith(WORD_START):
                parts.append(" " if parts else "")
                spaced = True
            parts += after
        if n == len(tokens):
            break
        t = int(tokens[n])
        span = span_of.get(t)
        if span is None:
            if not run:
                start = n
            run.append(t)
            continue
        flush()
        space = " " if parts and pieces[n].startswith(WORD_START) and not spaced else ""
        parts.append(space + chr(_MARK + span))
        spaced = False
    flush()
    if sentence.masked is None:
        return Rendered("".join(parts))
    marks = [chr(_MARK + i) for i in range(len(sentence.masked.spans))]
    text, restored = restore("".join(parts), sentence.masked, marks)
    return Rendered(text, restored)


def span_mark(i: int) -> str:
    """What stands for span ``i`` of a sentence while its translation is put together."""
    return chr(_MARK + i)


def unplaced(sentence: Sentence, tokens: Sequence[int]) -> list[int]:
    """The spans of ``sentence`` whose sentinel ``tokens`` does not hold (a search that ended before it)."""
    if sentence.constraint is None:
        return []
    return [i for i, ids in enumerate(sentence.constraint.ids) if not any(int(t) in ids for t in tokens)]


def needs_alignment(plan: TextPlan, hypotheses: Sequence[Hypothesis]) -> bool:
    """Whether putting the translation together needs its word alignment: markup, or a span left unplaced."""
    return bool(plan.elements) or any(unplaced(s, h.tokens) for s, h in zip(plan.sentences, hypotheses))


def place(
    plan: TextPlan,
    tokenizer,
    hypotheses: Sequence[Hypothesis],
    cross: Sequence[np.ndarray | None],
    alignment: Alignment = EVERY_HEAD,
) -> list[Inserts]:
    """Per sentence, the inserts that put the plan's markup and its unplaced spans into the translation
    ``hypotheses``, read from each sentence's cross-attention (``cross[i]``: layers, heads, target, source; None:
    the diagonal stands in)."""
    sentences, points = [], []
    for i, (s, h, c) in enumerate(zip(plan.sentences, hypotheses, cross)):
        n, source = len(h.tokens), source_spans(tokenizer, s.source, s.masked, s.text)
        probs = alignment.probs(c, n) if c is not None else _diagonal(n, len(s.source))
        same: dict[int, int] = {}
        if s.constraint is not None:
            where = {int(t): k for k, t in enumerate(s.source)}
            for r, t in enumerate(h.tokens):
                span = s.constraint.span_of.get(int(t))
                k = next((where[x] for x in s.constraint.ids[span] if x in where), None) if span is not None else None
                if k is not None:
                    same[r] = k
            points += [(s.offset + s.masked.spans[j].start, i, span_mark(j)) for j in unplaced(s, h.tokens)]
        pieces = tokenizer.pieces([int(t) for t in h.tokens])
        sentences.append(SentenceAlignment.build(s.offset, source, pieces, probs, same))
    return inserts(plan.elements, sentences, points)


def _diagonal(targets: int, sources: int) -> np.ndarray:
    """An alignment that pairs tokens by their relative place: for a model without attention maps."""
    probs = np.zeros((targets, sources), dtype=np.float32)
    for r in range(targets):
        probs[r, min(sources - 1, r * sources // max(1, targets))] = 1.0
    return probs


def labels(tokenizer, tokens: Sequence[int], sentence: Sentence) -> list[str]:
    """The pieces of ``tokens`` for a person to read: a sentinel shows the span it stands for."""
    pieces = tokenizer.pieces(tokens)
    if sentence.constraint is None:
        return pieces
    span_of = sentence.constraint.span_of
    return [
        (WORD_START if p.startswith(WORD_START) else "") + sentence.masked.spans[span_of[int(t)]].text
        if int(t) in span_of
        else p
        for t, p in zip(tokens, pieces)
    ]
