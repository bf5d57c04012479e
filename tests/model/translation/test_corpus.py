"""The corpus builder as a user meets it: outputs, deterministic leak-free splits, own data, and clear errors."""

from __future__ import annotations

import json
import shutil
from collections import defaultdict
from pathlib import Path

import pytest

from model.cli import run_cli
from model.translation import corpus, debian, sources
from model.translation.split import link_keys
from tests.ci import missing, needs_tool
from tests.conftest import run_module


def run(argv: list[str], capsys) -> tuple[int, str]:
    """``python -m model.translation.corpus ARGV`` in-process: exit status and stderr."""
    with pytest.raises(SystemExit) as exited:
        run_cli(corpus.main, [*map(str, argv), "--no-progress"])
    return exited.value.code, capsys.readouterr().err


def read_splits(out: Path) -> dict[str, list[tuple[str, str]]]:
    return {
        s: [tuple(line.split("\t")) for line in (out / f"{s}.tsv").read_text("utf-8").splitlines()]
        for s in corpus.SPLITS
    }


def test_builder_on_package_excerpts(excerpt_cache, tmp_path, capsys):
    """The corpus as it was before placeholders were masked (``--no-placeholders``), pair for pair."""
    out = tmp_path / "out"
    code, _ = run(["--cache", excerpt_cache, "--out", out, "--offline", "--no-placeholders"], capsys)
    assert code == 0
    stats = json.loads((out / "stats.json").read_text())
    pairs = [p for split in read_splits(out).values() for p in split]
    assert all(len(p) == 2 and all(p) for p in pairs)
    assert stats["total"] == len(pairs) == 54
    assert stats["splits"] == {s: len(v) for s, v in read_splits(out).items()}
    ding, help_, ui = (stats["sources"][name] for name in ("ding", "help", "ui"))
    assert ding["packages"] == {"trans-de-en": "1.9-6"}
    assert ding["stages"]["extracted"] == ding["stages"]["unique"] == 7
    assert help_["stages"]["extracted"] == 7 and help_["stages"]["sentences"] == 9  # one paragraph -> 3 sentences
    assert ui["stages"] == {
        "extracted": 8,
        "cleaned": 8,
        "sentences": 9,
        "has_letters": 9,
        "not_copy": 8,
        "length": 8,
        "ratio": 8,
        "unique": 8,
    }
    assert {p for p in pairs if p in UI_CLEANED} == UI_CLEANED
    wesnoth, freeciv, tuxpaint = (stats["sources"][name] for name in ("wesnoth", "freeciv", "tuxpaint"))
    assert wesnoth["packages"]["wesnoth-1.16-httt"] == "1:1.16.9-1" and len(wesnoth["packages"]) == 17
    assert wesnoth["stages"]["unique"] == 3  # "Editor" -> "Editor" is a copy
    assert ("Multiplayer and undo", "Mehrspieler und die Rückgängig-Funktion") in pairs
    assert freeciv["stages"]["unique"] == 3 and ("Keep current soundset", "Derzeitiges Sound-Set beibehalten") in pairs
    cataclysm, widelands = stats["sources"]["cataclysm"], stats["sources"]["widelands"]
    assert cataclysm["packages"] == {"cataclysm-dda-data": "0.F-3-9"} and cataclysm["stages"]["unique"] == 6
    assert ("Very dangerous.", "Sehr gefährlich.") in pairs  # colour markup gone, placeholders left out before
    assert widelands["packages"] == {"widelands-data": "2:1.1-3"} and widelands["stages"]["unique"] == 3
    assert ("Captain Thanlas the Elder, Explorer", "Kapitän Thanlas der Ältere, Entdecker") in pairs
    assert not any("npcname" in en or "%1%" in en for en, _ in pairs)
    assert tuxpaint["stages"]["unique"] == 1 and ("A red kangaroo.", "Ein rotes Riesenkänguru.") in pairs
    naev, freedroid, freedink = (stats["sources"][name] for name in ("naev", "freedroid", "freedink"))
    assert naev["packages"] == {"naev-data": "0.8.2-1"} and naev["stages"]["unique"] == 6  # one line -> 3 sentences
    assert ("Oh well.", "Ach so.") in pairs
    assert ("The ship has no fuel.", "Das Schiff hat keinen Treibstoff.") in pairs  # colour codes gone
    assert freedroid["packages"] == {"freedroidrpg-data": "1.0-1"} and freedroid["stages"]["unique"] == 4
    assert (
        "Don't come back without the Tachyon Condensator.",
        "Komm nicht ohne den Tachionen-Kondensator zurück.",
    ) in pairs
    assert freedink["packages"] == {"freedink-data": "1.08.20190120-2"} and freedink["stages"]["unique"] == 4
    assert ("Does he do anything to you?", "Hat er dir irgendwas angetan?") in pairs
    assert not any("&" in en or "%s" in en for en, _ in pairs)
    assert (
        "I've only a vague recollection of my ninth birthday.",
        "An meinen neunten Geburtstag kann ich mich nur ganz dunkel erinnern.",
    ) in pairs
    assert sum(sum(s["splits"].values()) for s in stats["sources"].values()) == stats["total"]


