"""The decoder rewrite that lets a request's beams share its cross-attention row (export/group_cross.py)."""

from __future__ import annotations

import shutil

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from contract.decoding import DecodeRequest, DecoderSpec, run_to_end, session_fn
from contract.manifest import load_entry, read_manifest, sha256_file
from contract.tokenizer import load_tokenizer
from export import group_cross
from export.common import max_abs_diff
from tests.conftest import ROOT, SHIPPED_TRANSLATOR, run_module

SENTENCES = [t for t in (ROOT / "benchmarks" / "translate_sentences.txt").read_text().splitlines() if t.strip()]


@pytest.fixture(scope="module")
def rewritten(tiny_translator_repository, tmp_path_factory):
    """(the exported tiny translator, a copy of it rewritten in place by the CLI)."""
    before = tiny_translator_repository / "translator" / "1"
    after = tmp_path_factory.mktemp("grouped") / "translator" / "1"
    shutil.copytree(before, after)
    proc = run_module("export.group_cross", "--entry", str(after))
    assert proc.returncode == 0, proc.stderr
    assert "beam 4 identical" in proc.stderr
    return before, after


def test_the_rewrite_records_its_parity_and_touches_only_the_decoder(rewritten):
    before, after = rewritten
    m, original = read_manifest(after), read_manifest(before)
    assert m["decoding"]["cross_rows"] == "request" and "cross_rows" not in original["decoding"]
    report = m["evaluation"]["cross_rows_rewrite"]
    for kind in ("greedy", "beam4"):
        assert report[kind]["identical"] == report["sentences"] == len(SENTENCES)
        assert report[kind]["max_abs_log_probs"] <= group_cross.LOG_PROB_TOL
    for f in original["files"]:
        if f not in ("decoder.onnx",):
            assert sha256_file(after / f) == sha256_file(before / f), f  # weights.bin, the other graphs
    load_entry(after)  # sha256s verify
    graph = onnx.load(str(after / "decoder.onnx"), load_external_data=False).graph
    named = {i.name: i.type.tensor_type.shape.dim[0].dim_param for i in graph.input}
    assert named["src_mask"] == named["cross_keys_0"] == "cross_rows" and named["tokens"] != "cross_rows"


def test_rows_per_request_and_rows_per_row_decode_alike(rewritten):
    """Through the rewritten graph: a row per request (beams sharing it) or a row per row, the same tokens;
    and a row per row gives exactly what the exported graph gives."""
    before, after = rewritten
    m = load_entry(after).manifest
    grouped = DecoderSpec.from_manifest(m)
    per_row = DecoderSpec(**{**grouped.__dict__, "cross_rows": "row"})
    sources = load_tokenizer(after, m.tokenizer).encode_batch(SENTENCES[:12], add_eos=True)

    def graph(entry, name):
        return session_fn(ort.InferenceSession(str(entry / name), providers=["CPUExecutionProvider"]))

    enc = graph(before, "encoder.onnx")
    old, new = graph(before, "decoder.onnx"), graph(after, "decoder.onnx")

    def decode(decoder, spec, beam):
        reqs = [DecodeRequest(list(s), spec.max_length(len(s)), beam=beam, num_return=2) for s in sources]
        return [[(h.tokens, h.score) for h in r.results()] for r in run_to_end(enc, decoder, reqs, spec)]

    assert decode(new, per_row, 3) == decode(old, per_row, 3)  # the same numbers, row for row
    shared, each = decode(new, grouped, 3), decode(new, per_row, 3)
    assert [[t for t, _ in r] for r in shared] == [[t for t, _ in r] for r in each]
    np.testing.assert_allclose([[s for _, s in r] for r in shared], [[s for _, s in r] for r in each], atol=1e-4)


def test_a_rewritten_decoder_or_a_classifier_is_refused(rewritten, tiny_vit_repository):
    _, after = rewritten
    again = run_module("export.group_cross", "--entry", str(after))
    assert again.returncode != 0 and "already" in again.stderr and "Traceback" not in again.stderr
    vit = next((tiny_vit_repository / "vit").iterdir())
    proc = run_module("export.group_cross", "--entry", str(vit))
    assert proc.returncode != 0 and "only a translator" in proc.stderr and "Traceback" not in proc.stderr


def test_the_shipped_translator_is_rewritten_and_its_parity_holds_on_its_graph():
    """Recomputed on the shipped decoder.onnx, not read from its manifest: beam 4 with a cross-attention
    row per request (what the service runs) gives every parity sentence the tokens of a row per row, which
    through the rewritten graph is what the exported graph computed, with per-step log-probabilities
    within LOG_PROB_TOL; the manifest's record says the same."""
    entry = load_entry(SHIPPED_TRANSLATOR)
    grouped = DecoderSpec.from_manifest(entry.manifest)
    assert grouped.cross_rows == "request"
    per_row = DecoderSpec(**{**grouped.__dict__, "cross_rows": "row"})
    sources = load_tokenizer(SHIPPED_TRANSLATOR, entry.manifest.tokenizer).encode_batch(SENTENCES, add_eos=True)

    def graph(name):
        return session_fn(ort.InferenceSession(str(SHIPPED_TRANSLATOR / name), providers=["CPUExecutionProvider"]))

    encoder, decoder = graph("encoder.onnx"), graph("decoder.onnx")

    def best(spec):
        reqs = [DecodeRequest(list(s), spec.max_length(len(s)), beam=4, record=True) for s in sources]
        return [r.results()[0] for r in run_to_end(encoder, decoder, reqs, spec)]

    shared, each = best(grouped), best(per_row)
    identical = sum(a.tokens == b.tokens for a, b in zip(shared, each))
    drift = max(max_abs_diff(x, y) for a, b in zip(shared, each) for x, y in zip(a.step_log_probs, b.step_log_probs))
    assert identical == len(SENTENCES) and drift <= group_cross.LOG_PROB_TOL
    assert read_manifest(SHIPPED_TRANSLATOR)["evaluation"]["cross_rows_rewrite"]["beam4"]["identical"] == identical
