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

from contract.constraints import Constraint, SentinelVocabulary
from contract.decoding import DecodeRequest, run_to_end
from contract.placeholders import Accelerator, Masked, mask, place_accelerator, restore, strip_accelerator
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


@dataclass
class Rendered:
    """A translated sentence: the text with its spans back, and whether each came back exactly once."""

    text: str
    restored: list[bool] = field(default_factory=list)


@dataclass
class TextPlan:
    """The sentences of one text and what goes between them (``gaps[i]`` before sentence i, ``gaps[-1]`` after)."""

    text: str
    sentences: list[Sentence]
    gaps: list[str]
    accelerator: Accelerator | None

    @property
    def spans(self) -> list[dict]:
        return [
            {"text": s.text, "kind": s.kind}
            for sentence in self.sentences
            if sentence.masked
            for s in sentence.masked.spans
        ]

    def finish(self, rendered: Sequence[Rendered]) -> str:
        """The translation of the whole text from its sentences' translations, in order."""
        parts = [self.gaps[0]]
        for r, gap in zip(rendered, self.gaps[1:]):
            parts += [r.text, gap]
        return place_accelerator("".join(parts), self.accelerator)


def plan_text(text: str, tokenizer, vocabulary: SentinelVocabulary | None) -> TextPlan:
    """Split ``text`` into sentences and mask each one's protected spans (``vocabulary`` None: mask nothing).

    Raises :class:`contract.placeholders.TooManySpans` when a sentence has more spans than free sentinels."""
    plain, accelerator = strip_accelerator(text) if vocabulary is not None else (text, None)
    cuts = segments(plain) or [(0, len(plain))]
    gaps = [plain[: cuts[0][0]]] + [plain[b:a] for (_, b), (a, _) in zip(cuts, cuts[1:] + [(len(plain), 0)])]
    texts = [plain[a:b] for a, b in cuts]
    masks = [mask(t, vocabulary.sentinels) if vocabulary is not None else None for t in texts]
    masks = [m if m is not None and m.spans else None for m in masks]
    ids = tokenizer.encode_batch([m.text if m else t for t, m in zip(texts, masks)], add_eos=True)
    sentences = []
    for t, m, source in zip(texts, masks, ids):
        constraint = None
        if m is not None:
            after = [s.after for s in m.spans]
            constraint = Constraint.for_text(m.text, m.sentinels, vocabulary, after, tokenizer.eos_id)
        sentences.append(Sentence(t, source, m, constraint))
    return TextPlan(text, sentences, gaps, accelerator)


def render(tokenizer, tokens: Sequence[int], sentence: Sentence) -> Rendered:
    """A sentence's generated ids as text, its spans in place of their sentinels."""
    if sentence.constraint is None:
        return Rendered(tokenizer.decode(tokens))
    span_of = sentence.constraint.span_of
    parts: list[str] = []
    run: list[int] = []

    def flush() -> None:
        if run:
            text = tokenizer.decode(run)
            if parts and tokenizer.pieces(run[:1])[0].startswith(WORD_START) and text:
                text = " " + text
            parts.append(text)
            run.clear()

    for t in tokens:
        span = span_of.get(int(t))
        if span is None:
            run.append(int(t))
            continue
        flush()
        space = " " if parts and tokenizer.pieces([t])[0].startswith(WORD_START) else ""
        parts.append(space + chr(_MARK + span))
    flush()
    marks = [chr(_MARK + i) for i in range(len(sentence.masked.spans))]
    text, restored = restore("".join(parts), sentence.masked, marks)
    return Rendered(text, restored)


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


def translate_texts(
    encoder, decoder, tokenizer, spec, texts: Sequence[str], beam: int, sentinels: Sequence[str] = (), chunk: int = 32
) -> list[str]:
    """Offline, the service's way: each text planned (:func:`plan_text`), its sentences decoded with their
    constraints in batches of ``chunk`` sentences, rendered and joined (evaluation and benchmarks)."""
    vocabulary = SentinelVocabulary.build(tokenizer, tuple(sentinels) or LETTER_SENTINELS)
    plans = [plan_text(t, tokenizer, vocabulary if vocabulary.sentinels else None) for t in texts]
    sentences = [s for p in plans for s in p.sentences]
    limits = [max(spec.max_length(len(s.source)), 1 + len(s.masked.spans if s.masked else ())) for s in sentences]
    requests = [DecodeRequest(s.source, n, beam=beam, constraint=s.constraint) for s, n in zip(sentences, limits)]
    for start in range(0, len(requests), chunk):
        run_to_end(encoder, decoder, requests[start : start + chunk], spec)
    rendered = iter(render(tokenizer, r.results()[0].tokens, s) for r, s in zip(requests, sentences))
    return [p.finish([next(rendered) for _ in p.sentences]) for p in plans]