# What masking adds to the excerpts' corpus (one sentinel per span, the same on both sides), and the
# pairs it replaces (their markup was stripped before; tags are protected spans now).
MASKED = {
    ("⟦1⟧ results found", "⟦1⟧ Ergebnisse gefunden"),  # %1 was stripped
    ("⟦1⟧ Multiplayer and undo ⟦2⟧", "⟦1⟧ Mehrspieler und die Rückgängig-Funktion ⟦2⟧"),
    ("You bought ⟦1⟧ in ⟦2⟧.", "Sie haben ⟦1⟧ in ⟦2⟧ gekauft."),  # left out before
    (
        "* This food looks as ⟦1⟧ fresh ⟦2⟧ as it can be.",
        "* Dieses Lebensmittel sieht so ⟦1⟧ frisch ⟦2⟧ aus, wie es nur sein kann.",
    ),
    ("⟦1⟧ calms down.", "⟦1⟧ beruhigt sich."),  # <npcname>: left out before
    ("⟦1⟧ drops the ⟦2⟧.", "⟦1⟧ lässt ⟦2⟧ fallen."),
    ("Captain Thanlas the Elder, ⟦1⟧ Explorer", "Kapitän Thanlas der Ältere, ⟦1⟧ Entdecker"),
    ("⟦1⟧ ⟦2⟧ is hailing you.", "⟦1⟧ ⟦2⟧ funkt dich an."),
    ("A ⟦1⟧ jumps out in front of you!", "Ein/e ⟦1⟧ stößt mit dir zusammen!"),
    ("⟦1⟧ Very dangerous. ⟦2⟧", "⟦1⟧ Sehr gefährlich. ⟦2⟧"),
}
REPLACED = {
    ("results found", "Ergebnisse gefunden"),
    ("Multiplayer and undo", "Mehrspieler und die Rückgängig-Funktion"),
    ("* This food looks as fresh as it can be.", "* Dieses Lebensmittel sieht so frisch aus, wie es nur sein kann."),
    ("Captain Thanlas the Elder, Explorer", "Kapitän Thanlas der Ältere, Entdecker"),
    ("Very dangerous.", "Sehr gefährlich."),
}


def test_placeholders_are_masked_by_default(excerpt_cache, tmp_path, capsys):
    for name, extra in (("masked", []), ("plain", ["--no-placeholders"])):
        assert run(["--cache", excerpt_cache, "--out", tmp_path / name, "--offline", *extra], capsys)[0] == 0
    masked, plain = ({p for split in read_splits(tmp_path / n).values() for p in split} for n in ("masked", "plain"))
    assert masked - plain == MASKED and plain - masked == REPLACED
    stats = json.loads((tmp_path / "masked" / "stats.json").read_text())
    assert stats["placeholders"] == {"masked": True, "sentinels": [f"⟦{i}⟧" for i in range(1, 17)]}
    counts = {name: s["placeholders"]["pairs"] for name, s in stats["sources"].items() if s["placeholders"]["pairs"]}
    assert counts == {"ui": 1, "wesnoth": 1, "freeciv": 1, "cataclysm": 4, "widelands": 1, "naev": 1, "freedroid": 1}
    assert stats["sources"]["cataclysm"]["placeholders"]["sentinels"] == 7
    assert stats["sources"]["ui"]["stages"]["same_sentinels"] == stats["sources"]["ui"]["stages"]["sentences"]
    plain_stats = json.loads((tmp_path / "plain" / "stats.json").read_text())
    assert plain_stats["placeholders"] == {"masked": False, "sentinels": []}
    assert (
        "placeholders" not in plain_stats["sources"]["ui"]
        and "same_sentinels" not in plain_stats["sources"]["ui"]["stages"]
    )


