"""Build the English->German corpus: ``python -m model.translation.corpus [--out data/translation]``.

Debian packages (or a user's own TSV / aligned files) -> placeholders masked -> cleaning rules ->
sentence alignment -> pair filters -> dedupe -> a deterministic train/valid/test split by a hash of
the cleaned English side -> ``train.tsv``, ``valid.tsv``, ``test.tsv`` (``source<TAB>target``) and
``stats.json``. The same inputs and options always give byte-identical TSV files.

A pair whose sides carry the same protected spans (``%s``, ``{name}``, tags: contract/placeholders.py)
is kept with them masked by the training sentinels ``⟦1⟧`` … ``⟦16⟧`` (model/translation/masking.py);
``--no-placeholders`` builds the corpus as it was before (such strings left out or their
placeholders stripped: the corpus ``translator/3`` was trained on).
"""

from __future__ import annotations

import argparse
import json
import logging
import shlex
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from contract.placeholders import TRAINING_SENTINELS
from model.cli import CliError, run_cli
from model.translation import debian, sources
from model.translation.cleaning import PAIR_FILTERS, FilterConfig, clean_text, dedupe_key
from model.translation.masking import protect_pair, renumber, sentinels, sentinels_agree, space_sentinels
from model.translation.sentences import align_sentences
from model.translation.split import SPLITS, assign_splits
from model.translation.textio import TextFileError, read_aligned, read_tsv, write_tsv

log = logging.getLogger("attnserve.translation.corpus")

Pair = tuple[str, str]


@dataclass(frozen=True)
class SourceSpec:
    """One corpus source: the packages it reads and how its text is treated."""

    packages: tuple[str, ...]
    # (package -> unpacked root, progress, protect: mask placeholders the reader would leave out) -> raw pairs
    read: Callable[[Mapping[str, Path], bool, bool], Iterator[Pair]]
    ui_strings: bool = False  # strip GTK mnemonic underscores
    segment: bool = False  # split paragraphs into sentence pairs


# The game's shared data (help, units, tutorial) and its sixteen story campaigns, one package each.
WESNOTH_CAMPAIGNS = (
    "did",
    "dm",
    "dw",
    "ei",
    "httt",
    "l",
    "low",
    "nr",
    "sof",
    "sota",
    "sotbe",
    "thot",
    "trow",
    "tsg",
    "ttb",
    "utbs",
)
WESNOTH_PACKAGES = ("wesnoth-1.16-data", *(f"wesnoth-1.16-{c}" for c in WESNOTH_CAMPAIGNS))


def catalogs(
    package: str, subdir: str, pairs_of: Callable[[list[tuple[str, str]]], list[Pair]], ui_strings: bool = False
) -> SourceSpec:
    """A source made of one package's German ``.mo`` catalogs under ``subdir``, read by ``pairs_of``."""
    return SourceSpec(
        (package,),
        lambda roots, p, protect: sources.read_game_catalogs([roots[package]], subdir, p, pairs_of, protect),
        ui_strings=ui_strings,
        segment=True,
    )


SOURCES: dict[str, SourceSpec] = {
    "ding": SourceSpec(("trans-de-en",), lambda roots, p, _: sources.read_ding(roots["trans-de-en"], p)),
    "help": SourceSpec(
        ("libreoffice-help-en-us", "libreoffice-help-de"),
        lambda roots, p, _: sources.read_help(roots["libreoffice-help-en-us"], roots["libreoffice-help-de"], p),
        segment=True,
    ),
    "ui": SourceSpec(
        ("libreoffice-l10n-de",),
        lambda roots, p, _: sources.read_ui_catalogs(roots["libreoffice-l10n-de"], p),
        ui_strings=True,
        segment=True,
    ),
    "wesnoth": SourceSpec(
        WESNOTH_PACKAGES,
        lambda roots, p, protect: sources.read_game_catalogs(
            list(roots.values()), sources.WESNOTH_LOCALE_DIR, p, protect=protect
        ),
        segment=True,
    ),
    "freeciv": catalogs("freeciv-data", sources.FREECIV_LOCALE_DIR, sources.game_message_pairs, ui_strings=True),
    "cataclysm": catalogs("cataclysm-dda-data", sources.CATACLYSM_LOCALE_DIR, sources.placeholder_free_pairs),
    "widelands": catalogs("widelands-data", sources.WIDELANDS_LOCALE_DIR, sources.placeholder_free_pairs),
    "tuxpaint": SourceSpec(
        ("tuxpaint-stamps-default",),
        lambda roots, p, _: sources.read_stamps(roots["tuxpaint-stamps-default"], p),
    ),
    "naev": catalogs("naev-data", sources.NAEV_LOCALE_DIR, sources.naev_pairs),
    "freedroid": catalogs("freedroidrpg-data", sources.FREEDROID_LOCALE_DIR, sources.freedroid_pairs),
    "freedink": catalogs("freedink-data", sources.FREEDINK_LOCALE_DIR, sources.freedink_pairs),
}


