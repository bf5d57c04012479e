"""A translation entry: its manifest contract, tokenizer, the two sessions, and the answer's shape.

Everything comes from the manifest: graph files, cache geometry (layers, heads, head size),
special ids, the longest sequence the graphs were exported for, and the default beam and length
penalty. Text is validated here (empty, too long in characters or tokens) so that a bad input is
refused before it queues.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from contract.decoding import (
    DecodeBatch,
    DecodeRequest,
    DecoderSpec,
    Graph,
    Hypothesis,
    decoder_inputs,
    decoding_outputs,
    pad_sources,
    session_fn,
    step,
)
from contract.manifest import Entry, ManifestError
from contract.tokenizer import TokenizerError, load_tokenizer, normalize_text
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

    def requests(
        self,
        texts: list[str],
        *,
        limits: Limits,
        beam_size: int,
        length_penalty: float,
        num_return_sequences: int,
        max_new_tokens: int | None,
    ) -> list[DecodeRequest]:
        """Check every option against the limits and tokenise and check every text, once, before the
        queue; one decoding request each, its generation limit resolved."""
        if beam_size > limits.max_beam_size:
            raise InvalidField(f"beam_size: must be at most {limits.max_beam_size}")
        if num_return_sequences > beam_size:
            raise InvalidField(f"num_return_sequences ({num_return_sequences}) cannot exceed beam_size ({beam_size})")
        if max_new_tokens is not None and max_new_tokens > min(limits.max_new_tokens, self.spec.max_positions):
            raise InvalidField(
                f"max_new_tokens {max_new_tokens} exceeds the limit of "
                f"{min(limits.max_new_tokens, self.spec.max_positions)}"
            )
        for i, text in enumerate(texts):
            if len(text) > limits.max_chars:
                raise TextTooLong(f"texts[{i}] has {len(text)} characters; the limit is {limits.max_chars}")
            if not normalize_text(text):
                raise InvalidField(f"texts[{i}] is empty or only whitespace")
        sources = self.tokenizer.encode_batch(texts, add_eos=True)
        for i, ids in enumerate(sources):
            if len(ids) > min(limits.max_source_tokens, self.spec.max_positions):
                raise TextTooLong(
                    f"texts[{i}] is {len(ids)} tokens long; the limit is "
                    f"{min(limits.max_source_tokens, self.spec.max_positions)}"
                )
        return [
            DecodeRequest(
                ids,
                max_new_tokens or min(self.spec.max_length(len(ids)), limits.max_new_tokens),
                beam=beam_size,
                length_penalty=length_penalty,
                num_return=num_return_sequences,
            )
            for ids in sources
        ]

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
        spec = self.spec
        ids, mask = pad_sources(sources, spec.pad_id)
        enc = self._encoder_attention({"src_ids": ids, "src_mask": mask})
        rows = [len(h.tokens) + int(h.finished) for h in hypotheses]
        tgt = np.full((len(hypotheses), max(rows)), spec.pad_id, dtype=np.int64)
        for i, (h, n) in enumerate(zip(hypotheses, rows)):
            tgt[i, :n] = [spec.bos_id, *h.tokens][:n]
        dec = self._prefix(
            {"tgt_ids": tgt, "cross_keys": enc["cross_keys"], "cross_values": enc["cross_values"], "src_mask": mask}
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

    def target_pieces(self, h: Hypothesis) -> tuple[list[str], list[str]]:
        """(the pieces each attention row generated, the pieces each row was fed: `<s>` then the tokens)."""
        spec = self.spec
        generated = self.tokenizer.pieces(h.tokens + ([spec.eos_id] if h.finished else []))
        return generated, self.tokenizer.pieces([spec.bos_id, *h.tokens])[: len(generated)]

    def hypothesis(self, h: Hypothesis, length_penalty: float) -> dict:
        return {
            "translation": self.tokenizer.decode(h.tokens),
            "score": h.score,
            "normalized_score": h.ranking(length_penalty),
            "finished": h.finished,
        }

    def result(self, req: DecodeRequest, nbest: bool) -> dict:
        best = req.results()
        out = {
            "translation": self.tokenizer.decode(best[0].tokens),
            "source_tokens": self.tokenizer.pieces(req.source),
            "target_tokens": self.tokenizer.pieces(best[0].tokens),
            "finished": best[0].finished,
        }
        if nbest:
            out["nbest"] = [self.hypothesis(h, req.length_penalty) for h in best]
        return out
