"""Training throughput of two versions of the translator's trainer, the same run on the same batches.

``python -m benchmarks.bench_train_translator --against /path/to/older/checkout --data data/translation``

Each round runs ``python -m model.train_translator --max-steps S`` of both trees, in alternating
order, for S = WARMUP and WARMUP + STEPS, and takes the difference of the wall times: the time of
STEPS steps without start-up (imports, tokenising, model building). Both trees draw the same batches
(same seed and batching), whose real source + target tokens are counted here. Medians of
``--rounds``. For the split of one tree's step see ``python -m model.train_translator --benchmark``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from contract.tokenizer import Tokenizer
from model.train_translator import load_split
from model.translation.batching import encode_pairs, make_batches

HERE = Path(__file__).resolve().parents[1]


def run(tree: Path, args: list[str], steps: int) -> float:
    with tempfile.TemporaryDirectory() as out:
        start = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "model.train_translator", *args, "--max-steps", str(steps), "--out", out],
            cwd=tree,
            env={**os.environ, "PYTHONPATH": str(tree)},
            capture_output=True,
            check=False,  # stopping inside the first epoch exits 2: expected
        )
        return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.bench_train_translator", description=__doc__.splitlines()[0])
    p.add_argument("--against", type=Path, required=True, help="a checkout of the older trainer")
    p.add_argument("--data", type=Path, default=Path("data/translation"))
    p.add_argument("--profile", default="default")
    p.add_argument("--max-tokens", type=int, default=4096)
    p.add_argument("--max-train", type=int, default=20000)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    common = ["--profile", args.profile, "--data", str(args.data.resolve()), "--no-progress"]
    common += ["--max-tokens", str(args.max_tokens), "--max-train", str(args.max_train)]
    tok = Tokenizer.load(args.data / "spm" / "spm.model")
    train, _ = encode_pairs(tok, load_split(args.data, "train")[: args.max_train], 128)
    batches = make_batches(train, args.max_tokens, torch.Generator().manual_seed(0))
    timed = batches[args.warmup : args.warmup + args.steps]
    tokens = sum(len(ex.src) + len(ex.tgt) for b in timed for ex in b)
    trees = {"before": args.against.resolve(), "after": HERE}
    seconds: dict[str, list[float]] = {name: [] for name in trees}
    for r in range(args.rounds):
        for name in list(trees)[:: 1 if r % 2 == 0 else -1]:
            short, long = run(trees[name], common, args.warmup), run(trees[name], common, args.warmup + args.steps)
            seconds[name].append(long - short)
            print(f"round {r + 1} {name}: {tokens / (long - short):,.0f} tokens/s", file=sys.stderr)
    rate = {name: tokens / statistics.median(s) for name, s in seconds.items()}
    print(
        f"{args.steps} steps of {args.max_tokens} tokens ({tokens:,} real tokens), {args.profile} profile, "
        f"{torch.get_num_threads()} threads: before {rate['before']:,.0f} tokens/s, after {rate['after']:,.0f} "
        f"tokens/s = {rate['after'] / rate['before']:.2f}x (medians of {args.rounds} rounds)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