@dataclass
class SourceReport:
    """What happened to one source's pairs; becomes its entry in stats.json."""

    stages: dict[str, int] = field(default_factory=dict)  # pairs left after each step, in order
    splits: Counter = field(default_factory=Counter)
    info: dict = field(default_factory=dict)  # packages and versions, or the user's files and bad lines
    placeholders: dict = field(default_factory=dict)  # kept pairs whose placeholders are masked, and their sentinels

    def as_dict(self) -> dict:
        masked = {"placeholders": self.placeholders} if self.placeholders else {}
        return {**self.info, "stages": self.stages, **masked, "splits": {s: self.splits[s] for s in SPLITS}}


@dataclass
class SourceInput:
    """Raw pairs of one source on their way into :func:`build`, with how to treat them."""

    pairs: Iterable[Pair]
    report: SourceReport
    ui_strings: bool = False
    segment: bool = False


def clean_pairs(
    raw: Iterable[Pair], *, ui_strings: bool, segment: bool, config: FilterConfig, pool: Sequence[str] = ()
) -> tuple[list[Pair], dict[str, int]]:
    """Clean both sides, split into sentence pairs, then keep pairs passing every filter; count each step.

    With a sentinel ``pool``, a pair whose sides carry the same protected spans is masked before cleaning
    (the readers of catalogs have masked theirs already), and a sentence pair is kept only when both its
    sides hold the same sentinels (``same_sentinels``: splitting may part them), renumbered from the first."""
    steps = ["extracted", "cleaned", "sentences", *(["same_sentinels"] if pool else []), *(n for n, _ in PAIR_FILTERS)]
    stages = dict.fromkeys(steps, 0)
    kept = []
    for source, target in raw:
        stages["extracted"] += 1
        if pool and (masked := protect_pair(source, target, pool)):
            source, target = masked
        source, target = clean_text(source, ui_strings=ui_strings), clean_text(target, ui_strings=ui_strings)
        if not source or not target:
            continue
        stages["cleaned"] += 1
        for s, t in align_sentences(source, target) if segment else [(source, target)]:
            stages["sentences"] += 1
            if pool:
                if not sentinels_agree(s, t):
                    continue
                stages["same_sentinels"] += 1
                s, t = (space_sentinels(side) for side in renumber(s, t, pool))
            for name, keep in PAIR_FILTERS:
                if not keep(s, t, config):
                    break
                stages[name] += 1
            else:
                kept.append((s, t))
    return kept, stages


