"""The held-out set of messages with inline markup (model/translation/heldout_markup.py)."""

from __future__ import annotations

import hashlib
import json

import pytest

from model.cli import CliError
from model.translation import heldout, heldout_markup, heldout_placeholders
from model.translation.corpus import SOURCES
from model.translation.textio import read_tsv, write_tsv
from tests.model.translation.excerpts import build_mo, make_package

SITE = ('See <a href="https://www.videolan.org/">the site</a>', 'Siehe <a href="https://www.videolan.org/">Website</a>')
LONG = "<b>Cannot open</b> " + "the file is far too long to be shown here, " * 8
PIDGIN_ENTRIES = [
    ("Unable to connect", "Verbindung nicht möglich"),  # no markup: not for this set
    ("<b>Account:</b> %s", "<b>Konto:</b> %s"),  # markup and a placeholder, both kept
    ("<b>Buddy</b>\x00<b>Buddies</b>", "<b>Buddy</b>\x00<b>Buddys</b>"),  # msgid with msgstr[0]: a copy
    ("Line one<br>Line  two", "Zeile eins<br>Zeile\nzwei"),  # a line break; whitespace normalised
    ("<i>Unknown</i> account", "Unbekanntes Konto"),  # the German lost the tags: dropped
    ("<b>Name</b> %s", "<b>Name</b>"),  # the German lost the placeholder: dropped
    ("<b></b>", "<b></b>"),  # only tags: no letters
    ("<span weight='bold'>Cannot read the file</span>", "<span weight='bold'>Datei nicht lesbar</span>"),
    (LONG, LONG.replace("Cannot open", "Kann nicht öffnen")),  # over MAX_CHARS
    ("Use <tt>x</tt> instead", "<tt>x</tt> stattdessen verwenden"),
]
VLC_ENTRIES = [
    ("Use <tt>x</tt> instead", "Nehmen Sie <tt>x</tt>"),  # pidgin comes first: its pair is kept
    SITE,
    ("menu\x04<b>Bold</b>", "<b>Fett</b>"),  # context dropped; a whole-message wrap is kept
    ("Press <i>Play</i> to start", "Drücken Sie <b>Abspielen</b>"),  # another tag: dropped
]
TRAIN = [("Cannot read the file", "Die Datei kann nicht gelesen werden")]


@pytest.fixture
def layout(tmp_path):
    """Every markup package in a cache (pidgin's and vlc's catalogs, the others empty) and a training corpus."""
    cache, corpus = tmp_path / "cache", tmp_path / "corpus"
    for packages in heldout_markup.MARKUP.values():
        for p in packages:
            entries = {"pidgin-data": PIDGIN_ENTRIES, "vlc-l10n": VLC_ENTRIES}.get(p, [])
            make_package(cache, p, {f"{heldout.LOCALE_DIR}/{p}.mo": build_mo(entries)}, "1.0-1")
    corpus.mkdir()
    write_tsv(corpus / "train.tsv", TRAIN)
    return cache, corpus


def build(cache, corpus, out, *extra: str) -> None:
    args = ["--corpus", str(corpus), "--out", str(out), "--cache", str(cache), "--offline", "--no-progress", *extra]
    assert heldout_markup.main(args) == 0


def test_no_markup_package_is_trained_on_or_reserved():
    markup = {p for packages in heldout_markup.MARKUP.values() for p in packages}
    trained = {p for spec in SOURCES.values() for p in spec.packages}
    reserved = {p for packages in heldout.RESERVED.values() for p in packages}
    assert not markup & (trained | reserved)


