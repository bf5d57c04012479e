"""Placeholder agreement of translations: the span judge, GNU msgfmt's format check (run for real) and invented %n."""

from __future__ import annotations

import pytest

from export.placeholder_metrics import (
    MsgfmtError,
    agreement,
    format_flags,
    invents_n,
    judge,
    msgfmt_check,
    po_file,
)
from tests.ci import needs_tool

needs_msgfmt = needs_tool("msgfmt", "Debian's gettext: make system-deps")

# (source, translation, span judge, msgfmt judge)
CASES = [
    ("Cannot open %s", "Kann %s nicht öffnen", True, True),
    ("Cannot open %s: %d", "Kann %s nicht öffnen: %s", False, False),  # wrong type
    ("Cannot open %s", "Kann nicht öffnen", False, False),  # missing %s
    ("Cannot open %s", "Kann %s nicht öffnen%n", False, False),  # an extra %n
    ("%s has %d files", "%d Dateien hat %s", True, False),  # non-positional reordered: a program reads garbage
    ("%s has %d files", "%2$d Dateien hat %1$s", False, True),  # positional: what a program allows
    ("%1$s is not %2$s", "%2$s ist nicht %1$s", True, True),
    ("missing {name} in {place}", "{place} fehlt {name}", True, True),
    ("missing {name}", "{nme} fehlt", False, False),
    ("%(count)d of %(total)d", "%(count)d von %(total)d", True, True),
    ('<b>Warning:</b> "%s" is gone', "<b>Warnung:</b> „%s“ ist weg", True, True),
    ("<b>bold</b>", "fett", False, True),  # no format string: msgfmt has nothing to check
    ("Cannot open %s", "", False, False),  # empty: msgfmt would skip it as untranslated
]


@pytest.mark.parametrize("source, translation, spans, _", CASES)
def test_span_agreement(source, translation, spans, _):
    assert agreement(source, translation) is spans


@needs_msgfmt
def test_msgfmt_judges_each_pair_from_one_run():
    errors = msgfmt_check([(s, t) for s, t, _, _ in CASES])
    assert [e is None for e in errors] == [ok for _, _, _, ok in CASES]
    assert "argument 2 are not the same" in errors[1] and "number of format specifications" in errors[2]
    assert errors[-1] == "empty translation"


@needs_msgfmt
def test_judge_counts_both_judges_and_lists_the_failures():
    sources, translations = zip(*[(s, t) for s, t, _, _ in CASES])
    report = judge(sources, translations)
    assert report["sentences"] == len(CASES)
    assert report["span_agreement"]["passed"] == sum(c[2] for c in CASES)
    assert report["msgfmt"]["passed"] == sum(c[3] for c in CASES)
    assert report["msgfmt"]["checked"] == len(CASES) - 1  # the tags-only pair has no format flag
    assert report["invented_n"] == 1
    failed = {f["index"] for f in report["failures"]}
    assert failed == {i for i, c in enumerate(CASES) if not (c[2] and c[3])}


@needs_msgfmt
def test_equal_sources_stay_distinct_entries():
    assert msgfmt_check([("Open %s", "Öffne %s"), ("Open %s", "Öffne"), ("Open %s", "Öffne %s")]) == [
        None,
        "number of format specifications in 'msgid' and 'msgstr' does not match",
        None,
    ]


@pytest.mark.parametrize(
    "source, translation, invented",
    [
        ("Wrote %s", "%s geschrieben%n", True),
        ("Wrote %s", "%s geschrieben%hn", True),
        ("Wrote %s", "%2$ln geschrieben", True),
        ("Wrote %s%n", "%s geschrieben%n", False),  # the source has one
        ("Wrote %s", "%s geschrieben", False),
        ("Wrote %s", "%%n geschrieben", False),  # a literal percent sign, then n
    ],
)
def test_invented_n(source, translation, invented):
    assert invents_n(source, translation) is invented


@pytest.mark.parametrize(
    "msgid, flags",
    [
        ("Open %s", ["c-format"]),
        ("%(name)s opened", ["python-format"]),
        ("{name} opened", ["python-brace-format"]),
        ("%s in {place}", ["c-format", "python-brace-format"]),
        ("100%% <b>done</b>", []),
    ],
)
def test_format_flags(msgid, flags):
    assert format_flags(msgid) == flags


def test_po_file_escapes_and_places_each_entry():
    text, starts = po_file([('say "hi"\\n', "sag „hallo“"), ("Open %s", "Öffne %s")])
    lines = text.splitlines()
    assert lines[starts[0] - 1 : starts[0] + 2] == ['msgctxt "0"', 'msgid "say \\"hi\\"\\\\n"', 'msgstr "sag „hallo“"']
    assert lines[starts[1] - 1] == "#, c-format"


def test_a_missing_msgfmt_is_one_clear_error():
    with pytest.raises(MsgfmtError, match="not found: install GNU gettext"):
        msgfmt_check([("Open %s", "Öffne %s")], msgfmt="attnserve-no-such-msgfmt")
