"""The fused variant of the shipped translator (export/fuse.py): same contract, same translations, fewer nodes."""

from __future__ import annotations

import shutil

import onnx
import onnxruntime as ort
import pytest

from contract.decoding import DecoderSpec, beam_search, decoding_outputs, greedy, session_fn
from contract.manifest import load_entry, read_manifest
from contract.tokenizer import load_tokenizer
from export import fuse
from export.common import ExportError, graph_io
from service.engine.resident import CacheGraphs, ResidentDecoder, ResidentEncoder
from tests.conftest import ROOT, SHIPPED_TRANSLATOR, run_module

SENTENCES = [t for t in (ROOT / "benchmarks" / "translate_sentences.txt").read_text().splitlines() if t.strip()]


@pytest.fixture(scope="module")
def fused_repository(tmp_path_factory):
    """The shipped translator and, written by the CLI, its fused variants: cross-attention only, and all."""
    repo = tmp_path_factory.mktemp("fused") / "models"
    entry = repo / "translator" / SHIPPED_TRANSLATOR.name
    shutil.copytree(SHIPPED_TRANSLATOR, entry)
    for name, extra in (("translator-fused", []), ("translator-fused-all", ["--self-attention"])):
        proc = run_module("export.fuse", "--entry", str(entry), "--name", name, *extra)
        assert proc.returncode == 0, proc.stderr
        assert "wrote" in proc.stderr
    return repo


@pytest.mark.parametrize(("name", "self_attention"), [("translator-fused", 0), ("translator-fused-all", 2)])
def test_the_variant_keeps_the_decoder_contract_and_records_parity_and_node_counts(
    fused_repository, name, self_attention
):
    entry = fused_repository / name / SHIPPED_TRANSLATOR.name
    m = read_manifest(entry)
    assert m["variant"] == {"precision": "fp32", "method": fuse.METHOD, "from": f"translator/{SHIPPED_TRANSLATOR.name}"}
    fused = m["fusion"]["fused"]
    # the shipped decoder's cross-attention takes a row per request (export/group_cross.py): kept as it is
    assert fused["cross_attention"] == 0 and fused["self_attention"] == self_attention
    assert fused["MultiHeadAttention"] == self_attention and fused["SkipLayerNormalization"] > 0
    assert m["decoding"]["cross_rows"] == "request"
    nodes = m["fusion"]["decoder_nodes_after_ort_optimisation"]
    assert nodes["before"] == fuse.ort_nodes(SHIPPED_TRANSLATOR / "decoder.onnx") > nodes["after"]
    parity = m["evaluation"]["vs_unfused"]
    assert parity["identical_greedy"] == parity["sentences"] == len(SENTENCES)
    assert parity["max_abs_log_probs"] <= fuse.LOG_PROB_TOL
    original = graph_io(SHIPPED_TRANSLATOR / "decoder.onnx")
    rewritten = graph_io(entry / "decoder.onnx")
    assert rewritten["inputs"] == original["inputs"] and rewritten["outputs"] == original["outputs"]
    assert load_entry(entry).manifest.variant.precision == "fp32"  # sha256s verify
    ops = {n.op_type for n in onnx.load(str(entry / "decoder.onnx"), load_external_data=False).graph.node}
    assert ("MultiHeadAttention" in ops) == (self_attention > 0) and "Softmax" in ops  # the grouped cross-attention
    prefix = onnx.load(str(entry / "decoder_prefix.onnx"), load_external_data=False)  # attention maps: unfused
    assert not {n.op_type for n in prefix.graph.node} & {"MultiHeadAttention", "SkipLayerNormalization"}


def test_the_fused_decoder_translates_alike_on_the_numpy_and_the_device_path(fused_repository):
    """Beam search with the fused decoder gives the unfused tokens; the device-resident path (CPU
    provider OrtValues, cache graphs built from the fused decoder) gives the numpy path's, bit for bit."""
    base = load_entry(SHIPPED_TRANSLATOR)
    spec = DecoderSpec.from_manifest(base.manifest)
    sources = load_tokenizer(SHIPPED_TRANSLATOR, base.manifest.tokenizer).encode_batch(SENTENCES[:8], add_eos=True)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    outputs = decoding_outputs(spec.layers)

    def sessions(entry):
        return [
            ort.InferenceSession(str(entry / f), opts, providers=["CPUExecutionProvider"])
            for f in ("encoder.onnx", "decoder.onnx")
        ]

    enc, dec = sessions(SHIPPED_TRANSLATOR)
    reference = beam_search(session_fn(enc, outputs["encoder"]), session_fn(dec, outputs["decoder"]), sources, spec)
    enc, dec = sessions(fused_repository / "translator-fused-all" / SHIPPED_TRANSLATOR.name)
    host = (session_fn(enc, outputs["encoder"]), session_fn(dec, outputs["decoder"]))
    graphs = CacheGraphs(enc, dec, spec.layers)
    device = (ResidentEncoder(enc, list(outputs["encoder"]), graphs), ResidentDecoder(dec, list(outputs["decoder"])))
    on_host = beam_search(*host, sources, spec)
    assert [h.tokens for h in on_host] == [h.tokens for h in reference]
    assert [(h.tokens, h.score) for h in beam_search(*device, sources, spec)] == [(h.tokens, h.score) for h in on_host]
    assert [h.tokens for h in greedy(*device, sources, spec)] == [h.tokens for h in greedy(*host, sources, spec)]


def test_a_graph_without_the_exported_cross_attention_is_refused(tmp_path):
    """The encoder holds no decoder cross-attention: nothing is written, and the error says why."""
    with pytest.raises(ExportError, match="no cross-attention"):
        fuse.fuse_decoder(SHIPPED_TRANSLATOR / "encoder.onnx", tmp_path / "out.onnx", 4, 256)
    assert not (tmp_path / "out.onnx").exists()


def test_an_exported_decoder_gets_its_cross_attention_fused(tiny_translator_repository, tmp_path):
    """A decoder as exported (a cross-attention row per row): each layer's cross-attention -> MultiHeadAttention."""
    entry = tmp_path / "models" / "translator" / "1"
    shutil.copytree(tiny_translator_repository / "translator" / "1", entry)
    proc = run_module("export.fuse", "--entry", str(entry))
    assert proc.returncode == 0, proc.stderr
    m = read_manifest(tmp_path / "models" / "translator-fused" / "1")
    layers = m["decoding"]["layers"]
    assert m["fusion"]["fused"]["cross_attention"] == layers == m["fusion"]["fused"]["MultiHeadAttention"]
    assert m["decoding"].get("cross_rows", "row") == "row"
