"""Continuous batching bare, as the service's scheduler drives it: this checkout against another, interleaved.

``python -m benchmarks.bench_joins --against ../older-checkout``

A stream of ``--requests`` requests (random sources of 5 to 29 tokens, each asking 8 to 39 new
tokens, the same for both checkouts) goes through one running batch of at most ``--rows`` decoder
rows: before each step every waiting request that fits joins (its sources encoded, then
``concatenate``), finished rows leave (``step``), until all are answered; greedy and beam 4. It is
the scheduler's loop without the service around it (``service/engine/scheduler.py``), on the
entry's graphs with one intra-op thread as the service runs them on two cores. Each checkout runs
in a process of its own (its ``contract`` package, this checkout's interpreter and models); the
checkouts alternate which goes first from round to round. It prints each checkout's median tokens/s
(a request's step counts one token) and milliseconds spent joining per run, the ratio of the medians
and the lowest and highest single-round ratio. What it answers: whether a change to the batch's
bookkeeping (``contract/decoding.py``, ``contract/batch_rows.py``) makes joins and leaves cheaper.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

RUN = """
import inspect, json, sys, time
sys.path.insert(0, sys.argv[1])
import numpy as np, onnxruntime as ort
from contract.decoding import DecodeBatch, DecodeRequest, DecoderSpec, concatenate, session_fn, step
from contract.manifest import load_entry
entry, rows_max, beam, count, seed = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
spec = DecoderSpec.from_manifest(load_entry(entry).manifest)
opts = ort.SessionOptions()
opts.intra_op_num_threads = 1
enc, dec = (session_fn(ort.InferenceSession(f"{entry}/{g}.onnx", opts, providers=["CPUExecutionProvider"]))
            for g in ("encoder", "decoder"))
room = {"room": rows_max} if "room" in inspect.signature(concatenate).parameters else {}
def run(seed):
    rng = np.random.default_rng(seed)
    waiting = [DecodeRequest(list(rng.integers(4, 8000, int(rng.integers(5, 30)))) + [spec.eos_id],
                             int(rng.integers(8, 40)), beam=beam) for _ in range(count)]
    batch, rows, tokens, joining_s, started = None, 0, 0, 0.0, time.perf_counter()
    while waiting or (batch is not None and len(batch)):
        joining = []
        while waiting and rows + waiting[0].beam <= rows_max:
            joining.append(waiting.pop(0))
            rows += beam
        if joining:
            new = DecodeBatch.start(joining, enc, spec)
            t = time.perf_counter()
            batch = new if batch is None or not len(batch) else concatenate(batch, new, **room)
            joining_s += time.perf_counter() - t
        tokens += len(batch.requests)
        finished, batch = step(batch, dec, spec)
        rows -= beam * len(finished)
    return tokens / (time.perf_counter() - started), joining_s
run(seed + 1000)  # warm-up
print(json.dumps(run(seed)))
"""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.bench_joins", description=__doc__.splitlines()[0])
    p.add_argument(
        "--against", type=Path, required=True, help="the other checkout (a git worktree of another revision)"
    )
    p.add_argument("--entry", type=Path, default=ROOT / "models" / "translator" / "3")
    p.add_argument("--rows", type=int, default=64, help="most decoder rows in the running batch")
    p.add_argument("--requests", type=int, default=200)
    p.add_argument("--rounds", type=int, default=3)
    return p.parse_args(argv)


def measure(checkout: Path, entry: Path, rows: int, beam: int, requests: int, seed: int) -> tuple[float, float]:
    cmd = [sys.executable, "-c", RUN, str(checkout), str(entry), str(rows), str(beam), str(requests), str(seed)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(f"{checkout}: {proc.stderr}")
    tok_s, joining_s = json.loads(proc.stdout.splitlines()[-1])
    return tok_s, joining_s * 1000


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    checkouts = {"this": ROOT, "other": args.against.resolve()}
    print(f"{args.entry}, at most {args.rows} rows, {args.requests} requests, {args.rounds} interleaved rounds")
    for beam in (1, 4):
        runs: dict[str, list[tuple[float, float]]] = {name: [] for name in checkouts}
        for r in range(args.rounds):
            order = list(checkouts) if r % 2 == 0 else list(reversed(checkouts))
            for name in order:
                runs[name].append(measure(checkouts[name], args.entry, args.rows, beam, args.requests, r))
        label = "greedy" if beam == 1 else f"beam {beam}"
        for name, path in checkouts.items():
            tok = statistics.median(t for t, _ in runs[name])
            joins = statistics.median(j for _, j in runs[name])
            print(f"{label:7s} {name:5s} {tok:9.1f} tok/s, joining {joins:8.1f} ms per run  ({path})")
        ratios = [a[0] / b[0] for a, b in zip(runs["this"], runs["other"], strict=True)]
        ratio = statistics.median(t for t, _ in runs["this"]) / statistics.median(t for t, _ in runs["other"])
        print(f"{label:7s} this vs other: {ratio:.3f}x (rounds {min(ratios):.3f}x to {max(ratios):.3f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
