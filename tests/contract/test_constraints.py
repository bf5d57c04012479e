"""Constrained search: every sentinel at most once, in order, never cut off, nothing invented, no rambling.

A bigram "translator" in numpy makes the model want each forbidden thing (end before a sentinel while it
would rather go on, a sentinel twice, the wrong order, a guarded piece, words past the length limit, a word
glued to a sentinel); an end the model wants most is taken, its missing spans left to the alignment. The
shipped translator checks the rule on real sentences through both decoding paths and inside continuous
batching.
"""

from __future__ import annotations

import numpy as np
import pytest

from contract.constraints import Constraint, SentinelVocabulary
from contract.decoding import DecodeBatch, DecodeRequest, DecoderSpec, concatenate, run_to_end, step
from contract.manifest import load_entry
from contract.placeholders import find_spans
from contract.tokenizer import load_tokenizer
from contract.translation_text import LETTER_SENTINELS, TextPlan, place, plan_text, render
from tests.conftest import ROOT, SHIPPED_TRANSLATOR
from tests.contract.test_decoding import bigram_graphs, real_graphs  # noqa: F401 (real_graphs: a fixture)

PAD, BOS, EOS, A, B, S1, S2, PCT = range(8)
SPEC = DecoderSpec(layers=1, heads=1, head_dim=1, max_positions=50)
PLACEHOLDER_SENTENCES = (ROOT / "benchmarks" / "placeholder_sentences.txt").read_text().splitlines()


def table(**rows: list[float]) -> np.ndarray:
    """Next-token probabilities by previous token; rows not given prefer the sentinels, then eos."""
    names = {"bos": BOS, "a": A, "b": B, "s1": S1, "s2": S2, "pct": PCT}
    t = np.full((8, 8), 1e-6)
    t[:, EOS], t[:, S1], t[:, S2] = 0.2, 0.4, 0.39
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
LATE_END = table(
    bos=[0, 0, 0.35, 0.05, 0, 0.4, 0.2, 0], s1=[0, 0, 0.3, 0, 0, 0, 0.7, 0], s2=[0, 0, 0.9, 0, 0, 0.05, 0.05, 0]
)
REPEATS = table(
    bos=[0, 0, 0.1, 0, 0, 0.5, 0.4, 0], s1=[0, 0, 0.1, 0, 0, 0.8, 0.1, 0], s2=[0, 0, 0.2, 0, 0, 0.3, 0.5, 0]
)
WRONG_ORDER = table(
    bos=[0, 0, 0.1, 0, 0, 0.1, 0.8, 0], s2=[0, 0, 0.5, 0, 0, 0.5, 0, 0], s1=[0, 0, 0.4, 0, 0, 0, 0.6, 0]
)
_WORDY = [0, 0, 0.01, 0.9, 0, 0.05, 0.04, 0]
CHATTY = table(bos=_WORDY, a=_WORDY, s1=_WORDY, s2=_WORDY)
_PERCENT = [0, 0, 0.1, 0.1, 0, 0.1, 0.1, 0.6]
INVENTS = table(bos=_PERCENT, pct=_PERCENT, s1=_PERCENT, s2=_PERCENT)
GLUES = table(bos=[0, 0, 0.1, 0, 0, 0.8, 0.1, 0], s1=[0, 0, 0.1, 0.6, 0.25, 0, 0.05, 0])


def counts(tokens: list[int]) -> tuple[int, int]:
    return tokens.count(S1), tokens.count(S2)


@pytest.mark.parametrize("beam", [1, 3])
def test_an_end_the_model_would_rather_not_take_waits_for_every_sentinel(beam):
    assert [] in [h.tokens for h in decode({A: LATE_END}, 3)]  # free, the search may end at once
    hyps = decode({A: LATE_END}, beam, c=constraint())
    assert counts(hyps[0].tokens) == (1, 1) and hyps[0].finished
    assert all(h.tokens for h in hyps)  # eos was never the first step's best: no hypothesis ended there


@pytest.mark.parametrize("beam", [1, 3])
def test_an_end_the_model_wants_most_is_taken_and_its_missing_spans_left_to_the_alignment(beam):
    """Forbidding it would make the model ramble until the length limit forces the sentinels in."""
    best = decode({A: EARLY_END}, beam, c=constraint())[0]
    assert best.tokens == [] and best.finished


