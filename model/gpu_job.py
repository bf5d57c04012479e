"""One GPU run in a fixed time: ``python -m model.gpu_job --arrays data/translation.npz --minutes 8 --out $OUT``.

Trains the translator from a pre-tokenised corpus (``model.translation.arrays``: the only data the
GPU machine needs, carried beside the code) until ``--minutes`` of wall clock are spent, start-up
included; then averages the weights of the last ``--average`` finished epochs and writes them as
fp16 shards with ``job.json`` (config, learning curve, throughput) into ``--out``: at most 8 files,
what the machine may send back. It exports nothing. Here, ``python -m model.weight_shards`` turns the
folder into a checkpoint for ``export.translator``. Options after ``--`` go to
``model.train_translator`` as they are (``-- --batch-scale 2 --compile``).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

from model.cli import CliError, run_cli
from model.train_translator import main as train
from model.training import average_checkpoints, load_checkpoint
from model.weight_shards import JOB, write_shards

RESERVE_MINUTES = 0.5  # averaging and writing the shards, after the trainer's own time limit


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    p = argparse.ArgumentParser(prog="python -m model.gpu_job", description=__doc__.splitlines()[0])
    p.add_argument("--arrays", type=Path, default=Path("data/translation.npz"), help="(default: %(default)s)")
    p.add_argument("--profile", default="wide", help="train_translator's profile (default: %(default)s)")
    p.add_argument("--minutes", type=float, required=True, help="wall-clock budget of the whole job")
    p.add_argument("--out", type=Path, required=True, help="folder for job.json and the weight shards ($OUT)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--average", type=int, default=4, metavar="N", help="average the last N epochs' weights")
    p.add_argument("--benchmark-steps", type=int, default=0, help="time so many steps first (job.json's throughput)")
    p.add_argument("--work", type=Path, help="checkpoint folder (default: a temporary one; nothing in it comes back)")
    argv = sys.argv[1:] if argv is None else argv
    ours, extra = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    return p.parse_args(ours), extra


def main(argv: list[str] | None = None) -> int:
    launched = time.time()
    args, extra = parse_args(argv)
    if args.minutes <= RESERVE_MINUTES or args.average < 1:
        raise CliError(f"need --minutes > {RESERVE_MINUTES} and --average >= 1")
    work = args.work or Path(tempfile.mkdtemp(prefix="gpu-job-"))
    common = ["--profile", args.profile, "--arrays", str(args.arrays), "--device", args.device, "--no-progress"]
    throughput = None
    if args.benchmark_steps:
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            train([*common, *extra, "--benchmark", str(args.benchmark_steps)])
        throughput = json.loads(printed.getvalue().splitlines()[-1])["benchmark"]
    left = args.minutes - (time.time() - launched) / 60 - RESERVE_MINUTES
    if left <= 0:
        raise CliError(f"--minutes {args.minutes} is spent before training starts")
    try:
        train([*common, *extra, "--out", str(work), "--time-limit", f"{left:.3f}"])
    except CliError as e:
        raise CliError(f"training gave no finished epoch: {e}") from None
    best = load_checkpoint(work / "best.pt")
    epochs = sorted((work / "epochs").glob("epoch-*.pt"))[-args.average :]
    state = average_checkpoints(epochs)
    training = {**best["training"], "averaged_epochs": [int(p.stem.split("-")[1]) for p in epochs]}
    weights = write_shards(state, args.out)
    job = {
        "config": best["config"],
        "parameters": sum(t.numel() for n, t in state.items() if n not in weights["aliases"]),
        "training": training,
        "throughput": throughput,
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "job_seconds": round(time.time() - launched, 1),
        "weights": weights,
    }
    (args.out / JOB).write_text(json.dumps(job, indent=1))
    curve = " ".join(f"{r['epoch']}:{r['val_loss']:.3f}" for r in training["history"])
    print(f"wrote {args.out}: epochs {training['epochs_done']}, val loss by epoch {curve}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    run_cli(main)
