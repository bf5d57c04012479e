"""The numpy decoding loops: bookkeeping of the cache, batch compaction, greedy vs beam search.

A small bigram "translator" written in numpy checks the search itself (beam search finds the more
probable sentence that greedy misses); the tiny exported translator checks it on real ORT graphs.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from contract.decoding import (
    DecodeBatch,
    DecodeRequest,
    DecoderSpec,
    beam_search,
    concatenate,
    decoding_outputs,
    greedy,
    length_runs,
    pad_sources,
    run_to_end,
    session_fn,
    split,
    step,
)
from contract.manifest import load_entry
from tests.conftest import SHIPPED_TRANSLATOR

PAD, BOS, EOS, A, B = range(5)
SPEC = DecoderSpec(layers=1, heads=1, head_dim=1, max_positions=50)


def bigram_graphs(tables: dict[int, np.ndarray]):
    """Log-probs of the next token depend on the previous token and on the source's first token."""
    seen = []

    def encoder(feeds):
        ids = feeds["src_ids"]
        kv = ids[:, 0].astype(np.float32)[None, :, None, None, None] * np.ones((1, 1, 1, ids.shape[1], 1), np.float32)
        return {"cross_keys": kv, "cross_values": kv}

    def decoder(feeds):
        past, cache = feeds["past_keys_0"], feeds["cache_mask"]  # SPEC has one layer
        n, t = cache.shape
        assert past.shape == (n, 1, t, 1) and feeds["src_mask"].shape[0] == n == feeds["cross_keys_0"].shape[0]
        assert (feeds["positions"][:, 0] == cache.sum(1)).all()  # a row's position = its real cached tokens
        seen.append(n)
        table = np.stack([tables[int(k)] for k in feeds["cross_keys_0"][:, 0, 0, 0]])  # (n, V, V)
        log_probs = np.log(table[np.arange(n), feeds["tokens"][:, 0]])
        new = np.zeros((n, 1, 1, 1), np.float32)
        return {"log_probs": log_probs, "new_keys_0": new, "new_values_0": new}

    return encoder, decoder, seen


def table(**rows) -> np.ndarray:
    t = np.full((5, 5), 1e-9)
    for prev, probs in rows.items():
        t[{"bos": BOS, "a": A, "b": B}[prev]] = probs
    return t / t.sum(-1, keepdims=True)


#                         pad   bos   eos   a     b
TRAP = table(bos=[1e-9, 1e-9, 1e-9, 0.6, 0.4], a=[1e-9, 1e-9, 0.4, 0.3, 0.3], b=[1e-9, 1e-9, 0.9, 0.05, 0.05])
LONG = table(bos=[1e-9, 1e-9, 0.1, 0.9, 1e-9], a=[1e-9, 1e-9, 0.2, 0.8, 1e-9])


def test_beam_search_finds_what_greedy_misses():
    enc, dec, _ = bigram_graphs({A: TRAP})
    (g,) = greedy(enc, dec, [[A, EOS]], SPEC)
    (b,) = beam_search(enc, dec, [[A, EOS]], SPEC, beam=2)
    assert g.tokens == [A] and g.score == pytest.approx(np.log(0.6 * 0.4))
    assert b.tokens == [B] and b.score == pytest.approx(np.log(0.4 * 0.9)) and b.finished


def test_finished_rows_leave_the_batch_and_results_keep_their_order():
    enc, dec, seen = bigram_graphs({A: TRAP, B: LONG})
    sources = [[B, EOS], [A, EOS], [B, A, EOS]]
    hyps = greedy(enc, dec, sources, SPEC)
    assert [h.tokens for h in hyps] == [[A] * 13, [A], [A] * 14]  # LONG stops at its length limit
    assert not hyps[0].finished and hyps[1].finished
    assert seen[:3] == [3, 3, 2]  # the short sentence left after its eos
    alone = [greedy(enc, dec, [s], SPEC)[0].tokens for s in sources]
    assert alone == [h.tokens for h in hyps]
    beams = beam_search(enc, dec, sources, SPEC, beam=3)
    # LONG: the first three finished hypotheses are [], [a], [a a]; by mean log-prob [a a] wins and the search stops
    assert [h.tokens for h in beams] == [[A, A], [B], [A, A]] and all(h.finished for h in beams)


def test_pad_sources_refuses_empty_input():
    ids, mask = pad_sources([[5, 2], [2]], PAD)
    assert ids.tolist() == [[5, 2], [2, 0]] and mask.tolist() == [[True, True], [True, False]]
    with pytest.raises(ValueError):
        pad_sources([[5, 2], []], PAD)
    with pytest.raises(ValueError):
        beam_search(*bigram_graphs({A: TRAP})[:2], [[A, EOS]], SPEC, beam=0)