@pytest.mark.parametrize("beam", [1, 3])
def test_no_sentinel_twice(beam):
    assert decode({A: REPEATS}, 1)[0].tokens[:2] == [S1, S1]
    hyps = decode({A: REPEATS}, beam, c=constraint())
    assert counts(hyps[0].tokens) == (1, 1) and hyps[0].finished
    assert all(max(counts(h.tokens)) <= 1 for h in hyps)


@pytest.mark.parametrize("beam", [1, 3])
def test_a_sentinel_waits_for_the_ones_it_must_follow(beam):
    assert decode({A: WRONG_ORDER}, 1)[0].tokens[0] == S2
    hyps = decode({A: WRONG_ORDER}, beam, c=constraint(after=((), (0,))))
    assert [t for t in hyps[0].tokens if t in (S1, S2)] == [S1, S2]
    assert all([t for t in h.tokens if t in (S1, S2)] in ([], [S1], [S1, S2]) for h in hyps)


@pytest.mark.parametrize("beam", [1, 3])
def test_the_length_limit_cannot_cut_a_sentinel_off(beam):
    assert decode({A: CHATTY}, 1, limit=4)[0].tokens == [A] * 4
    hyps = decode({A: CHATTY}, beam, limit=4, c=constraint())
    assert all(len(h.tokens) == 4 and not h.finished and counts(h.tokens) == (1, 1) for h in hyps)
    assert beam > 1 or sorted(hyps[0].tokens[-2:]) == [S1, S2]  # greedy: the last places were kept for them


@pytest.mark.parametrize("beam", [1, 3])
def test_past_its_budget_a_hypothesis_places_its_spans_or_ends(beam):
    """CHATTY wants words and never a sentinel; past 1.5 tokens per source token (3 here) it must place one."""
    assert counts(decode({A: CHATTY}, 1, limit=20)[0].tokens) == (0, 0)
    best = decode({A: CHATTY}, beam, limit=20, c=constraint())[0]
    assert counts(best.tokens) == (1, 1) and best.tokens.index(S2) <= 5, best.tokens


@pytest.mark.parametrize("beam", [1, 3])
def test_a_guarded_piece_the_source_has_no_use_for_is_never_written(beam):
    assert PCT in decode({A: INVENTS}, 1)[0].tokens
    hyps = decode({A: INVENTS}, beam, c=constraint())
    assert all(PCT not in h.tokens for h in hyps) and counts(hyps[0].tokens) == (1, 1)


@pytest.mark.parametrize("beam", [1, 3])
def test_nothing_goes_on_with_the_word_of_a_sentinel_set_apart(beam):
    """``Q`` + ``ie`` or ``%d`` + ``-Dateien``: A stands for a piece inside a word; unless the source's span touched
    the next word (``apart`` False), no such piece follows a sentinel."""
    glued = Constraint(((S1,), (S2,)), ((), ()), np.array([PCT]), EOS, np.array([A], dtype=np.int64))
    assert decode({A: GLUES}, beam, c=glued)[0].tokens[:2] == [S1, B]
    touching = Constraint(((S1,), (S2,)), ((), ()), np.array([PCT]), EOS, np.array([A]), apart=(False, True))
    assert decode({A: GLUES}, beam, c=touching)[0].tokens[:2] == [S1, A]


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
    placed = 0
    for s, r in zip(sentences, reqs):
        if s.constraint is None:  # its tags are taken out (contract/markup.py), nothing else to protect
            continue
        for h in r.results():
            spelt = [sum(t in ids for t in h.tokens) for ids in s.constraint.ids]
            assert max(spelt) <= 1, (s.text, tok.decode(h.tokens))
            placed += sum(spelt)
            plan = TextPlan(s.text, [s], ["", ""], None)
            rendered = render(tok, h.tokens, s, place(plan, tok, [h], [None])[0])  # the rest by the diagonal
            assert all(rendered.restored)
            assert sorted(x.text for x in s.masked.spans) == sorted(x.text for x in find_spans(rendered.text))
    assert placed >= 0.8 * sum(len(s.constraint.ids) * r.beam for s, r in zip(sentences, reqs) if s.constraint)
