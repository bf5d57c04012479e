"""Exporting the translator: two graphs + tokenizer, verified by greedy parity, described by the manifest."""

from __future__ import annotations

import json
import shutil

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from contract.decoding import decoder_inputs, decoding_outputs, session_fn
from contract.manifest import load_entry, read_manifest
from contract.tokenizer import Tokenizer
from export.common import ExportError, cpu_session
from export.shared_weights import ALIGN, MIN_BYTES, WEIGHTS
from export.translator import check_parity, decoder_spec, export_graphs, parity_report
from model.seq2seq import Seq2Seq, Seq2SeqConfig
from tests.conftest import ROOT, run_module


@pytest.fixture(scope="module")
def entry(tiny_translator_repository):
    return load_entry(tiny_translator_repository / "translator" / "1")


def test_the_entry_lists_every_file_with_its_sha256(entry):
    m = read_manifest(entry.path)
    assert m["task"] == "translation" and set(m["files"]) == {
        "encoder.onnx",
        "decoder.onnx",
        "decoder_prefix.onnx",
        "tokenizer.model",
        "weights.bin",
    }
    assert m["tokenizer"]["special_ids"] == {"pad": 0, "bos": 1, "eos": 2, "unk": 3}
    assert Tokenizer.load(entry.path / "tokenizer.model").vocab_size == m["tokenizer"]["vocab_size"] == 400


def test_every_parameter_is_stored_once_in_the_shared_weights_file(entry):
    names = ("encoder.onnx", "decoder.onnx", "decoder_prefix.onnx")
    graphs = {g: onnx.load(str(entry.path / g), load_external_data=False) for g in names}
    places = {}
    for model in graphs.values():
        for t in model.graph.initializer:
            if t.data_location == onnx.TensorProto.EXTERNAL:
                info = {e.key: e.value for e in t.external_data}
                assert info["location"] == WEIGHTS
                places.setdefault((int(info["offset"]), int(info["length"])), []).append(t.name)
            else:
                assert len(t.raw_data) < MIN_BYTES, t.name
    # the shared embedding is in all three graphs, the decoder's layers in two, each stored once
    assert max(len(names) for names in places.values()) == 3
    assert sum(length for _, length in places) <= (entry.path / WEIGHTS).stat().st_size
    assert (entry.path / WEIGHTS).stat().st_size < sum(length for _, length in places) + ALIGN * len(places)


def test_sharing_is_idempotent_and_keeps_the_graphs_outputs(entry, tmp_path):
    copy = tmp_path / "entry"
    shutil.copytree(entry.path, copy)
    ids = np.array([[5, 6, 7, 2]], dtype=np.int64)
    feeds = {"src_ids": ids, "src_mask": np.ones_like(ids, dtype=bool)}
    before = cpu_session(entry.path / "encoder.onnx").run(None, feeds)
    assert run_module("export.shared_weights", str(copy)).returncode == 0
    assert (copy / WEIGHTS).read_bytes() == (entry.path / WEIGHTS).read_bytes()
    load_entry(copy)  # the manifest's sha256s match the rewritten files
    after = cpu_session(copy / "encoder.onnx").run(None, feeds)
    for a, b in zip(before, after, strict=True):
        np.testing.assert_array_equal(a, b)


def test_graph_names_and_dynamic_axes_are_recorded(entry):
    enc, dec = read_manifest(entry.path)["graphs"]["encoder"], read_manifest(entry.path)["graphs"]["decoder"]
    assert [i["name"] for i in enc["inputs"]] == ["src_ids", "src_mask"]
    assert [o["name"] for o in enc["outputs"]] == ["memory", "cross_keys", "cross_values", "encoder_attentions"]
    layers = read_manifest(entry.path)["decoding"]["layers"]
    assert [i["name"] for i in dec["inputs"]] == decoder_inputs(
        layers
    )  # one cache tensor per layer: no split, no stack
    assert [o["name"] for o in dec["outputs"]] == list(decoding_outputs(layers)["decoder"])  # no attention per step
    assert dec["outputs"][1]["name"] == "new_keys_0"  # the new position only: the caller's buffers hold the cache
    prefix = read_manifest(entry.path)["graphs"]["decoder_prefix"]
    assert [i["name"] for i in prefix["inputs"]] == ["tgt_ids", "cross_keys", "cross_values", "src_mask"]
    assert [o["name"] for o in prefix["outputs"]] == ["log_probs", "self_attentions", "cross_attentions"]
    past = next(i for i in dec["inputs"] if i["name"] == "past_keys_0")["shape"]
    assert (
        len(past) == 4 and isinstance(past[0], str) and isinstance(past[2], str)
    )  # batch and cache length are dynamic
    assert [i["dtype"] for i in dec["inputs"]][:4] == ["int64", "int64", "bool", "bool"]


