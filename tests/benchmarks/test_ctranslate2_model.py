"""The CTranslate2 model built from the shipped model repository alone decodes exactly like our loop.

``benchmarks/bench_ctranslate2.py`` compares our decoding with CTranslate2 on this model, so the
comparison is only fair if the two compute the same translator: greedy output identical token for
token on the benchmark sentences. The weights come from the ONNX graphs, where the exporter folded
the weight matrices into unnamed initializers; a matrix that cannot be named must stop the
conversion with an error that says which, never be guessed.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import onnx
import onnxruntime as ort
import pytest

from benchmarks.bench_translate import SENTENCES
from benchmarks.ctranslate2_model import convert, greedy_agreement, translator
from contract.decoding import DecoderSpec, session_fn
from contract.manifest import describe_files, load_entry, read_manifest, write_manifest
from contract.tokenizer import Tokenizer
from model.onnx_weights import WeightNotIdentified, read_weights
from tests.conftest import ROOT, SHIPPED_TRANSLATOR
from tests.test_imports import imported_roots

SHIPPED = SHIPPED_TRANSLATOR


def test_the_conversion_from_the_shipped_repository_decodes_greedy_exactly_like_ours(tmp_path):
    pytest.importorskip("ctranslate2")
    entry = load_entry(SHIPPED)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    encoder, decoder = (
        session_fn(ort.InferenceSession(str(SHIPPED / entry.manifest.graph(g).file), options))
        for g in ("encoder", "decoder")
    )
    ct2 = translator(convert(SHIPPED, tmp_path / "ct2"), threads=1)
    same = greedy_agreement(
        ct2, encoder, decoder, DecoderSpec.from_manifest(entry.manifest), Tokenizer.load(SHIPPED / "tokenizer.model"),
        SENTENCES,
    )  # fmt: skip
    assert len(same) == 32 and all(same), f"differ on sentences {[i for i, s in enumerate(same) if not s]}"


def test_every_parameter_is_recovered_under_its_pytorch_name():
    cfg, weights, epsilon = read_weights(load_entry(SHIPPED))
    d, f = cfg["dim"], cfg["ffn_dim"]
    assert weights["encoder.0.attn.q.weight"].shape == (d, d) and weights["decoder.1.ffn.fc1.weight"].shape == (f, d)
    assert weights["encoder.3.ffn.fc2.weight"].shape == (d, f)
    assert (weights["src_embed.weight"] == weights["tgt_embed.weight"]).all()  # tied: the output projection
    assert (weights["src_embed.weight"] == weights["out.weight"]).all()
    per_encoder_layer, per_decoder_layer = 6 * 2 + 2 * 2, 8 * 2 + 3 * 2  # linear weights and biases, norms
    cross_kv = 2 * 2 * cfg["decoder_layers"]  # computed by the encoder graph
    expected = cfg["encoder_layers"] * per_encoder_layer + cfg["decoder_layers"] * per_decoder_layer + cross_kv + 4 + 3
    assert len(weights) == expected and epsilon == pytest.approx(1e-5)


def broken_copy(tmp_path: Path, rename: dict[str, str]) -> Path:
    """The shipped entry with initializers of its encoder renamed, its manifest's checksums updated."""
    entry = tmp_path / "translator" / "2"
    shutil.copytree(SHIPPED, entry)
    model = onnx.load(str(entry / "encoder.onnx"))
    for init in model.graph.initializer:
        init.name = rename.get(init.name, init.name)
    for node in model.graph.node:
        node.input[:] = [rename.get(x, x) for x in node.input]
    onnx.save(model, str(entry / "encoder.onnx"))
    manifest = read_manifest(entry)
    manifest["files"] = describe_files(entry, list(manifest["files"]))
    write_manifest(entry, manifest)
    return entry


def test_a_weight_whose_bias_is_not_a_parameter_is_a_clear_error(tmp_path):
    entry = broken_copy(tmp_path, {"model.encoder.1.attn.k.bias": "val_9999"})
    with pytest.raises(
        WeightNotIdentified,
        match=r"2/encoder\.onnx: cannot identify weight 'val_\d+' \(256, 256\) multiplied by MatMul",
    ):
        read_weights(load_entry(entry))


def test_a_parameter_the_graphs_do_not_hold_is_a_clear_error(tmp_path):
    pytest.importorskip("ctranslate2")
    entry = broken_copy(tmp_path, {"model.encoder.0.attn.q.bias": "model.encoder.0.attn.query.bias"})
    with pytest.raises(WeightNotIdentified, match=r"no parameter 'encoder\.0\.attn\.q\.weight' identified"):
        convert(entry, tmp_path / "ct2")


def test_the_conversion_needs_no_torch():
    assert "torch" not in imported_roots(ROOT / "model" / "onnx_weights.py")
    probe = (
        "import sys, benchmarks.ctranslate2_model; print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))"
    )
    proc = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=False)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stderr  # nothing of torch loaded, lazily or not
