"""Protected spans: what is found, how it is masked, and how it comes back (contract/placeholders.py)."""

from __future__ import annotations

import pytest

from contract.placeholders import (
    Accelerator,
    TooManySpans,
    find_spans,
    mask,
    place_accelerator,
    restore,
    strip_accelerator,
)

POOL = tuple("XYZQJK")


@pytest.mark.parametrize(
    ("text", "spans", "kind"),
    [
        ("Could not open %s.", ["%s"], "printf"),
        (
            "%5.2f %ld %1$s %zu %m %% %-10s %*d %dx%d",
            ["%5.2f", "%ld", "%1$s", "%zu", "%m", "%%", "%-10s", "%*d", "%d", "%d"],
            "printf",
        ),
        ("%(count)d files in %(folder)s", ["%(count)d", "%(folder)s"], "printf"),
        ("Page %1 of %2, %L3", ["%1", "%2", "%L3"], "positional"),
        ("{name} {0} {0:N2} {} {user.name}", ["{name}", "{0}", "{0:N2}", "{}", "{user.name}"], "brace"),
        ('<b>bold</b> <a href="x.html">link</a> <br/>', ["<b>", "</b>", '<a href="x.html">', "</a>", "<br/>"], "tag"),
        ("Tom &amp; Jerry &#169; &#x2014;", ["&amp;", "&#169;", "&#x2014;"], "entity"),
        (r"line\nnext\ttab \x41 \\", [r"\n", r"\t", r"\x41", "\\\\"], "escape"),
        ("a%20b and %0A", ["%20", "%0A"], None),
        ("%Y-%m-%d %H:%M, %_d %Oy", ["%Y", "%m", "%d", "%H", "%M", "%_d", "%Oy"], None),
        ("%PRODUCTNAME and %value, Boost %1% and %2%", ["%PRODUCTNAME", "%value", "%1%", "%2%"], None),
    ],
)
def test_each_kind_of_span_is_found_verbatim(text, spans, kind):
    found = find_spans(text)
    assert [s.text for s in found] == spans
    assert all(text[s.start : s.end] == s.text for s in found)
    if kind:
        assert {s.kind for s in found} == {kind}


@pytest.mark.parametrize("text", ["100% sure", "50 % off", "a {b c} d", "x < y > z", "AT&T", "C:\\Users"])
def test_text_that_only_looks_like_a_span_is_left_to_the_model(text):
    assert find_spans(text) == []


def test_sequential_conversions_and_closing_tags_must_follow_what_precedes_them():
    spans = find_spans("%s <b>%d</b> %1$s %(n)s {} {0} {}")
    by_text = {s.text: s for s in spans}
    assert spans[0].after == () and by_text["%d"].after == (0,)  # %d reads the argument after %s's
    assert by_text["</b>"].after == (1,)  # after its <b>
    assert by_text["%1$s"].after == by_text["%(n)s"].after == by_text["{0}"].after == ()
    assert spans[-1].after == (6,)  # the second {} after the first


@pytest.mark.parametrize(
    "text",
    [
        "Could not open file %s.",
        "<b>bold</b> text &amp; more\\n",
        "Progress: 50%% done, %1$s of %2$s",
        "%d%% complete",
        "(%s) files in <i>%s</i>.",
        "Warning:</b> done",
    ],
)
def test_a_masked_text_restores_to_itself(text):
    m = mask(text, POOL)
    assert all(s not in text for s in m.sentinels)
    restored, found = restore(m.text, m)
    assert restored == text and all(found)


def test_sentinels_stand_apart_from_the_words_they_touch_and_rejoin_them_after():
    m = mask("<b>bold</b> %dx", POOL)
    assert m.text == "X bold Y Z x"
    assert restore("X fett Y Z x", m) == ("<b>fett</b> %dx", [True, True, True])
    # a span that touched another span does not swallow the space before a word the model put between them
    m = mask("<b>%s</b>", POOL)
    assert restore("X Datei Y Z", m)[0] == "<b> Datei %s</b>"


def test_a_restored_span_is_never_read_as_a_longer_one():
    m = mask("%l contents", POOL)
    assert restore("Xinhalt", m)[0] == "%l inhalt"  # not "%linhalt", where a C program reads %li
    m = mask("%dx%d", POOL)
    assert restore("X x Y", m)[0] == "%dx%d"  # as the source had it


def test_a_sentinel_already_in_the_text_is_skipped_and_a_missing_one_is_reported():
    m = mask("X marks %s", POOL)
    assert m.sentinels == ("Y",) and m.text == "X marks Y"
    assert restore("X markiert", m) == ("X markiert", [False])


def test_more_spans_than_free_sentinels_is_refused():
    with pytest.raises(TooManySpans, match="7 protected spans"):
        mask(" ".join(["%s"] * 7), POOL)


@pytest.mark.parametrize(
    ("text", "plain", "accelerator"),
    [
        ("Save &As...", "Save As...", Accelerator("&", "A")),
        ("_File", "File", Accelerator("_", "F")),
        ("snake_case", "snake_case", None),
        ("Tom &amp; Jerry", "Tom &amp; Jerry", None),
        ("Drag & Drop", "Drag & Drop", None),
        ("&One &Two", "&One &Two", None),  # two markers: which one is meant is unknown, so neither is touched
    ],
)
def test_an_accelerator_is_taken_out_only_when_there_is_exactly_one(text, plain, accelerator):
    assert strip_accelerator(text) == (plain, accelerator)


@pytest.mark.parametrize(
    ("translation", "accelerator", "placed"),
    [
        ("Speichern unter...", Accelerator("&", "S"), "&Speichern unter..."),
        ("Datei öffnen", Accelerator("_", "O"), "_Datei öffnen"),  # o is not ö: the translation's first letter
        ("Als Datei", Accelerator("&", "D"), "Als &Datei"),
        ("Bild laden", Accelerator("&", "d"), "&Bild laden"),  # no word starts with d: the first letter
        ("123 Dateien", Accelerator("&", "x"), "123 &Dateien"),
    ],
)
def test_the_accelerator_goes_before_a_word_starting_with_its_letter_else_the_first_letter(
    translation, accelerator, placed
):
    assert place_accelerator(translation, accelerator) == placed
