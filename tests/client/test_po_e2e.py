"""``attnserve-client po translate`` on a real template from a Debian package, judged by Debian's ``msgfmt``.

Starts ``python -m service`` on the shipped models (the ``server`` fixture, 127.0.0.1 only) and fetches
``python3-wtforms`` with ``apt-get download`` + ``dpkg -x`` (``model.translation.debian``, ~60 kB) for
``wtforms/locale/wtforms.pot``: in bookworm (3.0.1-2), 33 form-validation messages, 3 of them plural and
13 ``python-format`` (``%(min)d``, ``%s``), with no ``Plural-Forms`` (Babel writes none into templates).
The whole template is translated in a few seconds. ``msgfmt --check --use-fuzzy`` then reads the result as
gettext would (without ``--use-fuzzy`` it would skip the fuzzy entries, and so could not fail).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import polib
import pytest
from attnserve_client import po
from attnserve_client.cli import main

from contract.placeholders import find_spans
from model.translation import debian
from tests.ci import missing

PACKAGE = "python3-wtforms"
TEMPLATE = "usr/lib/python3/dist-packages/wtforms/locale/wtforms.pot"


def needed(available: bool, what: str) -> None:
    if not available:
        missing(f"{what} is missing")  # CI installs them (make system-deps) and reaches Debian's registry


def msgfmt(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["msgfmt", *args], env={**os.environ, "LC_ALL": "C"}, capture_output=True, text=True, timeout=60, check=False
    )


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    needed(shutil.which("apt-get") is not None and shutil.which("dpkg") is not None, "apt-get or dpkg")
    needed(shutil.which("msgfmt") is not None, "msgfmt (Debian's gettext; make system-deps)")
    try:
        unpacked = debian.fetch(PACKAGE, tmp_path_factory.mktemp("debian-cache"))
    except debian.PackageError as e:
        needed(False, f"{PACKAGE} ({e})")
    return unpacked.root / TEMPLATE


@pytest.fixture(scope="module")
def translated(template, server, tmp_path_factory) -> tuple[Path, str]:
    """The template filled by the command line, as a user runs it: (the written catalog, what it printed)."""
    output = tmp_path_factory.mktemp("po") / "de.po"
    proc = subprocess.run(
        [sys.executable, "-m", "attnserve_client", "po", "translate", str(template), "-o", str(output)],
        env={**os.environ, "ATTNSERVE_BASE_URL": server.url},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return output, proc.stdout


def test_every_entry_is_filled_fuzzy_and_keeps_what_the_template_says(template, translated, record_property):
    output, printed = translated
    source, result = polib.pofile(str(template)), polib.pofile(str(output))
    plural = sum(1 for e in source if e.msgid_plural)
    assert len(source) >= 30 and plural >= 3 and any("python-format" in e.flags for e in source)
    summary = po.CatalogSummary(
        entries=len(source), kept=0, filled=len(source), plural_filled=plural, skipped=0, failed=0
    )
    assert printed == f"{output}: {summary}\n"
    assert [(e.msgctxt, e.msgid, e.msgid_plural, e.occurrences, ["fuzzy", *e.flags]) for e in source] == [
        (e.msgctxt, e.msgid, e.msgid_plural, e.occurrences, e.flags) for e in result
    ]
    assert all(
        e.msgstr if not e.msgid_plural else len(e.msgstr_plural) == 2 and all(e.msgstr_plural.values()) for e in result
    )
    assert result.metadata["Language"] == "de" and result.metadata["Plural-Forms"] == "nplurals=2; plural=(n != 1);"

    statistics = msgfmt("--statistics", "-o", os.devnull, str(output)).stderr.strip()
    record_property("msgfmt_statistics", statistics)
    print(f"msgfmt --statistics: {statistics}")
    assert statistics == f"0 translated messages, {len(source)} fuzzy translations."


def test_msgfmt_check_passes(translated):
    """Newlines, plural forms and the header are the client's to get right, placeholders the service's."""
    check = msgfmt("--check", "--use-fuzzy", "-o", os.devnull, str(translated[0]))
    assert check.returncode == 0, check.stderr


def test_json_prints_the_summary(template, server, tmp_path, capsys):
    status = main(["po", "translate", str(template), "-o", str(tmp_path / "de.po"), "--json", "--base-url", server.url])
    printed = json.loads(capsys.readouterr().out)
    assert status == 0 and printed["output"] == str(tmp_path / "de.po")
    assert printed["filled"] == printed["entries"] > 0 and printed["failed"] == 0


def test_the_sdk_fills_the_same_catalog(api, template, translated):
    result = api.translate_po(template)
    assert result.summary.filled == result.summary.entries and result.summary.failed == 0
    assert str(result.catalog) == str(polib.pofile(str(translated[0])))


@pytest.fixture(scope="module")
def c_template(tmp_path_factory) -> Path:
    """A C program's catalog: the first 60 messages with printf conversions of coreutils' German catalog
    (Debian's ``coreutils`` package, its ``.mo`` read back by ``msgunfmt``), their translations taken out
    and flagged ``c-format`` as xgettext flags them, so that ``msgfmt`` checks every conversion."""
    needed(shutil.which("msgunfmt") is not None, "msgunfmt (Debian's gettext; make system-deps)")
    needed(shutil.which("apt-get") is not None and shutil.which("dpkg") is not None, "apt-get or dpkg")
    try:
        unpacked = debian.fetch("coreutils", tmp_path_factory.mktemp("coreutils-cache"))
    except debian.PackageError as e:
        needed(False, f"coreutils ({e})")
    folder = tmp_path_factory.mktemp("c-po")
    mo = unpacked.root / "usr/share/locale/de/LC_MESSAGES/coreutils.mo"
    subprocess.run(["msgunfmt", str(mo), "-o", str(folder / "shipped.po")], check=True, timeout=60)
    template = polib.POFile()
    template.metadata = {"Content-Type": "text/plain; charset=UTF-8", "Language": "de"}
    template.metadata["Plural-Forms"] = "nplurals=2; plural=(n != 1);"
    for entry in polib.pofile(str(folder / "shipped.po")):
        if entry.msgid and not entry.msgid_plural and any(s.kind == "printf" for s in find_spans(entry.msgid)):
            template.append(polib.POEntry(msgid=entry.msgid, msgstr="", flags=["c-format"]))
        if len(template) == 60:
            break
    template.save(str(folder / "coreutils.pot"))
    return folder / "coreutils.pot"


def test_a_c_programs_catalog_keeps_every_conversion(c_template, server, tmp_path):
    output = tmp_path / "de.po"
    assert main(["--base-url", server.url, "po", "translate", str(c_template), "-o", str(output)]) == 0
    check = msgfmt("--check", "--use-fuzzy", "-o", os.devnull, str(output))
    assert check.returncode == 0, check.stderr
    for entry in polib.pofile(str(output)):
        assert "fuzzy" in entry.flags and entry.msgstr
        assert sorted(s.text for s in find_spans(entry.msgstr)) == sorted(s.text for s in find_spans(entry.msgid))
