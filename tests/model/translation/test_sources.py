"""The readers on real excerpts of each Debian source, and sentence alignment of paragraph pairs."""

from __future__ import annotations

import gettext
import io

import pytest

from model.translation import sources
from model.translation.sentences import align_sentences, split_sentences
from tests.model.translation.excerpts import (
    DING_LINES,
    DING_PAIRS,
    HELP_DE,
    HELP_EN,
    HELP_PAIRS,
    UI_ENTRIES,
    UI_PAIRS,
    build_mo,
)


def test_ding_example_sentences_are_extracted_from_real_lines():
    pairs = [p for line in DING_LINES for p in sources.ding_example_pairs(line)]
    assert pairs == DING_PAIRS


@pytest.mark.parametrize(
    "part, expected",
    [
        ("Ich habe keine Erinnerung an das Geschehen. [geh.]", "Ich habe keine Erinnerung an das Geschehen."),
        ("Sie hat ein phänomenales Gedächtnis.; Sie erinnert sich (wirklich) an alles.", "Sie hat ein phänomenales Gedächtnis."),
        ("Er war so niedergeschlagen/gedrückt, dass er nicht ans Telefon ging.", "Er war so niedergeschlagen, dass er nicht ans Telefon ging."),
        ("Wir haben es mit unserem Urlaub gut / schlecht getroffen.", None),  # phrase alternatives: unresolvable
        ("Aalsuppen {pl}", None),  # a word, not a sentence
        ("to give sb. a tryout", None),  # a template
        ("Nach unseren Erkenntnissen …", None),  # unfinished
    ],
)  # fmt: skip
def test_ding_sentence(part, expected):
    assert sources.ding_sentence(part) == expected


def test_ding_line_with_unequal_sub_entries_is_skipped():
    assert sources.ding_example_pairs("Das ist gut. | Sehr gut. :: That is good.") == []


def test_help_paragraphs_align_by_id_and_skip_code_and_variants():
    assert sources.help_paragraph_pairs(HELP_EN, HELP_DE) == HELP_PAIRS


def test_mo_parser_agrees_with_gettext():
    data = build_mo(UI_ENTRIES)
    parsed = dict(sources.parse_mo(data))
    catalog = gettext.GNUTranslations(io.BytesIO(data))
    assert parsed["RID_BASIC_START\x04$(ARG1) not allowed outside a procedure."] == catalog.pgettext(
        "RID_BASIC_START", "$(ARG1) not allowed outside a procedure."
    )
    assert catalog.npgettext("SCSTR_TOTAL", "One result found", "%1 results found", 2) == "%1 Ergebnisse gefunden"
    assert sorted(parsed.items()) == sorted(UI_ENTRIES)


def test_mo_parser_refuses_other_files():
    with pytest.raises(ValueError, match="not a gettext .mo file"):
        sources.parse_mo(b"<html>not a catalog</html>")


def test_ui_messages_drop_context_pair_plurals_and_skip_untranslated():
    assert sorted(sources.ui_message_pairs(sources.parse_mo(build_mo(UI_ENTRIES)))) == sorted(UI_PAIRS)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("Choose Insert - Pivot Table. The Select Source dialog appears.", ["Choose Insert - Pivot Table.", "The Select Source dialog appears."]),
        ("Wählen Sie z. B. eine Zelle. Dann OK.", ["Wählen Sie z. B. eine Zelle.", "Dann OK."]),
        ("Use e.g. Calc. Then save.", ["Use e.g. Calc.", "Then save."]),
        ("Am 17. September war es so. Gut!", ["Am 17. September war es so.", "Gut!"]),
        ("Choose File - Save As... Then type a name.", ["Choose File - Save As... Then type a name."]),
        ('Is it "done?" Yes.', ['Is it "done?"', "Yes."]),
        ("one sentence only", ["one sentence only"]),
    ],
)  # fmt: skip
def test_split_sentences(text, expected):
    assert split_sentences(text) == expected


def test_align_sentences_splits_only_when_counts_match():
    en = "Choose Insert - Pivot Table. The Select Source dialog appears."
    de = "Wählen Sie Einfügen – Pivot-Tabelle…. Der Dialog Quelle auswählen wird geöffnet."
    assert align_sentences(en, de) == [
        ("Choose Insert - Pivot Table.", "Wählen Sie Einfügen – Pivot-Tabelle…."),
        ("The Select Source dialog appears.", "Der Dialog Quelle auswählen wird geöffnet."),
    ]
    merged = "Wählen Sie Einfügen – Pivot-Tabelle…, worauf der Dialog Quelle auswählen geöffnet wird."
    assert align_sentences(en, merged) == [(en, merged)]  # still a translation: kept whole
