"""The training CLI as a user meets it: a real short run, and one clear line for every mistake."""

import json

import pytest
import torch

from tests.conftest import run_module


def test_tiny_training_run_writes_checkpoint_and_metrics(tiny_vit_checkpoint):
    ckpt = torch.load(tiny_vit_checkpoint, weights_only=False)
    metrics = json.loads((tiny_vit_checkpoint.parent / "metrics.json").read_text())
    assert ckpt["config"]["patch_size"] == 7
    assert metrics["training"]["dataset"]["dataset"] == "fashion-mnist"
    assert metrics["evaluation"]["test_examples"] == 10000
    assert metrics["evaluation"]["test_accuracy"] > 0.3  # well above chance (0.1) after 2 tiny epochs
    history = metrics["training"]["history"]
    assert history[-1]["train_loss"] < history[0]["train_loss"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--dataset", "imagenet-22k"], "unknown dataset 'imagenet-22k'"),
        (["--data-dir", "/nonexistent/fmnist"], "apt-get install dataset-fashion-mnist"),
        (["--patch-size", "5"], "not a multiple of patch_size"),
        (["--heads", "3"], "not divisible"),
        (["--epochs", "0"], "epochs"),
        (["--dataset", "image-folder"], "--data-dir"),
        (["--ema", "1.0"], "ema must be in [0, 1)"),
    ],
)
def test_bad_input_gives_one_clear_line(args, message):
    proc = run_module("model.train_vit", "--profile", "tiny", "--no-progress", "--max-steps", "1", *args)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert lines[-1].startswith("error: ") and message in lines[-1], proc.stderr
    assert "Traceback" not in proc.stderr


def test_same_seed_gives_identical_weights(tmp_path):
    """Reproducibility: the rebuild command retrains to the same weights, not merely similar ones."""
    states = []
    for run in ("a", "b"):
        proc = run_module(
            "model.train_vit",
            "--profile",
            "tiny",
            "--no-progress",
            "--max-steps",
            "8",
            "--seed",
            "7",
            "--out",
            str(tmp_path / run),
        )
        assert proc.returncode == 0, proc.stderr
        states.append(torch.load(tmp_path / run / "best.pt", weights_only=False)["state_dict"])
    assert states[0].keys() == states[1].keys()
    for key in states[0]:
        assert torch.equal(states[0][key], states[1][key]), key


def test_ema_keeps_an_average_of_the_weights(tmp_path):
    """With --ema the saved weights are the running average, not the last step's weights."""
    out = {}
    for name, extra in (("raw", []), ("ema", ["--ema", "0.9"])):
        proc = run_module(
            "model.train_vit",
            "--profile",
            "tiny",
            "--no-progress",
            "--max-steps",
            "8",
            "--out",
            str(tmp_path / name),
            *extra,
        )
        assert proc.returncode == 0, proc.stderr
        out[name] = torch.load(tmp_path / name / "best.pt", weights_only=False)
    assert out["ema"]["training"]["hyperparameters"]["ema"] == 0.9
    raw, ema = out["raw"]["state_dict"], out["ema"]["state_dict"]
    assert any(not torch.equal(raw[k], ema[k]) for k in raw)


def test_trains_on_an_image_folder(tmp_path):
    """Users' own images: root/<label>/*.png at any size, RGB here, resized to --image-size."""
    from tests.model.test_data import make_folder

    make_folder(tmp_path / "images", labels=("cat", "dog", "owl"), per_label=12, size=(40, 30))
    proc = run_module(
        "model.train_vit",
        "--profile",
        "tiny",
        "--no-progress",
        "--dataset",
        "image-folder",
        "--data-dir",
        str(tmp_path / "images"),
        "--image-size",
        "16",
        "--channels",
        "3",
        "--patch-size",
        "4",
        "--val-fraction",
        "0.2",
        "--out",
        str(tmp_path / "ck"),
    )
    assert proc.returncode == 0, proc.stderr
    ckpt = torch.load(tmp_path / "ck" / "best.pt", weights_only=False)
    assert ckpt["config"]["image_size"] == 16 and ckpt["config"]["channels"] == 3
    assert ckpt["config"]["num_classes"] == 3 and ckpt["label_names"] == ["cat", "dog", "owl"]
    assert ckpt["preprocessing"]["color_mode"] == "RGB" and len(ckpt["preprocessing"]["mean"]) == 3
    proc = run_module(
        "export.vit",
        "--checkpoint",
        str(tmp_path / "ck" / "best.pt"),
        "--repository",
        str(tmp_path / "models"),
        "--no-progress",
    )
    assert proc.returncode == 0, proc.stderr
    manifest = json.loads((tmp_path / "models" / "vit" / "1" / "manifest.json").read_text())
    assert manifest["graphs"]["model"]["inputs"][0]["shape"] == ["batch", 3, 16, 16]
    assert manifest["labels"] == ["cat", "dog", "owl"]
