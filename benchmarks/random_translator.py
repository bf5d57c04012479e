"""A randomly initialised translator checkpoint of a training profile's size, for decoding benchmarks.

``python -m benchmarks.random_translator --profile wide --out /tmp/wide``, then
``python -m export.translator --checkpoint /tmp/wide/best.pt --repository /tmp/models --version 1
--max-test 20 --parity-sentences 5`` and ``python -m benchmarks.bench_translate --repository /tmp/models
--against models/translator/3``: what a size costs to decode on the CPU before any GPU time is spent
on training it (the bare loop's fixed-length configurations ignore end-of-sentence, so untrained
weights decode exactly as many tokens as trained ones).
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

import torch

from contract.tokenizer import Tokenizer
from model.seq2seq import Seq2Seq
from model.train_translator import PROFILES
from model.training import save_checkpoint


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.random_translator", description=__doc__.splitlines()[0])
    p.add_argument("--profile", choices=sorted(PROFILES), default="wide")
    p.add_argument("--tokenizer", type=Path, default=Path("models/translator/3/tokenizer.model"))
    p.add_argument(
        "--data", type=Path, default=Path("data/translation"), help="corpus folder whose test.tsv export reads"
    )
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    tok = Tokenizer.load(args.tokenizer)
    torch.manual_seed(0)
    model = Seq2Seq(replace(PROFILES[args.profile]["config"], vocab_size=tok.vocab_size))
    save_checkpoint(
        args.out / "best.pt",
        {
            "state_dict": model.state_dict(),
            "task": "translation",
            "architecture": "Seq2Seq",
            "config": model.cfg.to_dict(),
            "tokenizer": {"model": tok.to_bytes(), "special_ids": tok.special.as_dict(), "vocab_size": tok.vocab_size},
            "training": {"data": str(args.data), "profile": args.profile, "untrained": True},
        },
    )
    print(f"wrote {args.out / 'best.pt'}: {model.num_parameters():,} parameters")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