def test_length_runs_cut_where_padding_would_cost_more_than_a_run():
    lengths = [34, 13, 9, 22, 21, 13, 6, 4, 10, 6, 14, 6, 3, 13, 26, 26]  # the benchmark's 16 sentences
    runs = length_runs(lengths, run_cost=16)
    assert sorted(i for run in runs for i in run) == list(range(16))
    assert [[lengths[i] for i in run] for run in runs] == [
        [3, 4, 6, 6, 6, 9, 10],
        [13, 13, 13, 14],
        [21, 22, 26, 26],
        [34],
    ]
    assert sum(len(r) * max(lengths[i] for i in r) for r in runs) == 264  # padded positions, against 544 in one run
    assert length_runs(lengths, run_cost=10**6) == [sorted(range(16), key=lambda i: (lengths[i], i))]
    assert len(length_runs(lengths, run_cost=0)) == len(set(lengths))  # equal lengths still share a run
    assert length_runs([]) == []


def test_a_batch_encodes_in_runs_and_pads_each_source_alike():
    calls = []

    def encoder(feeds):
        ids = feeds["src_ids"]
        calls.append(ids.shape)
        kv = (ids[:, None, :, None] + 0.5).astype(np.float32) * feeds["src_mask"][:, None, :, None]  # (B, H, S, Dh)
        return {"cross_keys": kv[None], "cross_values": -kv[None]}

    sources = [[7] * 30 + [EOS], [8, EOS], [9, 9, EOS]]
    batch = DecodeBatch.start([DecodeRequest(s, 5, beam=b) for s, b in zip(sources, (1, 2, 1))], encoder, SPEC)
    assert sorted(calls) == [(1, 31), (2, 3)]  # the two short sources in one run, the long one alone
    assert batch.src_mask.shape == (4, 31) and batch.src_mask.sum(1).tolist() == [31, 2, 2, 3]
    keys = batch.cross_keys[0][:, 0, :, 0]
    assert keys[1].tolist() == keys[2].tolist() == [8.5, 2.5] + [0.0] * 29  # beam rows share their source's
    assert keys[3, :4].tolist() == [9.5, 9.5, 2.5, 0.0] and (batch.cross_values[0][:, 0, :, 0] == -keys).all()
    with pytest.raises(ValueError):
        DecodeBatch.start([], encoder, SPEC)


@pytest.fixture(scope="module", params=["host", "device"])
def real_graphs(request):
    """The shipped translator's encoder and step decoder (no training, no torch): plain graphs (the numpy
    path), or the service's resident ones, whose batches keep their buffers in OrtValues (the device path)."""
    return shipped_graphs(request.param)


@pytest.fixture(scope="module")
def host_graphs():
    """``real_graphs``' plain graphs only: what only host batches do (rows set aside)."""
    return shipped_graphs("host")


def shipped_graphs(path: str):
    entry = SHIPPED_TRANSLATOR
    spec = DecoderSpec.from_manifest(load_entry(entry).manifest)
    sessions = [
        ort.InferenceSession(str(entry / f), providers=["CPUExecutionProvider"])
        for f in ("encoder.onnx", "decoder.onnx")
    ]
    if path == "device":
        from service.engine.resident import CacheGraphs, ResidentDecoder, ResidentEncoder

        outputs = decoding_outputs(spec.layers)
        graphs = CacheGraphs(sessions[0], sessions[1], spec.layers)
        return (
            ResidentEncoder(sessions[0], list(outputs["encoder"]), graphs),
            ResidentDecoder(sessions[1], list(outputs["decoder"])),
            spec,
        )
    return session_fn(sessions[0]), session_fn(sessions[1]), spec


def test_on_real_graphs_batching_and_beam_one_change_nothing(real_graphs):
    enc, dec, spec = real_graphs
    sources = [[40, 41, 42, 2], [50, 2], [60, 61, 62, 63, 64, 65, 2], [70, 71, 2]]
    batched = greedy(enc, dec, sources, spec)
    assert [h.tokens for h in batched] == [greedy(enc, dec, [s], spec)[0].tokens for s in sources]
    assert [h.tokens for h in beam_search(enc, dec, sources, spec, beam=1)] == [h.tokens for h in batched]
    for s, h in zip(sources, batched):
        assert len(h.tokens) <= spec.max_length(len(s))
    best = beam_search(enc, dec, sources, spec, beam=4, length_penalty=0.0)
    assert all(b.score >= g.score - 1e-4 for b, g in zip(best, batched) if g.finished)


