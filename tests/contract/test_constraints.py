"""Constrained search: every sentinel exactly once, in order, never cut off, nothing invented.

A bigram "translator" in numpy makes the model want each forbidden thing (end before a sentinel, a
sentinel twice, the wrong order, a guarded piece, words past the length limit); the shipped translator
checks the rule on real sentences through both decoding paths and inside continuous batching.
"""

from __future__ import annotations

import numpy as np
import pytest

from contract.constraints import Constraint, SentinelVocabulary
from contract.decoding import DecodeBatch, DecodeRequest, DecoderSpec, concatenate, run_to_end, step
from contract.manifest import load_entry
from contract.placeholders import find_spans
from contract.tokenizer import load_tokenizer
from contract.translation_text import LETTER_SENTINELS, plan_text, render
from tests.conftest import ROOT, SHIPPED_TRANSLATOR
from tests.contract.test_decoding import bigram_graphs, real_graphs  # noqa: F401 (real_graphs: a fixture)

PAD, BOS, EOS, A, B, S1, S2, PCT = range(8)
SPEC = DecoderSpec(layers=1, heads=1, head_dim=1, max_positions=50)
PLACEHOLDER_SENTENCES = (ROOT / "benchmarks" / "placeholder_sentences.txt").read_text().splitlines()


def table(**rows: list[float]) -> np.ndarray:
    """Next-token probabilities by previous token; rows not given prefer eos, then the sentinels."""
    names = {"bos": BOS, "a": A, "b": B, "s1": S1, "s2": S2, "pct": PCT}
    t = np.full((8, 8), 1e-6)
    t[:, EOS], t[:, S1], t[:, S2] = 1.0, 1e-3, 1e-3
    for prev, probs in rows.items():
        t[names[prev]] = np.maximum(probs, 1e-9)
    return t / t.sum(-1, keepdims=True)


def constraint(after=((), ()), banned=(PCT,)) -> Constraint:
    return Constraint(((S1,), (S2,)), after, np.array(banned, dtype=np.int64), EOS)


def decode(tables, beam: int, limit: int = 20, c: Constraint | None = None, source=(A, EOS)):
    enc, dec, _ = bigram_graphs(tables)
    (req,) = run_to_end(enc, dec, [DecodeRequest(list(source), limit, beam=beam, num_return=beam, constraint=c)], SPEC)
    return req.results()


#                     pad   bos   eos   a     b     s1    s2    pct
EARLY_END = table(bos=[0, 0, 0.9, 0.05, 0, 0.03, 0.02, 0], s1=[0, 0, 0.9, 0, 0, 0.05, 0.05, 0])
REPEATS = table(
    bos=[0, 0, 0.1, 0, 0, 0.5, 0.4, 0], s1=[0, 0, 0.1, 0, 0, 0.8, 0.1, 0], s2=[0, 0, 0.2, 0, 0, 0.3, 0.5, 0]
)
WRONG_ORDER = table(
    bos=[0, 0, 0.1, 0, 0, 0.1, 0.8, 0], s2=[0, 0, 0.5, 0, 0, 0.5, 0, 0], s1=[0, 0, 0.5, 0, 0, 0, 0.5, 0]
)
CHATTY = table(bos=[0, 0, 0.01, 0.9, 0, 0.05, 0.04, 0], a=[0, 0, 0.01, 0.9, 0, 0.05, 0.04, 0])
INVENTS = table(bos=[0, 0, 0.1, 0.1, 0, 0.1, 0.1, 0.6], pct=[0, 0, 0.1, 0.1, 0, 0.1, 0.1, 0.6])


def counts(tokens: list[int]) -> tuple[int, int]:
    return tokens.count(S1), tokens.count(S2)


@pytest.mark.parametrize("beam", [1, 3])
def test_no_end_of_sentence_before_every_sentinel_is_placed(beam):
    unconstrained = decode({A: EARLY_END}, beam)
    assert unconstrained[0].tokens == []  # what the model wants: stop at once
    for h in decode({A: EARLY_END}, beam, c=constraint()):
        assert counts(h.tokens) == (1, 1) and h.finished and len(h.tokens) <= 3


