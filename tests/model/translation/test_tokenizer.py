"""The shared tokenizer: special ids, round trip on real lines, save/load, the training CLI, and no torch."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import unicodedata

import pytest
import sentencepiece as spm

from contract.placeholders import TRAINING_SENTINELS
from contract.tokenizer import Tokenizer, TokenizerError, normalize_text
from model.cli import run_cli
from model.translation import corpus
from model.translation import tokenizer as trainer
from model.translation.masking import sentinels
from tests.conftest import ROOT
from tests.model.translation.excerpts import DING_PAIRS, HELP_PAIRS, UI_PAIRS

REAL_LINES = [side for pair in DING_PAIRS + HELP_PAIRS + UI_PAIRS for side in pair]
UNSEEN = [
    "Größe ändern: 1024 × 768 → 😀 中国 ǅ",  # characters never seen in training: byte fallback
    unicodedata.normalize("NFD", "Wählen Sie »Format – Absatz…«."),  # decomposed umlauts
    "  I\u2019ve   only\ta\u00a0vague recollection.\n",  # typographic apostrophe, odd whitespace
    "",
]


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return trainer.train_tokenizer(trainer.training_sentences(DING_PAIRS + HELP_PAIRS + UI_PAIRS), vocab_size=400)


def test_special_ids_are_fixed(tok):
    assert tok.special.as_dict() == {"pad": 0, "bos": 1, "eos": 2, "unk": 3}
    assert tok.pieces([0, 1, 2, 3]) == ["<pad>", "<s>", "</s>", "<unk>"]
    assert tok.vocab_size == 400


@pytest.mark.parametrize("text", REAL_LINES + UNSEEN)
def test_round_trip_reproduces_the_normalised_text(tok, text):
    ids = tok.encode(text)
    assert tok.unk_id not in ids
    assert tok.decode(ids) == normalize_text(text)


def test_bos_eos_and_padding_are_added_on_request_and_dropped_on_decode(tok):
    text = "She has total recall."
    plain = tok.encode(text)
    framed = tok.encode(text, add_bos=True, add_eos=True)
    assert framed == [tok.bos_id, *plain, tok.eos_id]
    assert tok.decode(framed + [tok.pad_id] * 3) == text
    assert tok.encode_batch([text, "Neu"], add_eos=True) == [plain + [tok.eos_id], tok.encode("Neu") + [tok.eos_id]]


def test_each_training_sentinel_is_one_piece(tok):
    assert tok.pieces(range(4, 20)) == list(TRAINING_SENTINELS)  # right after the special ids
    for text in ("Open ⟦1⟧ now", "a⟦16⟧b ⟦10⟧⟦1⟧.", "⟦1⟧ ⟦2⟧"):
        ids = tok.encode(text)
        assert tok.decode(ids) == text
        assert [p for p in tok.pieces(ids) if "⟦" in p] == sentinels(text)
    plain = trainer.train_tokenizer(
        trainer.training_sentences(DING_PAIRS + HELP_PAIRS + UI_PAIRS), vocab_size=400, symbols=()
    )
    assert not any("⟦" in p for p in plain.pieces(range(plain.vocab_size)))


def test_save_and_load_give_the_same_tokenizer(tok, tmp_path):
    path = tok.save(tmp_path / "spm.model")
    loaded = Tokenizer.load(path)
    assert loaded.vocab_size == tok.vocab_size
    assert [loaded.encode(t) for t in REAL_LINES] == [tok.encode(t) for t in REAL_LINES]


def test_load_refuses_missing_garbage_and_foreign_special_ids(tmp_path):
    with pytest.raises(TokenizerError, match="cannot read"):
        Tokenizer.load(tmp_path / "missing.model")
    with pytest.raises(TokenizerError, match="not a SentencePiece model"):
        Tokenizer.from_bytes(b"not a model")
    buffer = io.BytesIO()  # SentencePiece's own defaults: unk=0, bos=1, eos=2, no pad
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(REAL_LINES), model_writer=buffer, vocab_size=200, minloglevel=2
    )
    with pytest.raises(TokenizerError, match="special ids"):
        Tokenizer.from_bytes(buffer.getvalue())


def test_training_is_reproducible():
    sentences = trainer.training_sentences(DING_PAIRS + HELP_PAIRS + UI_PAIRS)
    first = trainer.train_tokenizer(sentences, vocab_size=400).to_bytes()
    assert trainer.train_tokenizer(sentences, vocab_size=400).to_bytes() == first


def test_training_cli_on_a_built_corpus(excerpt_cache, tmp_path, capsys):
    data = tmp_path / "translation"
    with pytest.raises(SystemExit) as built:
        run_cli(corpus.main, ["--cache", str(excerpt_cache), "--out", str(data), "--offline", "--no-progress"])
    assert built.value.code == 0
    with pytest.raises(SystemExit) as trained:
        run_cli(trainer.main, ["--data", str(data), "--vocab-size", "360"])
    assert trained.value.code == 0, capsys.readouterr().err
    info = json.loads((data / "spm" / "tokenizer.json").read_text())
    assert info["special_ids"] == {"pad": 0, "bos": 1, "eos": 2, "unk": 3}
    assert info["vocab_size"] == 360 and info["model_type"] == "unigram"
    assert info["trainer_options"]["user_defined_symbols"] == list(TRAINING_SENTINELS)
    assert info["trained_on"]["pairs"] == len((data / "train.tsv").read_text().splitlines())
    assert Tokenizer.load(data / "spm" / "spm.model").vocab_size == 360
    assert (data / "spm" / "spm.vocab").read_text().splitlines()[:4] == ["<pad>\t0", "<s>\t1", "</s>\t2", "<unk>\t3"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--data", "{tmp}/nowhere"], "build the corpus first"),
        (["--data", "{tmp}/tiny", "--vocab-size", "100"], "Vocabulary size is smaller than required_chars"),
        (["--data", "{tmp}/tiny", "--vocab-size", "5000"], "Vocabulary size too high"),
    ],
)
def test_training_cli_errors(args, message, tmp_path, capsys):
    (tmp_path / "tiny").mkdir()
    (tmp_path / "tiny" / "train.tsv").write_text("Good morning.\tGuten Morgen.\n", encoding="utf-8")
    with pytest.raises(SystemExit) as exited:
        run_cli(trainer.main, [a.format(tmp=tmp_path) for a in args])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and err.strip().splitlines()[-1].startswith("error: ") and message in err


def test_the_tokenizer_imports_no_torch_model_or_export():
    probe = (
        "import sys, contract.tokenizer\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in {'torch', 'model', 'export'}))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