def build(
    inputs: Mapping[str, SourceInput],
    config: FilterConfig,
    valid_fraction: float,
    test_fraction: float,
    max_group: int = 500,
    pool: Sequence[str] = (),
) -> tuple[dict[str, list[Pair]], dict[str, list[str]], dict[str, int]]:
    """Clean (masking placeholders with ``pool``'s sentinels), dedupe (the first source to bring a pair
    keeps it) and split near-duplicate groups whole.

    Returns the pairs of each split, the source name of each of those pairs, and the grouping's
    counts; fills each input's report.
    """
    pairs: list[Pair] = []
    origin: list[str] = []
    seen: set[tuple[str, str]] = set()
    for name, source in inputs.items():
        report = source.report
        kept, report.stages = clean_pairs(
            source.pairs, ui_strings=source.ui_strings, segment=source.segment, config=config, pool=pool
        )
        unique = masked = masks = 0
        for pair in kept:
            if (key := dedupe_key(*pair)) in seen:
                continue
            seen.add(key)
            unique += 1
            if found := len(sentinels(pair[0])):
                masked, masks = masked + 1, masks + found
            pairs.append(pair)
            origin.append(name)
        report.stages["unique"] = unique
        if pool:
            report.placeholders = {"pairs": masked, "sentinels": masks}
        log.info("%s: %s", name, ", ".join(f"{k} {v}" for k, v in report.stages.items()))
    assigned, grouping = assign_splits([s for s, _ in pairs], valid_fraction, test_fraction, max_group)
    splits: dict[str, list[Pair]] = {s: [] for s in SPLITS}
    domains: dict[str, list[str]] = {s: [] for s in SPLITS}
    for pair, name, split in zip(pairs, origin, assigned):
        splits[split].append(pair)
        domains[split].append(name)
        inputs[name].report.splits[split] += 1
    return splits, domains, grouping


def package_inputs(
    names: list[str], cache: Path, *, offline: bool, refresh: bool, progress: bool, protect: bool = True
) -> dict[str, SourceInput]:
    """Fetch the packages of the chosen sources and wire their readers into :func:`build`'s inputs
    (``protect``: the catalog readers mask the placeholders they would otherwise leave out)."""
    inputs = {}
    for name in names:
        spec = SOURCES[name]
        unpacked = {p: debian.fetch(p, cache, offline=offline, refresh=refresh) for p in spec.packages}
        report = SourceReport(info={"packages": {p: u.version for p, u in unpacked.items()}})
        roots = {p: u.root for p, u in unpacked.items()}
        inputs[name] = SourceInput(spec.read(roots, progress, protect), report, spec.ui_strings, spec.segment)
    return inputs


def user_inputs(args: argparse.Namespace) -> dict[str, SourceInput]:
    """A user's TSV or aligned files as the single source ``user``; bad lines are reported, then skipped."""
    if args.tsv:
        pairs, bad = read_tsv(args.tsv)
        files = [str(args.tsv)]
    else:
        pairs, bad = read_aligned(args.source, args.target)
        files = [str(args.source), str(args.target)]
    if bad.total:
        log.warning("%s: %s", " + ".join(files), bad.summary())
    report = SourceReport(info={"files": files, "bad_lines": bad.as_dict()})
    return {"user": SourceInput(pairs, report)}


