"""A translation entry: its manifest contract, tokenizer, the two sessions, and the answer's shape.

Everything comes from the manifest: graph files, cache geometry (layers, heads, head size),
special ids, the longest sequence the graphs were exported for, and the default beam and length
penalty. Text is validated here (empty, too long in characters or tokens) so that a bad input is
refused before it queues.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from contract.constraints import SentinelVocabulary
from contract.decoding import (
    DecodeBatch,
    DecodeRequest,
    DecoderSpec,
    Graph,
    Hypothesis,
    decoder_inputs,
    decoding_outputs,
    session_fn,
    step,
)
from contract.manifest import Entry, ManifestError
from contract.placeholders import TooManySpans
from contract.projection import Alignment, Inserts
from contract.tokenizer import TokenizerError, load_tokenizer, normalize_text
from contract.translate_graphs import attention_maps
from contract.translation_text import (
    LETTER_SENTINELS,
    Sentence,
    TextPlan,
    labels,
    needs_alignment,
    place,
    plan_text,
    render,
)
from service.engine.resident import CacheGraphs, ResidentDecoder, ResidentEncoder
from service.errors import InvalidField, TextTooLong
from service.runtime import CUDA, SessionHandle

TASK = "translation"


@dataclass(frozen=True)
class Limits:
    """The service's caps on a translation request (its settings), checked with the model's own limits."""

    max_chars: int
    max_source_tokens: int
    max_new_tokens: int
    max_beam_size: int
    max_html_chars: int = 200_000


@dataclass
class Job:
    """One text of a request: its plan (sentences, protected spans) and a decoding request per sentence,
    decoded as rows of the same batch."""

    plan: TextPlan
    requests: list[DecodeRequest] = field(default_factory=list)
    inserts: dict[int, list[Inserts]] = field(default_factory=dict)  # per rank: markup, unplaced spans (`place`)
    maps: list[dict] | None = None  # the best translation's attention maps per sentence, when `place` ran them


class Translator:
    def __init__(
        self,
        entry: Entry,
        encoder: SessionHandle,
        decoder: SessionHandle,
        prefix: SessionHandle | None = None,
        default_beam: int = 0,
        max_beam: int | None = None,
        decoder_cache: str = "auto",
    ) -> None:
        m = entry.manifest
        self.name, self.version = entry.name, entry.version
        if m.tokenizer is None or m.decoding is None:  # the contract requires both of a translator
            raise ManifestError(f"{entry.path}: a translation manifest needs tokenizer and decoding sections")
        try:
            self.tokenizer = load_tokenizer(entry.path, m.tokenizer)  # either kind the manifest describes
        except TokenizerError as e:
            raise ManifestError(f"{entry.path}: {e}") from e
        self.spec = DecoderSpec.from_manifest(m)
        # The beam of a request that names none: the operator's setting, else the manifest's (capped).
        self.default_beam = default_beam or min(m.decoding.beam, max_beam or m.decoding.beam)
        self.default_length_penalty = m.decoding.length_penalty
        # What stands for a protected span while a sentence is decoded: the manifest's sentinels, else the
        # capital letters the tokenizer spells as one piece (contract/translation_text.py).
        vocabulary = SentinelVocabulary.build(self.tokenizer, m.decoding.sentinels or LETTER_SENTINELS)
        self.sentinels = vocabulary if vocabulary.sentinels else None  # None: this model cannot protect spans
        self.alignment = Alignment.of(m.decoding.alignment)  # where markup goes back (contract/projection.py)
        # Decoding asks the graphs for what it uses only; attention outputs are fetched by `attention`.
        outputs = decoding_outputs(self.spec.layers)
        missing = set(decoder_inputs(self.spec.layers)) - {i.name for i in decoder.session.get_inputs()}
        missing |= set(outputs["decoder"]) - {o.name for o in decoder.session.get_outputs()}
        if missing:
            raise ManifestError(
                f"{entry.path}: decoder.onnx lacks {sorted(missing)} (an export from before per-layer "
                "cache buffers?); re-export it with `python -m export.translator`"
            )
        self.provider = encoder.provider
        # Both paths exist because each is the faster where it serves: on a GPU the device path keeps the
        # caches off PCIe; on the CPU the numpy path is the faster (device ÷ host 0.77x to 0.97x, batch 1 to 64,
        # `python -m benchmarks.bench_translate --decoder-cache`): onnxruntime's TopK and graph runs cost more
        # there than numpy's argmax and in-place writes.
        self.cache_on_device = decoder_cache == "device" or (decoder_cache == "auto" and decoder.provider == CUDA)
        if self.cache_on_device:
            graphs = CacheGraphs(encoder.session, decoder.session, self.spec.layers)
            self.encoder: Graph = ResidentEncoder(encoder.session, list(outputs["encoder"]), graphs)
            self.decoder: Graph = ResidentDecoder(decoder.session, list(outputs["decoder"]))
        else:
            self.encoder = session_fn(encoder.session, outputs["encoder"])
            self.decoder = session_fn(decoder.session, outputs["decoder"])
        self._encoder_attention: Graph | None = None
        self._prefix: Graph | None = None
        if prefix is not None:  # an entry without decoder_prefix serves translations without attention
            self._encoder_attention = session_fn(encoder.session, [*outputs["encoder"], "encoder_attentions"])
            self._prefix = session_fn(prefix.session, ["self_attentions", "cross_attentions"])

    @property
    def has_attention(self) -> bool:
        return self._prefix is not None

    def jobs(
        self,
        texts: list[str],
        *,
        limits: Limits,
        beam_size: int,
        length_penalty: float,
        num_return_sequences: int,
        max_new_tokens: int | None,
        protect: bool = True,
        html: bool = False,
        checked: bool = False,
    ) -> list[Job]:
        """Check every option against the limits, split every text into sentences and mask its protected spans
        (``protect``), tokenise and check each sentence, once, before the queue: one job per text (``html``: an HTML
        document), with a decoding request per sentence, its generation limit resolved (``checked``: ``check`` has
        passed already)."""
        if not checked:
            self.check(texts, limits, beam_size, num_return_sequences, max_new_tokens, html)
        jobs = []
        for i, text in enumerate(texts):
            try:
                vocabulary = self.sentinels if protect and self.sentinels else None
                plan = plan_text(text, self.tokenizer, vocabulary, html=html)
            except TooManySpans as e:
                raise InvalidField(f"texts[{i}]: {e}") from e
            job = Job(plan)
            for sentence in plan.sentences:
                job.requests.append(
                    self._request(i, sentence, limits, beam_size, length_penalty, num_return_sequences, max_new_tokens)
                )
            jobs.append(job)
        return jobs

    def check(
        self, texts: list[str], limits: Limits, beam_size: int, num_return: int, max_new_tokens: int | None, html: bool
    ) -> None:
        """What ``jobs`` checks before tokenising: the options against the limits, each text's length and words."""
        if beam_size > limits.max_beam_size:
            raise InvalidField(f"beam_size: must be at most {limits.max_beam_size}")
        if num_return > beam_size:
            raise InvalidField(f"num_return_sequences ({num_return}) cannot exceed beam_size ({beam_size})")
        most = min(limits.max_new_tokens, self.spec.max_positions)
        if max_new_tokens is not None and max_new_tokens > most:
            raise InvalidField(f"max_new_tokens {max_new_tokens} exceeds the limit of {most}")
        most_chars = limits.max_html_chars if html else limits.max_chars
        for i, text in enumerate(texts):
            if len(text) > most_chars:
                raise TextTooLong(f"texts[{i}] has {len(text)} characters; the limit is {most_chars}")
            if not normalize_text(text):
                raise InvalidField(f"texts[{i}] is empty or only whitespace")

    def _request(
        self, i: int, sentence: Sentence, limits: Limits, beam: int, length_penalty: float, num_return: int, asked
    ) -> DecodeRequest:
        ids, most = sentence.source, min(limits.max_source_tokens, self.spec.max_positions)
        if len(ids) > most:
            raise TextTooLong(f"texts[{i}] has a sentence {len(ids)} tokens long; the limit is {most}")
        spans = len(sentence.constraint.ids) if sentence.constraint is not None else 0
        limit = asked or max(spans + 1, min(self.spec.max_length(len(ids)), limits.max_new_tokens))
        if limit <= spans:
            raise InvalidField(f"max_new_tokens {limit} leaves no room for the {spans} placeholders of texts[{i}]")
        return DecodeRequest(
            ids, limit, beam=beam, length_penalty=length_penalty, num_return=num_return, constraint=sentence.constraint
        )

    def warm_up(self, max_rows: int, should_stop=lambda: False) -> None:
        """Run the graphs at growing batch sizes and cache lengths so that first requests pay no set-up."""
        size = 1
        while size <= max_rows and not should_stop():
            reqs = [DecodeRequest([5 + i % 50, self.spec.eos_id], 3) for i in range(size)]
            batch = DecodeBatch.start(reqs, self.encoder, self.spec)
            while len(batch):
                _, batch = step(batch, self.decoder, self.spec)
            size *= 2
        if self.has_attention and not should_stop():
            self.attention([[5, self.spec.eos_id]], [Hypothesis([7], 0.0, True)])

    def attention(self, sources: list[list[int]], hypotheses: list[Hypothesis]) -> list[dict[str, np.ndarray]]:
        """Every attention map of each (source, returned hypothesis) pair, in one encoder and one
        teacher-forced decoder run: the rows are exactly those the hypothesis's own decoding steps
        computed (its tokens are fed back), whichever beam it came from.

        Per pair: ``encoder_self_attention`` (Le, H, S, S), ``decoder_self_attention`` (Ld, H, T, T)
        and ``cross_attention`` (Ld, H, T, S), where S counts the source's tokens (eos included) and
        T the generated ones (eos included when the hypothesis finished).
        """
        if self._prefix is None or self._encoder_attention is None:
            raise ManifestError(f"model {self.name} has no decoder_prefix graph: no attention maps")
        return attention_maps(self._encoder_attention, self._prefix, self.spec, sources, hypotheses)

    def to_place(self, jobs: list[Job], nbest: bool) -> list[tuple[Job, int, list[Hypothesis]]]:
        """The returned translations (job, rank, its sentences' hypotheses) with markup or spans the search left
        out, which :meth:`place` puts in."""
        wanted = []
        for job in jobs:
            ranked = [r.results() for r in job.requests]
            for n in range(len(ranked[0]) if nbest and ranked else 1):
                picks = [hs[min(n, len(hs) - 1)] for hs in ranked]
                if ranked and needs_alignment(job.plan, picks):
                    wanted.append((job, n, picks))
        return wanted

    def place(self, wanted: list[tuple[Job, int, list[Hypothesis]]]) -> None:
        """Where the markup and left-out spans of ``wanted`` (:meth:`to_place`) go, from each translation's word
        alignment (one attention run for all; without a decoder_prefix graph, the diagonal). Runs graphs: call
        it off the event loop."""
        sources = [s.source for job, _, picks in wanted for s in job.plan.sentences]
        hypotheses = [h for _, _, picks in wanted for h in picks]
        maps = iter(self.attention(sources, hypotheses) if self.has_attention else [None] * len(hypotheses))
        for job, n, picks in wanted:
            own = [next(maps) for _ in picks]
            cross = [m["cross_attention"] if m is not None else None for m in own]
            job.inserts[n] = place(job.plan, self.tokenizer, picks, cross, self.alignment)
            if n == 0 and self.has_attention:
                job.maps = own  # return_attention reads these instead of running the graphs again

    def target_pieces(self, h: Hypothesis, sentence: Sentence) -> tuple[list[str], list[str]]:
        """(the pieces each attention row generated, the pieces each row was fed: `<s>` then the tokens)."""
        spec = self.spec
        generated = labels(self.tokenizer, h.tokens + ([spec.eos_id] if h.finished else []), sentence)
        return generated, labels(self.tokenizer, [spec.bos_id, *h.tokens], sentence)[: len(generated)]

    def result(self, job: Job, nbest: bool) -> dict:
        """A text's answer: its sentences' best translations joined, with the spans each carried over."""
        tok, sentences = self.tokenizer, job.plan.sentences
        ranked = [r.results() for r in job.requests]
        best = [hs[0] for hs in ranked]
        inserts = job.inserts.get(0, [None] * len(sentences))
        rendered = [render(tok, h.tokens, s, i) for h, s, i in zip(best, sentences, inserts)]
        restored = [ok for r in rendered for ok in r.restored]
        out = {
            "translation": job.plan.finish(rendered),
            "source_tokens": [p for s in sentences for p in labels(tok, s.source, s)],
            "target_tokens": [p for h, s in zip(best, sentences) for p in labels(tok, h.tokens, s)],
            "finished": all(h.finished for h in best),
            "placeholders": job.plan.placeholders(restored),
            "sentences": [
                {"source": s.text, "translation": r.text, "finished": h.finished}
                for s, r, h in zip(sentences, rendered, best)
            ],
        }
        if nbest and ranked:
            out["nbest"] = [self._alternative(job, ranked, n) for n in range(len(ranked[0]))]
        return out

    def _alternative(self, job: Job, ranked: list[list[Hypothesis]], n: int) -> dict:
        """The n-th best translation of a text: each sentence's n-th best (or its last, if it has fewer)."""
        picks = [hs[min(n, len(hs) - 1)] for hs in ranked]
        inserts = job.inserts.get(n, [None] * len(picks))
        rendered = [render(self.tokenizer, h.tokens, s, i) for h, s, i in zip(picks, job.plan.sentences, inserts)]
        score = sum(h.score for h in picks)
        length = sum(len(h.tokens) + h.finished for h in picks)
        return {
            "translation": job.plan.finish(rendered),
            "score": score,
            "normalized_score": score / max(1, length) ** job.requests[0].length_penalty,
            "finished": all(h.finished for h in picks),
        }

    def streamed_before(self, job: Job, sentence: int) -> str:
        """The translation of the sentences before ``sentence`` (finished), with what separates them: what a
        stream shows before that sentence's own tokens."""
        plan, parts = job.plan, [job.plan.gaps[0]]
        for i in range(sentence):
            parts += [render(self.tokenizer, job.requests[i].results()[0].tokens, plan.sentences[i]).text]
            parts += [plan.gaps[i + 1]]
        return "".join(parts)
