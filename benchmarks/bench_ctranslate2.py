"""Our decoding loop against CTranslate2, fp32 and int8, on the translator of the model repository.

``python -m benchmarks.bench_ctranslate2 --repository models --rounds 5``

CTranslate2 is what a user would pick to serve a Transformer translator fast. This builds the
CTranslate2 model from the repository alone (``benchmarks/ctranslate2_model.py``: the weights of
the entry's ONNX graphs), checks that its greedy translations of the benchmark sentences
(``translate_sentences.txt``) are ours token for token, then times both at batch 1 and 16, greedy
and beam 4, 20 and 64 generated tokens (``--tokens``): our bare decoding loop (``contract/decoding.py`` on
onnxruntime sessions built with the service's options, as ``bench_translate`` runs it) on the entry
and on its int8 variant (the repository's ``<name>-int8``, or quantised here as ``export.quantize``
does) against CTranslate2 float32 and int8 (``compute_type="int8"``), every engine at 1 and at 2
intra-op threads, the faster kept per configuration (the service itself leaves one core to its
event loop: on two cores it runs onnxruntime on one; both counts are printed). Every run generates
exactly that many tokens per sentence (end-of-sentence ruled out: ``without_eos`` for ours,
``min_decoding_length`` for CTranslate2; checked on the first run). In each of ``--rounds`` rounds
every configuration runs every engine in turn (the order rotating by round); the median of the
rounds is kept. ``--ours`` runs our loop on a variant of the entry with the same weights (a fused
decoder from ``python -m export.fuse``), CTranslate2 still built from the entry. Skipped, with a
note, when ctranslate2 is not installed.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from contract.decoding import DecodeRequest, run_to_end
from contract.precision import variant_folder

TOKENS = (20, 64)  # generated per sentence; --tokens 2 20 times a step as the difference of two lengths


def configs(tokens: tuple[int, ...] = TOKENS) -> list[tuple[int, int, int]]:
    return [(batch, beam, n) for batch in (1, 16) for beam in (1, 4) for n in tokens]


COMPUTE_TYPES = {"fp32": "float32", "int8": "int8"}
OURS = ("ours fp32", "ours int8")
MIN_SECONDS = 0.2  # a measurement repeats its decode until it lasts this long: batch 1 at 20 tokens is ~20 ms
SETTLE_S = 0.1  # idle gap after each measurement, so no engine's spinning worker threads overlap the next one


@dataclass(frozen=True)
class Engine:
    name: str  # "fp32"/"int8": CTranslate2; "ours fp32"/"ours int8": our loop on the entry / its int8 variant
    threads: int

    @property
    def ours(self) -> bool:
        return self.name.startswith("ours")

    @property
    def label(self) -> str:
        return self.name if self.ours else f"CTranslate2 {self.name}, {self.threads} thread(s)"


def int8_variant(entry_dir: Path, tmp: Path) -> tuple[Path, str]:
    """Our int8 variant of the entry: its ``int8/`` folder (``make int8``), or else one quantised here the same
    way (``export.quantize``, without its quality evaluation) into ``tmp``."""
    shipped = variant_folder(entry_dir)
    if (shipped / "manifest.json").is_file():
        return shipped, f"{shipped}"
    from export.quantize import write_variant

    final, _ = write_variant(entry_dir, tmp / "int8" / entry_dir.name, False, lambda folder, manifest: {})
    return final, f"quantised here as export.quantize does ({shipped} is absent: make int8 writes it)"


def config_label(batch: int, beam: int, tokens: int) -> str:
    return f"batch {batch}, {'greedy' if beam == 1 else f'beam {beam}'}, {tokens} tokens"


def timed(fn: Callable[[], object], reps: int) -> float:
    """Seconds per call of ``fn``, over ``reps`` calls."""
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - start) / reps


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.bench_ctranslate2", description=__doc__.splitlines()[0])
    p.add_argument("--repository", type=Path, default=Path("models"))
    p.add_argument("--name", default="translator")
    p.add_argument("--version", help="the entry's version (default: the highest)")
    p.add_argument(
        "--ours",
        type=Path,
        help="run our loop on this entry instead, a variant of the same weights (e.g. one python -m export.fuse "
        "wrote); its int8 variant is quantised here from it. CTranslate2 is still built from the entry",
    )
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds; the median is kept (default 5)")
    p.add_argument("--tokens", type=int, nargs="+", default=list(TOKENS), help="tokens generated per sentence (20 64)")
    p.add_argument(
        "--threads", type=int, nargs="+", default=[1, 2], help="intra-op thread counts to try, for each engine (1 2)"
    )
    args = p.parse_args(argv)
    if args.rounds < 1 or min(args.threads) < 1 or min(args.tokens) < 1:
        p.error("--rounds, --threads and --tokens must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        import ctranslate2
        import onnx  # noqa: F401 - read_weights reads the graphs with it
    except ImportError:
        print("CTranslate2 comparison skipped: pip install ctranslate2 onnx (make install-dev installs both)")
        return 0
    import onnxruntime

    from benchmarks.bench_translate import SENTENCES, Bare
    from benchmarks.ctranslate2_model import convert, decode, greedy_agreement, translator
    from service.settings import Settings

    folder = args.repository / args.name
    entry_dir = (
        folder / args.version
        if args.version
        else max(folder.iterdir(), key=lambda p: int(p.name) if p.name.isdigit() else -1)
    )
    engines = [Engine(kind, t) for kind in (*OURS, *COMPUTE_TYPES) for t in args.threads]
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        model_dir = convert(entry_dir, Path(tmp) / "ct2")
        converted_s = time.perf_counter() - start
        ours_dir = args.ours or entry_dir
        int8_dir, int8_origin = int8_variant(ours_dir, Path(tmp) / "repo")
        if args.ours is not None:
            int8_origin = f"quantised here from {ours_dir} as export.quantize does"
        folders = {"ours fp32": ours_dir, "ours int8": int8_dir}
        bare = {e: Bare(folders[e.name], Settings(intra_op_threads=e.threads)) for e in engines if e.ours}
        ct2 = {e: translator(model_dir, e.threads, COMPUTE_TYPES[e.name]) for e in engines if not e.ours}
    fp32 = next(b for e, b in bare.items() if e.name == "ours fp32")
    service_threads = Settings().intra_op_threads or max(1, (os.cpu_count() or 2) - 1)
    print(
        f"{args.name}/{entry_dir.name}: {fp32.manifest.model['parameters']:,} parameters, CTranslate2 model built "
        f"from {entry_dir} in {converted_s:.1f} s; our loop on {ours_dir}; our int8 variant: {int8_origin}; CTranslate2 "
        f"{ctranslate2.__version__}, onnxruntime {onnxruntime.__version__}; {os.cpu_count()} cores (the service "
        f"runs onnxruntime on {service_threads} intra-op thread(s) here); medians of {args.rounds} rounds"
    )
    for kind in COMPUTE_TYPES:
        engine = next(e for e in ct2 if e.name == kind)
        same = greedy_agreement(ct2[engine], fp32.encoder, fp32.decoder, fp32.spec, fp32.tok, SENTENCES)
        print(f"CTranslate2 {kind} greedy translations identical to ours: {sum(same)}/{len(same)} sentences")

    def run(engine: Engine, batch: int, beam: int, tokens: int) -> Callable[[], list[list[int] | list[str]]]:
        sources = fp32.sources(batch)
        if engine.ours:
            b = bare[engine]
            return lambda: [
                r.results()[0].tokens
                for r in run_to_end(
                    b.encoder, b.fixed_length_decoder, [DecodeRequest(s, tokens, beam=beam) for s in sources], b.spec
                )
            ]
        pieces = [fp32.tok.pieces(s) for s in sources]
        return lambda: decode(ct2[engine], pieces, tokens, beam)

    calls, reps = {}, {}
    for config in configs(tuple(args.tokens)):  # warm up, check the lengths, and size each measurement
        for engine in engines:
            fn = calls[config, engine] = run(engine, *config)
            fn()
            start = time.perf_counter()
            out = fn()
            once = time.perf_counter() - start
            if any(len(o) != config[2] for o in out):
                raise RuntimeError(f"{engine.label}, {config_label(*config)}: lengths {[len(o) for o in out]}")
            reps[config, engine] = max(1, math.ceil(MIN_SECONDS / once))
    seconds: dict[tuple, list[float]] = {key: [] for key in calls}
    for r in range(args.rounds):
        order = engines[r % len(engines) :] + engines[: r % len(engines)]
        for config in configs(tuple(args.tokens)):
            for engine in order:
                seconds[config, engine].append(timed(calls[config, engine], reps[config, engine]))
                time.sleep(SETTLE_S)
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)

    rate = {key: key[0][0] * key[0][2] / statistics.median(s) for key, s in seconds.items()}  # tok/s
    best = {  # (config, engine kind) -> its faster thread setting
        (config, kind): max((e for e in engines if e.name == kind), key=lambda e, c=config: rate[c, e])
        for config in configs(tuple(args.tokens))
        for kind in (*OURS, *COMPUTE_TYPES)
    }
    print()
    header = f"{'tokens/s':<28}" + "".join(
        f"{f'ours {kind}':>11}{'thr':>4}{f'CT2 {kind}':>10}{'thr':>4}{'ratio':>8}" for kind in COMPUTE_TYPES
    )
    print(header)
    print("-" * len(header))
    for config in configs(tuple(args.tokens)):
        cells = [f"{config_label(*config):<28}"]
        for kind in COMPUTE_TYPES:
            mine, theirs = best[config, f"ours {kind}"], best[config, kind]
            cells.append(
                f"{rate[config, mine]:>11,.0f}{mine.threads:>4}{rate[config, theirs]:>10,.0f}{theirs.threads:>4}"
                f"{rate[config, mine] / rate[config, theirs]:>7.2f}x"
            )
        print("".join(cells))
    print(
        f"\nratio: ours ÷ CTranslate2 of the same precision, each at its faster intra-op thread count (thr). "
        f"Below, every engine's tok/s at each thread count, and the lowest and highest single-round ratio: how "
        f"far the {args.rounds} rounds spread."
    )
    kinds = (*OURS, *COMPUTE_TYPES)
    print(f"{'':<28}" + "".join(f"{f'{kind} {t}':>13}" for kind in kinds for t in args.threads) + f"{'rounds':>26}")
    for config in configs(tuple(args.tokens)):
        cells = [f"{config_label(*config):<28}"]
        cells += [f"{rate[config, e]:>13,.0f}" for kind in kinds for e in engines if e.name == kind]
        for kind in COMPUTE_TYPES:
            mine, theirs = best[config, f"ours {kind}"], best[config, kind]
            per_round = [t / o for t, o in zip(seconds[config, theirs], seconds[config, mine])]
            cells.append(f"{min(per_round):>7.2f}-{max(per_round):.2f}x")
        print("".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