UI_CLEANED = {
    ("One result found", "1 Ergebnis gefunden"),
    ("results found", "Ergebnisse gefunden"),
    ("High (1024 × 768 pixels)", "Hoch (1024 x 768 px)"),
    ("Move Down", "Nach unten verschieben"),
    ("Table", "Tabelle"),
    ("not allowed outside a procedure.", "außerhalb einer Prozedur unzulässig."),
    (
        "You will have to restart the program after this edit.",
        "Sie müssen nach dieser Änderung das Programm neu starten.",
    ),
    ("Continue?", "Fortfahren?"),
}


def test_outputs_are_identical_across_runs(excerpt_cache, tmp_path, capsys):
    for name in ("a", "b"):
        assert run(["--cache", excerpt_cache, "--out", tmp_path / name, "--offline"], capsys)[0] == 0
    for f in ("train.tsv", "valid.tsv", "test.tsv"):
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes(), f
    a, b = (json.loads((tmp_path / name / "stats.json").read_text()) for name in ("a", "b"))
    a.pop("command"), b.pop("command")  # it names the --out folder
    assert a == b


def test_same_english_never_lands_in_two_splits(tmp_path, capsys):
    lines = []
    words = [
        "red",
        "green",
        "blue",
        "black",
        "white",
        "grey",
        "brown",
        "pink",
        "gold",
        "silver",
        "orange",
        "violet",
        "navy",
        "olive",
        "teal",
        "cyan",
        "lime",
        "plum",
        "rose",
        "sand",
    ]
    for i in range(300):  # each English sentence four times: other German, case, spacing, punctuation
        first, second = words[i % 20], words[i // 20]
        en = f"Open {first} {second}."
        lines += [
            f"{en}\tÖffne {first} {second}.",
            f"{en.upper()}\tÖFFNE {first.upper()} {second.upper()}.",
            f"Open  {first} {second}.\tÖffnen {first} {second}.",
            f"Open {first} {second}:\tÖffne {first}/{second}:",
        ]
    tsv = tmp_path / "mine.tsv"
    tsv.write_text("\n".join(lines) + "\n", encoding="utf-8")
    code, _ = run(
        ["--tsv", tsv, "--out", tmp_path / "out", "--valid-fraction", "0.3", "--test-fraction", "0.3"], capsys
    )
    assert code == 0
    where = defaultdict(set)
    for split, pairs in read_splits(tmp_path / "out").items():
        for source, _ in pairs:
            where[link_keys(source)[0]].add(split)  # the case- and punctuation-folded words
    assert len(where) == 300 and all(len(s) == 1 for s in where.values())
    assert {next(iter(s)) for s in where.values()} == set(corpus.SPLITS)


def test_bad_tsv_lines_are_counted_reported_and_skipped(tmp_path, capsys, caplog):
    tsv = tmp_path / "mine.tsv"
    tsv.write_text(
        "Good morning.\tGuten Morgen.\n"
        "no tab on this line\n"
        "\n"  # blank lines are not data
        "Thank you.\tDanke.\textra field\n"
        "\tLeere Quelle.\n"
        "Empty target.\t \n"
        "See you tomorrow.\tBis morgen.\n",
        encoding="utf-8",
    )
    out = tmp_path / "out"
    code, _ = run(["--tsv", tsv, "--out", out], capsys)
    assert code == 0
    stats = json.loads((out / "stats.json").read_text())
    assert stats["sources"]["user"]["bad_lines"] == {
        "total": 4,
        "by_reason": {"empty source": 1, "empty target": 1, "more than one tab": 1, "no tab": 1},
        "first_lines": {"no tab": [2], "more than one tab": [4], "empty source": [5], "empty target": [6]},
    }
    assert stats["total"] == 2
    assert "4 bad lines skipped" in caplog.text and "no tab (1, line 2)" in caplog.text


def test_two_aligned_files(tmp_path, capsys):
    (tmp_path / "en.txt").write_text("Good morning.\nThank you.\n\nSee you.\n", encoding="utf-8")
    (tmp_path / "de.txt").write_text("Guten Morgen.\nDanke.\n\nBis bald.\n", encoding="utf-8")
    out = tmp_path / "out"
    code, _ = run(["--source", tmp_path / "en.txt", "--target", tmp_path / "de.txt", "--out", out], capsys)
    assert code == 0
    assert sorted(p for split in read_splits(out).values() for p in split) == [
        ("Good morning.", "Guten Morgen."),
        ("See you.", "Bis bald."),
        ("Thank you.", "Danke."),
    ]


def _write(path: Path, content: str | bytes) -> Path:
    path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
    return path


@pytest.mark.parametrize(
    "make_args, message",
    [
        (lambda t: ["--offline", "--cache", t / "empty-cache"], "package 'trans-de-en' is not in the cache"),
        (lambda t: ["--tsv", _write(t / "copies.tsv", "LN\tLN\n12\t12\n")], "empty corpus"),
        (lambda t: ["--tsv", _write(t / "bad.tsv", "no tab\nstill no tab\n")], "empty corpus"),
        (lambda t: ["--tsv", t / "missing.tsv"], "does not exist"),
        (lambda t: ["--tsv", t], "is a folder"),
        (lambda t: ["--tsv", _write(t / "latin1.tsv", "Größe\tsize\n".encode("latin-1"))], "is not UTF-8"),
        (lambda t: ["--source", _write(t / "en", "a\nb\n"), "--target", _write(t / "de", "a\n")], "must be aligned"),
        (lambda t: ["--source", _write(t / "en.txt", "a\n")], "--source and --target go together"),
        (lambda t: ["--tsv", t / "x.tsv", "--source", t / "y.txt", "--target", t / "z.txt"], "not both"),
        (lambda t: ["--sources", "ding,wikipedia"], "unknown source wikipedia"),
        (lambda t: ["--valid-fraction", "0.6", "--test-fraction", "0.6"], "add up to less than 1"),
    ],
)
def test_bad_input_gives_one_clear_line_and_exit_2(make_args, message, tmp_path, capsys):
    code, err = run([*make_args(tmp_path), "--out", tmp_path / "out"], capsys)
    assert code == 2
    assert err.strip().splitlines()[-1].startswith("error: ") and message in err, err
    assert "Traceback" not in err
    assert not (tmp_path / "out" / "train.tsv").exists()


@pytest.mark.parametrize(
    "package, rel, message",
    [
        ("trans-de-en", sources.DING_FILE, "cannot read"),
        ("libreoffice-help-en-us", sources.HELP_DIR, "no help pages"),
        ("libreoffice-l10n-de", sources.UI_CATALOG_DIR, "no .mo catalogs"),
    ],
)
def test_a_package_without_its_files_is_reported(package, rel, message, excerpt_cache, tmp_path, capsys):
    path = excerpt_cache / package / rel  # the version marker stays: "unpacked", but incompletely
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink()
    code, err = run(["--cache", excerpt_cache, "--out", tmp_path / "out", "--offline"], capsys)
    assert code == 2 and message in err and "Traceback" not in err


def test_missing_apt_tools_are_reported(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no apt-get, no dpkg
    code, err = run(["--cache", tmp_path / "cache", "--out", tmp_path / "out"], capsys)
    assert code == 2 and "'apt-get' not found" in err and "--tsv" in err


@needs_tool("apt-get", "Debian/Ubuntu")
def test_unknown_package_is_reported(tmp_path):
    if not debian._apt_lists_present():
        missing("apt has no package lists here (apt-get update)")
    with pytest.raises(debian.PackageError, match="could not download package 'attnserve-no-such-package'"):
        debian.fetch("attnserve-no-such-package", tmp_path)


def test_cli_error_as_a_subprocess(tmp_path):
    """The real entry point: exit status 2 and one ``error:`` line, no traceback."""
    proc = run_module(
        "model.translation.corpus", "--tsv", str(tmp_path / "nope.tsv"), "--out", str(tmp_path / "o"), timeout=120
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [f"error: {tmp_path / 'nope.tsv'} does not exist"]
