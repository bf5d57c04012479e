"""Training pairs with placeholders masked the same way on both sides (model/translation/masking.py)."""

from __future__ import annotations

import pytest

from contract.placeholders import TRAINING_SENTINELS, TooManySpans
from model.translation.masking import (
    mask_pair,
    protect_entries,
    protect_pair,
    renumber,
    sentinels_agree,
    space_sentinels,
)


@pytest.mark.parametrize(
    "pair, masked",
    [
        (("Cannot open %s: %s", "Kann %s nicht öffnen: %s"), ("Cannot open ⟦1⟧: ⟦2⟧", "Kann ⟦1⟧ nicht öffnen: ⟦2⟧")),
        (("%1$s is not %2$s", "%2$s ist nicht %1$s"), ("⟦1⟧ is not ⟦2⟧", "⟦2⟧ ist nicht ⟦1⟧")),  # the span decides
        (("%s of %d", "%d von %s"), ("⟦1⟧ of ⟦2⟧", "⟦2⟧ von ⟦1⟧")),
        (("<b>%s</b> left", "<b>%s</b> übrig"), ("⟦1⟧ ⟦2⟧ ⟦3⟧ left", "⟦1⟧ ⟦2⟧ ⟦3⟧ übrig")),
        (("{name} wins", "{name} gewinnt"), ("⟦1⟧ wins", "⟦1⟧ gewinnt")),
        (  # LibreOffice's %NAME placeholders are no printf conversion (%LA): they keep the old treatment
            ("%LANGUAGENAME script %s failed", "%LANGUAGENAME-Skript %s schlug fehl"),
            ("%LANGUAGENAME script ⟦1⟧ failed", "%LANGUAGENAME-Skript ⟦1⟧ schlug fehl"),
        ),
        (("<b>Warning:</b> %s", "<b>Warnung:</b> %s"), ("⟦1⟧ Warning: ⟦2⟧ ⟦3⟧", "⟦1⟧ Warnung: ⟦2⟧ ⟦3⟧")),  # spaced
    ],
)
def test_the_same_span_gets_the_same_sentinel_on_both_sides(pair, masked):
    assert mask_pair(*pair) == masked


@pytest.mark.parametrize(
    "pair",
    [
        ("Cannot open %s", "Kann nicht öffnen"),  # a span missing
        ("use <name> instead", "<Name> verwenden"),  # the tag translated
        ("%s%s too large", "%1$s%2$s zu groß"),  # rewritten as positional
        ("No placeholder here", "Kein Platzhalter"),
        ("The %LANGUAGENAME script", "Das %LANGUAGENAME-Skript"),
        ("No property '%Value'", "Keine Eigenschaft '%Value'"),
        ("Open ⟦1⟧ %s", "Öffne ⟦1⟧ %s"),  # already holds a sentinel
        (" ".join(["%s"] * 17), " ".join(["%s"] * 17)),  # more spans than sentinels
    ],
)
def test_pairs_that_cannot_be_masked_keep_the_old_treatment(pair):
    assert protect_pair(*pair) is None


def test_mask_pair_says_why():
    with pytest.raises(ValueError, match="different protected spans"):
        mask_pair("Open %s", "Öffne")
    with pytest.raises(TooManySpans):
        mask_pair("%s %s %s", "%s %s %s", TRAINING_SENTINELS[:2])


def test_catalog_entries_are_masked_form_by_form():
    entries = [
        ("", "Content-Type: text/plain; charset=UTF-8\n"),  # the header stays as it is
        ("menu\x04%d file\x00%d files", "%d Datei\x00%d Dateien"),
        ("One file\x00%d files", "Eine Datei\x00%d Dateien"),  # the singular has no span: left alone
        ("<npcname> drops the %s.", "<npcname> lässt %s fallen."),
        ("$unit.name| attacks %s", "$unit.name| greift an"),  # spans differ: left for the reader to leave out
    ]
    assert protect_entries(entries) == [
        entries[0],
        ("menu\x04⟦1⟧ file\x00⟦1⟧ files", "⟦1⟧ Datei\x00⟦1⟧ Dateien"),
        ("One file\x00⟦1⟧ files", "Eine Datei\x00⟦1⟧ Dateien"),
        ("⟦1⟧ drops the ⟦2⟧.", "⟦1⟧ lässt ⟦2⟧ fallen."),
        entries[4],
    ]


@pytest.mark.parametrize(
    "source, target, agree",
    [
        ("⟦1⟧ wins. ⟦2⟧ loses.", "⟦2⟧ verliert. ⟦1⟧ gewinnt.", True),
        ("No sentinel.", "Kein Platzhalter.", True),
        ("⟦1⟧ wins.", "Gewonnen.", False),  # the sentence split parted them
        ("⟦1⟧ and ⟦1⟧", "⟦1⟧ und ⟦1⟧", False),  # a sentinel stands for one span
    ],
)
def test_sentinels_agree(source, target, agree):
    assert sentinels_agree(source, target) is agree


def test_a_sentence_cut_from_a_longer_text_starts_again_at_the_first_sentinel():
    assert renumber("⟦3⟧ loses to ⟦4⟧.", "⟦3⟧ verliert gegen ⟦4⟧.") == ("⟦1⟧ loses to ⟦2⟧.", "⟦1⟧ verliert gegen ⟦2⟧.")
    assert renumber("⟦4⟧ then ⟦3⟧", "⟦3⟧ dann ⟦4⟧") == ("⟦1⟧ then ⟦2⟧", "⟦2⟧ dann ⟦1⟧")
    assert renumber("⟦1⟧ ok", "⟦1⟧ gut") == ("⟦1⟧ ok", "⟦1⟧ gut")


@pytest.mark.parametrize(
    "text, spaced",
    [
        ("⟦1⟧ Units⟦2⟧", "⟦1⟧ Units ⟦2⟧"),
        ("a⟦1⟧⟦12⟧b", "a ⟦1⟧ ⟦12⟧ b"),
        ("(⟦1⟧), ⟦2⟧.", "(⟦1⟧), ⟦2⟧."),  # punctuation may touch a sentinel
    ],
)
def test_space_sentinels(text, spaced):
    assert space_sentinels(text) == spaced
