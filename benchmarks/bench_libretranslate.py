"""POST /translate against LibreTranslate on the same weights: ``python -m benchmarks.bench_libretranslate``.

What a user who wants a self-hosted translation API installs today is LibreTranslate: Flask behind
waitress, in front of CTranslate2 through argos-translate, one ``translate_batch`` per request and no
batching across requests. This measures our service against it on our own translator, in one run
(about 14 minutes with the defaults):

1. it builds an Argos Translate package of the entry (``bench_libretranslate_servers.argos_package``:
   ``ctranslate2_model.convert``, our SentencePiece model, en->de metadata) in a temporary folder;
2. it starts our service as ``make serve`` does (``python -m service``, default settings, gRPC off) on
   a repository holding that entry alone, and LibreTranslate 1.9 (``make libretranslate`` installs it in
   ``.venv-libretranslate``; ``--load-only en,de``) once per beam and per ``--lt-settings`` candidate,
   offline (``bench_libretranslate_offline``); all on 127.0.0.1, free ports;
3. it translates the messages one at a time on both and counts the identical translations;
4. it drives both with wrk and ``bench_classify``'s Lua script, which sends the bodies in turn: the
   ``--messages`` real one-sentence messages of ``translate_messages.txt`` (the 32 of
   ``translate_sentences.txt``, then 168 English sides of the corpus' test split, spread evenly over
   those that are one sentence by ``contract.sentences``, 20 to 160 characters, without markup), one
   per request, greedy and beam 4, at each of ``--clients`` (1, 8, 32) connections, ``--duration``
   seconds a run, in ``--rounds`` interleaved rounds, the servers' order rotating by round; after each
   round, with the servers idle, the CTranslate2 ceiling: one ``translate_batch`` of all the messages
   on the package's model (``max_batch_size`` 32, ``inter_threads`` 2 with one thread each, argos'
   length penalty);
5. it prints per load the medians (and the rounds' range) of req/s, p50 and p99 latency and server
   CPU per request, and attnserve / LibreTranslate, LibreTranslate at its fastest setting for that
   load; the ceiling, and both servers at the most clients against it; how many translations agree;
   both servers' RSS once ready (after step 3: LibreTranslate loads its model at its first request)
   and after the load.

LibreTranslate's beam is argos-translate's ``ARGOS_BEAM_SIZE`` (default 4; LibreTranslate's API has no
such parameter), so each beam has LibreTranslate processes of its own. Its settings for a load are
``ARGOS_INTER_THREADS`` translators side by side, ``ARGOS_INTRA_THREADS`` threads each and waitress'
``--threads``; ``--lt-settings`` lists the candidates as INTERxINTRAxTHREADS, and each load keeps the
fastest. ``--precision`` sets both sides' precision. The default, int8, is what each serves by default:
our version's int8 variant (``ATTNSERVE_PRECISION=auto`` serves the shipped ``translator/3/int8``; for an
entry without one, one is quantised here as ``export.quantize`` does) against CTranslate2's int8
``compute_type`` (argos-translate's default on a CPU) on the same package; ``fp32`` compares the fp32
entry with CTranslate2's float32.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.bench_classify import ROOT, run_wrk, write_script
from benchmarks.bench_libretranslate_servers import (
    COMPUTE_TYPES,
    LT_PYTHON,
    Ceiling,
    LTSetting,
    Server,
    argos_package,
    lt_body,
    lt_versions,
    start_attnserve,
    start_libretranslate,
    translations,
)
from contract.precision import variant_folder

MESSAGES = (Path(__file__).parent / "translate_messages.txt").read_text("utf-8").splitlines()
SETTLE_S = 0.5  # idle gap after each run: CTranslate2's OpenMP threads spin a while after work
FINAL_PUNCTUATION = ".!?;:…"


def search_label(beam: int) -> str:
    return "greedy" if beam == 1 else f"beam {beam}"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.bench_libretranslate", description=__doc__.splitlines()[0])
    p.add_argument("--repository", type=Path, default=ROOT / "models")
    p.add_argument("--name", default="translator")
    p.add_argument("--precision", choices=sorted(COMPUTE_TYPES), default="int8")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--duration", type=int, default=8, help="seconds of each wrk run (whole seconds)")
    p.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--beams", type=int, nargs="+", default=[1, 4])
    p.add_argument("--messages", type=int, default=len(MESSAGES), help=f"how many messages (at most {len(MESSAGES)})")
    p.add_argument(
        "--lt-settings",
        type=LTSetting.parse,
        nargs="+",
        default=[LTSetting(1, 2, 4), LTSetting(2, 1, 4), LTSetting(2, 1, 8)],
        metavar="INTERxINTRAxTHREADS",
        help="LibreTranslate candidates: CTranslate2 translators x threads each x waitress threads (1x2x4 2x1x4 2x1x8)",
    )
    args = p.parse_args(argv)
    if args.rounds < 1 or args.duration < 1 or not 1 <= args.messages <= len(MESSAGES):
        p.error("--rounds and --duration must be >= 1, --messages within the file")
    return args


def entries(args: argparse.Namespace, tmp: Path) -> tuple[Path, Path, str]:
    """(fp32 entry: the Argos package's weights, the entry our service serves at ``--precision``, where the
    latter comes from): the version itself (its ``int8/`` variant, with int8), or a variant quantised here."""
    folder = args.repository / args.name
    fp32 = max((p for p in folder.iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
    if args.precision == "fp32" or (variant_folder(fp32) / "manifest.json").is_file():
        return fp32, fp32, f"{fp32}, ATTNSERVE_PRECISION={args.precision}"
    from benchmarks.bench_ctranslate2 import int8_variant

    served, origin = int8_variant(fp32, tmp / "quantised")
    return fp32, served, origin


def same_words(ours: str, theirs: str) -> bool:
    """Identical but for the final punctuation, which LibreTranslate sets to the source's
    (``improve_translation_formatting``)."""
    return ours.rstrip(FINAL_PUNCTUATION) == theirs.rstrip(FINAL_PUNCTUATION)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if shutil.which("wrk") is None:
        raise SystemExit("wrk not found: install it with 'sudo apt-get install -y wrk' (make system-deps)")
    if not LT_PYTHON.is_file():
        raise SystemExit(f"{LT_PYTHON} not found: run 'make libretranslate' (LibreTranslate in its own environment)")
    texts = MESSAGES[: args.messages]
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-libretranslate-") as tmp_name:
        tmp = Path(tmp_name)
        fp32, served, origin = entries(args, tmp)
        repository = tmp / "models"  # the entry alone, as LibreTranslate has the one package
        (repository / served.parent.name).mkdir(parents=True)
        (repository / served.parent.name / served.name).symlink_to(served.resolve())
        package = argos_package(fp32, tmp / "packages")
        ceiling = Ceiling(package, args.precision, texts)
        print(
            f"attnserve: {served} ({origin}); LibreTranslate: {lt_versions()}, Argos package of {fp32} at "
            f"{args.precision}; CTranslate2 {ceiling.version} here; {len(texts)} messages; {os.cpu_count()} cores",
            flush=True,
        )
        servers: dict[str, Server] = {}
        try:
            servers["attnserve"] = start_attnserve(repository, tmp, args.precision)
            for beam in args.beams:
                for setting in args.lt_settings:
                    name = lt_name(setting, beam)
                    servers[name] = start_libretranslate(tmp / "packages", tmp, setting, beam, args.precision, name)
            for name, server in servers.items():
                server.wait_ready("/readyz" if name == "attnserve" else "/languages")
            agreement = agree(args, texts, servers)
            rss_ready = {name: s.rss_mib() for name, s in servers.items()}
            runs, ceilings = measure(args, tmp, texts, servers, ceiling)
            rss_after = {name: s.rss_mib() for name, s in servers.items()}
        finally:
            for server in servers.values():
                server.stop()
    report(args, len(texts), runs, ceilings)
    print()
    for beam, (identical, but_punctuation, ours, theirs) in agreement.items():
        print(
            f"{search_label(beam)} translations identical, attnserve and LibreTranslate: {identical}/{len(texts)}; "
            f"but for the final punctuation mark {but_punctuation}/{len(texts)}; mean length {ours:.1f} and "
            f"{theirs:.1f} characters"
        )
    print("\nRSS (MiB) once ready (after the translations one at a time) and after the load:")
    for name in servers:
        print(f"  {name}: {rss_ready[name]:,.1f} -> {rss_after[name]:,.1f} MiB")
    print(f"\nbenchmark run time: {(time.monotonic() - started) / 60:.1f} minutes")
    return 0


def lt_name(setting: LTSetting, beam: int) -> str:
    return f"lt-{setting.label}-beam{beam}"


def agree(args: argparse.Namespace, texts: list[str], servers: dict[str, Server]) -> dict[int, tuple]:
    """Per beam: (identical translations, identical but for the final punctuation, mean characters of ours
    and of LibreTranslate's), the messages translated one at a time; this also loads LibreTranslate's
    models, which it does at its first request."""
    out = {}
    for beam in args.beams:
        ours = translations(servers["attnserve"], texts, beam)
        theirs = translations(servers[lt_name(args.lt_settings[0], beam)], texts, beam)
        for setting in args.lt_settings[1:]:  # the same translations: CTranslate2 loaded and checked alive
            translations(servers[lt_name(setting, beam)], texts[:1], beam)
        if not all(ours) or not all(theirs):
            raise SystemExit(f"{search_label(beam)}: an empty translation")
        pairs = list(zip(ours, theirs))
        out[beam] = (
            sum(a == b for a, b in pairs),
            sum(same_words(a, b) for a, b in pairs),
            statistics.mean(map(len, ours)),
            statistics.mean(map(len, theirs)),
        )
    return out


def measure(
    args: argparse.Namespace, tmp: Path, texts: list[str], servers: dict[str, Server], ceiling: Ceiling
) -> tuple[dict[tuple, list[dict]], dict[int, list[float]]]:
    """wrk's figures per (beam, clients, server), one per round; the ceiling's sentences/s per beam, one per round."""
    json_type = "application/json"
    scripts = {"lt": write_script(tmp, "lt", [json.dumps(lt_body(t)).encode() for t in texts], json_type, "/translate")}
    for beam in args.beams:
        bodies = [json.dumps({"text": t, "beam_size": beam}).encode() for t in texts]
        scripts[f"attnserve-{beam}"] = write_script(tmp, f"attnserve-{beam}", bodies, json_type, "/translate")

    def run(name: str, beam: int, clients: int, seconds: int) -> dict:
        script = scripts[f"attnserve-{beam}" if name == "attnserve" else "lt"]
        out = run_wrk(servers[name], script, clients, seconds, 1, "/translate")
        if out["non_2xx"] or out["errors"]:
            load = f"{search_label(beam)}, {clients} clients"
            raise SystemExit(f"{name}, {load}: {out['non_2xx']} non-2xx answers, {out['errors']} errors")
        time.sleep(SETTLE_S)
        return out

    def in_turn(beam: int, r: int) -> list[str]:
        names = ["attnserve"] + [lt_name(s, beam) for s in args.lt_settings]
        return names[r % len(names) :] + names[: r % len(names)]

    for beam in args.beams:  # first connections and allocations, untimed
        for name in in_turn(beam, 0):
            run(name, beam, max(args.clients), 1)
    runs: dict[tuple, list[dict]] = {}
    ceilings: dict[int, list[float]] = {beam: [] for beam in args.beams}
    for r in range(args.rounds):
        for beam in args.beams:
            for clients in args.clients:
                for name in in_turn(beam, r):
                    runs.setdefault((beam, clients, name), []).append(run(name, beam, clients, args.duration))
            ceilings[beam].append(ceiling.sentences_per_s(beam))
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    return runs, ceilings


def report(args: argparse.Namespace, n: int, runs: dict[tuple, list[dict]], ceilings: dict[int, list[float]]) -> None:
    rate = {key: [r["requests"] / r["seconds"] for r in rs] for key, rs in runs.items()}

    def figures(key: tuple) -> str:
        rs, rates = runs[key], rate[key]
        p50, p99 = (statistics.median(r[q] / 1000 for r in rs) for q in ("p50", "p99"))
        cpu = statistics.median(r["server_cpu_us"] / 1000 for r in rs)
        return (
            f"{statistics.median(rates):,.1f} req/s ({min(rates):,.1f} to {max(rates):,.1f}), p50 {p50:,.1f} ms, "
            f"p99 {p99:,.1f} ms, server CPU {cpu:,.2f} ms/req"
        )

    print(
        f"\nPOST /translate, one message per request (wrk, round-robin over {n} messages), "
        f"{args.precision}; medians of {args.rounds} rounds of {args.duration} s (the rounds' range in brackets); "
        "LibreTranslate at its fastest setting for the load (INTERxINTRAxTHREADS)"
    )
    best = {}
    for beam in args.beams:
        for clients in args.clients:
            lts = [lt_name(s, beam) for s in args.lt_settings]
            name = best[beam, clients] = max(lts, key=lambda n: statistics.median(rate[beam, clients, n]))
            ours, theirs = rate[beam, clients, "attnserve"], rate[beam, clients, name]
            per_round = [a / b for a, b in zip(ours, theirs)]
            label = f"{search_label(beam)}, {clients} clients"
            print(f"{label}: attnserve       {figures((beam, clients, 'attnserve'))}")
            print(f"{label}: LibreTranslate  {figures((beam, clients, name))} [{name.split('-')[1]}]")
            print(
                f"{label}: attnserve / LibreTranslate {statistics.median(ours) / statistics.median(theirs):.2f}x "
                f"(rounds {min(per_round):.2f}x to {max(per_round):.2f}x)"
            )
    print("\nLibreTranslate, every candidate setting (req/s, median):")
    for beam in args.beams:
        for clients in args.clients:
            cells = ", ".join(
                f"{s.label} {statistics.median(rate[beam, clients, lt_name(s, beam)]):,.1f}" for s in args.lt_settings
            )
            print(f"  {search_label(beam)}, {clients} clients: {cells}")
    top = max(args.clients)
    print()
    for beam in args.beams:
        c = statistics.median(ceilings[beam])
        ours = statistics.median(rate[beam, top, "attnserve"])
        theirs = statistics.median(rate[beam, top, best[beam, top]])
        print(
            f"CTranslate2 ceiling, {search_label(beam)}: translate_batch of the {n} messages, "
            f"max_batch_size 32, inter_threads 2: {c:,.1f} sentences/s ({min(ceilings[beam]):,.1f} to "
            f"{max(ceilings[beam]):,.1f}); at {top} clients attnserve {ours / c:.2f}x, LibreTranslate {theirs / c:.2f}x"
        )


if __name__ == "__main__":
    sys.exit(main())
