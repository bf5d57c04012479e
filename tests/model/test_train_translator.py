"""The translator's training CLI: a tiny run end to end, resuming, time limits and clear errors."""

from __future__ import annotations

import json

import pytest
import torch

from model.cli import CliError, run_cli
from model.train_translator import main, oversample
from tests.conftest import run_module


def train(*args: str) -> None:
    with pytest.raises(SystemExit) as done:
        run_cli(main, ["--profile", "tiny", "--no-progress", *args])
    assert done.value.code == 0


def test_tiny_run_writes_a_checkpoint_with_everything_export_needs(tiny_translator_checkpoint):
    ckpt = torch.load(tiny_translator_checkpoint, weights_only=False)
    assert ckpt["task"] == "translation" and ckpt["config"]["vocab_size"] == 400
    assert ckpt["tokenizer"]["special_ids"] == {"pad": 0, "bos": 1, "eos": 2, "unk": 3}
    t = ckpt["training"]
    assert t["epochs_done"] == 3 and len(t["history"]) == 3 and t["stopped_by"] == "epochs"
    assert t["history"][-1]["train_loss"] < t["history"][0]["train_loss"]
    metrics = json.loads((tiny_translator_checkpoint.parent / "metrics.json").read_text())
    assert metrics["training"]["best_epoch"] == t["best_epoch"] and "val_bleu" in metrics["training"]["history"][0]


def test_resuming_gives_the_same_weights_as_one_run(tiny_translation_data, tmp_path):
    data = ["--data", str(tiny_translation_data), "--dropout", "0.1"]
    train(*data, "--out", str(tmp_path / "once"), "--epochs", "3")
    train(*data, "--out", str(tmp_path / "twice"), "--epochs", "1")
    train(*data, "--out", str(tmp_path / "twice"), "--epochs", "3", "--resume")
    once = torch.load(tmp_path / "once" / "last.pt", weights_only=False)
    twice = torch.load(tmp_path / "twice" / "last.pt", weights_only=False)
    assert twice["state"]["epoch"] == 3 and twice["state"]["step"] == once["state"]["step"]
    for name, tensor in once["state_dict"].items():
        assert torch.equal(tensor, twice["state_dict"][name]), name


def test_a_run_stopped_mid_epoch_resumes_where_it_stopped(tiny_translation_data, tmp_path):
    data = ["--data", str(tiny_translation_data), "--max-tokens", "256", "--out", str(tmp_path)]
    with pytest.raises(SystemExit) as stopped:
        run_cli(main, ["--profile", "tiny", "--no-progress", *data, "--max-steps", "2"])
    assert stopped.value.code == 2  # nothing to evaluate yet: says so, and how to continue
    last = torch.load(tmp_path / "last.pt", weights_only=False)
    assert last["state"]["step"] == 2 and last["state"]["batch"] == 2
    train(*data, "--resume")
    assert torch.load(tmp_path / "last.pt", weights_only=False)["state"]["epoch"] == 1


@pytest.mark.parametrize(
    "args, message",
    [
        (["--data", "{tmp}/nowhere"], "python -m model.translation.tokenizer"),
        (["--data", "{data}", "--tokenizer", "{tmp}/x.model"], "No such file"),
        (["--data", "{data}", "--dim", "33"], "bad model configuration"),
        (["--data", "{data}", "--max-tokens", "8"], "max-tokens >= max-length"),
        (["--data", "{empty}"], "holds no sentence pairs"),
        (["--data", "{data}", "--out", "{tmp}/new", "--resume"], "does not exist"),
        (["--data", "{data}", "--device", "gpu0"], "device 'gpu0' is not usable here"),
        (["--data", "{data}", "--oversample", "ding"], "expected DOMAIN=N with N >= 1"),
        (["--data", "{data}", "--oversample", "ding=0"], "expected DOMAIN=N with N >= 1"),
        (["--data", "{data}", "--oversample", "news=2"], "no training pair is from 'news'"),
    ],
)
def test_cli_errors_are_one_clear_line(args, message, tiny_translation_data, tmp_path):
    empty = tmp_path / "empty"
    (empty / "spm").mkdir(parents=True)
    (empty / "spm" / "spm.model").write_bytes((tiny_translation_data / "spm" / "spm.model").read_bytes())
    (empty / "train.tsv").write_text("no tab here\n\n")
    subs = {"{tmp}": str(tmp_path), "{data}": str(tiny_translation_data), "{empty}": str(empty)}

    def fill(arg: str) -> str:
        for key, value in subs.items():
            arg = arg.replace(key, value)
        return arg

    proc = run_module("model.train_translator", "--profile", "tiny", *map(fill, args))
    assert proc.returncode == 2
    assert message in proc.stderr and "Traceback" not in proc.stderr


def test_oversample_repeats_the_pairs_of_the_named_domains_in_corpus_order(tmp_path):
    pairs = [("a", "A"), ("b", "B"), ("c", "C")]
    (tmp_path / "train.domains").write_text("ding\nhelp\nding\n", encoding="utf-8")
    assert oversample(tmp_path, pairs, {}) is pairs
    assert oversample(tmp_path, pairs, {"ding": 2}) == [("a", "A"), ("a", "A"), ("b", "B"), ("c", "C"), ("c", "C")]
    assert oversample(tmp_path, pairs, {"ding": 1, "help": 3}) == [
        ("a", "A"),
        ("b", "B"),
        ("b", "B"),
        ("b", "B"),
        ("c", "C"),
    ]
    with pytest.raises(CliError, match="has 3 lines for 2 training pairs"):
        oversample(tmp_path, pairs[:2], {"ding": 2})
    with pytest.raises(CliError, match="--oversample needs"):
        oversample(tmp_path / "elsewhere", pairs, {"ding": 2})


