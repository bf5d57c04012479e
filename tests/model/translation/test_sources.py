"""The readers on real excerpts of each Debian source, and sentence alignment of paragraph pairs."""

from __future__ import annotations

import gettext
import io

import pytest

from model.translation import sources
from model.translation.sentences import align_sentences, split_sentences
from tests.model.translation.excerpts import (
    CATACLYSM_ENTRIES,
    CATACLYSM_PAIRS,
    DING_LINES,
    DING_PAIRS,
    FREECIV_ENTRIES,
    FREECIV_PAIRS,
    FREEDINK_ENTRIES,
    FREEDINK_PAIRS,
    FREEDROID_ENTRIES,
    FREEDROID_PAIRS,
    HELP_DE,
    HELP_EN,
    HELP_PAIRS,
    NAEV_ENTRIES,
    NAEV_PAIRS,
    STAMP_KANGAROO,
    UI_ENTRIES,
    UI_PAIRS,
    WESNOTH_ENTRIES,
    WESNOTH_PAIRS,
    WIDELANDS_ENTRIES,
    WIDELANDS_PAIRS,
    build_mo,
    make_package,
)


def test_ding_example_sentences_are_extracted_from_real_lines():
    pairs = [p for line in DING_LINES for p in sources.ding_example_pairs(line)]
    assert pairs == DING_PAIRS


@pytest.mark.parametrize(
    "part, expected",
    [
        ("Ich habe keine Erinnerung an das Geschehen. [geh.]", "Ich habe keine Erinnerung an das Geschehen."),
        (
            "Sie hat ein phänomenales Gedächtnis.; Sie erinnert sich (wirklich) an alles.",
            "Sie hat ein phänomenales Gedächtnis.",
        ),
        (
            "Er war so niedergeschlagen/gedrückt, dass er nicht ans Telefon ging.",
            "Er war so niedergeschlagen, dass er nicht ans Telefon ging.",
        ),
        ("Wir haben es mit unserem Urlaub gut / schlecht getroffen.", None),  # phrase alternatives: unresolvable
        ("Aalsuppen {pl}", None),  # a word, not a sentence
        ("to give sb. a tryout", None),  # a template
        ("Nach unseren Erkenntnissen …", None),  # unfinished
    ],
)
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
        (
            "Choose Insert - Pivot Table. The Select Source dialog appears.",
            ["Choose Insert - Pivot Table.", "The Select Source dialog appears."],
        ),
        ("Wählen Sie z. B. eine Zelle. Dann OK.", ["Wählen Sie z. B. eine Zelle.", "Dann OK."]),
        ("Use e.g. Calc. Then save.", ["Use e.g. Calc.", "Then save."]),
        ("Am 17. September war es so. Gut!", ["Am 17. September war es so.", "Gut!"]),
        ("Choose File - Save As... Then type a name.", ["Choose File - Save As... Then type a name."]),
        ('Is it "done?" Yes.', ['Is it "done?"', "Yes."]),
        ("one sentence only", ["one sentence only"]),
    ],
)
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


def test_game_messages_drop_hints_and_markup_and_leave_out_runtime_text():
    assert sources.game_message_pairs(sources.parse_mo(build_mo(WESNOTH_ENTRIES))) == WESNOTH_PAIRS
    assert sorted(sources.game_message_pairs(sources.parse_mo(build_mo(FREECIV_ENTRIES)))) == sorted(FREECIV_PAIRS)


@pytest.mark.parametrize(
    "text",
    ["He has $gold gold.", "You bought %s.", "Built %d units", "%[tech]Bronze Working", "Wait for {PLAYER}"],
)
def test_game_messages_with_runtime_text_are_left_out(text):
    assert sources.game_message_pairs([(text, text + " (de)")]) == []


