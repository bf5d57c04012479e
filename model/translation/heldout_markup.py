"""A held-out set of UI messages with inline markup: ``python -m model.translation.heldout_markup``.

It measures whether a translator carries ``<b>…</b>``, ``<a href="…">…</a>``, ``<span …>…</span>`` and
``<br/>`` over intact, on real messages of desktop applications (:data:`MARKUP`: GNOME, Xfce and KDE
programs and a few others) whose German catalogs neither the training corpus nor the other held-out
sets (:data:`~model.translation.heldout.RESERVED`) read. The rules:

- an entry gives one pair: its context goes; a plural entry gives its singular msgid with msgstr[0]
  (:func:`~model.translation.heldout_placeholders.first_form_pairs`); the header and untranslated entries go;
- both sides are whitespace-normalised (``contract.tokenizer.normalize_text``) and nothing else changes;
- the English holds markup: a closing tag that closes an opening one (``contract.placeholders.find_spans``,
  kind ``tag``), or a line break ``<br>``/``<br/>``;
- the German holds exactly the same tags, as a multiset of their texts, and the same other protected
  spans (placeholders, entities, escapes) as the English;
- at most :data:`MAX_CHARS` characters per side and :data:`MAX_SPANS` spans;
- the corpus's pair filters (letters on both sides, no copies, length, length ratio) on the two sides with
  their tags taken out, so that tags count neither as letters nor as words: a message that only wraps one
  word in ``<b>…</b>`` stays, one that is all tags goes;
- one pair per English text (the first tool in :data:`MARKUP` order keeps it);
- no near-duplicate of a training sentence of ``--corpus``: the English is compared as it is, with its spans
  taken out and with them masked (:func:`~model.translation.heldout_placeholders.near_training`);
- at most ``--per-tool`` pairs per tool, those with the smallest sha256 of their English side.

Output in ``--out``: ``test.tsv``, ``test.domains`` (the tool of each pair) and ``stats.json`` (packages
and versions, counts at each step, the tag names kept, the rules).
"""

from __future__ import annotations

import logging
import re
import shlex
import sys
from collections import Counter
from collections.abc import Iterable

from contract.markup import find_tags
from contract.placeholders import TRAINING_SENTINELS, find_spans
from contract.tokenizer import normalize_text
from model.cli import CliError, run_cli
from model.translation import debian
from model.translation.cleaning import PAIR_FILTERS, FilterConfig
from model.translation.heldout import Pair, parser, reserved_catalogs, set_stats, write_set
from model.translation.heldout_placeholders import first_form_pairs, placeholder_set
from model.translation.masking import span_texts
from model.translation.textio import TextFileError

log = logging.getLogger("attnserve.translation.heldout_markup")

# Each tool and the Debian packages that hold its German catalogs (none trained on, none in RESERVED).
MARKUP: dict[str, tuple[str, ...]] = {
    "pidgin": ("pidgin-data",),
    "vlc": ("vlc-l10n",),
    "thunar": ("thunar-data",),
    "gnome-shell": ("gnome-shell-common",),
    "evolution": ("evolution-common",),
    "nm-applet": ("network-manager-gnome",),
    "nautilus": ("nautilus-data",),
    "gnome-software": ("gnome-software-common",),
    "evince": ("evince-common",),
    "gedit": ("gedit-common",),
    "hexchat": ("hexchat-common",),
    "audacity": ("audacity-data",),
    "xfce4-settings": ("xfce4-settings",),
    "gnome-control-center": ("gnome-control-center-data",),
    "konsole": ("konsole",),
    "dolphin": ("dolphin",),
    "okular": ("okular",),
    "ark": ("ark",),
    "gwenview": ("gwenview",),
    "k3b": ("k3b-i18n",),
    "kget": ("kget",),
    "krusader": ("krusader",),
}
PER_TOOL = 30
MAX_CHARS = 300
MAX_SPANS = len(TRAINING_SENTINELS)
_BREAK = re.compile(r"<br\s*/?>", re.IGNORECASE)


def tag_texts(text: str) -> Counter:
    """The tags of ``text`` as a multiset of their texts."""
    return Counter(s.text for s in find_spans(text) if s.kind == "tag")


def has_markup(text: str) -> bool:
    """A closing tag that closes an opening one (``find_spans`` orders it after it), or a line break."""
    return any(
        s.kind == "tag" and ((s.text.startswith("</") and s.after) or _BREAK.fullmatch(s.text))
        for s in find_spans(text)
    )


def untagged(text: str) -> str:
    """``text`` with each tag replaced by a space, whitespace-normalised: what the pair filters look at."""
    spans = [s for s in find_spans(text) if s.kind == "tag"]
    starts, ends = [s.start for s in spans] + [len(text)], [0] + [s.end for s in spans]
    return normalize_text(" ".join(text[a:b] for a, b in zip(ends, starts)))


def markup_pairs(raw: Iterable[Pair], config: FilterConfig) -> tuple[list[Pair], dict[str, int]]:
    """The pairs whose sides carry the same markup and spans and pass the length and pair filters; counts per step."""
    steps = ["extracted", "with_markup", "same_tags", "same_spans", "short", *(name for name, _ in PAIR_FILTERS)]
    stages = dict.fromkeys(steps, 0)
    kept = []
    for english, german in raw:
        stages["extracted"] += 1
        english, german = normalize_text(english), normalize_text(german)
        if not has_markup(english):
            continue
        stages["with_markup"] += 1
        if tag_texts(german) != tag_texts(english):
            continue
        stages["same_tags"] += 1
        if (spans := span_texts(english)) != span_texts(german):
            continue
        stages["same_spans"] += 1
        if max(len(english), len(german)) > MAX_CHARS or spans.total() > MAX_SPANS:
            continue
        stages["short"] += 1
        for name, keep in PAIR_FILTERS:
            if not keep(untagged(english), untagged(german), config):
                break
            stages[name] += 1
        else:
            kept.append((english, german))
    return kept, stages


def tag_names(pairs: Iterable[Pair]) -> dict[str, int]:
    """How often each tag opens (or breaks a line) in the English of ``pairs``, by lower-cased name."""
    return dict(Counter(t.name for en, _ in pairs for t in find_tags(en) if not t.closing).most_common())


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    prog = "python -m model.translation.heldout_markup"
    args = parser(prog, __doc__, "data/translation-heldout-markup", PER_TOOL).parse_args(argv)
    if args.per_tool < 1:
        raise CliError("--per-tool must be at least 1")
    try:
        reserved = reserved_catalogs(args, first_form_pairs, MARKUP)
        pairs, domains, counts = placeholder_set(
            reserved.catalogs, reserved.keys, args.per_tool, FilterConfig(), select=markup_pairs
        )
    except (debian.PackageError, TextFileError, ValueError) as e:
        raise CliError(str(e)) from e
    except OSError as e:
        raise CliError(f"cannot read {e.filename or 'a file'}: {e.strerror or e}") from e
    command = f"{prog} " + shlex.join(argv if argv is not None else sys.argv[1:])
    rules = {"max_chars": MAX_CHARS, "max_spans": MAX_SPANS, "per_tool": args.per_tool, "plural": "msgstr[0]"}
    rules["pair_filters_on"] = "both sides with their tags taken out"
    stats = set_stats(pairs, reserved, counts, args, command, tag_names=tag_names(pairs), rules=rules)
    write_set(args.out, pairs, domains, stats)
    log.info("wrote %s: %d pairs from %d tools", args.out, len(pairs), len(MARKUP))
    return 0


if __name__ == "__main__":
    run_cli(main)