def test_on_real_graphs_runs_encode_as_one_padded_batch_does(real_graphs):
    enc, _, spec = real_graphs
    sources = [[40 + i for i in range(n)] + [2] for n in (2, 30, 3, 12, 28, 5)]
    batch = DecodeBatch.start([DecodeRequest(s, 5) for s in sources], enc, spec)
    ids, mask = pad_sources(sources, spec.pad_id)
    one = enc({"src_ids": ids, "src_mask": mask})
    assert (batch.src_mask == mask).all()
    for layer, (k, v) in enumerate(zip(batch.cross_keys, batch.cross_values)):
        real = mask[:, None, :, None]  # padded positions hold different (masked) values
        np.testing.assert_allclose(np.where(real, k, 0), np.where(real, one["cross_keys"][layer], 0), atol=2e-5)
        np.testing.assert_allclose(np.where(real, v, 0), np.where(real, one["cross_values"][layer], 0), atol=2e-5)


def test_requests_joining_a_running_batch_get_what_they_get_alone(real_graphs):
    enc, dec, spec = real_graphs
    sources = [[40, 41, 42, 2], [50, 2], [60, 61, 62, 63, 64, 65, 2], [70, 71, 2], [80, 81, 82, 83, 2]]
    first = [
        DecodeRequest(sources[0], 12),
        DecodeRequest(sources[1], 12),
        DecodeRequest(sources[2], 9, beam=3, num_return=2),
    ]
    batch = DecodeBatch.start(first, enc, spec)
    finished = []  # a short sentence may end within the first steps
    for _ in range(3):
        done, batch = step(batch, dec, spec)
        finished += done
    late = [DecodeRequest(sources[3], 12, beam=2, num_return=2), DecodeRequest(sources[4], 5)]
    batch = concatenate(batch, DecodeBatch.start(late, enc, spec))
    assert batch.width == 3 and batch.capacity > 3  # three positions written, room for more
    assert batch.cache_mask[-3:].sum() == 0 and batch.cache_mask[:-3, :3].all()  # the newcomers' cache is padding
    assert not batch.cache_mask[:, 3:].any()
    while len(batch):
        done, batch = step(batch, dec, spec)
        finished += done
    assert sorted(r.id for r in finished) == sorted(r.id for r in first + late)
    for r in first + late:
        (alone,) = run_to_end(
            enc, dec, [DecodeRequest(r.source, r.max_new_tokens, beam=r.beam, num_return=r.num_return)], spec
        )
        assert [h.tokens for h in r.results()] == [h.tokens for h in alone.results()]
        np.testing.assert_allclose([h.score for h in r.results()], [h.score for h in alone.results()], atol=1e-4)
        assert len(r.results()) == r.num_return and all(len(h.tokens) <= r.max_new_tokens for h in r.results())
        ranks = [h.ranking(r.length_penalty) for h in r.results()]
        assert ranks == sorted(ranks, reverse=True)


def test_requests_set_aside_and_joined_back_get_what_they_get_alone(host_graphs):
    """``split`` sets some requests' rows aside (buffers of their own) while the others step on; joined back
    later, every request decodes what it decodes alone: the scheduler sets batch work aside so (host batches
    only: a device batch keeps its rows in OrtValues)."""
    enc, dec, spec = host_graphs
    reqs = [
        DecodeRequest([40, 41, 42, 2], 14),
        DecodeRequest([50, 51, 2], 14, beam=2, num_return=2),
        DecodeRequest([60, 61, 62, 63, 64, 65, 2], 12),
        DecodeRequest([70, 71, 2], 14, beam=2),
    ]
    batch = DecodeBatch.start(reqs, enc, spec)
    finished = []
    for _ in range(2):
        done, batch = step(batch, dec, spec)
        finished += done
    aside = {reqs[1].id, reqs[2].id}
    batch, parked = split(batch, aside)
    assert [r.id for r in parked.requests] == [reqs[1].id, reqs[2].id] and len(parked) == 3
    assert [r.id for r in batch.requests] == [reqs[0].id, reqs[3].id]
    before = [c.copy() for c in parked.past_keys]
    for _ in range(5):
        done, batch = step(batch, dec, spec)
        finished += done
    assert all(np.array_equal(a, b) for a, b in zip(before, parked.past_keys))  # untouched while aside
    batch = concatenate(batch, parked)
    while len(batch):
        done, batch = step(batch, dec, spec)
        finished += done
    assert sorted(r.id for r in finished) == sorted(r.id for r in reqs)
    for r in reqs:
        (alone,) = run_to_end(
            enc, dec, [DecodeRequest(r.source, r.max_new_tokens, beam=r.beam, num_return=r.num_return)], spec
        )
        assert [h.tokens for h in r.results()] == [h.tokens for h in alone.results()]
        np.testing.assert_allclose([h.score for h in r.results()], [h.score for h in alone.results()], atol=1e-4)
    everyone, nobody = split(DecodeBatch.start([DecodeRequest([40, 2], 4)], enc, spec), set())
    assert nobody is None and len(everyone) == 1
    whole = DecodeBatch.start([DecodeRequest([40, 2], 4), DecodeRequest([41, 2], 4)], enc, spec)
    left, gone = split(whole, {r.id for r in whole.requests})
    assert left is None and gone is whole  # every row leaves: nothing copied