def test_game_catalogs_are_read_from_every_package_in_name_order(tmp_path):
    for name, entries in (("b", FREECIV_ENTRIES), ("a", WESNOTH_ENTRIES)):
        make_package(tmp_path, name, {f"{sources.WESNOTH_LOCALE_DIR}/{name}.mo": build_mo(entries)})
    pairs = list(sources.read_game_catalogs([tmp_path / "b", tmp_path / "a"], sources.WESNOTH_LOCALE_DIR, False))
    assert pairs == WESNOTH_PAIRS + sources.game_message_pairs(sources.parse_mo(build_mo(FREECIV_ENTRIES)))
    with pytest.raises(ValueError, match="no .mo catalogs"):
        list(sources.read_game_catalogs([tmp_path / "a"], sources.FREECIV_LOCALE_DIR, False))


def test_placeholder_free_pairs_keep_markup_and_leave_out_placeholders():
    assert sources.placeholder_free_pairs(sources.parse_mo(build_mo(CATACLYSM_ENTRIES))) == CATACLYSM_PAIRS
    assert sources.placeholder_free_pairs(sources.parse_mo(build_mo(WIDELANDS_ENTRIES))) == WIDELANDS_PAIRS


def test_dialogue_catalogs_lose_style_codes_and_run_time_variables():
    assert sources.naev_pairs(sources.parse_mo(build_mo(NAEV_ENTRIES))) == NAEV_PAIRS
    assert sources.freedroid_pairs(sources.parse_mo(build_mo(FREEDROID_ENTRIES))) == FREEDROID_PAIRS
    assert sources.freedink_pairs(sources.parse_mo(build_mo(FREEDINK_ENTRIES))) == FREEDINK_PAIRS


@pytest.mark.parametrize(
    ("text", "kept"),
    [
        ("Thanks for visiting, [b]Will Gapes[/b]!", "Thanks for visiting, Will Gapes!"),
        ("[n]No completed quests yet.[w]", "No completed quests yet."),
        ("[OK] Entering sleep mode... [Done].", "[OK] Entering sleep mode... [Done]."),  # words, not codes
        ("OPENGATE [inner] [outer]", "OPENGATE [inner] [outer]"),
    ],
)
def test_freedroid_style_codes_go_but_bracketed_words_stay(text, kept):
    assert sources.freedroid_pairs([(text, text + " ")]) == [(kept, kept + " ")]


@pytest.mark.parametrize(
    ("text", "placeholder"),
    [
        ("<npcname> calms down.", True),
        ("Wrong use, should be: /kick <name> <reason>", True),
        ("I <really> hate <zombies>.", True),
        ("</bad> closes nothing", True),
        ("* This item can be <good>reinforced</good>.", False),
        ("<color_light_red>Dangerous.</color> Run.", False),
        ("Soft and supple.<br> And yet untouched.<br/>", False),
        ("1 < 2 and 3 > 2", False),
    ],
)
def test_placeholder_tags_are_told_from_markup(text, placeholder):
    assert sources.has_placeholder_tag(text) is placeholder


def test_catalog_reader_takes_the_pair_rule_it_is_given(tmp_path):
    make_package(tmp_path, "c", {f"{sources.CATACLYSM_LOCALE_DIR}/c.mo": build_mo(CATACLYSM_ENTRIES)})
    read = sources.read_game_catalogs([tmp_path / "c"], sources.CATACLYSM_LOCALE_DIR, False)
    strict = sources.read_game_catalogs(
        [tmp_path / "c"], sources.CATACLYSM_LOCALE_DIR, False, sources.placeholder_free_pairs
    )
    assert list(strict) == CATACLYSM_PAIRS
    assert ("<npcname> calms down.", "<npcname> beruhigt sich.") in list(read)


def test_stamp_description_takes_the_english_line_and_the_german_one():
    assert sources.stamp_description_pair(STAMP_KANGAROO) == ("A red kangaroo.", "Ein rotes Riesenkänguru.")
    assert sources.stamp_description_pair("A duck.\nfr.utf8=Un canard.\n") is None  # no German
    assert sources.stamp_description_pair("de.utf8=Eine Ente.\n") is None  # no English line first
    assert sources.stamp_description_pair("") is None
