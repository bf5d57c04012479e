"""The out-of-domain test set from the core system tools' catalogs (model/translation/heldout.py)."""

from __future__ import annotations

import hashlib
import json

import pytest

from model.cli import CliError
from model.translation import heldout
from model.translation.corpus import SOURCES
from model.translation.textio import read_tsv, write_tsv
from tests.model.translation.excerpts import build_mo, make_package

# Verbatim from tar 1.34+dfsg-1.2+deb12u1 and git 1:2.39.5-0+deb12u3 (Debian bookworm), de/LC_MESSAGES.
TAR_ENTRIES = [
    ("--stat requires file names", "--stat erfordert Dateinamen"),
    ("--occurrence is meaningless without a file list", "--occurrence ist ohne Dateiliste bedeutungslos"),
    ("--pax-option can be used only on POSIX archives", "--pax-option kann nur mit POSIX-Archiven benutzt werden"),
    ("Record size = %lu block\x00Record size = %lu blocks", "Recordgröße = %lu Block\x00Recordgröße = %lu Blöcke"),
]
GIT_ENTRIES = [
    (" stale (use 'git remote prune' to remove)", " veraltet (benutzen Sie 'git remote prune' zum Löschen)"),
    (" merges with remote %s", " führt mit Remote-Branch %s zusammen"),
]
# One word away from tar's "--occurrence is meaningless without a file list": a near-duplicate.
TRAIN = [("--occurrence is pointless without a file list", "--occurrence ist ohne Dateiliste sinnlos")]


@pytest.fixture
def layout(tmp_path):
    """Every reserved package in a cache as debian.fetch leaves it (catalogs of tar and git, the others
    empty), and a corpus whose training split holds a near-duplicate of one tar message."""
    cache, corpus = tmp_path / "cache", tmp_path / "corpus"
    for packages in heldout.RESERVED.values():
        for p in packages:
            entries = {"tar": TAR_ENTRIES, "git": GIT_ENTRIES}.get(p, [])
            make_package(cache, p, {f"{heldout.LOCALE_DIR}/{p}.mo": build_mo(entries)}, f"{len(p)}.0-1")
    corpus.mkdir()
    write_tsv(corpus / "train.tsv", TRAIN)
    return cache, corpus


def build(cache, corpus, out, *extra: str) -> None:
    args = ["--corpus", str(corpus), "--out", str(out), "--cache", str(cache), "--offline", "--no-progress", *extra]
    assert heldout.main(args) == 0


def test_no_reserved_package_is_ever_trained_on():
    trained = {p for spec in SOURCES.values() for p in spec.packages}
    reserved = {p for packages in heldout.RESERVED.values() for p in packages}
    assert not trained & reserved
    assert {"coreutils", "git", "apt", "dpkg", "bash", "tar", "libc-l10n", "libgtk-3-common"} <= reserved


def test_heldout_set_from_catalog_excerpts(layout, tmp_path):
    cache, corpus = layout
    build(cache, corpus, tmp_path / "out")
    pairs, bad = read_tsv(tmp_path / "out" / "test.tsv")
    domains = (tmp_path / "out" / "test.domains").read_text(encoding="utf-8").splitlines()
    assert bad.total == 0 and len(domains) == len(pairs)
    got = dict(zip(pairs, domains))
    assert got == {  # placeholders left out whole, the near-duplicate of training dropped
        ("--stat requires file names", "--stat erfordert Dateinamen"): "tar",
        (
            "--pax-option can be used only on POSIX archives",
            "--pax-option kann nur mit POSIX-Archiven benutzt werden",
        ): "tar",
        (
            "stale (use 'git remote prune' to remove)",
            "veraltet (benutzen Sie 'git remote prune' zum Löschen)",
        ): "git",
    }
    stats = json.loads((tmp_path / "out" / "stats.json").read_text())
    assert stats["total"] == 3 and stats["excluded"] == {"corpus": str(corpus), "train_pairs": 1}
    assert stats["sources"]["tar"]["packages"] == {"tar": "3.0-1"}
    assert stats["sources"]["gettext"]["packages"] == {"gettext-base": "12.0-1", "gettext": "7.0-1"}
    tar = stats["sources"]["tar"]["stages"]
    assert (tar["extracted"], tar["unique"], tar["unlike_training"], tar["kept"]) == (3, 3, 2, 2)


def test_the_same_packages_give_the_same_bytes_and_the_cap_keeps_the_smallest_hashes(layout, tmp_path):
    cache, corpus = layout
    build(cache, corpus, tmp_path / "a")
    build(cache, corpus, tmp_path / "b")
    for name in ("test.tsv", "test.domains"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    build(cache, corpus, tmp_path / "one", "--per-tool", "1")
    pairs, _ = read_tsv(tmp_path / "one" / "test.tsv")
    tar = ["--stat requires file names", "--pax-option can be used only on POSIX archives"]
    smallest = min(tar, key=lambda s: hashlib.sha256(s.encode()).digest())
    assert [s for s, _ in pairs] == ["stale (use 'git remote prune' to remove)", smallest]  # git comes first


def test_errors_are_one_line(layout, tmp_path):
    cache, corpus = layout
    with pytest.raises(CliError, match="train.tsv"):
        build(cache, tmp_path / "no-corpus", tmp_path / "out")
    (cache / "tar" / ".attnserve-unpacked").unlink()  # not in the cache, and --offline
    with pytest.raises(CliError, match="tar"):
        build(cache, corpus, tmp_path / "out")
    with pytest.raises(CliError, match="per-tool"):
        build(cache, corpus, tmp_path / "out", "--per-tool", "0")
