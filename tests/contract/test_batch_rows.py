"""A decode batch's buffers with rows to spare: joins write in place, a leaving request's rows take the last one's,
new buffers come only with new columns, and nothing read ever comes from a spare row."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from contract.batch_rows import GROW, joined_capacity, spare_rows, trim_points
from contract.decoding import DecodeBatch, DecodeRequest, DecoderSpec, concatenate, plan, run_to_end, session_fn, step
from contract.manifest import load_entry
from tests.conftest import SHIPPED_TRANSLATOR

SOURCES = [
    [40, 41, 42, 2],
    [50, 2],
    [60, 61, 62, 63, 64, 65, 2],
    [70, 71, 2],
    [80, 81, 82, 83, 2],
    [90, 91, 92, 93, 94, 95, 96, 97, 98, 2],
    [100, 2],
]


@pytest.fixture(scope="module")
def graphs():
    entry = SHIPPED_TRANSLATOR
    spec = DecoderSpec.from_manifest(load_entry(entry).manifest)
    enc, dec = (
        session_fn(ort.InferenceSession(str(entry / f), providers=["CPUExecutionProvider"]))
        for f in ("encoder.onnx", "decoder.onnx")
    )
    return enc, dec, spec


def steps(batch, dec, spec, n):
    for _ in range(n):
        _, batch = step(batch, dec, spec)
    return batch


def test_the_geometry_rules():
    assert spare_rows(10, None) == 10 + GROW and spare_rows(64, None) == 96 and spare_rows(10, 64) == 64
    assert spare_rows(70, 64) == 70  # never fewer than in use
    assert joined_capacity(5, 20, 0) == 20 and joined_capacity(5, 20, 5) == 20  # newcomers fit a's columns
    assert joined_capacity(5, 20, 7) == 7 + GROW  # a wider newcomer: new buffers
    mask = np.zeros((2, 40), bool)
    mask[:, 3:30] = True
    src = np.zeros((2, 50), bool)
    src[0, :20] = True
    assert trim_points(mask, src, 30) == (0, 20)  # 3 unused cache columns stay, 30 unused source columns go
    mask[:, :20] = False
    assert trim_points(mask, src[:, :30], 30) == (20, 30)


def test_a_join_writes_the_newcomers_into_spare_rows_and_leaves_the_running_rows_alone(graphs):
    enc, dec, spec = graphs
    first = [DecodeRequest(s, 20) for s in SOURCES[:3]]
    batch = steps(
        concatenate(DecodeBatch.start(first[:1], enc, spec), DecodeBatch.start(first[1:], enc, spec)), dec, spec, 2
    )
    assert batch.rows is not None and len(batch.rows) == spare_rows(3, None)
    running = [k.copy() for k in batch.past_keys]
    late = DecodeBatch.start([DecodeRequest(SOURCES[3], 20, beam=2)], enc, spec)
    joined = concatenate(batch, late, room=32)
    assert joined.rows is batch.rows  # no new buffer: the spare rows took them
    assert all(np.shares_memory(j, b) for j, b in zip(joined.past_keys, batch.past_keys))
    for before, now in zip(running, joined.past_keys):
        assert (now[:3] == before).all()
    assert joined.width == batch.width and joined.capacity == batch.capacity
    assert not joined.cache_mask[3:].any() and not joined.past_keys[0][3:].any()  # padding: zero and masked
    assert (joined.src_mask[3:, : late.src_mask.shape[1]] == late.src_mask).all() and not joined.src_mask[3:, 3:].any()


def test_a_wider_or_longer_newcomer_or_a_full_batch_gets_new_buffers_with_room(graphs):
    enc, dec, spec = graphs
    batch = steps(DecodeBatch.start([DecodeRequest(SOURCES[1], 20)], enc, spec), dec, spec, 1)
    longer = concatenate(batch, DecodeBatch.start([DecodeRequest(SOURCES[5], 20)], enc, spec), room=8)
    assert longer.rows is not batch.rows and len(longer.rows) == 8 and longer.src_mask.shape[1] == len(SOURCES[5])
    full = longer
    for s in SOURCES[:6]:
        full = concatenate(full, DecodeBatch.start([DecodeRequest(s, 20)], enc, spec), room=8)
    assert len(full) == 8 and full.rows is longer.rows  # the room was used in place
    more = concatenate(full, DecodeBatch.start([DecodeRequest(SOURCES[6], 20)], enc, spec), room=8)
    assert len(more) == 9 and more.rows is not full.rows and len(more.rows) >= 9


def test_rows_leaving_move_within_the_buffers_until_enough_columns_fall_out_of_use(graphs):
    enc, dec, spec = graphs
    reqs = [DecodeRequest(s, 40) for s in SOURCES[:4]]
    batch = steps(
        concatenate(DecodeBatch.start(reqs[:1], enc, spec), DecodeBatch.start(reqs[1:], enc, spec)), dec, spec, 3
    )
    buffers, kept = batch.rows, batch.past_keys[0][[0, 2, 3]].copy()
    taken = batch.take(np.array([0, 2, 3]), [reqs[0], reqs[2], reqs[3]], batch.tokens[[0, 2, 3]])
    assert taken.rows is buffers and (taken.past_keys[0] == kept).all()
    assert taken.capacity == batch.capacity and taken.src_mask.shape[1] == batch.src_mask.shape[1]
    # A row that ran GROW or more steps leaves: the columns it alone used go, in new buffers.
    old = DecodeBatch.start([DecodeRequest(SOURCES[5], 40)], enc, spec)  # 25 tokens
    old = steps(old, dec, spec, GROW + 1)
    both = concatenate(old, DecodeBatch.start([DecodeRequest(SOURCES[2], 40)], enc, spec))  # 12 tokens
    both = steps(both, dec, spec, 2)
    young = both.take(np.array([1]), both.requests[1:], both.tokens[1:])
    assert young.rows is not both.rows and young.width == 2 and young.capacity == both.capacity - (GROW + 1)


def test_spare_rows_are_never_read(graphs):
    """NaN in every spare row, after every change of the batch: the decoded results stay those of each request alone."""
    enc, dec, spec = graphs

    def poison(batch):
        if batch.rows is not None:
            for full in batch.rows.caches():
                full[len(batch) :] = np.nan
            for full in batch.rows.crosses():  # a row per request when their beams share it
                full[len(batch.src_mask) :] = np.nan
        return batch

    first = [DecodeRequest(SOURCES[0], 12), DecodeRequest(SOURCES[2], 9, beam=3, num_return=2)]
    late = [
        DecodeRequest(SOURCES[3], 12, beam=2, num_return=2),
        DecodeRequest(SOURCES[4], 6),
        DecodeRequest(SOURCES[6], 8),
    ]
    batch, n = DecodeBatch.start(first, enc, spec), 0
    while len(batch):
        _, batch = step(poison(batch), dec, spec)
        n += 1
        if n in (2, 5):
            joining = late[:2] if n == 2 else late[2:]
            batch = poison(concatenate(batch, DecodeBatch.start(joining, enc, spec), room=16))
    for r in first + late:
        (alone,) = run_to_end(
            enc, dec, [DecodeRequest(r.source, r.max_new_tokens, beam=r.beam, num_return=r.num_return)], spec
        )
        assert [h.tokens for h in r.results()] == [h.tokens for h in alone.results()]
        np.testing.assert_allclose([h.score for h in r.results()], [h.score for h in alone.results()], atol=1e-4)


def test_the_beams_of_a_request_share_its_cross_attention_row_while_every_request_has_as_many(graphs):
    """The shipped decoder takes a cross-attention row per request (export/group_cross.py): a batch whose
    requests all search with g beams keeps one row per request; a request of another width turns the
    batch back to a row per row. Decoded results are those of each request alone, spare rows poisoned."""
    enc, dec, spec = graphs
    assert spec.cross_rows == "request"

    def poisoned(batch):
        for full in batch.rows.caches():
            full[len(batch) :] = np.nan
        for full in batch.rows.crosses():
            full[len(batch.src_mask) :] = np.nan
        return batch

    first = [DecodeRequest(SOURCES[i], 9, beam=2, num_return=2) for i in (0, 2, 5)]
    batch = poisoned(DecodeBatch.start(first, enc, spec, room=16))
    assert batch.group == 2 and len(batch) == 6 and len(batch.src_mask) == 3
    assert all(len(k) == 3 for k in batch.cross_keys) and len(batch.rows.cross_keys[0]) == 8  # 16 rows / 2
    batch = poisoned(steps(batch, dec, spec, 2))
    same_width = DecodeRequest(SOURCES[1], 7, beam=2)
    joined = poisoned(concatenate(batch, DecodeBatch.start([same_width], enc, spec), room=16))
    assert joined.rows is batch.rows and joined.group == 2 and len(joined.src_mask) == 4  # in place, still shared
    joined = poisoned(steps(joined, dec, spec, 2))
    greedy = DecodeRequest(SOURCES[3], 6)
    mixed = poisoned(concatenate(joined, DecodeBatch.start([greedy], enc, spec), room=16))
    assert mixed.group == 1 and len(mixed.src_mask) == len(mixed) > len(joined)  # a cross-attention row for each row
    while len(mixed):
        _, mixed = step(poisoned(mixed), dec, spec)
    for r in [*first, same_width, greedy]:
        (alone,) = run_to_end(
            enc, dec, [DecodeRequest(r.source, r.max_new_tokens, beam=r.beam, num_return=r.num_return)], spec
        )
        assert [h.tokens for h in r.results()] == [h.tokens for h in alone.results()]
        np.testing.assert_allclose([h.score for h in r.results()], [h.score for h in alone.results()], atol=1e-4)


def test_requests_leaving_a_shared_batch_take_their_cross_attention_rows_with_them(graphs):
    enc, dec, spec = graphs
    reqs = [DecodeRequest(s, 40, beam=2) for s in SOURCES[:4]]
    batch = steps(DecodeBatch.start(reqs, enc, spec), dec, spec, 3)
    kept_cross = batch.cross_keys[0][[0, 3]].copy()
    rows = np.array([0, 1, 6, 7])  # requests 0 and 3, their beams together
    taken = batch.take(rows, [reqs[0], reqs[3]], batch.tokens[rows])
    assert taken.group == 2 and len(taken.src_mask) == 2 and (taken.cross_keys[0] == kept_cross).all()
    per_row = DecoderSpec(**{**spec.__dict__, "cross_rows": "row"})
    alone = DecodeBatch.start([DecodeRequest(s, 40, beam=2) for s in SOURCES[:4]], enc, per_row)
    assert alone.group == 1 and len(alone.src_mask) == 8  # a decoder without the rewrite: a row per row


def test_a_request_that_leaves_is_replaced_by_the_last_so_only_its_rows_move():
    """With every request on as many rows, the last requests fill the places of those that finished; a mix of
    beam widths keeps the batch's order."""
    reqs = [DecodeRequest([5, 2], 9) for _ in range(5)]
    finished, keep, rows, tokens = plan(reqs, [[(0, 10)], [], [(0, 12)], [(0, 13)], [(0, 14)]])
    assert finished == [reqs[1]] and keep == [reqs[0], reqs[4], reqs[2], reqs[3]]
    assert rows.tolist() == [0, 4, 2, 3] and tokens.tolist() == [10, 14, 12, 13]
    beams = [DecodeRequest([5, 2], 9, beam=2) for _ in range(4)]  # rows 0-1, 2-3, 4-5, 6-7
    finished, keep, rows, tokens = plan(beams, [[], [(1, 7), (1, 8)], [], [(0, 3), (1, 4)]])
    assert keep == [beams[3], beams[1]] and rows.tolist() == [6, 7, 3, 3] and tokens.tolist() == [3, 4, 7, 8]
    mixed = [DecodeRequest([5, 2], 9, beam=b) for b in (1, 2, 1)]
    _, keep, rows, _ = plan(mixed, [[], [(0, 7), (1, 8)], [(0, 9)]])
    assert keep == mixed[1:] and rows.tolist() == [1, 2, 3]


def test_rows_moving_within_the_buffers_copy_only_the_cache_columns_in_use(graphs):
    enc, dec, spec = graphs
    reqs = [DecodeRequest(s, 40) for s in SOURCES[:4]]
    batch = steps(DecodeBatch.start(reqs, enc, spec, room=8), dec, spec, 3)
    for full in batch.rows.caches():
        full[3, :, batch.width :] = np.nan  # row 3's columns past the width, which no step reads as keys
    taken = batch.take(np.array([0, 3, 2]), [reqs[0], reqs[3], reqs[2]], batch.tokens[[0, 3, 2]])
    assert taken.rows is batch.rows
    assert all((k[1, :, taken.width :] == 0).all() for k in taken.rows.caches())  # row 1 keeps its own zeros
    assert all(np.isnan(k[3, :, taken.width :]).all() for k in taken.rows.caches())  # row 3 was not read past them
