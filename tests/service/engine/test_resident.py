"""The device-resident decoding path against the numpy one, on the shipped translator and real sentences.

Both must decode the same tokens with the same scores, bit for bit: the device path keeps the numpy
batch's geometry (capacity, width, padding, trimming) so the decoder sees the same shapes, and its
cache graphs only move data. Here the device is the CPU provider's (OrtValues in host memory), which
runs every graph the CUDA provider would.
"""

from __future__ import annotations

import threading

import numpy as np
import onnxruntime as ort
import pytest

from contract.constraints import SentinelVocabulary
from contract.decoding import (
    DecodeBatch,
    DecodeRequest,
    DecoderSpec,
    beam_search,
    concatenate,
    decoding_outputs,
    greedy,
    session_fn,
    step,
)
from contract.manifest import load_entry
from contract.tokenizer import load_tokenizer
from contract.translation_text import LETTER_SENTINELS, plan_text
from service.engine.resident import CacheGraphs, DeviceBatch, ResidentDecoder, ResidentEncoder
from service.runtime import create_session
from service.settings import Settings
from service.translator import Translator
from tests.conftest import ROOT, SHIPPED_TRANSLATOR

SENTENCES = [t for t in (ROOT / "benchmarks" / "translate_sentences.txt").read_text().splitlines() if t.strip()]
PLACEHOLDERS = (ROOT / "benchmarks" / "placeholder_sentences.txt").read_text().splitlines()


@pytest.fixture(scope="module", params=["free", "constrained"])
def paths(request):
    """(spec, sources of 16 real sentences, host graphs, device graphs, each source's constraint), over the same
    two sessions: sentences without placeholders, or software strings whose placeholders bind the search."""
    entry = load_entry(SHIPPED_TRANSLATOR)
    spec = DecoderSpec.from_manifest(entry.manifest)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    enc, dec = (
        ort.InferenceSession(str(SHIPPED_TRANSLATOR / f), opts, providers=["CPUExecutionProvider"])
        for f in ("encoder.onnx", "decoder.onnx")
    )
    outputs = decoding_outputs(spec.layers)
    graphs = CacheGraphs(enc, dec, spec.layers)
    host = (session_fn(enc, outputs["encoder"]), session_fn(dec, outputs["decoder"]))
    device = (ResidentEncoder(enc, list(outputs["encoder"]), graphs), ResidentDecoder(dec, list(outputs["decoder"])))
    tokenizer = load_tokenizer(SHIPPED_TRANSLATOR, entry.manifest.tokenizer)
    if request.param == "free":
        return spec, tokenizer.encode_batch(SENTENCES[:16], add_eos=True), host, device, [None] * 16
    vocabulary = SentinelVocabulary.build(tokenizer, LETTER_SENTINELS)
    planned = [plan_text(t, tokenizer, vocabulary).sentences[0] for t in PLACEHOLDERS]
    sentences = [s for s in planned if s.constraint is not None][:16]  # markup alone is taken out: no constraint
    assert len(sentences) == 16
    return spec, [s.source for s in sentences], host, device, [s.constraint for s in sentences]


def same(a, b) -> None:
    """Equal hypotheses: tokens, scores (exactly), finished, in the same order."""
    assert [(h.tokens, h.score, h.finished) for h in a] == [(h.tokens, h.score, h.finished) for h in b]


def test_greedy_and_beam_search_decode_alike(paths):
    spec, sources, host, device, bound = paths
    same(greedy(*device, sources, spec, constraints=bound), greedy(*host, sources, spec, constraints=bound))
    same(
        beam_search(*device, sources, spec, beam=4, constraints=bound),
        beam_search(*host, sources, spec, beam=4, constraints=bound),
    )


def test_recorded_log_probs_are_the_same(paths):
    spec, sources, host, device, bound = paths
    on_device = greedy(*device, sources[:4], spec, record=True, constraints=bound[:4])
    on_host = greedy(*host, sources[:4], spec, record=True, constraints=bound[:4])
    same(on_device, on_host)
    for d, h in zip(on_device, on_host):
        assert len(d.step_log_probs) == len(h.tokens) + h.finished
        for x, y in zip(d.step_log_probs, h.step_log_probs):
            np.testing.assert_array_equal(x, y)


