"""The translator's graphs over whole texts: the attention maps of translations, and texts translated offline.

:func:`attention_maps` runs the encoder (with its attention outputs) and the teacher-forced ``decoder_prefix``
graph once for a batch of (source, hypothesis) pairs: the maps a user asks for, and the cross-attention that
puts markup back (``contract/projection.py``). :func:`translate_all` translates texts the service's way
(``contract/translation_text.py``: planned, decoded with their constraints, aligned, rendered and joined)
without a service, for the evaluations (``export/evaluate_markup.py``, ``export/evaluate_placeholders.py``)
and the benchmarks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from contract.constraints import SentinelVocabulary
from contract.decoding import DecodeRequest, Graph, Hypothesis, pad_sources, run_to_end
from contract.placeholders import TooManySpans
from contract.projection import EVERY_HEAD, Alignment
from contract.translation_text import (
    LETTER_SENTINELS,
    TextPlan,
    needs_alignment,
    place,
    plan_text,
    render,
    unplaced,
)


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
