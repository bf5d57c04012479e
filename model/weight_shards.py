"""Trained weights as a few fp16 files, and back into a checkpoint ``export.translator`` reads.

The GPU job (``model.gpu_job``) can bring back at most 8 files of at most 16 MiB, 64 MiB together:
the weights go as fp16 ``.npz`` shards (each tied parameter once) beside ``job.json``, which lists
them and holds the config and the training record. Here,

``python -m model.weight_shards --job DIR --arrays data/translation.npz --out checkpoints/translator-gpu``

writes ``best.pt`` from them (fp32 again, the tokenizer taken from the arrays the job trained on),
for ``python -m export.translator --checkpoint checkpoints/translator-gpu/best.pt``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

from contract.tokenizer import Tokenizer
from model.cli import CliError, run_cli
from model.training import save_checkpoint
from model.translation.arrays import load_arrays

MAX_FILES = 7  # weight shards; job.json is the eighth file
MAX_BYTES = 16 * 2**20  # per file
MAX_TOTAL = 62 * 2**20  # what comes back is at most 64 MiB together, job.json included
JOB = "job.json"


def write_shards(state: dict[str, torch.Tensor], folder: Path) -> dict:
    """fp16 shards of ``state`` under ``folder``; returns the index ``read_shards`` needs (for job.json)."""
    seen: dict[tuple, list[str]] = {}  # shape -> names stored: tied weights (equal after averaging too) go once
    aliases, shards, sizes = {}, [[]], [0]
    for name, tensor in state.items():
        same = next((n for n in seen.get(tuple(tensor.shape), []) if torch.equal(state[n], tensor)), None)
        if same is not None:
            aliases[name] = same
            continue
        seen.setdefault(tuple(tensor.shape), []).append(name)
        size = tensor.numel() * 2
        if size > MAX_BYTES:
            raise CliError(f"{name} alone is {size:,} bytes in fp16, over the {MAX_BYTES:,} a file may hold")
        if sizes[-1] + size > MAX_BYTES:
            shards.append([])
            sizes.append(0)
        shards[-1].append(name)
        sizes[-1] += size
    if len(shards) > MAX_FILES or sum(sizes) > MAX_TOTAL:
        raise CliError(f"{sum(sizes):,} bytes of fp16 weights need {len(shards)} files: over what can come back")
    folder.mkdir(parents=True, exist_ok=True)
    files = {}
    for i, names in enumerate(shards):
        file = f"weights-{i}.npz"
        np.savez(folder / file, **{n: state[n].detach().cpu().to(torch.float16).numpy() for n in names})
        files[file] = names
    return {"dtype": "float16", "files": files, "aliases": aliases}


def read_shards(folder: Path, index: dict) -> dict[str, torch.Tensor]:
    """The fp32 state dict written by ``write_shards``, every alias filled in."""
    state = {}
    for file, names in index["files"].items():
        with np.load(folder / file) as z:
            state.update({n: torch.from_numpy(z[n].astype(np.float32)) for n in names})
    state.update({alias: state[name] for alias, name in index["aliases"].items()})
    return state


def checkpoint_from_job(job_dir: Path, arrays: Path) -> dict:
    try:
        job = json.loads((job_dir / JOB).read_text())
    except (OSError, ValueError) as e:
        raise CliError(f"{job_dir / JOB}: {e} (the folder python -m model.gpu_job wrote)") from None
    corpus = load_arrays(arrays)
    tok = Tokenizer.from_bytes(corpus.tokenizer)
    if tok.vocab_size != job["config"]["vocab_size"]:
        raise CliError(
            f"{arrays}'s tokenizer has {tok.vocab_size} pieces, the job's model {job['config']['vocab_size']}"
        )
    return {
        "state_dict": read_shards(job_dir, job["weights"]),
        "task": "translation",
        "architecture": "Seq2Seq",
        "config": job["config"],
        "tokenizer": {"model": tok.to_bytes(), "special_ids": tok.special.as_dict(), "vocab_size": tok.vocab_size},
        "training": {**job["training"], "weights_brought_back": "float16"},
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m model.weight_shards", description=__doc__.splitlines()[0])
    p.add_argument("--job", type=Path, required=True, help="the folder the GPU job wrote (job.json + weights-*.npz)")
    p.add_argument("--arrays", type=Path, default=Path("data/translation.npz"), help="the corpus it trained on")
    p.add_argument("--out", type=Path, default=Path("checkpoints/translator-gpu"), help="(default: %(default)s)")
    args = p.parse_args(argv)
    ckpt = checkpoint_from_job(args.job, args.arrays)
    save_checkpoint(args.out / "best.pt", ckpt)
    print(f"wrote {args.out / 'best.pt'} ({len(ckpt['state_dict'])} tensors)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    run_cli(main)
