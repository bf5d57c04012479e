"""A translation entry: its manifest contract, tokenizer, the two sessions, and the answer's shape.

Everything comes from the manifest: graph files, cache geometry (layers, heads, head size),
special ids, the longest sequence the graphs were exported for, and the default beam and length
penalty. Text is validated here (empty, too long in characters or tokens) so that a bad input is
refused before it queues.
"""

from __future__ import annotations

from dataclasses import dataclass

from service.decoding import DecodeBatch, DecoderSpec, Graph, Hypothesis, Request, session_fn, step
from service.errors import InvalidField, TextTooLong
from service.manifest import Entry, ManifestError
from service.runtime import SessionHandle
from service.tokenizer import Tokenizer, TokenizerError, normalize_text

TASK = "translation"


@dataclass(frozen=True)
class Limits:
    max_chars: int
    max_source_tokens: int
    max_new_tokens: int


class Translator:
    def __init__(self, entry: Entry, encoder: SessionHandle, decoder: SessionHandle) -> None:
        m = entry.manifest
        self.name, self.version = entry.name, entry.version
        try:
            special = m["tokenizer"]["special_ids"]
            self.tokenizer = Tokenizer.load(entry.path / m["tokenizer"]["file"])
            self.spec = DecoderSpec.from_manifest(m)
            self.default_beam = int(m["decoding"].get("beam", 1))
            self.default_length_penalty = float(m["decoding"].get("length_penalty", 1.0))
        except (KeyError, TypeError, ValueError, TokenizerError) as e:
            raise ManifestError(f"{entry.path}: translation manifest is incomplete or malformed: {e!r}") from e
        if self.tokenizer.special.as_dict() != {k: int(v) for k, v in special.items()}:
            raise ManifestError(f"{entry.path}: tokenizer special ids differ from the manifest's")
        self.encoder: Graph = session_fn(encoder.session)
        self.decoder: Graph = session_fn(decoder.session)
        self.provider = encoder.provider

    def requests(self, texts: list[str], *, limits: Limits, beam_size: int, length_penalty: float,
                 num_return_sequences: int, max_new_tokens: int | None) -> list[Request]:  # fmt: skip
        """Tokenise and validate every text; one decoding request each."""
        if num_return_sequences > beam_size:
            raise InvalidField(f"num_return_sequences ({num_return_sequences}) cannot exceed beam_size ({beam_size})")
        if max_new_tokens is not None and max_new_tokens > min(limits.max_new_tokens, self.spec.max_positions):
            raise InvalidField(f"max_new_tokens {max_new_tokens} exceeds the limit of "
                               f"{min(limits.max_new_tokens, self.spec.max_positions)}")  # fmt: skip
        for i, text in enumerate(texts):
            if len(text) > limits.max_chars:
                raise TextTooLong(f"texts[{i}] has {len(text)} characters; the limit is {limits.max_chars}")
            if not normalize_text(text):
                raise InvalidField(f"texts[{i}] is empty or only whitespace")
        sources = self.tokenizer.encode_batch(texts, add_eos=True)
        for i, ids in enumerate(sources):
            if len(ids) > min(limits.max_source_tokens, self.spec.max_positions):
                raise TextTooLong(f"texts[{i}] is {len(ids)} tokens long; the limit is "
                                  f"{min(limits.max_source_tokens, self.spec.max_positions)}")  # fmt: skip
        return [
            Request(ids, max_new_tokens or min(self.spec.max_length(len(ids)), limits.max_new_tokens), beam=beam_size,
                    length_penalty=length_penalty, num_return=num_return_sequences)
            for ids in sources
        ]  # fmt: skip

    def start(self, requests: list[Request]) -> DecodeBatch:
        return DecodeBatch.start(requests, self.encoder, self.spec)

    def step(self, batch: DecodeBatch) -> tuple[list[Request], DecodeBatch]:
        return step(batch, self.decoder, self.spec)

    def warm_up(self, max_rows: int, should_stop=lambda: False) -> None:
        """Run the graphs at growing batch sizes and cache lengths so that first requests pay no set-up."""
        size = 1
        while size <= max_rows and not should_stop():
            reqs = [Request([5 + i % 50, self.spec.eos_id], 3) for i in range(size)]
            batch = self.start(reqs)
            while len(batch):
                _, batch = self.step(batch)
            size *= 2

    def hypothesis(self, h: Hypothesis, length_penalty: float) -> dict:
        return {"translation": self.tokenizer.decode(h.tokens), "score": h.score,
                "normalized_score": h.ranking(length_penalty), "finished": h.finished}  # fmt: skip

    def result(self, req: Request, nbest: bool) -> dict:
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
