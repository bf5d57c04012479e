"""German a translator would accept around markup and placeholders: ``python -m export.evaluate_markup``.

Translates a held-out set of software messages (``--data``: ``make heldout-markup`` for messages with
inline tags, ``make heldout-placeholders`` for printf/brace placeholders) the service's way
(``contract.translation_text``) and judges more than the spans (``export/text_quality.py``):

- ``tags``: the source's tags all back and nesting as they did; ``spans``: every protected span back exactly
  once (``export/placeholder_metrics.py``);
- ``finished``: every sentence's search ended by itself, not at the length limit;
- ``runaway``: the text is more than 1.8 times as long as the reference's (tags taken out of both);
- ``chrF``/``BLEU`` of the text with its tags taken out against the reference's, and BLEU with everything in;
- ``compounds``: number placeholders glued to a capitalised word (``%d-Dateien``), beside the references' count;
- the same per number of placeholders (1, 2, 3+), with examples of the 3+.

Modes, one run: ``projected`` (the service: markup taken out and put back by alignment), ``searched`` (tags
masked like placeholders and placed by the constrained search), ``stripped`` (the messages with their tags
taken out, translated as they are: what the markup costs).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from contract.decoding import DecoderSpec, session_fn
from contract.placeholders import find_spans
from contract.projection import Alignment
from contract.tokenizer import load_tokenizer
from contract.translate_graphs import attention_maps, translate_all
from export.common import cpu_session
from export.evaluate import translator_and_test_set
from export.placeholder_metrics import agreement
from export.scoring import score
from export.text_quality import runaway, span_compounds, tags_kept, without_tags
from export.translator import BEAM
from model.cli import CliError, run_cli

MODES = ("projected", "searched", "stripped")


def share(flags: list[bool]) -> float | None:
    return round(100 * sum(flags) / len(flags), 2) if flags else None


def judge(sources: list[str], refs: list[str], hyps: list[str], finished: list[bool], stripped: bool) -> dict:
    """The figures of one set of translations (``stripped``: the sources had their tags taken out)."""
    plain_refs = [without_tags(r) for r in refs] if stripped else refs
    return {
        "sentences": len(sources),
        "tags": share([tags_kept(s, h) for s, h in zip(sources, hyps)]),
        "spans": share([agreement(s, h) for s, h in zip(sources, hyps)]),
        "finished": share(finished),
        "runaway": share([runaway(h, r) for h, r in zip(hyps, refs)]),
        "text": score([without_tags(h) for h in hyps], [without_tags(r) for r in refs]),
        "bleu_with_spans": score(hyps, plain_refs)["bleu"],
        "compounds": sum(span_compounds(h) for h in hyps),
        "reference_compounds": sum(span_compounds(r) for r in plain_refs),
    }


def by_spans(sources, refs, hyps, finished, stripped) -> dict:
    """:func:`judge` for the messages with 0, 1, 2 and 3 or more placeholders (tags not counted)."""
    groups: dict[str, list[int]] = {}
    for i, s in enumerate(sources):
        n = sum(x.kind != "tag" for x in find_spans(s))
        groups.setdefault(str(min(n, 3)) + ("+" if n >= 3 else ""), []).append(i)
    return {
        k: judge(*([x[i] for i in ix] for x in (sources, refs, hyps, finished)), stripped)
        for k, ix in sorted(groups.items())
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m export.evaluate_markup", description=__doc__.splitlines()[0])
    p.add_argument("--entry", type=Path, required=True, help="a translator entry, e.g. models/translator/3/int8")
    p.add_argument("--data", type=Path, default=Path("data/translation-heldout-markup"), help="folder with test.tsv")
    p.add_argument("--beam", type=int, default=BEAM, help="beam size, 1: greedy (default: %(default)s)")
    p.add_argument("--modes", default=",".join(MODES), help="comma-separated (default: %(default)s)")
    p.add_argument("--max-test", type=int, help="score only the first N pairs (smoke tests)")
    p.add_argument("--examples", type=int, default=10, help="3+ placeholder examples kept (default: %(default)s)")
    p.add_argument("--out", type=Path, help="write everything (every translation too) here as JSON")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    if args.beam < 1 or not modes or set(modes) - set(MODES):
        raise CliError(f"--beam must be at least 1 and --modes a list of {', '.join(MODES)}")
    m, pairs, _ = translator_and_test_set(args.entry, args.data)
    pairs = pairs[: args.max_test] if args.max_test is not None else pairs
    if not pairs:
        raise CliError(f"{args.data / 'test.tsv'} holds no sentence pairs")
    if "decoder_prefix" not in m.graphs:
        raise CliError(f"{args.entry} has no decoder_prefix graph: no attention to align markup with")
    tok, spec = load_tokenizer(args.entry, m.tokenizer), DecoderSpec.from_manifest(m)
    session = {g: cpu_session(args.entry / m.graph(g).file) for g in ("encoder", "decoder", "decoder_prefix")}
    encoder, decoder = session_fn(session["encoder"]), session_fn(session["decoder"])
    with_maps = session_fn(session["encoder"], ["cross_keys", "cross_values", "encoder_attentions"])
    prefix = session_fn(session["decoder_prefix"], ["self_attentions", "cross_attentions"])

    def attention(sources, hyps):
        return attention_maps(with_maps, prefix, spec, sources, hyps)

    alignment, sentinels = Alignment.of(m.decoding.alignment), tuple(m.decoding.sentinels or ())
    sources, refs = [s for s, _ in pairs], [t for _, t in pairs]
    result = {"entry": f"{m.name}/{m.version}", "data": str(args.data / "test.tsv"), "beam": args.beam, "modes": {}}
    for mode in modes:
        texts = [without_tags(s) for s in sources] if mode == "stripped" else sources
        start = time.perf_counter()
        out = translate_all(
            encoder, decoder, tok, spec, texts, args.beam, sentinels, 32, attention, alignment, mode != "searched"
        )
        hyps, finished = [t.text for t in out], [t.finished for t in out]
        r = judge(texts, refs, hyps, finished, mode == "stripped")
        r["spans_by_alignment"] = share([i < sum(t.aligned for t in out) for i in range(sum(t.spans for t in out))])
        r["seconds"] = round(time.perf_counter() - start, 1)
        r["by_spans"] = by_spans(texts, refs, hyps, finished, mode == "stripped")
        many = [i for i, s in enumerate(texts) if sum(x.kind != "tag" for x in find_spans(s)) >= 3]
        r["examples_3plus"] = [
            {"source": texts[i], "translation": hyps[i], "reference": refs[i], "finished": finished[i]}
            for i in many[: args.examples]
        ]
        r["translations"] = [{"translation": h, "finished": f} for h, f in zip(hyps, finished)]
        result["modes"][mode] = r
    print(f"{m.name}/{m.version} on {args.data / 'test.tsv'} ({len(pairs)} messages), beam {args.beam}")
    head = "tags %  spans %  finished %  runaway %  chrF  BLEU(text)  BLEU  compounds (ref)  s"
    print(f"  {'mode':<10} {head}")
    for mode, r in result["modes"].items():
        print(f"  {mode:<10} {_row(r)}  spans placed by alignment: {r['spans_by_alignment']}%")
        for k, g in r["by_spans"].items():
            print(f"    {k + ' spans':<8} {_row(g)}  ({g['sentences']})")
    if args.out:
        args.out.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        print(f"wrote {args.out}", file=sys.stderr)
    return 0


def _row(r: dict) -> str:
    return (
        f"{r['tags']:6.1f} {r['spans']:8.1f} {r['finished']:11.1f} {r['runaway']:10.1f} {r['text']['chrf']:5.1f} "
        f"{r['text']['bleu']:11.1f} {r['bleu_with_spans']:5.1f} {r['compounds']:6d} ({r['reference_compounds']})"
        + (f" {r['seconds']:6.1f}" if "seconds" in r else "")
    )


if __name__ == "__main__":
    run_cli(main)
