"""An out-of-domain test set: ``python -m model.translation.heldout --corpus data/translation``.

The German catalogs of the core system tools (coreutils, git, apt, dpkg, bash, tar, grep, findutils,
diffutils, GLib/GTK, GnuPG, man-db, the C library, make, gettext, PackageKit, AppStream) are never
trained on: the corpus builder reads none of their packages. Scoring a translator on them says how
it does on software text it has not seen, beside the in-domain test split.

Their messages are read as the game catalogs are (strings with run-time placeholders such as
``%s`` left out whole), cleaned and split into sentences as the corpus is, deduplicated, and every
pair that is a near-duplicate of a training sentence of ``--corpus`` (the split's link keys:
equal words, equal masks, masks one word apart) is dropped. At most ``--per-tool`` pairs are
kept per tool, those with the smallest sha256 of their English side, so the same packages always
give the same set. Output: ``test.tsv``, ``test.domains`` (the tool of each pair) and ``stats.json``
(packages and versions, counts at each step) in ``--out``, which ``python -m export.evaluate
--data`` scores.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import shlex
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import NamedTuple

from model.cli import CliError, run_cli
from model.translation import debian, sources
from model.translation.cleaning import FilterConfig, dedupe_key
from model.translation.corpus import clean_pairs
from model.translation.split import link_keys
from model.translation.textio import TextFileError, read_tsv, write_tsv

log = logging.getLogger("attnserve.translation.heldout")

Pair = tuple[str, str]

LOCALE_DIR = "usr/share/locale/de/LC_MESSAGES"
# Each tool and the Debian packages that hold its German catalogs (gettext: runtime and tools).
RESERVED: dict[str, tuple[str, ...]] = {
    "coreutils": ("coreutils",),
    "git": ("git",),
    "apt": ("apt",),
    "dpkg": ("dpkg",),
    "bash": ("bash",),
    "tar": ("tar",),
    "grep": ("grep",),
    "findutils": ("findutils",),
    "diffutils": ("diffutils",),
    "glib": ("libglib2.0-data",),
    "gtk": ("libgtk-3-common",),
    "gnupg": ("gnupg-l10n",),
    "man-db": ("man-db",),
    "libc": ("libc-l10n",),
    "make": ("make",),
    "gettext": ("gettext-base", "gettext"),
    "packagekit": ("packagekit",),
    "appstream": ("appstream",),
}
PER_TOOL = 200


def training_keys(train: Iterable[Pair]) -> set[int]:
    """Hashes of the link keys of every training English sentence (hashes: 2M tuples would not fit lightly)."""
    return {hash(key) for source, _ in train for key in link_keys(source)}


def near_training(source: str, keys: set[int]) -> bool:
    return any(hash(key) in keys for key in link_keys(source))


def sample(pairs: list[Pair], count: int) -> list[Pair]:
    """The ``count`` pairs with the smallest sha256 of their English side (all of them if fewer)."""
    return sorted(pairs, key=lambda p: hashlib.sha256(p[0].encode()).digest())[:count]


def heldout_set(
    catalogs: Mapping[str, Iterable[Pair]], keys: set[int], per_tool: int, config: FilterConfig
) -> tuple[list[Pair], list[str], dict[str, dict]]:
    """(pairs, the tool of each pair, the counts at each step per tool) from each tool's raw catalog pairs."""
    pairs: list[Pair] = []
    domains: list[str] = []
    counts: dict[str, dict] = {}
    seen: set[tuple[str, str]] = set()
    for name, raw in catalogs.items():
        kept, stages = clean_pairs(raw, ui_strings=True, segment=True, config=config)
        unique = []
        for pair in kept:
            if (key := dedupe_key(*pair)) not in seen:
                seen.add(key)
                unique.append(pair)
        unseen = [p for p in unique if not near_training(p[0], keys)]
        chosen = sample(unseen, per_tool)
        stages |= {"unique": len(unique), "unlike_training": len(unseen), "kept": len(chosen)}
        counts[name] = stages
        pairs += chosen
        domains += [name] * len(chosen)
        log.info("%s: %s", name, ", ".join(f"{k} {v}" for k, v in stages.items()))
    return pairs, domains, counts


