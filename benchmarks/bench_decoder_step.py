"""One decoder step of translator entries, interleaved: nodes onnxruntime runs and ms per step.

``python -m benchmarks.bench_decoder_step models/translator/3 models/translator-fused/3 --rounds 15``

Times each entry's ``decoder.onnx`` alone (no decoding loop) at batch 1, 16 and 64 rows, a 24-column
cache and 20 source positions, on sessions built as the service builds them on the CPU (full
optimisation, ``--threads`` intra-op threads). In each round every entry runs in turn; the median of
the rounds is kept, with the ratio to the first entry (its time over this one's: above 1, faster) and
that ratio's lowest and highest single round. The inputs are random
but the same for every entry; the largest log-prob difference to the first entry is printed beside.
With ``--group G`` every G adjacent rows share their cross-attention keys, values and source mask
(a request's beams): an entry whose decoder takes a row per request (``decoding.cross_rows``,
``export.group_cross``) gets one row per G, the others a copy in every row.
What it answers: whether a rewritten step graph (``export.fuse``, ``export.group_cross``) is faster
than the exported one.

``--ctranslate2`` adds CTranslate2 running the first entry's weights (``benchmarks/ctranslate2_model.py``; an
int8 variant folder: its fp32 entry's weights, ``compute_type="int8"``) on ``--threads`` intra-op threads:
the time of one step of its whole loop at the same rows (search included), as the difference of two
fixed generation lengths (``CT2_LENGTHS``, their cache widths centred on ``CACHE``) over sources of
``SOURCE`` tokens, interleaved with the graphs; with ``--group G``, a beam search of G beams per
sentence over rows / G sentences, as the graphs' rows share a request's cross-attention inputs. It
answers whether our step graph alone is slower than CTranslate2's whole step, or the time goes around it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

from contract.decoding import DecoderSpec, decoder_inputs
from contract.manifest import load_entry
from export.fuse import SENTENCES, ort_nodes

BATCHES = (1, 16, 64)
CACHE, SOURCE = 24, 20  # columns of the cache buffer, source positions
MIN_SECONDS = 0.1  # each measurement repeats the step until it lasts about this long
CT2_LENGTHS = (CACHE - 12, CACHE + 12)  # tokens generated: the cache spans 12 to 36 columns, 24 on average


def feeds(spec: DecoderSpec, rows: int, rng: np.random.Generator, group: int = 1) -> dict[str, np.ndarray]:
    """Random step inputs; cross-attention inputs alike for each ``group`` adjacent rows."""
    names = decoder_inputs(spec.layers)
    shared = max(1, rows // group)
    out = {
        "tokens": rng.integers(4, 1000, (rows, 1)),
        "positions": np.full((rows, 1), CACHE, np.int64),
        "cache_mask": np.ones((rows, CACHE), bool),
        "src_mask": np.ones((shared, SOURCE), bool),
    }
    out["cache_mask"][::2, :3] = False  # every other row joined three steps later (left-padded)
    out["src_mask"][::3, SOURCE - 4 :] = False  # and some sources are shorter
    for name in names[4:]:
        n, width = (rows, CACHE) if name.startswith("past") else (shared, SOURCE)
        out[name] = rng.standard_normal((n, spec.heads, width, spec.head_dim)).astype(np.float32)
    return out


def for_entry(inputs: dict[str, np.ndarray], spec: DecoderSpec, rows: int) -> dict[str, np.ndarray]:
    """The inputs as the entry's decoder takes them: shared cross-attention rows, or one copy per row."""
    if spec.cross_rows == "request" or len(inputs["src_mask"]) == rows:
        return inputs
    g = rows // len(inputs["src_mask"])
    shared = ["src_mask"] + [n for n in inputs if n.startswith("cross_")]
    return inputs | {n: np.repeat(inputs[n], g, axis=0) for n in shared}