def test_parity_and_evaluation_are_recorded(entry):
    ev = read_manifest(entry.path)["evaluation"]
    assert ev["parity"]["identical_tokens"] == ev["parity"]["sentences"] == min(20, ev["sentences"]) > 0
    assert ev["parity"]["max_abs_log_probs"] <= 1e-4 and ev["parity"]["prefix_vs_steps_max_abs"] <= 1e-4
    assert ev["parity"]["prefix_max_abs_attention"] <= 1e-5
    for key in ("greedy", "beam4", "copy_source"):
        assert 0 <= ev[key]["bleu"] <= 100 and 0 <= ev[key]["chrf"] <= 100
    assert ev["sentences"] > 0 and ev["examples"][0]["source"] and "greedy" in ev["examples"][0]
    assert {e["domain"] for e in ev["examples"]} == {"ding", "help", "ui"} and "beam4" in ev["examples"][0]
    domains = ev["domains"]
    assert sorted(domains) == ["ding", "everyday", "help", "ui"]  # everyday pools ding (and tuxpaint)
    assert (
        domains["everyday"] == domains["ding"]
        and sum(domains[d]["sentences"] for d in ("ding", "help", "ui")) == ev["sentences"]
    )
    for d in domains.values():
        assert 0 <= d["greedy"]["bleu"] <= 100 and 0 <= d["beam4"]["chrf"] <= 100
    assert ev["signatures"]["bleu"].startswith("nrefs:1|") and "chrF" not in ev["signatures"]["bleu"]
    assert read_manifest(entry.path)["data"]["folder"]  # the tiny corpus has no stats.json: no sources to name


def test_average_of_the_last_epochs(tiny_translator_checkpoint, tmp_path):
    repo = tmp_path / "models"
    args = ["--checkpoint", str(tiny_translator_checkpoint), "--repository", str(repo), "--version", "1"]
    proc = run_module("export.translator", *args, "--average", "2", "--parity-sentences", "5", "--no-progress")
    assert proc.returncode == 0, proc.stderr
    manifest = json.loads((repo / "translator" / "1" / "manifest.json").read_text())
    assert manifest["training"]["averaged_epochs"] == [2, 3]
    assert manifest["evaluation"]["parity"]["identical_tokens"] == 5
    proc = run_module("export.translator", *args, "--force", "--average", "9")
    assert proc.returncode == 2 and "only 3 epoch weights" in proc.stderr


