"""A text's way through the translator: accelerator, sentences, protected spans, and back.

:func:`plan_text` turns one input text into the sentences the decoder translates, as rows of the
same batch: the keyboard accelerator is taken out (``contract/placeholders.py``), the text is cut into
sentences (``contract/sentences.py``), and in each sentence the protected spans are masked by the
model's sentinels and become that sentence's :class:`~contract.constraints.Constraint`.
:meth:`TextPlan.finish` puts the translated sentences back together: each sentence's tokens are
rendered with the spans in place of their sentinels, the sentences joined with the whitespace that
separated them in the input, and the accelerator placed. The service and the evaluation
(``export/evaluate_placeholders.py``) run the same code.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from contract.constraints import Constraint, SentinelVocabulary
from contract.decoding import DecodeRequest, Graph, Hypothesis, pad_sources, run_to_end
from contract.html_text import html_parts
from contract.markup import Element, Segment, split_markup
from contract.placeholders import (
    Accelerator,
    Masked,
    TooManySpans,
    find_spans,
    mask,
    place_accelerator,
    restore,
    strip_accelerator,
    unglue_numbers,
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
    return Rendered(unglue_numbers(text, sentence.masked), restored)


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


def attention_maps(
    encoder: Graph, prefix: Graph, spec, sources: list[list[int]], hypotheses: Sequence[Hypothesis]
) -> list[dict[str, np.ndarray]]:
    """Every attention map of each (source, hypothesis) pair, in one encoder and one teacher-forced decoder run
    (``encoder``: the encoder graph asked for ``encoder_attentions`` too; ``prefix``: the decoder_prefix graph): the
    rows are exactly those the hypothesis's own decoding steps computed, since its tokens are fed back.

    Per pair: ``encoder_self_attention`` (Le, H, S, S), ``decoder_self_attention`` (Ld, H, T, T) and
    ``cross_attention`` (Ld, H, T, S), where S counts the source's tokens (eos included) and T the generated ones
    (eos included when the hypothesis finished)."""
    ids, src_mask = pad_sources(sources, spec.pad_id)
    enc = encoder({"src_ids": ids, "src_mask": src_mask})
    rows = [len(h.tokens) + int(h.finished) for h in hypotheses]
    tgt = np.full((len(hypotheses), max(rows)), spec.pad_id, dtype=np.int64)
    for i, (h, n) in enumerate(zip(hypotheses, rows)):
        tgt[i, :n] = [spec.bos_id, *h.tokens][:n]
    dec = prefix(
        {"tgt_ids": tgt, "cross_keys": enc["cross_keys"], "cross_values": enc["cross_values"], "src_mask": src_mask}
    )
    out = []
    for i, (src, n) in enumerate(zip(sources, rows)):
        s = len(src)
        out.append(
            {
                "encoder_self_attention": enc["encoder_attentions"][i, :, :, :s, :s],
                "decoder_self_attention": dec["self_attentions"][i, :, :, :n, :n],
                "cross_attention": dec["cross_attentions"][i, :, :, :n, :s],
            }
        )
    return out


@dataclass(frozen=True)
class Translated:
    text: str
    finished: bool  # every sentence's search ended by itself (not at the length limit)
    spans: int = 0  # protected spans the search was asked to place
    aligned: int = 0  # of those, the ones it left out, placed by the word alignment instead


def translate_all(
    encoder,
    decoder,
    tokenizer,
    spec,
    texts: Sequence[str],
    beam: int,
    sentinels: Sequence[str] = (),
    chunk: int = 32,
    attention=None,
    alignment: Alignment = EVERY_HEAD,
    markup: bool = True,
) -> list[Translated]:
    """Offline, the service's way: each text planned (:func:`plan_text`), its sentences decoded with their
    constraints in batches of ``chunk`` sentences, markup and unplaced spans put back by the alignment that
    ``attention`` (sources, hypotheses -> :func:`attention_maps`; None: the diagonal) gives, rendered and joined
    (evaluation and benchmarks)."""
    vocabulary = SentinelVocabulary.build(tokenizer, tuple(sentinels) or LETTER_SENTINELS)
    plans = [_plan_or_plain(t, tokenizer, vocabulary if vocabulary.sentinels else None, markup) for t in texts]
    sentences = [s for p in plans for s in p.sentences]
    limits = [max(spec.max_length(len(s.source)), 1 + len(s.masked.spans if s.masked else ())) for s in sentences]
    requests = [DecodeRequest(s.source, n, beam=beam, constraint=s.constraint) for s, n in zip(sentences, limits)]
    for start in range(0, len(requests), chunk):
        run_to_end(encoder, decoder, requests[start : start + chunk], spec)
    best = iter([r.results()[0] for r in requests])
    out = []
    for p in plans:
        hyps = [next(best) for _ in p.sentences]
        places: list = [None] * len(hyps)
        if needs_alignment(p, hyps):
            maps = attention([s.source for s in p.sentences], hyps) if attention is not None else None
            cross = [m["cross_attention"] for m in maps] if maps is not None else [None] * len(hyps)
            places = place(p, tokenizer, hyps, cross, alignment)
        rendered = [render(tokenizer, h.tokens, s, ins) for h, s, ins in zip(hyps, p.sentences, places)]
        spans = sum(len(s.constraint.ids) for s in p.sentences if s.constraint is not None)
        aligned = sum(len(unplaced(s, h.tokens)) for s, h in zip(p.sentences, hyps))
        out.append(Translated(p.finish(rendered), all(h.finished for h in hyps), spans, aligned))
    return out


def _plan_or_plain(text: str, tokenizer, vocabulary: SentinelVocabulary | None, markup: bool) -> TextPlan:
    """:func:`plan_text`, or the text as it is where it holds more spans than there are sentinels (the service
    refuses such a text; an evaluation translates it unprotected)."""
    try:
        return plan_text(text, tokenizer, vocabulary, markup)
    except TooManySpans:
        return plan_text(text, tokenizer, None)


def translate_texts(
    encoder, decoder, tokenizer, spec, texts: Sequence[str], beam: int, sentinels: Sequence[str] = (), chunk: int = 32
) -> list[str]:
    """:func:`translate_all`'s texts, markup placed along the diagonal (no attention graph needed)."""
    return [t.text for t in translate_all(encoder, decoder, tokenizer, spec, texts, beam, sentinels, chunk)]
