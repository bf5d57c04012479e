"""The corpus pre-tokenised into compact arrays: ``python -m model.translation.arrays``.

One ``.npz`` holds everything a training run reads from a corpus folder: the train and validation
pairs as token ids (uint16, one flat array per side with offsets), the training pairs' source
domains (for ``--oversample``), the validation references (for BLEU) and the SentencePiece model.
``python -m model.train_translator --arrays FILE`` trains from it exactly as from the folder (the
same examples in the same order), on a machine that has neither the corpus nor the tokenizer
trainer: the GPU job carries it beside the code, where a few MiB is all there is room for.
Pairs are stored whole; ``--max-length`` is applied when they are read.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

import numpy as np

from contract.tokenizer import Tokenizer, TokenizerError
from model.cli import CliError, run_cli
from model.translation.batching import Example
from model.translation.textio import TextFileError, read_tsv

FORMAT = 1
SPLITS = ("train", "valid")


def _text(array: np.ndarray) -> str:
    return array.tobytes().decode("utf-8")


def _bytes(text: str | bytes) -> np.ndarray:
    return np.frombuffer(text.encode("utf-8") if isinstance(text, str) else text, dtype=np.uint8)


def _flat(rows: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Ids (uint16) of every row end to end, and the (N + 1) offsets where each row starts."""
    offsets = np.zeros(len(rows) + 1, dtype=np.uint32)
    np.cumsum([len(r) for r in rows], out=offsets[1:])
    return np.fromiter((i for r in rows for i in r), dtype=np.uint16, count=int(offsets[-1])), offsets


@dataclass(frozen=True)
class CorpusArrays:
    arrays: dict[str, np.ndarray]
    meta: dict

    @property
    def tokenizer(self) -> bytes:
        return self.arrays["tokenizer"].tobytes()

    def examples(self, split: str) -> list[Example]:
        """Every pair of ``split`` as the trainer's examples, ``index`` its line in the split."""
        src, tgt = (self._rows(split, side) for side in ("src", "tgt"))
        return [Example(i, s, t) for i, (s, t) in enumerate(zip(src, tgt, strict=True))]

    def _rows(self, split: str, side: str) -> list[list[int]]:
        ids, offsets = self.arrays[f"{split}_{side}"].tolist(), self.arrays[f"{split}_{side}_offsets"].tolist()
        return [ids[a:b] for a, b in pairwise(offsets)]

    def domains(self) -> list[str]:
        """The source domain of each training pair, as ``train.domains`` has it (empty if it had none)."""
        names = self.meta["domains"]
        return [names[i] for i in self.arrays["train_domains"].tolist()] if names else []

    def valid_references(self) -> list[str]:
        return _text(self.arrays["valid_refs"]).split("\n")


def build_arrays(data: Path, tokenizer: Path) -> CorpusArrays:
    tok = Tokenizer.load(tokenizer)
    if tok.vocab_size > np.iinfo(np.uint16).max + 1:
        raise CliError(f"{tok.vocab_size} pieces do not fit uint16 token ids")
    arrays = {"tokenizer": _bytes(tokenizer.read_bytes())}
    counts = {}
    for split in SPLITS:
        pairs, _ = read_tsv(data / f"{split}.tsv")
        counts[split] = len(pairs)
        arrays[f"{split}_src"], arrays[f"{split}_src_offsets"] = _flat(
            tok.encode_batch([s for s, _ in pairs], add_eos=True)
        )
        arrays[f"{split}_tgt"], arrays[f"{split}_tgt_offsets"] = _flat(
            tok.encode_batch([t for _, t in pairs], add_bos=True, add_eos=True)
        )
        if split == "valid":
            arrays["valid_refs"] = _bytes("\n".join(t for _, t in pairs))
    path = data / "train.domains"
    domains = path.read_text(encoding="utf-8").splitlines() if path.is_file() else []
    if domains and len(domains) != counts["train"]:
        raise CliError(f"{path} has {len(domains)} lines for {counts['train']} training pairs: rebuild the corpus")
    names = sorted(set(domains))
    arrays["train_domains"] = np.array([names.index(d) for d in domains], dtype=np.uint8)
    meta = {"format": FORMAT, "data": str(data), "vocab_size": tok.vocab_size, "pairs": counts, "domains": names}
    return CorpusArrays(arrays, meta)


def save_arrays(corpus: CorpusArrays, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        np.savez_compressed(f, meta=_bytes(json.dumps(corpus.meta)), **corpus.arrays)


def load_arrays(path: Path) -> CorpusArrays:
    try:
        with np.load(path) as z:
            arrays = {k: z[k] for k in z.files}
        meta = json.loads(_text(arrays.pop("meta")))
    except (OSError, ValueError, KeyError) as e:
        raise CliError(f"{path}: not a pre-tokenised corpus ({e}); write one with python -m model.translation.arrays")
    if meta.get("format") != FORMAT:
        raise CliError(f"{path}: format {meta.get('format')}, this code reads {FORMAT}: write it again")
    return CorpusArrays(arrays, meta)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m model.translation.arrays", description=__doc__.splitlines()[0])
    p.add_argument("--data", type=Path, default=Path("data/translation"), help="corpus folder (default: %(default)s)")
    p.add_argument("--tokenizer", type=Path, help="SentencePiece model (default: <data>/spm/spm.model)")
    p.add_argument("--out", type=Path, default=Path("data/translation.npz"), help="(default: %(default)s)")
    args = p.parse_args(argv)
    try:
        corpus = build_arrays(args.data, args.tokenizer or args.data / "spm" / "spm.model")
    except (TextFileError, TokenizerError) as e:
        raise CliError(f"{e} (build the corpus first: make corpus)") from None
    save_arrays(corpus, args.out)
    tokens = sum(int(corpus.arrays[f"{s}_{side}"].size) for s in SPLITS for side in ("src", "tgt"))
    print(
        f"wrote {args.out}: {corpus.meta['pairs']} pairs, {tokens:,} tokens, {args.out.stat().st_size:,} bytes",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    run_cli(main)