def test_an_oversampled_run_records_its_factors_and_trains_on_the_repeats(tiny_translation_data, tmp_path):
    train("--data", str(tiny_translation_data), "--out", str(tmp_path), "--epochs", "1", "--oversample", "ding=3")
    t = torch.load(tmp_path / "best.pt", weights_only=False)["training"]
    domains = (tiny_translation_data / "train.domains").read_text().splitlines()
    assert t["oversample"] == {"ding": 3}
    assert t["train_pairs"] + t["left_out_long"] == len(domains) + 2 * domains.count("ding")
    assert "--oversample ding=3" in t["command"]


def test_average_checkpoints_is_the_elementwise_mean(tmp_path):
    import torch

    from model.training import average_checkpoints, save_checkpoint

    for i, value in enumerate((1.0, 2.0, 6.0)):
        save_checkpoint(
            tmp_path / f"epoch-{i}.pt", {"state_dict": {"w": torch.full((2, 2), value), "n": torch.tensor(i)}}
        )
    mean = average_checkpoints(sorted(tmp_path.glob("epoch-*.pt")))
    assert torch.equal(mean["w"], torch.full((2, 2), 3.0)) and int(mean["n"]) == 2
    save_checkpoint(tmp_path / "other.pt", {"state_dict": {"v": torch.zeros(1)}})
    with pytest.raises(ValueError, match="same parameters"):
        average_checkpoints([tmp_path / "epoch-0.pt", tmp_path / "other.pt"])


def test_training_keeps_the_last_epochs_weights(tiny_translator_checkpoint):
    kept = sorted(p.name for p in (tiny_translator_checkpoint.parent / "epochs").glob("*.pt"))
    assert kept == ["epoch-001.pt", "epoch-002.pt", "epoch-003.pt"]


def test_init_from_a_shipped_entry_starts_at_its_exported_weights(
    tiny_translator_repository, tiny_translator_checkpoint, tiny_translation_data, tmp_path
):
    entry = tiny_translator_repository / "translator" / "1"
    args = ["--data", str(tiny_translation_data), "--out", str(tmp_path), "--init-from", str(entry)]
    # lr 1e-12: one step leaves the weights where they started, so last.pt shows the starting point
    proc = run_module("model.train_translator", "--profile", "tiny", *args, "--lr", "1e-12", "--max-steps", "1")
    assert proc.returncode == 2 and "from translator/1" in proc.stderr, proc.stderr
    last = torch.load(tmp_path / "last.pt", weights_only=False)
    exported = torch.load(tiny_translator_checkpoint, weights_only=False)["state_dict"]
    assert last["state"]["init_from"]["entry"] == "translator/1" and last["state"]["init_from"]["epochs_done"] == 3
    assert last["config"] == json.loads((entry / "manifest.json").read_text())["model"]["config"] | {
        "dropout": last["config"]["dropout"]
    }
    assert set(last["state_dict"]) == set(exported)
    for name, tensor in exported.items():
        torch.testing.assert_close(last["state_dict"][name], tensor, atol=1e-6, rtol=0, msg=name)


def test_a_run_from_an_entry_resumes_with_the_entrys_tokenizer(
    tiny_translator_repository, tiny_translation_data, tmp_path
):
    data = tmp_path / "data"  # a corpus without a tokenizer of its own: the entry's is the one to use
    data.mkdir()
    for split in ("train.tsv", "valid.tsv"):
        (data / split).write_bytes((tiny_translation_data / split).read_bytes())
    entry = tiny_translator_repository / "translator" / "1"
    args = ["--data", str(data), "--out", str(tmp_path / "run"), "--init-from", str(entry), "--max-tokens", "256"]
    proc = run_module("model.train_translator", "--profile", "tiny", *args, "--max-steps", "2")
    assert proc.returncode == 2, proc.stderr  # stopped inside the first epoch
    proc = run_module("model.train_translator", "--profile", "tiny", *args, "--resume")
    assert proc.returncode == 0 and "resuming at epoch 1" in proc.stderr, proc.stderr
    best = torch.load(tmp_path / "run" / "best.pt", weights_only=False)
    assert best["training"]["init_from"]["entry"] == "translator/1" and best["training"]["epochs_done"] == 1


@pytest.mark.parametrize(
    "extra, message",
    [(["--dim", "64"], "--init-from takes the entry's model config: drop --dim"), ([], "--init-from")],
)
def test_init_from_errors_are_one_clear_line(
    extra, message, tiny_translator_repository, tiny_translation_data, tmp_path
):
    entry = tiny_translator_repository / "translator" / ("1" if extra else "9")
    args = ["--data", str(tiny_translation_data), "--out", str(tmp_path), "--init-from", str(entry), *extra]
    proc = run_module("model.train_translator", "--profile", "tiny", *args)
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