class CTranslate2Step:
    """CTranslate2 on the weights of ``entry`` (a fp32 entry, or an int8 variant folder in one), decoding a
    fixed number of tokens: :meth:`time` gives one step of its loop at ``rows`` rows."""

    def __init__(self, entry: Path, threads: int, workdir: Path) -> None:
        from benchmarks.ctranslate2_model import convert, translator
        from contract.tokenizer import Tokenizer

        manifest = load_entry(entry).manifest
        variant = manifest.variant  # an int8 folder: CTranslate2 quantises its fp32 entry's weights as it loads
        base = entry.parent if variant is not None else entry
        self.compute_type = "int8" if variant is not None and variant.precision == "int8" else "float32"
        self.translator = translator(convert(base, workdir / "ct2"), threads, self.compute_type)
        tok = Tokenizer.load(base / manifest.tokenizer.file)
        ids = [tok.encode(line) for line in SENTENCES.read_text("utf-8").splitlines() if line]
        long = [tok.pieces(s[: SOURCE - 1] + [tok.eos_id]) for s in ids if len(s) >= SOURCE - 1]  # eos ends a source
        if not long:
            raise SystemExit(f"no sentence of {SOURCE - 1} tokens in {SENTENCES}")
        self.sources = long

    def _decode(self, rows: int, beam: int, tokens: int) -> None:
        batch = [self.sources[i % len(self.sources)] for i in range(rows // beam)]
        self.translator.translate_batch(
            batch, beam_size=beam, min_decoding_length=tokens, max_decoding_length=tokens, return_scores=False
        )

    def time(self, rows: int, beam: int, reps: int) -> float:
        """ms per step of ``rows`` rows (``rows / beam`` sentences, each searched with ``beam`` beams): the
        difference of the two generation lengths, each decoded ``reps`` times."""
        short, long = CT2_LENGTHS
        spent = []
        for tokens in (short, long):
            start = time.perf_counter()
            for _ in range(reps):
                self._decode(rows, beam, tokens)
            spent.append((time.perf_counter() - start) / reps)
        return (spent[1] - spent[0]) / (long - short) * 1e3


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.bench_decoder_step", description=__doc__.splitlines()[0])
    p.add_argument("entries", type=Path, nargs="+", help="translator entries; ratios are to the first")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--group", type=int, default=1, help="rows sharing cross-attention inputs (a request's beams)")
    p.add_argument(
        "--ctranslate2", action="store_true", help="add CTranslate2's whole step on the first entry's weights"
    )
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-decoder-step-") as tmp:
        return run(args, Path(tmp))


def run(args: argparse.Namespace, workdir: Path) -> int:
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.intra_op_num_threads, opts.inter_op_num_threads = args.threads, 1
    graphs, specs = [], []
    for entry in args.entries:
        m = load_entry(entry).manifest
        graphs.append(entry / m.graph("decoder").file)
        specs.append(DecoderSpec.from_manifest(m))
    sessions = [ort.InferenceSession(str(g), opts, providers=["CPUExecutionProvider"]) for g in graphs]
    ct2 = CTranslate2Step(args.entries[0], args.threads, workdir) if args.ctranslate2 else None
    print(f"onnxruntime {ort.__version__}, {args.threads} intra-op thread(s), medians of {args.rounds} rounds")
    for entry, graph in zip(args.entries, graphs):
        print(f"{entry!s:<40} {ort_nodes(graph):>4} nodes per step after onnxruntime's optimisation")
    for rows in BATCHES:
        beam = args.group if rows % args.group == 0 else 1
        common = feeds(specs[0], rows, np.random.default_rng(rows), beam)
        inputs = [for_entry(common, spec, rows) for spec in specs]
        first = [s.run(["log_probs"], x)[0] for s, x in zip(sessions, inputs)]
        reps = []
        for s, x in zip(sessions, inputs):
            start = time.perf_counter()
            s.run(None, x)
            reps.append(max(1, round(MIN_SECONDS / (time.perf_counter() - start))))
        ms: list[list[float]] = [[] for _ in sessions]
        ct2_ms: list[float] = []
        if ct2 is not None:
            ct2.time(rows, beam, 1)  # warm
            ct2_reps = max(1, round(reps[0] / (CT2_LENGTHS[1] - CT2_LENGTHS[0])))
        for r in range(args.rounds):
            for k in [(r + i) % len(sessions) for i in range(len(sessions))]:
                start = time.perf_counter()
                for _ in range(reps[k]):
                    sessions[k].run(None, inputs[k])
                ms[k].append((time.perf_counter() - start) / reps[k] * 1e3)
            if ct2 is not None:
                ct2_ms.append(ct2.time(rows, beam, ct2_reps))
        cells = []
        for k, entry in enumerate(args.entries):
            ratio = [a / b for a, b in zip(ms[0], ms[k])]
            drift = float(np.abs(first[k] - first[0]).max())
            cells.append(
                f"{entry.parent.name}: {statistics.median(ms[k]):.3f} ms "
                f"({statistics.median(ratio):.2f}x, {min(ratio):.2f}-{max(ratio):.2f}; |dlog_probs| {drift:.0e})"
            )
        if ct2 is not None:
            ratio = [a / b for a, b in zip(ms[0], ct2_ms)]
            cells.append(
                f"CTranslate2 {ct2.compute_type}{f' beam {beam}' if beam > 1 else ''}, its whole step: "
                f"{statistics.median(ct2_ms):.3f} ms "
                f"(first entry's graph / it: {statistics.median(ratio):.2f}x, {min(ratio):.2f}-{max(ratio):.2f})"
            )
        print(f"batch {rows:>3}  " + "  ".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
