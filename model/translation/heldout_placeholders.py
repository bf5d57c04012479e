"""A held-out set of messages that carry placeholders: ``python -m model.translation.heldout_placeholders``.

The plain held-out set (:mod:`model.translation.heldout`) leaves out every message with a run-time
placeholder; this one keeps only such messages, verbatim, to measure whether a translator carries
``%s``, ``%1$d``, ``{name}``, ``<b>…</b>`` or ``&amp;`` over intact. It reads the same reserved
catalogs (the core system tools' German ``.mo`` files, never trained on), with these rules:

- an entry gives one pair: its context goes; a plural entry gives its singular msgid with msgstr[0],
  its other forms are skipped (near-copies of the first); the header and untranslated entries go;
- both sides are whitespace-normalised (``contract.tokenizer.normalize_text``) and nothing else:
  placeholders, markup, entities, escapes and keyboard accelerators (``_Open``, ``&File``) stay
  as they are, since the service handles each of them;
- a pair is kept only when its English side holds protected spans (``contract.placeholders.find_spans``)
  and its German side holds exactly the same ones, as a multiset of span texts (their order may
  differ: ``%1$s``/``%2$s`` may swap). The references come from compiled catalogs, so nearly all do;
- at most :data:`MAX_CHARS` characters per side (the service takes 2,000 characters and 256 tokens by
  default, but the longer messages are usage screens, not sentences) and :data:`MAX_SPANS` spans
  (the sentinels a model has to stand for them);
- the corpus's pair filters (letters on both sides, no copies, length, length ratio);
- one pair per English text (the first tool in :data:`~model.translation.heldout.RESERVED` order keeps it);
- no near-duplicate of a training sentence of ``--corpus`` (the split's link keys, as the plain set):
  the English is compared as it is, with its spans taken out (as the placeholder-free corpus has it)
  and with them masked by the training sentinels (as a corpus built with placeholders has it);
- at most ``--per-tool`` pairs per tool, those with the smallest sha256 of their English side.

Output in ``--out``: ``test.tsv``, ``test.domains`` (the tool of each pair) and ``stats.json``
(packages and versions, counts at each step, span kinds), which ``python -m export.evaluate_placeholders``
scores.
"""

from __future__ import annotations

import logging
import shlex
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Mapping

from contract.placeholders import TRAINING_SENTINELS, find_spans, mask
from contract.tokenizer import normalize_text
from model.cli import CliError, run_cli
from model.translation import debian
from model.translation.cleaning import PAIR_FILTERS, FilterConfig
from model.translation.heldout import (
    RESERVED,
    Pair,
    parser,
    reserved_catalogs,
    sample,
    set_stats,
    write_set,
)
from model.translation.masking import span_texts
from model.translation.split import link_keys
from model.translation.textio import TextFileError

log = logging.getLogger("attnserve.translation.heldout_placeholders")

PER_TOOL = 45
MAX_CHARS = 300
MAX_SPANS = len(TRAINING_SENTINELS)


def first_form_pairs(entries: list[tuple[str, str]]) -> list[Pair]:
    """``(msgid, msgstr[0])`` of each translated entry, context dropped, verbatim."""
    pairs = []
    for msgid, msgstr in entries:
        english, german = msgid.split("\x04", 1)[-1].split("\x00")[0], msgstr.split("\x00")[0]
        if english and german:
            pairs.append((english, german))
    return pairs


def comparable_forms(english: str) -> tuple[str, ...]:
    """The English as it is, without its spans, and with them masked: how a training corpus may hold it."""
    spans = find_spans(english)
    stripped = "".join(
        english[a:b] for a, b in zip([0] + [s.end for s in spans], [s.start for s in spans] + [len(english)])
    )
    return english, stripped, mask(english, TRAINING_SENTINELS).text


def near_training(english: str, keys: set[int]) -> bool:
    return any(hash(key) in keys for form in comparable_forms(english) for key in link_keys(form))


def placeholder_pairs(raw: Iterable[Pair], config: FilterConfig) -> tuple[list[Pair], dict[str, int]]:
    """The pairs whose sides carry the same protected spans and pass the length and pair filters; counts per step."""
    steps = ["extracted", "with_spans", "same_spans", "short", *(name for name, _ in PAIR_FILTERS)]
    stages = dict.fromkeys(steps, 0)
    kept = []
    for english, german in raw:
        stages["extracted"] += 1
        english, german = normalize_text(english), normalize_text(german)
        if not (spans := span_texts(english)):
            continue
        stages["with_spans"] += 1
        if span_texts(german) != spans:
            continue
        stages["same_spans"] += 1
        if max(len(english), len(german)) > MAX_CHARS or spans.total() > MAX_SPANS:
            continue
        stages["short"] += 1
        for name, keep in PAIR_FILTERS:
            if not keep(english, german, config):
                break
            stages[name] += 1
        else:
            kept.append((english, german))
    return kept, stages


def placeholder_set(
    catalogs: Mapping[str, Iterable[Pair]],
    keys: set[int],
    per_tool: int,
    config: FilterConfig,
    select: Callable[[Iterable[Pair], FilterConfig], tuple[list[Pair], dict[str, int]]] | None = None,
) -> tuple[list[Pair], list[str], dict[str, dict]]:
    """(pairs, the tool of each pair, the counts at each step per tool) from each tool's first-form pairs, those
    that ``select`` keeps (default :func:`placeholder_pairs`), each English once, none near training, at most
    ``per_tool`` a tool."""
    select = select or placeholder_pairs
    pairs: list[Pair] = []
    domains: list[str] = []
    counts: dict[str, dict] = {}
    seen: set[str] = set()
    for name, raw in catalogs.items():
        kept, stages = select(raw, config)
        unique = []
        for pair in kept:
            if pair[0] not in seen:
                seen.add(pair[0])
                unique.append(pair)
        unseen = [p for p in unique if not near_training(p[0], keys)]
        chosen = sample(unseen, per_tool)
        stages |= {"unique": len(unique), "unlike_training": len(unseen), "kept": len(chosen)}
        counts[name] = stages
        pairs += chosen
        domains += [name] * len(chosen)
        log.info("%s: %s", name, ", ".join(f"{k} {v}" for k, v in stages.items()))
    return pairs, domains, counts


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    prog = "python -m model.translation.heldout_placeholders"
    args = parser(prog, __doc__, "data/translation-heldout-placeholders", PER_TOOL).parse_args(argv)
    if args.per_tool < 1:
        raise CliError("--per-tool must be at least 1")
    try:
        reserved = reserved_catalogs(args, first_form_pairs)
        pairs, domains, counts = placeholder_set(reserved.catalogs, reserved.keys, args.per_tool, FilterConfig())
    except (debian.PackageError, TextFileError, ValueError) as e:
        raise CliError(str(e)) from e
    except OSError as e:
        raise CliError(f"cannot read {e.filename or 'a file'}: {e.strerror or e}") from e
    stats = set_stats(
        pairs,
        reserved,
        counts,
        args,
        f"{prog} " + shlex.join(argv if argv is not None else sys.argv[1:]),
        span_kinds=dict(sorted(Counter(s.kind for en, _ in pairs for s in find_spans(en)).items())),
        rules={"max_chars": MAX_CHARS, "max_spans": MAX_SPANS, "per_tool": args.per_tool, "plural": "msgstr[0]"},
    )
    write_set(args.out, pairs, domains, stats)
    log.info("wrote %s: %d pairs from %d tools", args.out, len(pairs), len(RESERVED))
    return 0


if __name__ == "__main__":
    run_cli(main)
