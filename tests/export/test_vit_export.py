"""Export of a real (tiny, trained) ViT: parity, manifest contract, sha256 verification, int8 variant."""

import json
import shutil

import numpy as np
import onnxruntime as ort
import pytest
import torch

from contract.manifest import (
    ManifestError,
    Preprocessing,
    load_entry,
    parse_manifest,
    read_manifest,
    verify_files,
    write_manifest,
)
from export.common import ExportError, cpu_session
from export.vit import ATTENTION_TOL, LOGITS_TOL, check_parity, parity_report
from model.vit import ViT, ViTConfig
from tests.conftest import run_module
from tests.export.weights_files import assert_classifier_weights_stored_once


@pytest.fixture(scope="module")
def entry(tiny_vit_repository):
    return tiny_vit_repository / "vit" / "1"


def test_manifest_describes_everything_the_service_needs(entry):
    m = read_manifest(entry)
    assert (m["name"], m["version"], m["task"]) == ("vit", "1", "image-classification")
    assert m["framework"]["opset"] >= 17
    io, attention = m["graphs"]["model"], m["graphs"]["attention"]
    assert (
        io["inputs"]
        == attention["inputs"]
        == [{"name": "pixel_values", "dtype": "float32", "shape": ["batch", 1, 28, 28]}]
    )
    assert [o["name"] for o in io["outputs"]] == ["logits"]  # serving pays for no attention it was not asked for
    assert [o["name"] for o in attention["outputs"]] == ["logits", "attentions"]
    cfg = ViTConfig.from_dict(m["model"]["config"])
    assert attention["outputs"][1]["shape"] == ["batch", cfg.depth, cfg.heads, cfg.num_tokens, cfg.num_tokens]
    assert m["attention"]["graph"] == "attention" and m["attention"]["output"] == "attentions"
    assert m["labels"][0] == "T-shirt/top" and len(m["labels"]) == 10
    assert set(m["preprocessing"]) >= {"image_size", "channels", "color_mode", "mean", "std", "scale"}
    assert m["attention"]["grid"] == [4, 4] and m["attention"]["prefix_tokens"] == 1
    ev = m["evaluation"]
    assert ev["test_examples"] == 10000 and 0.3 < ev["test_accuracy"] <= 1.0
    assert abs(ev["test_accuracy"] - ev["pytorch_test_accuracy"]) < 0.002
    assert ev["parity"]["batch_sizes"] == [1, 8, 64] and ev["parity"]["argmax_identical"]
    assert ev["parity"]["max_abs_logits"] <= LOGITS_TOL and ev["parity"]["max_abs_attention"] <= ATTENTION_TOL
    assert m["training"]["seed"] == 0 and "model.train_vit" in m["training"]["command"]
    samples = m["samples"]
    assert [s["index"] for s in samples] == list(range(10)) and [s["label"] for s in samples] == m["labels"]
    assert set(m["files"]) == {"model.onnx", "model_attention.onnx", "weights.bin"} | {s["file"] for s in samples}


def test_both_graphs_point_into_one_weights_file(entry):
    assert_classifier_weights_stored_once(entry)


def test_graphs_have_a_dynamic_batch_axis_and_agree(entry):
    serving, attention = (
        ort.InferenceSession(str(entry / f), providers=["CPUExecutionProvider"])
        for f in ("model.onnx", "model_attention.onnx")
    )
    assert [o.name for o in serving.get_outputs()] == ["logits"]
    for bs in (1, 3, 17):
        x = np.random.default_rng(bs).normal(size=(bs, 1, 28, 28)).astype(np.float32)
        (logits,) = serving.run(None, {"pixel_values": x})
        same, attn = attention.run(None, {"pixel_values": x})
        assert logits.shape == (bs, 10) and attn.shape[0] == bs and np.array_equal(logits, same)


