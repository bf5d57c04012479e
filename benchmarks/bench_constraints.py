"""What the placeholder constraint costs a decoding step: the same batch searched with and without it.

``python -m benchmarks.bench_constraints --entry models/translator/3 --rounds 7``

The 32 software strings of ``benchmarks/placeholder_sentences.txt`` are masked as the service masks them
(``contract/translation_text.py``) and started as one batch, greedy (33 rows) and beam 4 (132 rows);
after four steps, so that hypotheses hold some sentinels, the batch's next step is taken apart: the
decoder graph's run, and the search (``contract.decoding.advance``) over its log-probs with each
request's constraint (every sentinel exactly once, ``contract/constraints.py``) and without. A step is
the decoder run plus the search; what is printed is the median over the rounds of each, the step's
time without and with the constraint, their ratio and its lowest and highest single round. A whole
decoding is not what is compared, because a constrained search takes other tokens and so keeps other
rows for another number of steps. Sessions are built as the service builds them on the CPU
(``--threads`` intra-op threads).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

from contract.constraints import SentinelVocabulary
from contract.decoding import (
    DecodeBatch,
    DecodeRequest,
    DecoderSpec,
    LogProbs,
    advance,
    decoding_outputs,
    session_fn,
    step,
)
from contract.manifest import load_entry
from contract.tokenizer import load_tokenizer
from contract.translation_text import LETTER_SENTINELS, plan_text

SENTENCES = Path(__file__).with_name("placeholder_sentences.txt")
REPEAT = 20  # calls per timing


def step_feeds(batch: DecodeBatch) -> dict[str, np.ndarray]:
    feeds = {"tokens": batch.tokens[:, None], "positions": batch.positions[:, None], "cache_mask": batch.cache_mask}
    feeds["src_mask"] = batch.src_mask
    for i in range(len(batch.past_keys)):
        feeds[f"past_keys_{i}"], feeds[f"past_values_{i}"] = batch.past_keys[i], batch.past_values[i]
        feeds[f"cross_keys_{i}"], feeds[f"cross_values_{i}"] = batch.cross_keys[i], batch.cross_values[i]
    return feeds


def timed(run, prepare) -> float:
    """Milliseconds per call of ``run(prepare())``, ``prepare`` not timed."""
    total = 0.0
    for _ in range(REPEAT):
        arg = prepare()
        start = time.perf_counter()
        run(arg)
        total += time.perf_counter() - start
    return total * 1e3 / REPEAT


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.bench_constraints", description=__doc__.splitlines()[0])
    p.add_argument("--entry", type=Path, default=Path("models/translator/3"))
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--threads", type=int, default=1, help="intra-op threads (the service's default on 2 cores: 1)")
    args = p.parse_args(argv)
    manifest = load_entry(args.entry).manifest
    spec = DecoderSpec.from_manifest(manifest)
    tokenizer = load_tokenizer(args.entry, manifest.tokenizer)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = args.threads
    outputs = decoding_outputs(spec.layers)
    encoder, decoder = (
        session_fn(ort.InferenceSession(str(args.entry / f), opts, providers=["CPUExecutionProvider"]), outputs[k])
        for f, k in (("encoder.onnx", "encoder"), ("decoder.onnx", "decoder"))
    )
    vocabulary = SentinelVocabulary.build(tokenizer, manifest.decoding.sentinels or LETTER_SENTINELS)
    texts = [t for t in SENTENCES.read_text().splitlines() if t.strip()]
    sentences = [s for t in texts for s in plan_text(t, tokenizer, vocabulary).sentences]
    print(f"{args.entry}: {len(sentences)} masked sentences, {args.rounds} rounds, {args.threads} thread(s)")
    print(
        f"{'search':<8} {'rows':>5} {'decoder ms':>11} {'search off':>11} {'search on':>10} {'step on/off':>12} {'range':>13}"
    )
    for beam in (1, 4):
        reqs = [DecodeRequest(s.source, 200, beam=beam, constraint=s.constraint) for s in sentences]
        batch = DecodeBatch.start(reqs, encoder, spec)
        for _ in range(4):
            _, batch = step(batch, decoder, spec)
        feeds = step_feeds(batch)
        log_probs = decoder(feeds)["log_probs"]
        free = copy.deepcopy(batch.requests)
        for r in free:
            r.constraint = None
        # a request keeps its constraint (and the masks it has made) from step to step: copies share it
        shared = {id(r.constraint): r.constraint for r in batch.requests}
        advance(copy.deepcopy(batch.requests, dict(shared)), LogProbs(log_probs.copy()), spec.eos_id)
        dec, off, on = [], [], []
        for _ in range(args.rounds):
            dec.append(timed(decoder, lambda feeds=feeds: feeds))
            off.append(
                timed(
                    lambda a: advance(a[0], a[1], spec.eos_id),
                    lambda free=free, x=log_probs: (copy.deepcopy(free), LogProbs(x.copy())),
                )
            )
            on.append(
                timed(
                    lambda a: advance(a[0], a[1], spec.eos_id),
                    lambda bound=batch.requests, x=log_probs, m=shared: (
                        copy.deepcopy(bound, dict(m)),
                        LogProbs(x.copy()),
                    ),
                )
            )
        ratios = [(d + b) / (d + a) for d, a, b in zip(dec, off, on)]
        d, a, b = statistics.median(dec), statistics.median(off), statistics.median(on)
        name = "greedy" if beam == 1 else f"beam {beam}"
        print(
            f"{name:<8} {len(batch):>5} {d:>11.3f} {a:>11.3f} {b:>10.3f} {(d + b) / (d + a):>12.3f} "
            f"{min(ratios):>6.3f}-{max(ratios):.3f}"
        )


if __name__ == "__main__":
    main()