def test_only_pairs_carrying_the_same_markup_are_kept_verbatim(layout, tmp_path):
    cache, corpus = layout
    build(cache, corpus, tmp_path / "out")
    pairs, bad = read_tsv(tmp_path / "out" / "test.tsv")
    domains = (tmp_path / "out" / "test.domains").read_text(encoding="utf-8").splitlines()
    assert bad.total == 0
    assert dict(zip(pairs, domains)) == {
        ("<b>Account:</b> %s", "<b>Konto:</b> %s"): "pidgin",
        ("Line one<br>Line two", "Zeile eins<br>Zeile zwei"): "pidgin",
        ("Use <tt>x</tt> instead", "<tt>x</tt> stattdessen verwenden"): "pidgin",
        SITE: "vlc",
        ("<b>Bold</b>", "<b>Fett</b>"): "vlc",
    }
    stats = json.loads((tmp_path / "out" / "stats.json").read_text())
    assert stats["total"] == 5 and stats["tag_names"] == {"b": 2, "br": 1, "tt": 1, "a": 1}
    assert stats["sources"]["pidgin"]["packages"] == {"pidgin-data": "1.0-1"}
    pidgin, vlc = stats["sources"]["pidgin"]["stages"], stats["sources"]["vlc"]["stages"]
    assert (pidgin["extracted"], pidgin["with_markup"], pidgin["same_tags"], pidgin["same_spans"]) == (10, 9, 8, 7)
    assert (pidgin["short"], pidgin["has_letters"], pidgin["not_copy"], pidgin["ratio"]) == (6, 5, 4, 4)
    assert (pidgin["unique"], pidgin["unlike_training"], pidgin["kept"]) == (4, 3, 3)
    assert (vlc["extracted"], vlc["same_tags"], vlc["ratio"], vlc["unique"], vlc["kept"]) == (4, 3, 3, 2, 2)


@pytest.mark.parametrize(
    "english, german, kept",
    [
        ("<b>Warning:</b> disk full", "<b>Warnung:</b> Platte voll", True),
        ("Warning: <br/>disk full", "Warnung: <br/>Platte voll", True),
        ("Warning: disk full", "Warnung: Platte voll", False),  # no markup
        ("Warning: <b>disk full", "Warnung: <b>Platte voll", False),  # an opening tag alone is not paired markup
        ("<b>Warning:</b> disk full", "Warnung: Platte voll", False),  # the German lost the tags
        ("<b>Warning:</b> disk full", "<B>Warnung:</B> Platte voll", False),  # tags rewritten
        ("<b>Warning:</b> %s full", "<b>Warnung:</b> voll", False),  # the German lost a placeholder
        ("<b>OK</b>", "<b>OK</b>", False),  # a copy
        ("<b>%s</b>", "<b>%s</b>", False),  # letters only inside the tags
        ("<b>Bold</b>", "<b>Fett</b>", True),  # a whole-message wrap
    ],
)
def test_the_pair_rules(english, german, kept):
    pairs, _ = heldout_markup.markup_pairs([(english, german)], heldout_markup.FilterConfig())
    assert bool(pairs) is kept


def test_the_same_packages_give_the_same_bytes_and_the_cap_keeps_the_smallest_hashes(layout, tmp_path):
    cache, corpus = layout
    build(cache, corpus, tmp_path / "a")
    build(cache, corpus, tmp_path / "b")
    for name in ("test.tsv", "test.domains"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    build(cache, corpus, tmp_path / "one", "--per-tool", "1")
    pairs, _ = read_tsv(tmp_path / "one" / "test.tsv")
    pidgin = ["<b>Account:</b> %s", "Line one<br>Line two", "Use <tt>x</tt> instead"]
    vlc = [SITE[0], "<b>Bold</b>"]
    smallest = [min(tool, key=lambda s: hashlib.sha256(s.encode()).digest()) for tool in (pidgin, vlc)]
    assert [s for s, _ in pairs] == smallest  # pidgin comes first


@pytest.mark.parametrize(
    "english, near",
    [
        ("Cannot read the file", True),
        ("<span weight='bold'>Cannot read the file</span>", True),  # the training text with its tags out
        ("<b>Cannot write the file</b>", False),
    ],
)
def test_near_duplicates_of_training_are_dropped(english, near):
    keys = heldout.training_keys(TRAIN)
    assert heldout_placeholders.near_training(english, keys) is near


def test_errors_are_one_line(layout, tmp_path):
    cache, corpus = layout
    with pytest.raises(CliError, match="train.tsv"):
        build(cache, tmp_path / "no-corpus", tmp_path / "out")
    with pytest.raises(CliError, match="per-tool"):
        build(cache, corpus, tmp_path / "out", "--per-tool", "0")
