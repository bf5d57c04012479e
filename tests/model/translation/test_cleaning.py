"""Every cleaning rule and pair filter, on strings taken from the real sources."""

from __future__ import annotations

import unicodedata

import pytest

from contract.tokenizer import normalize_text
from model.translation import cleaning as c


@pytest.mark.parametrize(
    "rule, text, expected",
    [
        (
            c.strip_markup,
            '<ahelp hid=".">Creates a new <emph>LibreOffice</emph> document.</ahelp>',
            " Creates a new  LibreOffice  document.  ",
        ),
        (c.strip_markup, "Find &amp; Replace &lt;b&gt; &#x2013; &quot;x&quot;", 'Find & Replace <b> – "x"'),
        (c.strip_markup, "Not equal (<>) and a<b", "Not equal (<>) and a<b"),  # no tags there
        (
            c.expand_product_name,
            "%PRODUCTNAME Writer and $[officename] Calc",
            "LibreOffice Writer and LibreOffice Calc",
        ),
        (c.strip_placeholders, "The path %1 already exists.", "The path   already exists."),
        (c.strip_placeholders, "$(ARG1) not allowed", "  not allowed"),
        (c.strip_placeholders, "Column %COLUMNNUMBER of %s: %d %.2f%", "Column of : %"),
        (c.strip_placeholders, "The “$columnname$” column, $1 and $DEPLOYED", "The “ ” column,   and  "),
        (c.strip_placeholders, "Open hyperlink: %{link} {0} {} #1 #lib# <%1>", "Open hyperlink:                "),
        (
            c.strip_placeholders,
            "Costs $30 at 50%, cell $A$1, =SUM($B$2:C3)",
            "Costs $30 at 50%, cell $A$1, =SUM($B$2:C3)",
        ),
        (c.strip_urls, "A copy can be obtained at http://mozilla.org/MPL/2.0/.", "A copy can be obtained at  ."),
        (
            c.strip_urls,
            "see https://crashreport.libreoffice.org/stats/crash_details/x or www.libreoffice.org, thanks",
            "see   or  , thanks",
        ),
        (
            c.strip_accelerators,
            "All ~Pages, Pa~ges:, &File, Find & Replace, R&D",
            "All Pages, Pages:, File, Find & Replace, R&D",
        ),
        (
            c.strip_mnemonic_underscores,
            "Move Do_wn, _Add, H_inzufügen, (_1024 pixels)",
            "Move Down, Add, Hinzufügen, (1024 pixels)",
        ),
        # a digit after the underscore, or several underscores: a name; but SF_FileSystem looks like a mnemonic,
        # which is why the rule runs on UI catalogs only
        (
            c.strip_mnemonic_underscores,
            "Ausdruck_1, FILE_NAME_A, SF_FileSystem",
            "Ausdruck_1, FILE_NAME_A, SFFileSystem",
        ),
        (c.tidy_punctuation, "The path '' already exists .", "The path already exists."),
        (c.tidy_punctuation, 'Ist das Trennzeichen leer ("") , so', "Ist das Trennzeichen leer, so"),
        (c.tidy_punctuation, "Not equal (<>)", "Not equal (<>)"),
        (normalize_text, "  I\u2019ve\tonly\u00a0a  vague\nidea\u00ad ", "I've only a vague idea"),
        (normalize_text, unicodedata.normalize("NFD", "Größe"), "Größe"),
    ],
)
def test_text_rule(rule, text, expected):
    assert " ".join(rule(text).split()) == " ".join(expected.split())  # spaces left behind are tidy's job


@pytest.mark.parametrize(
    "text, ui_strings, expected",
    [
        ("$(ARG1) außerhalb einer Prozedur unzulässig.", True, "außerhalb einer Prozedur unzulässig."),
        (
            "Sie müssen nach dieser Änderung das Programm neu starten.\nFortfahren?",
            True,
            "Sie müssen nach dieser Änderung das Programm neu starten. Fortfahren?",
        ),
        ("Hoch (_1024 x 768 px)", True, "Hoch (1024 x 768 px)"),
        ("Data series '%1'", True, "Data series"),
        (
            "%PRODUCTNAME is made available ... at http://mozilla.org/MPL/2.0/.",
            True,
            "LibreOffice is made available ... at.",
        ),
        ("Use file_name here.", False, "Use file_name here."),
    ],
)
def test_clean_text_applies_the_rules_in_order(text, ui_strings, expected):
    assert c.clean_text(text, ui_strings=ui_strings) == expected


def test_clean_text_is_idempotent_on_its_output():
    for text in ["~Table", "The URL <%1> cannot be converted.", "Find &amp; Replace", "Größe\u00a0 ändern"]:
        once = c.clean_text(text, ui_strings=True)
        assert c.clean_text(once, ui_strings=True) == once


CONFIG = c.FilterConfig(min_words=1, max_words=5, max_chars=40, max_ratio=2.0, ratio_min_chars=10)


@pytest.mark.parametrize(
    "keep, source, target, expected",
    [
        (c.letters_ok, "Shadow", "Schatten", True),
        (c.letters_ok, "(-32768 - 32767)", "(-32768 – 32767)", False),
        (c.not_copy, "Name", "Name", False),
        (c.not_copy, "LN", "ln", False),
        (c.not_copy, "Shadow", "Schatten", True),
        (c.length_ok, "one two three four five", "eins zwei drei vier fünf", True),
        (c.length_ok, "one two three four five six", "eins", False),  # too many words
        (c.length_ok, "Supercalifragilisticexpialidocious" * 2, "x", False),  # too many characters
        (c.ratio_ok, "Up", "Nach oben", True),  # short: no ratio check
        (c.ratio_ok, "Save the file", "Speichern Sie die Datei", True),
        (c.ratio_ok, "Save", "Speichern Sie die Datei jetzt sofort ab", False),
    ],
)
def test_pair_filter(keep, source, target, expected):
    assert keep(source, target, CONFIG) is expected


def test_filters_run_in_the_documented_order():
    assert [name for name, _ in c.PAIR_FILTERS] == ["has_letters", "not_copy", "length", "ratio"]