@pytest.mark.parametrize("beam", [1, 3])
def test_no_sentinel_twice(beam):
    assert decode({A: REPEATS}, 1)[0].tokens[:2] == [S1, S1]
    for h in decode({A: REPEATS}, beam, c=constraint()):
        assert counts(h.tokens) == (1, 1) and h.finished


@pytest.mark.parametrize("beam", [1, 3])
def test_a_sentinel_waits_for_the_ones_it_must_follow(beam):
    assert decode({A: WRONG_ORDER}, 1)[0].tokens[0] == S2
    for h in decode({A: WRONG_ORDER}, beam, c=constraint(after=((), (0,)))):
        assert [t for t in h.tokens if t in (S1, S2)] == [S1, S2]


@pytest.mark.parametrize("beam", [1, 3])
def test_the_length_limit_cannot_cut_a_sentinel_off(beam):
    assert decode({A: CHATTY}, 1, limit=4)[0].tokens == [A] * 4
    for h in decode({A: CHATTY}, beam, limit=4, c=constraint()):
        assert len(h.tokens) <= 4 and counts(h.tokens) == (1, 1)
        assert not h.finished or h.tokens[-1] in (S1, S2)  # the last places were kept for the sentinels


@pytest.mark.parametrize("beam", [1, 3])
def test_a_guarded_piece_the_source_has_no_use_for_is_never_written(beam):
    assert PCT in decode({A: INVENTS}, 1)[0].tokens
    for h in decode({A: INVENTS}, beam, c=constraint()):
        assert PCT not in h.tokens and counts(h.tokens) == (1, 1)


def test_constrained_and_free_requests_share_a_batch_and_each_gets_what_it_gets_alone():
    tables = {A: REPEATS, B: CHATTY}
    enc, dec, _ = bigram_graphs(tables)
    reqs = [
        DecodeRequest([A, EOS], 6, beam=3, num_return=2, constraint=constraint()),
        DecodeRequest([B, EOS], 6),
        DecodeRequest([A, EOS], 6, beam=3),
        DecodeRequest([B, EOS], 6, constraint=constraint()),
    ]
    batch = DecodeBatch.start(reqs[:2], enc, SPEC)
    _, batch = step(batch, dec, SPEC)
    batch = concatenate(batch, DecodeBatch.start(reqs[2:], enc, SPEC))
    while len(batch):
        _, batch = step(batch, dec, SPEC)
    for r in reqs:
        alone = DecodeRequest(r.source, 6, beam=r.beam, num_return=r.num_return, constraint=r.constraint)
        run_to_end(enc, dec, [alone], SPEC)
        assert [(h.tokens, h.score) for h in r.results()] == [(h.tokens, h.score) for h in alone.results()]
        if r.constraint is not None:
            assert all(counts(h.tokens) == (1, 1) for h in r.results())


@pytest.mark.parametrize("beam", [1, 4])
def test_on_the_shipped_translator_every_span_comes_back_once_on_both_paths(real_graphs, beam):  # noqa: F811
    """Every hypothesis of the n-best list carries each sentinel once; the text has every span back."""
    enc, dec, spec = real_graphs
    tok = load_tokenizer(SHIPPED_TRANSLATOR, load_entry(SHIPPED_TRANSLATOR).manifest.tokenizer)
    vocabulary = SentinelVocabulary.build(tok, LETTER_SENTINELS)
    plans = [plan_text(t, tok, vocabulary) for t in PLACEHOLDER_SENTENCES]
    sentences = [s for p in plans for s in p.sentences]
    reqs = [
        DecodeRequest(s.source, spec.max_length(len(s.source)), beam=beam, num_return=beam, constraint=s.constraint)
        for s in sentences
    ]
    run_to_end(enc, dec, reqs, spec)
    for s, r in zip(sentences, reqs):
        for h in r.results():
            spelt = [sum(t in ids for t in h.tokens) for ids in s.constraint.ids]
            assert spelt == [1] * len(spelt), (s.text, tok.decode(h.tokens))
            rendered = render(tok, h.tokens, s)
            assert all(rendered.restored)
            assert sorted(x.text for x in s.masked.spans) == sorted(x.text for x in find_spans(rendered.text))
