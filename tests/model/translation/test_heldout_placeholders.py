"""The held-out set of messages with placeholders (model/translation/heldout_placeholders.py)."""

from __future__ import annotations

import hashlib
import json

import pytest

from model.cli import CliError
from model.translation import heldout, heldout_placeholders
from model.translation.textio import read_tsv, write_tsv
from tests.model.translation.excerpts import build_mo, make_package

LONG = "Cannot open %s: " + "the file is far too long to be shown here, " * 8
TAR_ENTRIES = [
    ("--stat requires file names", "--stat erfordert Dateinamen"),  # no placeholder: not for this set
    ("Record size = %lu block\x00Record size = %lu blocks", "Recordgröße = %lu Block\x00Recordgröße = %lu Blöcke"),
    ("%s: Cannot open\n", "%s: Kann nicht geöffnet werden\n"),  # whitespace normalised, nothing else
    ("Cannot read the file %s", "Die Datei %s kann nicht gelesen werden"),  # training holds it without the %s
    ("%s%s argument '%s' too large", "Argument „%3$s“ für %1$s%2$s ist zu groß"),  # spans rewritten: dropped
    (LONG, LONG.replace("Cannot open", "Kann nicht öffnen")),  # over MAX_CHARS
    ("%s: %s", "%s: %s"),  # a copy
]
GIT_ENTRIES = [
    ("could not move %1$s to %2$s", "konnte %2$s nicht nach %1$s verschieben"),  # positional, reordered: kept
    ("use <name> instead of the real target", "<Name> statt echtem Ziel verwenden"),  # the tag translated: dropped
    ("menu\x04_Open %s", "%s ö_ffnen"),  # context dropped, accelerator kept
    ("<b>%s</b> &amp; more", "<b>%s</b> &amp; mehr"),  # markup and entities verbatim
    ("%s: Cannot open", "%s: Öffnen nicht möglich"),  # git comes before tar: this one is kept
    ("missing {name} in config", "{name} fehlt in der Konfiguration"),
]
TRAIN = [("Cannot read the file", "Die Datei kann nicht gelesen werden")]


@pytest.fixture
def layout(tmp_path):
    """Every reserved package in a cache (tar's and git's catalogs, the others empty) and a training corpus."""
    cache, corpus = tmp_path / "cache", tmp_path / "corpus"
    for packages in heldout.RESERVED.values():
        for p in packages:
            entries = {"tar": TAR_ENTRIES, "git": GIT_ENTRIES}.get(p, [])
            make_package(cache, p, {f"{heldout.LOCALE_DIR}/{p}.mo": build_mo(entries)}, "1.0-1")
    corpus.mkdir()
    write_tsv(corpus / "train.tsv", TRAIN)
    return cache, corpus


def build(cache, corpus, out, *extra: str) -> None:
    args = ["--corpus", str(corpus), "--out", str(out), "--cache", str(cache), "--offline", "--no-progress", *extra]
    assert heldout_placeholders.main(args) == 0


def test_only_pairs_carrying_the_same_spans_are_kept_verbatim(layout, tmp_path):
    cache, corpus = layout
    build(cache, corpus, tmp_path / "out")
    pairs, bad = read_tsv(tmp_path / "out" / "test.tsv")
    domains = (tmp_path / "out" / "test.domains").read_text(encoding="utf-8").splitlines()
    assert bad.total == 0
    assert dict(zip(pairs, domains)) == {
        ("Record size = %lu block", "Recordgröße = %lu Block"): "tar",  # msgid with msgstr[0]
        ("%s: Cannot open", "%s: Öffnen nicht möglich"): "git",  # tar's is a duplicate, normalised
        ("could not move %1$s to %2$s", "konnte %2$s nicht nach %1$s verschieben"): "git",
        ("_Open %s", "%s ö_ffnen"): "git",
        ("<b>%s</b> &amp; more", "<b>%s</b> &amp; mehr"): "git",
        ("missing {name} in config", "{name} fehlt in der Konfiguration"): "git",
    }
    stats = json.loads((tmp_path / "out" / "stats.json").read_text())
    assert stats["total"] == 6 and stats["span_kinds"] == {"brace": 1, "entity": 1, "printf": 6, "tag": 2}
    tar, git = stats["sources"]["tar"]["stages"], stats["sources"]["git"]["stages"]
    assert (tar["extracted"], tar["with_spans"], tar["same_spans"], tar["short"], tar["not_copy"]) == (7, 6, 5, 4, 3)
    assert (tar["unique"], tar["unlike_training"], tar["kept"]) == (2, 1, 1)
    assert (git["extracted"], git["same_spans"], git["unique"], git["kept"]) == (6, 5, 5, 5)


def test_the_same_packages_give_the_same_bytes_and_the_cap_keeps_the_smallest_hashes(layout, tmp_path):
    cache, corpus = layout
    build(cache, corpus, tmp_path / "a")
    build(cache, corpus, tmp_path / "b")
    for name in ("test.tsv", "test.domains"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    build(cache, corpus, tmp_path / "one", "--per-tool", "1")
    pairs, _ = read_tsv(tmp_path / "one" / "test.tsv")
    git = [en for en, _ in GIT_ENTRIES if en.startswith(("could", "menu", "<b>", "%s", "missing"))]
    git[git.index("menu\x04_Open %s")] = "_Open %s"
    smallest = min(git, key=lambda s: hashlib.sha256(s.encode()).digest())
    assert [s for s, _ in pairs] == [smallest, "Record size = %lu block"]  # git comes first


@pytest.mark.parametrize(
    "english, near",
    [
        ("Cannot read the file %s", True),  # the training text without its placeholder
        ("Cannot read the file <b>%s</b>", True),
        ("Cannot write the file %s", False),
    ],
)
def test_near_duplicates_of_training_are_found_with_the_spans_out(english, near):
    keys = heldout.training_keys(TRAIN)
    assert heldout_placeholders.near_training(english, keys) is near


def test_errors_are_one_line(layout, tmp_path):
    cache, corpus = layout
    with pytest.raises(CliError, match="train.tsv"):
        build(cache, tmp_path / "no-corpus", tmp_path / "out")
    with pytest.raises(CliError, match="per-tool"):
        build(cache, corpus, tmp_path / "out", "--per-tool", "0")
