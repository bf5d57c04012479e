"""Score a translator entry on a corpus's test split: ``python -m export.evaluate --entry models/translator/3``.

The evaluation the exporter writes into a new entry's manifest (``export/scoring.py``: sacrebleu
BLEU and chrF per source domain and overall, greedy and beam 4, the fixed examples), run on an
entry that already exists: to compare versions on one split, for instance an older version on the
test split of a corpus that has since grown. Prints one line per domain; ``--out FILE`` writes the
whole result as JSON; ``--record KEY`` also writes it into the entry's manifest as
``evaluation.KEY``, with the data's provenance from its ``stats.json`` (how the held-out system
catalogs of ``python -m model.translation.heldout`` are recorded: ``--record heldout``). The graphs
run on onnxruntime's CPU provider, as the exporter runs them.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from contract.decoding import DecoderSpec, session_fn
from contract.manifest import ManifestError, load_entry, read_manifest, write_manifest
from contract.tokenizer import load_tokenizer
from export.common import cpu_session
from export.scoring import ScoringError, evaluate, read_domains
from export.translator import BEAM, corpus_provenance, translate_all
from model.cli import CliError, run_cli
from model.translation.textio import TextFileError, read_tsv


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m export.evaluate", description=__doc__.splitlines()[0])
    p.add_argument("--entry", type=Path, required=True, help="a translator entry, e.g. models/translator/3")
    p.add_argument("--data", type=Path, default=Path("data/translation"), help="corpus folder holding test.tsv")
    p.add_argument("--max-test", type=int, help="score only the first N test pairs (smoke tests)")
    p.add_argument("--out", type=Path, help="write the whole evaluation here as JSON")
    p.add_argument("--record", metavar="KEY", help="also write it into the entry's manifest as evaluation.KEY")
    p.add_argument("--no-progress", action="store_true")
    return p.parse_args(argv)


def translator_and_test_set(entry: Path, data: Path):
    """(the translator entry's manifest, the test pairs of ``data``, each pair's domain), or a one-line error."""
    try:
        m = load_entry(entry).manifest
        pairs, _ = read_tsv(data / "test.tsv")
        domains = read_domains(data, "test", len(pairs))
    except (ManifestError, TextFileError, ScoringError) as e:
        raise CliError(str(e)) from None
    if m.task != "translation":
        raise CliError(f"{entry} is a {m.task} entry, not a translator")
    return m, pairs, domains


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    m, pairs, domains = translator_and_test_set(args.entry, args.data)
    if args.record and args.max_test:
        raise CliError("--record writes the evaluation of a whole test split only: drop --max-test")
    if args.record and not recordable(args.record, m.evaluation):
        raise CliError(f"--record {args.record}: a key of the exporter's own evaluation; choose another")
    pairs, domains = (pairs[: args.max_test], domains[: args.max_test]) if args.max_test else (pairs, domains)
    if not pairs:
        raise CliError(f"{args.data / 'test.tsv'} holds no sentence pairs")
    tok, spec = load_tokenizer(args.entry, m.tokenizer), DecoderSpec.from_manifest(m)
    encoder, decoder = (session_fn(cpu_session(args.entry / m.graph(g).file)) for g in ("encoder", "decoder"))

    def translate(texts: list[str], beam: int) -> tuple[list[str], float]:
        sources = tok.encode_batch(texts, add_eos=True)
        return translate_all(encoder, decoder, sources, spec, tok, beam, not args.no_progress)

    result = evaluate(translate, pairs, domains, BEAM)
    best = f"beam{BEAM}"
    print(f"{m.name}/{m.version} on {args.data / 'test.tsv'} ({len(pairs)} pairs): BLEU / chrF, greedy and beam {BEAM}")
    for name, d in result["domains"].items():
        print(
            f"  {name:<12}{d['sentences']:>6}  greedy {d['greedy']['bleu']:6.2f} / {d['greedy']['chrf']:6.2f}"
            f"  beam {d[best]['bleu']:6.2f} / {d[best]['chrf']:6.2f}"
        )
    print(
        f"  {'overall':<12}{len(pairs):>6}  greedy {result['greedy']['bleu']:6.2f} / {result['greedy']['chrf']:6.2f}"
        f"  beam {result[best]['bleu']:6.2f} / {result[best]['chrf']:6.2f}"
    )
    if args.out:
        args.out.write_text(json.dumps(result, indent=2, ensure_ascii=False), encoding="utf-8")
        print(f"wrote {args.out}", file=sys.stderr)
    if args.record:
        manifest = read_manifest(args.entry)
        manifest["evaluation"][args.record] = {"data": corpus_provenance(args.data), **result}
        print(f"recorded in {write_manifest(args.entry, manifest)} as evaluation.{args.record}", file=sys.stderr)
    return 0


def recordable(key: str, evaluation: dict) -> bool:
    """May ``--record`` write ``evaluation[key]``: a new key, or one an earlier ``--record`` wrote (it
    carries its data's provenance), never one of the exporter's own figures."""
    earlier = evaluation.get(key)
    return earlier is None or isinstance(earlier, dict) and "data" in earlier


if __name__ == "__main__":
    run_cli(main)