def schedule(encoder, decoder, spec, sources, bound) -> tuple[list[DecodeRequest], list[tuple]]:
    """Continuous batching as the scheduler does it: requests join mid-decode (greedy, beams with n-best),
    one is cancelled, short ones leave; returns the requests and the batch's geometry after every step."""
    first = [
        DecodeRequest(sources[0], 30),
        DecodeRequest(sources[1], 30, beam=4, num_return=4),
        DecodeRequest(sources[2], 8),
    ]
    late = [
        DecodeRequest(sources[3], 30, beam=3, num_return=2),
        DecodeRequest(sources[4], 30),
        DecodeRequest(sources[5], 40, beam=2),
    ]
    latest = [DecodeRequest(s, 30, beam=b) for s, b in zip(sources[6:12], (1, 4, 1, 2, 1, 4))]
    for r, c in zip(first + late + latest, bound):
        r.constraint = c
    batch, seen, n = DecodeBatch.start(first, encoder, spec), [], 0
    while len(batch):
        _, batch = step(batch, decoder, spec)
        n += 1
        if n == 3:
            batch = concatenate(batch, DecodeBatch.start(late, encoder, spec))
        if n == 5:
            late[1].cancelled = True
        if n == 9:
            batch = concatenate(batch, DecodeBatch.start(latest, encoder, spec))
        if len(batch):
            seen.append((len(batch), batch.width, batch.capacity, batch.cache_mask.tolist(), batch.src_mask.tolist()))
    return first + late + latest, seen


def test_joins_leaves_and_cancellations_mid_decode_give_what_the_numpy_path_gives(paths):
    spec, sources, host, device, bound = paths
    on_device, device_steps = schedule(*device, spec, sources, bound)
    on_host, host_steps = schedule(*host, spec, sources, bound)
    assert device_steps == host_steps  # the same rows, widths, capacities and masks at every step
    assert any(capacity > 16 for _, _, capacity, _, _ in host_steps)  # the caches grew on the way
    for d, h in zip(on_device, on_host):
        assert d.steps == h.steps and d.cancelled == h.cancelled
        same(d.results(), h.results())
        assert len(d.results()) == d.num_return or d.cancelled


def test_a_device_batch_steps_only_on_its_resident_decoder(paths):
    spec, sources, host, device, _ = paths
    batch = DecodeBatch.start([DecodeRequest(sources[0], 4)], device[0], spec)
    assert isinstance(batch, DeviceBatch)
    with pytest.raises(TypeError):
        step(batch, host[1], spec)
    with pytest.raises(TypeError):
        concatenate(batch, DecodeBatch.start([DecodeRequest(sources[1], 4)], host[0], spec))


def test_batches_of_two_threads_share_the_cache_graphs(paths):
    """The scheduler's worker and a warm-up may decode at once, on the same model's graphs."""
    spec, sources, host, device, bound = paths
    expected = [
        beam_search(*host, sources[:8], spec, beam=2, constraints=bound[:8]),
        greedy(*host, sources[8:], spec, constraints=bound[8:]),
    ]
    got: list = [None, None]

    def decode(i: int) -> None:
        if i == 0:
            got[i] = beam_search(*device, sources[:8], spec, beam=2, constraints=bound[:8])
        else:
            got[i] = greedy(*device, sources[8:], spec, constraints=bound[8:])

    threads = [threading.Thread(target=decode, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for g, e in zip(got, expected):
        same(g, e)


@pytest.mark.parametrize(("setting", "on_device"), [("auto", False), ("host", False), ("device", True)])
def test_the_setting_chooses_the_path(setting, on_device):
    settings = Settings(intra_op_threads=1, execution_provider="cpu")
    entry = load_entry(SHIPPED_TRANSLATOR)
    sessions = [create_session(SHIPPED_TRANSLATOR / f, settings) for f in ("encoder.onnx", "decoder.onnx")]
    translator = Translator(entry, *sessions, decoder_cache=setting)
    assert translator.cache_on_device is on_device
    assert isinstance(translator.encoder, ResidentEncoder) is on_device
    translator.warm_up(4)  # both paths run the scheduler's functions