def test_onnx_matches_pytorch_on_real_images(entry, tiny_vit_checkpoint, fashion_mnist):
    ckpt = torch.load(tiny_vit_checkpoint, weights_only=False)
    vit = ViT(ViTConfig.from_dict(ckpt["config"])).eval()
    vit.load_state_dict(ckpt["state_dict"])
    x = Preprocessing.model_validate(ckpt["preprocessing"]).apply(fashion_mnist.test_images[:64])
    report = parity_report(
        vit, cpu_session(entry / "model_attention.onnx"), x, logits_only=cpu_session(entry / "model.onnx")
    )
    check_parity(report)
    # and the check does fail when the graph drifts from the weights
    with torch.no_grad():
        vit.head.bias.add_(1e-2)
    with pytest.raises(ExportError, match="parity check failed"):
        check_parity(parity_report(vit, cpu_session(entry / "model_attention.onnx"), x))


def test_manifest_round_trip(tmp_path, entry):
    m = read_manifest(entry)
    write_manifest(tmp_path, m)
    assert read_manifest(tmp_path) == m
    with pytest.raises(ManifestError, match="required keys"):
        write_manifest(tmp_path, {"name": "x"})


def test_corrupted_file_is_detected(tmp_path, entry):
    copy = tmp_path / "vit" / "1"
    shutil.copytree(entry, copy)
    assert load_entry(copy).name == "vit"
    data = bytearray((copy / "model.onnx").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (copy / "model.onnx").write_bytes(bytes(data))
    with pytest.raises(ManifestError, match=r"model.onnx: sha256 mismatch .* corrupted"):
        verify_files(copy, parse_manifest(read_manifest(copy)))
    (copy / "model.onnx").unlink()
    with pytest.raises(ManifestError, match="missing"):
        load_entry(copy)


def test_malformed_manifest_is_refused(tmp_path, entry):
    shutil.copytree(entry, tmp_path / "e")
    (tmp_path / "e" / "manifest.json").write_text("{not json")
    with pytest.raises(ManifestError, match="not valid JSON"):
        load_entry(tmp_path / "e")
    (tmp_path / "e" / "manifest.json").write_text(json.dumps({"schema_version": 1}))
    with pytest.raises(ManifestError, match="missing required keys"):
        load_entry(tmp_path / "e")


def test_int8_variant_records_its_own_accuracy(tiny_vit_checkpoint, tmp_path):
    proc = run_module(
        "export.vit",
        "--checkpoint",
        str(tiny_vit_checkpoint),
        "--repository",
        str(tmp_path),
        "--version",
        "3",
        "--int8",
        "--int8-max-loss",  # the tiny model is 40-50% accurate: its int8 copy may lose points; the gate is tested below
        "100",
        "--no-progress",
    )
    assert proc.returncode == 0, proc.stderr
    m = read_manifest(tmp_path / "vit-int8" / "3")
    assert m["variant"]["precision"] == "int8"
    assert 0.0 < m["evaluation"]["test_accuracy"] <= 1.0
    assert 0.9 <= m["evaluation"]["vs_fp32"]["top1_agreement"] <= 1.0
    load_entry(tmp_path / "vit-int8" / "3")  # its sha256s verify


def test_an_int8_variant_below_the_gate_is_refused_and_leaves_nothing(tiny_vit_checkpoint, tmp_path):
    args = ["--checkpoint", str(tiny_vit_checkpoint), "--repository", str(tmp_path), "--version", "4", "--int8"]
    proc = run_module("export.vit", *args, "--int8-max-loss", "-100", "--no-progress")  # no variant can pass
    assert proc.returncode == 2 and "int8 test accuracy" in proc.stderr and "more than -1.000 below" in proc.stderr
    assert (tmp_path / "vit" / "4" / "manifest.json").is_file()  # the fp32 entry stands
    assert not (tmp_path / "vit-int8" / "4").exists()


def test_export_refuses_to_overwrite_without_force(tiny_vit_checkpoint, tiny_vit_repository):
    proc = run_module(
        "export.vit",
        "--checkpoint",
        str(tiny_vit_checkpoint),
        "--repository",
        str(tiny_vit_repository),
        "--version",
        "1",
        "--no-progress",
    )
    assert proc.returncode == 2 and "already exists" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    "args, message",
    [(["--checkpoint", "/nonexistent.pt"], "does not exist"), (["--opset", "11"], "opset must be >= 17")],
)
def test_export_cli_bad_input(args, message, tmp_path):
    proc = run_module("export.vit", "--repository", str(tmp_path), *args)
    assert proc.returncode == 2 and message in proc.stderr.strip().splitlines()[-1]
    assert "Traceback" not in proc.stderr
