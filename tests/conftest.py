"""Session-wide fixtures: a tiny ViT trained on real Fashion-MNIST and exported once per test run."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# the shipped translator entry: the one place to change when a new version replaces it
SHIPPED_TRANSLATOR = ROOT / "models" / "translator" / "3"


def run_module(module: str, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run one of the project's CLIs the way a user does (``python -m ...``) and capture its output."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.fixture(scope="session")
def tiny_vit_checkpoint(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("vit-tiny")
    proc = run_module("model.train_vit", "--profile", "tiny", "--out", str(out), "--no-progress", "--epochs", "2")
    assert proc.returncode == 0, proc.stderr
    return out / "best.pt"


@pytest.fixture(scope="session")
def tiny_vit_repository(tiny_vit_checkpoint, tmp_path_factory) -> Path:
    """A model repository ``<tmp>/models/vit/1`` holding the tiny ViT, exported and parity-checked."""
    repo = tmp_path_factory.mktemp("repo") / "models"
    proc = run_module(
        "export.vit",
        "--checkpoint",
        str(tiny_vit_checkpoint),
        "--repository",
        str(repo),
        "--version",
        "1",
        "--no-progress",
    )
    assert proc.returncode == 0, proc.stderr
    return repo


@pytest.fixture(scope="session")
def fashion_mnist():
    """The real Fashion-MNIST, as installed by `make data` (Debian's dataset-fashion-mnist)."""
    from model.data import load_image_dataset

    return load_image_dataset("fashion-mnist")


@pytest.fixture(scope="session")
def tiny_translation_data(tmp_path_factory) -> Path:
    """A corpus folder (train/valid/test.tsv + spm/spm.model) of real sentence pairs from the excerpts.

    The split is not held out: the fixture exercises the pipeline's mechanics, not its quality.
    """
    from model.translation import tokenizer as trainer
    from model.translation.textio import write_tsv
    from tests.model.translation.excerpts import DING_PAIRS, HELP_PAIRS, UI_PAIRS

    data = tmp_path_factory.mktemp("translation")
    pairs = DING_PAIRS + HELP_PAIRS + UI_PAIRS
    domains = ["ding"] * len(DING_PAIRS) + ["help"] * len(HELP_PAIRS) + ["ui"] * len(UI_PAIRS)
    write_tsv(data / "train.tsv", pairs)
    (data / "train.domains").write_text("".join(f"{d}\n" for d in domains), encoding="utf-8")
    write_tsv(data / "valid.tsv", pairs[::3])
    write_tsv(data / "test.tsv", pairs[1::2])
    (data / "test.domains").write_text("".join(f"{d}\n" for d in domains[1::2]), encoding="utf-8")
    (data / "spm").mkdir()
    trainer.train_tokenizer(trainer.training_sentences(pairs), vocab_size=400).save(data / "spm" / "spm.model")
    return data


@pytest.fixture(scope="session")
def tiny_translator_checkpoint(tiny_translation_data, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("translator-tiny")
    proc = run_module(
        "model.train_translator",
        "--profile",
        "tiny",
        "--data",
        str(tiny_translation_data),
        "--out",
        str(out),
        "--epochs",
        "3",
        "--no-progress",
    )
    assert proc.returncode == 0, proc.stderr
    return out / "best.pt"


@pytest.fixture(scope="session")
def tiny_translator_repository(tiny_translator_checkpoint, tmp_path_factory) -> Path:
    """A model repository ``<tmp>/models/translator/1``: the tiny translator, exported and parity-checked."""
    repo = tmp_path_factory.mktemp("repo") / "models"
    proc = run_module(
        "export.translator",
        "--checkpoint",
        str(tiny_translator_checkpoint),
        "--repository",
        str(repo),
        "--version",
        "1",
        "--parity-sentences",
        "20",
        "--no-progress",
    )
    assert proc.returncode == 0, proc.stderr
    return repo


@pytest.fixture(scope="session")
def both_repository(tiny_vit_repository, tiny_translator_repository, tmp_path_factory) -> Path:
    """A repository with the tiny ViT and the tiny translator, served together (read-only: copy to change)."""
    repo = tmp_path_factory.mktemp("both") / "models"
    shutil.copytree(tiny_vit_repository / "vit", repo / "vit")
    shutil.copytree(tiny_translator_repository / "translator", repo / "translator")
    return repo
