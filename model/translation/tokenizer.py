"""Train the shared English+German subword tokenizer: ``python -m model.translation.tokenizer``.

Reads both sides of ``train.tsv`` only (validation and test text never shapes the vocabulary),
trains a SentencePiece unigram model with fixed special ids, checks the round trip on every line
of ``valid.tsv``, and writes ``spm.model`` (what the service loads), ``spm.vocab`` (for reading)
and ``tokenizer.json`` (settings, special ids and measured figures, for the manifest).
The wrapper class is ``contract.tokenizer.Tokenizer``; see its docstring for the normalisation.
The sixteen training sentinels ``⟦1⟧`` … ``⟦16⟧`` (model/translation/masking.py) are user-defined
symbols, one piece each, so the decoder can be made to emit each exactly once (``--no-sentinels``: the
tokenizer of a corpus built without them).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import logging
import shlex
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

import sentencepiece as spm

from contract.placeholders import TRAINING_SENTINELS
from contract.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID, Tokenizer, normalize_text
from model.cli import CliError, run_cli
from model.translation.textio import TextFileError, read_tsv

log = logging.getLogger("attnserve.translation.tokenizer")

# Measured on the real corpus (docs/training/translation-data.md): unigram and BPE compress alike at 8k
# (13.4 pieces per English sentence, 14.6 vs 14.7 per German one); unigram cuts German compounds at
# morpheme boundaries more often (Vor|bereit|ungen, Groß|ereignis vs Vor|ber|eit|ungen, Groß|ere|ignis).
TRAINER_OPTIONS = {
    "normalization_rule_name": "identity",  # normalize_text is the only normalisation: round trip holds
    "byte_fallback": True,  # unseen characters become UTF-8 bytes, never <unk>
    "split_digits": True,  # numbers are copied digit by digit instead of learnt as words
    "pad_id": PAD_ID,
    "bos_id": BOS_ID,
    "eos_id": EOS_ID,
    "unk_id": UNK_ID,
    "pad_piece": "<pad>",
    "bos_piece": "<s>",
    "eos_piece": "</s>",
    "unk_piece": "<unk>",
    "input_sentence_size": 0,  # use every sentence: no sampling, so the model is reproducible
    "shuffle_input_sentence": False,
    "minloglevel": 2,
}


def training_sentences(pairs: Iterable[tuple[str, str]]) -> list[str]:
    """Both sides of every pair, normalised: one joint vocabulary for source and target."""
    return [normalize_text(side) for pair in pairs for side in pair if side.strip()]


def train_tokenizer(
    sentences: Sequence[str],
    *,
    vocab_size: int = 8000,
    model_type: str = "unigram",
    character_coverage: float = 0.99995,  # characters seen ~10+ times get a piece (0.9995 sent », « and ] to bytes)
    threads: int = 1,
    symbols: Sequence[str] = TRAINING_SENTINELS,
) -> Tokenizer:
    """Train in memory, each of ``symbols`` one piece (ids 4, 5, … after the special ids); SentencePiece's own
    errors (e.g. a vocabulary too large for the text) become ``ValueError``."""
    if not sentences:
        raise ValueError("no training sentences")
    buffer = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(sentences),
            model_writer=buffer,
            model_type=model_type,
            vocab_size=vocab_size,
            character_coverage=character_coverage,
            num_threads=threads,
            **({"user_defined_symbols": list(symbols)} if symbols else {}),
            **TRAINER_OPTIONS,
        )
    except RuntimeError as e:  # "INTERNAL: src/trainer_interface.cc(638) [<condition>] <message>": keep the message
        raise ValueError(f"SentencePiece training failed: {str(e).strip().splitlines()[-1].split('] ', 1)[-1]}") from e
    return Tokenizer.from_bytes(buffer.getvalue())


def round_trip_failures(tokenizer: Tokenizer, texts: Iterable[str]) -> list[str]:
    """Texts whose ``decode(encode(text))`` differs from ``normalize_text(text)`` (should be none)."""
    return [t for t in texts if tokenizer.decode(tokenizer.encode(t)) != normalize_text(t)]


def measure(tokenizer: Tokenizer, texts: Sequence[str]) -> dict:
    """Pieces per sentence and per word, and how often byte fallback was needed: the figures behind the choice."""
    ids = tokenizer.encode_batch(texts)
    pieces = sum(len(x) for x in ids)
    words = sum(len(t.split()) for t in texts)
    byte_pieces = sum(1 for x in ids for i in x if tokenizer.pieces([i])[0].startswith("<0x"))
    return {
        "sentences": len(texts),
        "pieces_per_sentence": round(pieces / max(len(texts), 1), 3),
        "pieces_per_word": round(pieces / max(words, 1), 3),
        "max_pieces": max((len(x) for x in ids), default=0),
        "byte_fallback_pieces": byte_pieces,
    }


def write_vocab(tokenizer: Tokenizer, path: Path) -> None:
    """``piece<TAB>id`` per line: for people reading the vocabulary, the service never needs it."""
    path.write_text(
        "".join(f"{p}\t{i}\n" for i, p in enumerate(tokenizer.pieces(range(tokenizer.vocab_size)))), encoding="utf-8"
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m model.translation.tokenizer", description=__doc__.splitlines()[0])
    p.add_argument(
        "--data",
        type=Path,
        default=Path("data/translation"),
        help="corpus folder with train.tsv (default: %(default)s)",
    )
    p.add_argument("--out", type=Path, help="output folder (default: <data>/spm)")
    p.add_argument("--vocab-size", type=int, default=8000)
    p.add_argument("--model-type", choices=("unigram", "bpe"), default="unigram")
    p.add_argument(
        "--character-coverage", type=float, default=0.99995, help="share of characters that get their own piece"
    )
    p.add_argument("--threads", type=int, default=1, help="SentencePiece trainer threads")
    p.add_argument(
        "--no-sentinels", action="store_true", help="no user-defined sentinel pieces (a corpus built --no-placeholders)"
    )
    return p.parse_args(argv)


def read_split(data: Path, split: str) -> list[tuple[str, str]]:
    path = data / f"{split}.tsv"
    if not path.is_file():
        raise CliError(
            f"{path} does not exist: build the corpus first (python -m model.translation.corpus --out {data})"
        )
    try:
        pairs, bad = read_tsv(path)
    except TextFileError as e:
        raise CliError(str(e)) from e
    if bad.total:
        log.warning("%s: %s", path, bad.summary())
    return pairs


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    args = parse_args(argv)
    out = args.out or args.data / "spm"
    train = read_split(args.data, "train")
    sentences = training_sentences(train)
    if not sentences:
        raise CliError(f"{args.data / 'train.tsv'} holds no sentence pairs")
    log.info(
        "training a %d-piece %s model on %d sentences (both sides of %d pairs)",
        args.vocab_size,
        args.model_type,
        len(sentences),
        len(train),
    )
    start = time.perf_counter()
    tokenizer = train_tokenizer(
        sentences,
        vocab_size=args.vocab_size,
        model_type=args.model_type,
        character_coverage=args.character_coverage,
        threads=args.threads,
        symbols=() if args.no_sentinels else TRAINING_SENTINELS,
    )
    seconds = time.perf_counter() - start
    valid = training_sentences(read_split(args.data, "valid")) if (args.data / "valid.tsv").is_file() else []
    if failures := round_trip_failures(tokenizer, valid):
        raise CliError(f"round trip fails on {len(failures)} validation sentences, e.g. {failures[0]!r}")
    out.mkdir(parents=True, exist_ok=True)
    model_path = tokenizer.save(out / "spm.model")
    write_vocab(tokenizer, out / "spm.vocab")
    info = {
        "library": f"sentencepiece {spm.__version__}",
        "model_file": model_path.name,
        "sha256": hashlib.sha256(model_path.read_bytes()).hexdigest(),
        "model_type": args.model_type,
        "vocab_size": tokenizer.vocab_size,
        "special_ids": tokenizer.special.as_dict(),
        "normalization": "contract.tokenizer.normalize_text (NFC, apostrophes, whitespace), then SentencePiece identity",
        "trainer_options": {
            "character_coverage": args.character_coverage,
            **{k: v for k, v in TRAINER_OPTIONS.items() if k != "minloglevel"},
            "user_defined_symbols": [] if args.no_sentinels else list(TRAINING_SENTINELS),
        },
        "trained_on": {"file": str(args.data / "train.tsv"), "pairs": len(train), "sentences": len(sentences)},
        "training_seconds": round(seconds, 1),
        "valid": {**measure(tokenizer, valid), "round_trip_failures": 0} if valid else None,
        "command": "python -m model.translation.tokenizer " + shlex.join(argv if argv is not None else sys.argv[1:]),
    }
    (out / "tokenizer.json").write_text(json.dumps(info, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    log.info("wrote %s (%d pieces, %.1fs); valid: %s", model_path, tokenizer.vocab_size, seconds, info["valid"])
    return 0


if __name__ == "__main__":
    run_cli(main)
