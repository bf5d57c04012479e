"""The one-run GPU job end to end on the CPU: pre-tokenise -> carry -> train -> weights back -> export -> evaluate."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
import torch

from model.training import average_checkpoints
from model.translation.arrays import load_arrays
from model.weight_shards import MAX_BYTES, read_shards
from tests.conftest import ROOT, run_module


@pytest.fixture(scope="module")
def job(tiny_translation_data, tmp_path_factory):
    """Runs the launcher from a folder holding only the code's view of the data: the .npz it carries."""
    root = tmp_path_factory.mktemp("gpu-job")
    arrays = root / "data" / "translation.npz"
    proc = run_module("model.translation.arrays", "--data", str(tiny_translation_data), "--out", str(arrays))
    assert proc.returncode == 0, proc.stderr
    carried = root / "carried" / "translation.npz"
    carried.parent.mkdir()
    shutil.copy(arrays, carried)
    out, work = root / "out", root / "work"
    args = ["--arrays", str(carried), "--profile", "tiny", "--minutes", "5", "--device", "cpu", "--average", "2"]
    trainer = ["--epochs", "8", "--max-tokens", "256", "--bleu-every", "4", "--oversample", "ding=2"]
    proc = run_module(
        "model.gpu_job", *args, "--out", str(out), "--work", str(work), "--benchmark-steps", "2", "--", *trainer
    )
    assert proc.returncode == 0, proc.stderr
    return {"arrays": arrays, "out": out, "work": work, "root": root}


def test_the_job_sends_back_a_few_fp16_files_with_its_learning_curve(job):
    files = sorted(p.name for p in job["out"].iterdir())
    assert "job.json" in files and len(files) <= 8 and all((job["out"] / f).stat().st_size <= MAX_BYTES for f in files)
    record = json.loads((job["out"] / "job.json").read_text())
    history = record["training"]["history"]
    assert record["training"]["epochs_done"] == len(history) == 8 and record["training"]["averaged_epochs"] == [7, 8]
    assert [h["val_bleu"] is not None for h in history] == [False, False, False, True] * 2
    assert record["throughput"]["tokens_per_second"] > 0 and set(record["throughput"]["split"]) >= {"forward", "data"}
    assert record["training"]["oversample"] == {"ding": 2} and "--batch-scale" not in record["training"]["command"]
    # the shards hold the average of the last two epochs, rounded to fp16; tied weights once
    back = read_shards(job["out"], record["weights"])
    mean = average_checkpoints(sorted((job["work"] / "epochs").glob("epoch-*.pt"))[-2:])
    assert back.keys() == mean.keys() and record["weights"]["aliases"]
    for name, tensor in mean.items():
        torch.testing.assert_close(back[name], tensor.half().float(), atol=0, rtol=0, msg=name)


def test_the_weights_come_back_as_an_entry_that_exports_and_evaluates(job, tiny_translation_data):
    ckpt_dir, repo = job["root"] / "back", job["root"] / "models"
    proc = run_module(
        "model.weight_shards", "--job", str(job["out"]), "--arrays", str(job["arrays"]), "--out", str(ckpt_dir)
    )
    assert proc.returncode == 0, proc.stderr
    export = ["--checkpoint", str(ckpt_dir / "best.pt"), "--repository", str(repo), "--version", "4"]
    proc = run_module("export.translator", *export, "--parity-sentences", "5", "--no-progress")
    assert proc.returncode == 0, proc.stderr
    manifest = json.loads((repo / "translator" / "4" / "manifest.json").read_text())
    assert (
        manifest["training"]["averaged_epochs"] == [7, 8] and manifest["training"]["weights_brought_back"] == "float16"
    )
    assert manifest["data"]["folder"] == str(tiny_translation_data)  # the test split of the corpus the arrays came from
    proc = run_module(
        "export.evaluate", "--entry", str(repo / "translator" / "4"), "--data", str(tiny_translation_data)
    )
    assert proc.returncode == 0 and proc.stdout.splitlines()[-1].split()[0] == "overall", proc.stderr


def test_arrays_give_the_examples_tokenising_the_folder_gives(job, tiny_translation_data):
    from contract.tokenizer import Tokenizer
    from model.translation.batching import encode_pairs
    from model.translation.textio import read_tsv

    corpus = load_arrays(job["arrays"])
    tok = Tokenizer.from_bytes(corpus.tokenizer)
    pairs, _ = read_tsv(tiny_translation_data / "train.tsv")
    expected, _ = encode_pairs(tok, pairs, 10_000)
    assert corpus.examples("train") == expected
    assert corpus.domains() == (tiny_translation_data / "train.domains").read_text().splitlines()
    assert corpus.valid_references() == [t for _, t in read_tsv(tiny_translation_data / "valid.tsv")[0]]


def test_the_job_imports_nothing_the_gpu_machine_lacks():
    """The GPU machine's image has torch, numpy, sentencepiece, sacrebleu and tqdm, not the serving stack."""
    code = "import sys, model.gpu_job; print([m for m in ('pydantic', 'onnx', 'onnxruntime') if m in sys.modules])"
    proc = subprocess.run(
        [sys.executable, "-c", code], check=False, cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stderr