def parser(prog: str, doc: str, out: str, per_tool: int) -> argparse.ArgumentParser:
    """The options every held-out set takes: the corpus it excludes, where it goes, the package cache, the cap."""
    p = argparse.ArgumentParser(prog=prog, description=doc.splitlines()[0])
    p.add_argument("--corpus", type=Path, default=Path("data/translation"), help="corpus whose train.tsv is excluded")
    p.add_argument("--out", type=Path, default=Path(out), help="output folder (default: %(default)s)")
    p.add_argument("--cache", type=Path, default=Path("data/cache"), help="downloaded and unpacked packages")
    p.add_argument("--per-tool", type=int, default=per_tool, help="pairs kept per tool (default: %(default)s)")
    p.add_argument("--offline", action="store_true", help="use only packages already in the cache; never call apt-get")
    p.add_argument("--refresh", action="store_true", help="download and unpack again even when cached")
    p.add_argument("--no-progress", action="store_true")
    return p


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    args = parser("python -m model.translation.heldout", __doc__, "data/translation-heldout", PER_TOOL).parse_args(argv)
    if args.per_tool < 1:
        raise CliError("--per-tool must be at least 1")
    return args


def fetch_reserved(
    args: argparse.Namespace, tools: Mapping[str, tuple[str, ...]] = RESERVED
) -> dict[str, list[debian.Unpacked]]:
    """Each tool's packages, from the cache or apt (``--cache``, ``--offline``, ``--refresh``)."""
    return {
        name: [debian.fetch(p, args.cache, offline=args.offline, refresh=args.refresh) for p in packages]
        for name, packages in tools.items()
    }


class Reserved(NamedTuple):
    keys: set[int]  # the link keys of the training corpus' English sentences
    train_pairs: int
    unpacked: dict[str, list[debian.Unpacked]]  # each tool's packages
    catalogs: dict[str, Iterable[Pair]]  # each tool's catalog pairs


def reserved_catalogs(
    args: argparse.Namespace, pairs_of=sources.game_message_pairs, tools: Mapping[str, tuple[str, ...]] = RESERVED
) -> Reserved:
    """What the held-out sets are drawn from: the reserved tools' catalogs (``pairs_of`` reads a catalog's
    entries; ``tools``, other packages than :data:`RESERVED`), and the training corpus (``--corpus``)
    whose near-duplicates they leave out."""
    train, _ = read_tsv(args.corpus / "train.tsv")
    unpacked = fetch_reserved(args, tools)
    catalogs = {
        name: sources.read_game_catalogs([u.root for u in found], LOCALE_DIR, not args.no_progress, pairs_of)
        for name, found in unpacked.items()
    }
    return Reserved(training_keys(train), len(train), unpacked, catalogs)


def set_stats(
    pairs: list[Pair], reserved: Reserved, counts: dict, args: argparse.Namespace, command: str, **extra
) -> dict:
    """A held-out set's ``stats.json``: its size, ``extra``, each tool's packages and counts, what it excludes."""
    return {
        "direction": {"source": "en", "target": "de"},
        "total": len(pairs),
        "splits": {"test": len(pairs)},
        **extra,
        "sources": {
            name: {"packages": {u.name: u.version for u in found}, "stages": counts[name]}
            for name, found in reserved.unpacked.items()
        },
        "excluded": {"corpus": str(args.corpus), "train_pairs": reserved.train_pairs},
        "command": command,
    }


def write_set(out: Path, pairs: list[Pair], domains: list[str], stats: dict) -> None:
    """``test.tsv``, ``test.domains`` (the tool of each pair) and ``stats.json``, as ``export.evaluate`` reads them."""
    out.mkdir(parents=True, exist_ok=True)
    write_tsv(out / "test.tsv", pairs)
    (out / "test.domains").write_text("".join(f"{d}\n" for d in domains), encoding="utf-8")
    (out / "stats.json").write_text(json.dumps(stats, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    args = parse_args(argv)
    try:
        reserved = reserved_catalogs(args)
        pairs, domains, counts = heldout_set(reserved.catalogs, reserved.keys, args.per_tool, FilterConfig())
    except (debian.PackageError, TextFileError, ValueError) as e:
        raise CliError(str(e)) from e
    except OSError as e:
        raise CliError(f"cannot read {e.filename or 'a file'}: {e.strerror or e}") from e
    command = "python -m model.translation.heldout " + shlex.join(argv if argv is not None else sys.argv[1:])
    stats = set_stats(pairs, reserved, counts, args, command)
    write_set(args.out, pairs, domains, stats)
    log.info("wrote %s: %d pairs from %d tools", args.out, len(pairs), len(RESERVED))
    return 0


if __name__ == "__main__":
    run_cli(main)