def test_a_cancelled_request_leaves_at_the_next_step(real_graphs):
    enc, dec, spec = real_graphs
    reqs = [DecodeRequest([40, 41, 2], 20, beam=2), DecodeRequest([50, 51, 2], 20)]
    batch = DecodeBatch.start(reqs, enc, spec)
    _, batch = step(batch, dec, spec)
    reqs[0].cancelled = True
    done, batch = step(batch, dec, spec)
    assert reqs[0] in done and batch.requests == [reqs[1]] * (reqs[1] in batch.requests) and len(batch) <= 1


def test_request_options_are_validated():
    for bad in ({"source": []}, {"beam": 0}, {"max_new_tokens": 0}, {"num_return": 3, "beam": 2}):
        with pytest.raises(ValueError):
            DecodeRequest(**{"source": [5, 2], "max_new_tokens": 4, **bad})


def test_top_candidates_are_each_rows_best_in_order_with_ties_to_the_lower_id():
    from contract.decoding import top_candidates

    rng = np.random.default_rng(3)
    log_probs = np.round(rng.standard_normal((6, 50)), 1).astype(np.float32)  # rounded: plenty of ties
    log_probs[2, :] = -np.inf
    log_probs[2, 7] = 0.0
    before = log_probs.copy()
    ids, values = top_candidates(log_probs, 8)
    np.testing.assert_array_equal(log_probs, before)  # searched in place, every value put back
    expected = np.argsort(-log_probs, axis=1, kind="stable")[:, :8]
    np.testing.assert_array_equal(ids[[0, 1, 3, 4, 5]], expected[[0, 1, 3, 4, 5]])
    np.testing.assert_array_equal(values, np.take_along_axis(log_probs, ids, 1))
    assert ids[2, 0] == 7 and np.isneginf(values[2, 1:]).all()  # a row with fewer finite candidates than k


def test_beam_search_reading_beam_plus_one_candidates_per_row_chooses_as_from_every_token():
    """``advance`` reads each row's best ``beam + 1`` tokens; a search over every token of every row must
    choose the same survivors and finished hypotheses, step after step (ties, eos near the top, dead rows)."""
    from contract.decoding import LogProbs, advance

    class EveryToken(LogProbs):
        def best(self, rows, k):  # the whole vocabulary, ranked as top_candidates ranks: ties to the lower id
            mine = self.log_probs[rows]
            ids = np.argsort(-mine, axis=1, kind="stable")
            return ids, np.take_along_axis(mine, ids, 1)

    rng = np.random.default_rng(7)
    vocab, eos = 12, 2
    for trial in range(40):
        beam = int(rng.integers(2, 6))
        requests = {kind: [DecodeRequest([5, eos], 30, beam=beam) for _ in range(3)] for kind in ("read", "every")}
        for _ in range(6):
            rows = sum(r.beam for r in requests["read"])
            x = np.round(rng.standard_normal((rows, vocab)), 1).astype(np.float32) * 2  # rounded: ties
            x[rng.random(rows) < 0.5, eos] = x.max() + 1.0  # eos often the best token of a row
            x[rng.random((rows, vocab)) < 0.1] = -np.inf
            read = advance(requests["read"], LogProbs(x.copy()), eos)
            every = advance(requests["every"], EveryToken(x.copy()), eos)
            assert read == every, trial
            for a, b in zip(requests["read"], requests["every"]):
                assert [(h.tokens, h.score) for h in a.live] == [(h.tokens, h.score) for h in b.live]
                assert [(h.tokens, h.score) for h in a.done] == [(h.tokens, h.score) for h in b.done]
            # as ``step`` does, the finished requests leave; the others decode on
            requests = {kind: [r for r, picked in zip(rs, read) if picked] for kind, rs in requests.items()}
            if not requests["read"]:
                break
