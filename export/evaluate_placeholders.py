"""Does a translator keep placeholders? ``python -m export.evaluate_placeholders --entry models/translator/3``.

Translates the held-out messages with placeholders (``--data``, ``make heldout-placeholders``) and
scores the translations by export/placeholder_metrics.py (span agreement, msgfmt's format check,
invented ``%n``) and by sacrebleu's BLEU and chrF (``export/scoring.py``) with the placeholders in the
text. Two ways to translate, so that the before and after of protected spans is one run:

- ``--mode raw``: the texts as they are, through ``contract.decoding``'s greedy or beam search on the
  entry's onnxruntime graphs, exactly as ``export.evaluate`` translates;
- ``--mode protected``: through ``contract.translation_text``, the service's path: accelerator out,
  sentences, spans masked by the model's sentinels, constrained search, spans and accelerator restored;
- ``--mode both``: one after the other, printed side by side.

The references are judged too: they pass both judges by construction, so a failure there is a bug of
the judges or of the set. ``--out FILE`` writes everything as JSON: per mode the figures, per tool
the passes, every translation, and each failure with its source, translation and reference. The graphs run on onnxruntime's CPU provider, as the exporter runs them.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from contract.decoding import DecoderSpec, session_fn
from contract.tokenizer import load_tokenizer
from export.common import cpu_session
from export.evaluate import translator_and_test_set
from export.placeholder_metrics import MsgfmtError, judge
from export.scoring import score
from export.translator import BEAM, translate_all
from model.cli import CliError, run_cli

MODES = ("raw", "protected")


def translate_protected(encoder, decoder, tok, spec: DecoderSpec, texts: list[str], beam: int, sentinels) -> list[str]:
    """The service's text pipeline (imported here: it is written alongside this evaluation)."""
    from contract.translate_graphs import translate_texts

    return translate_texts(encoder, decoder, tok, spec, texts, beam, sentinels)


def by_domain(report: dict, domains: Sequence[str]) -> dict:
    """Sentences and passes of each judge per tool, from a report's failures."""
    out: dict[str, dict] = {}
    for d in domains:
        out.setdefault(d, {"sentences": 0, "spans": 0, "msgfmt": 0})["sentences"] += 1
    for d in out.values():
        d["spans"] = d["msgfmt"] = d["sentences"]
    for f in report["failures"]:
        d = out[domains[f["index"]]]
        d["spans"] -= not f["spans"]
        d["msgfmt"] -= f["msgfmt"] is not None
    return dict(sorted(out.items()))


def evaluate_mode(
    translate: Callable[[list[str]], list[str]], pairs: Sequence[tuple[str, str]], domains: Sequence[str]
) -> dict:
    sources, refs = [s for s, _ in pairs], [t for _, t in pairs]
    start = time.perf_counter()
    hyps = translate(sources)
    seconds = round(time.perf_counter() - start, 1)
    report = judge(sources, hyps)
    for f in report["failures"]:
        f |= {"reference": refs[f["index"]], "domain": domains[f["index"]]}
    return {
        **score(hyps, refs),
        "seconds": seconds,
        **report,
        "domains": by_domain(report, domains),
        "translations": hyps,
    }


def row(name: str, r: dict) -> str:
    bleu = f"{r['bleu']:7.2f} {r['chrf']:7.2f} {r['seconds']:9.1f}" if "bleu" in r else ""
    return (
        f"  {name:<10} {r['span_agreement']['percent']:8.2f} {r['msgfmt']['percent']:8.2f} {r['invented_n']:11d} {bleu}"
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m export.evaluate_placeholders", description=__doc__.splitlines()[0])
    p.add_argument("--entry", type=Path, required=True, help="a translator entry, e.g. models/translator/3")
    p.add_argument(
        "--data", type=Path, default=Path("data/translation-heldout-placeholders"), help="folder holding test.tsv"
    )
    p.add_argument("--mode", choices=(*MODES, "both"), default="both", help="how to translate (default: %(default)s)")
    p.add_argument("--beam", type=int, default=BEAM, help="beam size, 1: greedy (default: %(default)s)")
    p.add_argument("--max-test", type=int, help="score only the first N pairs (smoke tests)")
    p.add_argument("--show", type=int, default=5, help="failures printed per mode (default: %(default)s)")
    p.add_argument("--out", type=Path, help="write the whole evaluation here as JSON")
    p.add_argument("--no-progress", action="store_true")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.beam < 1:
        raise CliError("--beam must be at least 1")
    m, pairs, domains = translator_and_test_set(args.entry, args.data)
    pairs, domains = (
        (pairs[: args.max_test], domains[: args.max_test]) if args.max_test is not None else (pairs, domains)
    )
    if not pairs:
        raise CliError(f"{args.data / 'test.tsv'} holds no sentence pairs")
    tok, spec = load_tokenizer(args.entry, m.tokenizer), DecoderSpec.from_manifest(m)
    encoder, decoder = (session_fn(cpu_session(args.entry / m.graph(g).file)) for g in ("encoder", "decoder"))
    sentinels = tuple(getattr(m.decoding, "sentinels", None) or ())  # empty: the pipeline's own default

    def raw(texts: list[str]) -> list[str]:
        sources = tok.encode_batch(texts, add_eos=True)
        return translate_all(encoder, decoder, sources, spec, tok, args.beam, not args.no_progress)[0]

    def protected(texts: list[str]) -> list[str]:
        return translate_protected(encoder, decoder, tok, spec, texts, args.beam, sentinels)

    modes = MODES if args.mode == "both" else (args.mode,)
    try:
        result = {
            "entry": f"{m.name}/{m.version}",
            "data": str(args.data / "test.tsv"),
            "beam": args.beam,
            "reference": judge([s for s, _ in pairs], [t for _, t in pairs]),
            "modes": {
                name: evaluate_mode({"raw": raw, "protected": protected}[name], pairs, domains) for name in modes
            },
        }
    except MsgfmtError as e:
        raise CliError(str(e)) from None
    print(f"{m.name}/{m.version} on {args.data / 'test.tsv'} ({len(pairs)} pairs), beam {args.beam}")
    print(f"  {'mode':<10} {'spans %':>8} {'msgfmt %':>8} {'invented %n':>11} {'BLEU':>7} {'chrF':>7} {'seconds':>9}")
    print(row("reference", result["reference"]))
    for name, r in result["modes"].items():
        print(row(name, r))
    for name, r in result["modes"].items():
        for f in r["failures"][: args.show]:
            why = "spans differ" if not f["spans"] else f["msgfmt"] or "invents %n"
            print(f"  {name} [{f['domain']}] {why}\n    {f['source']}\n    {f['translation']}")
    if args.out:
        args.out.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    run_cli(main)