def write_outputs(out: Path, splits: dict[str, list[Pair]], domains: dict[str, list[str]], stats: dict) -> None:
    """``{split}.tsv`` and, aligned line by line with it, ``{split}.domains`` (the source of each pair)."""
    out.mkdir(parents=True, exist_ok=True)
    for split, pairs in splits.items():
        write_tsv(out / f"{split}.tsv", pairs)
        (out / f"{split}.domains").write_text("".join(f"{d}\n" for d in domains[split]), encoding="utf-8")
    (out / "stats.json").write_text(json.dumps(stats, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m model.translation.corpus", description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("data/translation"), help="output folder (default: %(default)s)")
    p.add_argument(
        "--cache", type=Path, default=Path("data/cache"), help="downloaded and unpacked packages (default: %(default)s)"
    )
    p.add_argument("--sources", default=",".join(SOURCES), help="comma-separated subset of %(default)s")
    p.add_argument("--offline", action="store_true", help="use only packages already in the cache; never call apt-get")
    p.add_argument("--refresh", action="store_true", help="download and unpack again even when cached")
    own = p.add_argument_group("your own data instead of the Debian packages")
    own.add_argument("--tsv", type=Path, help="source<TAB>target, one pair a line")
    own.add_argument("--source", type=Path, help="source sentences, one a line (with --target)")
    own.add_argument("--target", type=Path, help="target sentences, aligned with --source line by line")
    p.add_argument("--valid-fraction", type=float, default=0.02)
    p.add_argument("--test-fraction", type=float, default=0.02)
    p.add_argument(
        "--max-group", type=int, default=500, help="larger near-duplicate groups go to train (default: %(default)s)"
    )
    defaults = FilterConfig()
    for name, value in defaults.as_dict().items():
        p.add_argument(
            f"--{name.replace('_', '-')}",
            type=type(value),
            default=value,
            help="filter threshold (default: %(default)s)",
        )
    p.add_argument(
        "--no-placeholders",
        action="store_true",
        help="leave strings with placeholders out (or strip them) instead of masking them: the corpus before masking",
    )
    p.add_argument("--no-progress", action="store_true")
    return p.parse_args(argv)


def check_args(args: argparse.Namespace) -> list[str]:
    """Refuse contradictory options up front; returns the chosen package sources."""
    if args.tsv and (args.source or args.target):
        raise CliError("give either --tsv FILE or --source FILE --target FILE, not both")
    if bool(args.source) != bool(args.target):
        raise CliError("--source and --target go together: two files aligned line by line")
    if not (
        0 < args.valid_fraction < 1 and 0 < args.test_fraction < 1 and args.valid_fraction + args.test_fraction < 1
    ):
        raise CliError("--valid-fraction and --test-fraction must be in (0, 1) and add up to less than 1")
    names = [n.strip() for n in args.sources.split(",") if n.strip()]
    unknown = sorted(set(names) - set(SOURCES))
    if unknown or not names:
        raise CliError(f"unknown source {', '.join(unknown) or '(none given)'}: choose from {', '.join(SOURCES)}")
    return names


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    args = parse_args(argv)
    names = check_args(args)
    config = FilterConfig(**{k: getattr(args, k) for k in FilterConfig().as_dict()})
    pool = () if args.no_placeholders else TRAINING_SENTINELS
    try:
        if args.tsv or args.source:
            inputs = user_inputs(args)
        else:
            inputs = package_inputs(
                names,
                args.cache,
                offline=args.offline,
                refresh=args.refresh,
                progress=not args.no_progress,
                protect=bool(pool),
            )
        splits, domains, grouping = build(inputs, config, args.valid_fraction, args.test_fraction, args.max_group, pool)
    except (debian.PackageError, TextFileError) as e:
        raise CliError(str(e)) from e
    except OSError as e:  # an unreadable file inside an unpacked package
        raise CliError(f"cannot read {e.filename or 'a package file'}: {e.strerror or e}") from e
    reports = {name: source.report for name, source in inputs.items()}
    total = sum(len(p) for p in splits.values())
    if total == 0:
        read = sum(r.stages.get("extracted", 0) for r in reports.values())
        raise CliError(f"empty corpus: no sentence pair left after cleaning and filtering ({read} read)")
    for split, pairs in splits.items():
        if not pairs:
            log.warning("the %s split is empty: add data or raise --%s-fraction", split, split)
    stats = {
        "direction": {"source": "en", "target": "de"} if "user" not in reports else None,
        "total": total,
        "splits": {s: len(splits[s]) for s in SPLITS},
        "sources": {name: r.as_dict() for name, r in reports.items()},
        "filters": config.as_dict(),
        "placeholders": {"masked": bool(pool), "sentinels": list(pool)},
        "split": {
            "valid_fraction": args.valid_fraction,
            "test_fraction": args.test_fraction,
            "max_group": args.max_group,
            **grouping,
            "rule": "near-duplicate groups (model/translation/split.py) go to one split whole: sha256 of the "
            "group's smallest mask, first 8 bytes / 2**64; groups over max_group go to train",
        },
        "command": "python -m model.translation.corpus " + shlex.join(argv if argv is not None else sys.argv[1:]),
    }
    write_outputs(args.out, splits, domains, stats)
    log.info("wrote %s: %s", args.out, ", ".join(f"{s} {len(splits[s])}" for s in SPLITS))
    return 0


if __name__ == "__main__":
    run_cli(main)