def test_encoder_outputs_for_a_padded_batch(entry):
    sess = ort.InferenceSession(str(entry.path / "encoder.onnx"), providers=["CPUExecutionProvider"])
    ids = np.array([[40, 41, 42, 2], [50, 2, 0, 0]], dtype=np.int64)
    memory, ck, cv, attn = sess.run(None, {"src_ids": ids, "src_mask": ids != 0})
    cfg = read_manifest(entry.path)["model"]["config"]
    heads, layers = cfg["heads"], cfg["decoder_layers"]
    assert memory.shape == (2, 4, cfg["dim"]) and ck.shape == cv.shape == (layers, 2, heads, 4, cfg["dim"] // heads)
    assert attn.shape == (2, cfg["encoder_layers"], heads, 4, 4)
    np.testing.assert_allclose(attn.sum(-1), 1.0, atol=1e-5)
    assert np.abs(attn[1, ..., 2:]).max() == 0


def test_parity_check_refuses_graphs_that_drift(tiny_translator_checkpoint, tmp_path):
    ckpt = torch.load(tiny_translator_checkpoint, weights_only=False)
    model = Seq2Seq(Seq2SeqConfig.from_dict(ckpt["config"])).eval()
    model.load_state_dict(ckpt["state_dict"])
    export_graphs(model, tmp_path)
    with torch.no_grad():
        model.out.weight.add_(torch.randn_like(model.out.weight))  # PyTorch no longer matches the graphs
    graphs = [
        session_fn(ort.InferenceSession(str(tmp_path / f), providers=["CPUExecutionProvider"]))
        for f in ("encoder.onnx", "decoder.onnx")
    ]
    sources = [[40, 41, 2], [50, 51, 52, 2]]
    report = parity_report(model, *graphs, sources)
    assert report["max_abs_log_probs"] > 1e-2
    with pytest.raises(ExportError, match="parity check failed"):
        check_parity(report)
    assert decoder_spec(model.cfg).layers == model.cfg.decoder_layers


def test_cli_errors(tiny_translator_checkpoint, tmp_path):
    proc = run_module("export.translator", "--checkpoint", str(tmp_path / "none.pt"), "--repository", str(tmp_path))
    assert proc.returncode == 2 and "does not exist" in proc.stderr
    last = tiny_translator_checkpoint.parent / "last.pt"
    proc = run_module("export.translator", "--checkpoint", str(last), "--repository", str(tmp_path))
    assert proc.returncode == 2 and "--resume" in proc.stderr
    proc = run_module(
        "export.translator",
        "--checkpoint",
        str(tiny_translator_checkpoint),
        "--repository",
        str(tmp_path),
        "--data",
        str(tmp_path),
    )
    assert proc.returncode == 2 and "test.tsv" in proc.stderr and "Traceback" not in proc.stderr
    assert not any((tmp_path / "translator").glob("*")) if (tmp_path / "translator").exists() else True


def test_evaluating_an_existing_entry_gives_its_export_time_figures(entry, tiny_translation_data, tmp_path):
    out = tmp_path / "evaluation.json"
    proc = run_module(
        "export.evaluate", "--entry", str(entry.path), "--data", str(tiny_translation_data), "--out", str(out)
    )
    assert proc.returncode == 0, proc.stderr
    again, recorded = json.loads(out.read_text()), read_manifest(entry.path)["evaluation"]
    for key in ("greedy", "beam4"):  # same graphs, same split: the manifest's scores, recomputed
        assert {m: again[key][m] for m in ("bleu", "chrf")} == {m: recorded[key][m] for m in ("bleu", "chrf")}
    assert again["domains"].keys() == recorded["domains"].keys() and again["signatures"] == recorded["signatures"]
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("translator/1 on ") and lines[-1].split()[:2] == ["overall", str(again["sentences"])]
    assert any(line.split()[0] == "everyday" for line in lines[1:])


def test_evaluate_errors_are_one_line(tiny_translation_data, tmp_path):
    vit = ROOT / "models" / "vit" / "1"
    for args, message in (
        (["--entry", str(vit), "--data", str(tiny_translation_data)], "not a translator"),
        (["--entry", str(tmp_path / "missing")], "missing"),
    ):
        proc = run_module("export.evaluate", *args)
        assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_an_evaluation_is_recorded_in_the_manifest_under_its_own_key(entry, tiny_translation_data, tmp_path):
    copy, data = tmp_path / "translator" / "1", tmp_path / "data"
    shutil.copytree(entry.path, copy)
    shutil.copytree(tiny_translation_data, data)
    stats = {"total": 4, "sources": {"tar": {"packages": {"tar": "1.34"}, "stages": {"kept": 4}}}, "excluded": {}}
    (data / "stats.json").write_text(json.dumps(stats), encoding="utf-8")
    for _ in range(2):  # a key --record wrote may be recorded again
        proc = run_module("export.evaluate", "--entry", str(copy), "--data", str(data), "--record", "x")
        assert proc.returncode == 0, proc.stderr
    evaluation = load_entry(copy).manifest.evaluation  # still a valid entry, every file's sha256 intact
    own = read_manifest(entry.path)["evaluation"]
    assert {k: v for k, v in evaluation.items() if k != "x"} == own  # the exporter's figures untouched
    recorded = evaluation["x"]
    assert recorded["data"]["sources"] == stats["sources"] and recorded["data"]["folder"] == str(data)
    assert recorded["data"]["excluded"] == {}
    assert {m: recorded["beam4"][m] for m in ("bleu", "chrf")} == {m: own["beam4"][m] for m in ("bleu", "chrf")}
    for args, message in ((["--record", "beam4"], "exporter's own"), (["--record", "y", "--max-test", "2"], "whole")):
        proc = run_module("export.evaluate", "--entry", str(copy), "--data", str(data), *args)
        assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert read_manifest(copy)["evaluation"].keys() == {*own, "x"}
