"""Markup taken out of a text and put back by alignment: what is kept verbatim, what is projected, and nesting.

The projection is checked on hand-made alignments (a target token linked to the source token it was made
from), so that each rule is seen on its own; the shipped translator checks it end to end on the messages of
the issue that asked for it.
"""

from __future__ import annotations

import re

import numpy as np
import onnxruntime as ort
import pytest

from contract.constraints import SentinelVocabulary
from contract.decoding import session_fn
from contract.html_text import html_parts
from contract.manifest import load_entry
from contract.markup import Element, Segment, nest, split_markup
from contract.projection import SentenceAlignment, inserts
from contract.tokenizer import load_tokenizer
from contract.translate_graphs import attention_maps, translate_all
from contract.translation_text import LETTER_SENTINELS, Rendered, plan_text
from export.text_quality import tags_kept, without_tags
from tests.conftest import SHIPPED_TRANSLATOR
from tests.contract.test_decoding import real_graphs  # noqa: F401 (a fixture)


def segments(parts):
    return [p for p in parts if isinstance(p, Segment)]


def test_inline_tags_leave_the_text_and_remember_what_they_wrapped():
    (seg,) = split_markup("Press <kbd>Ctrl</kbd>+<kbd>S</kbd> to save.")
    assert seg.plain == "Press Ctrl+S to save."
    assert [(e.open, seg.plain[e.start : e.end]) for e in seg.elements] == [("<kbd>", "Ctrl"), ("<kbd>", "S")]


def test_nested_elements_know_their_parent():
    (seg,) = split_markup("Could not open <nobr><strong>%1</strong></nobr> now.")
    outer, inner = seg.elements
    assert (outer.parent, inner.parent) == (None, 0) and seg.plain[inner.start : inner.end] == "%1"


@pytest.mark.parametrize(
    ("text", "kept"),
    [
        ("<b>Alignment</b>", ["<b>", "</b>"]),  # wraps everything: wraps the whole translation
        ("<b><big>Keep this?</big></b>", ["<b><big>", "</big></b>"]),
        ("<p>One.</p><p>Two.</p>", ["<p>", "</p><p>", "</p>"]),  # blocks separate segments
        ("<b>Failed.</b><br/>The error: %1", ["<b>", "</b><br/>"]),
        ("\n<b>Note</b>: %s", ["\n"]),
    ],
)
def test_blocks_breaks_and_whole_wraps_are_kept_verbatim_between_segments(text, kept):
    parts = split_markup(text)
    assert [p for p in parts if isinstance(p, str)] == kept
    assert all(not any(t in s.plain for t in ("<", ">")) for s in segments(parts))


def test_a_pair_split_by_a_break_is_kept_around_it_and_text_without_words_is_not_translated():
    parts = split_markup("<b>First<br/>second</b>")
    assert [p for p in parts if isinstance(p, str)] == ["<b>", "<br/>", "</b>"]
    assert split_markup("%1 <em>%2</em>") == ["%1 <em>%2</em>"]


def test_nest_clips_children_to_their_parent_and_keeps_siblings_apart():
    # parent [2, 6); its child claims [0, 8): clipped; two siblings overlap: the later one starts where the first ends
    assert nest([(2, 6), (0, 8)], [None, 0]) == [(2, 6), (2, 6)]
    assert nest([(0, 4), (2, 6)], [None, None]) == [(0, 4), (4, 6)]
    assert nest([(0, 4), (1, 3)], [None, None]) == [(0, 4), (4, 4)]  # swallowed: a point after it


def alignment(pieces, links, source_chars, same=None):
    probs = np.zeros((len(pieces), len(source_chars) + 1))
    for r, k in enumerate(links):
        probs[r, k if k is not None else -1] = 1
    return SentenceAlignment.build(0, source_chars, pieces, probs, same or {})


def test_an_element_wraps_the_whole_target_words_its_source_words_became():
    # "Click here now" -> "Klicken Sie hier jetzt": <a> wrapped "here" (chars 6-10)
    source = [(0, 5), (6, 10), (11, 14)]
    a = alignment(["▁Klicken", "▁Sie", "▁hi", "er", "▁jetzt"], [0, 0, 1, 1, 2], source)
    (ins,) = inserts([Element("<a>", "</a>", 6, 10, None)], [a])
    assert ins == {2: ([], ["<a>"]), 4: (["</a>"], [])}


def test_a_stray_link_does_not_stretch_an_element_over_the_words_between():
    source = [(0, 5), (6, 10), (11, 14)]
    # "hier" is inside; a far word that attends to "here" too would stretch the range: the densest run wins
    a = alignment(["▁hier", "▁und", "▁dann", "▁noch", "▁etwas", "▁hier"], [1, 0, 2, 2, 2, 1], source)
    (ins,) = inserts([Element("<b>", "</b>", 6, 10, None)], [a])
    assert ins[0] == ([], ["<b>"]) and ins[1] == (["</b>"], [])


def test_the_shipped_translator_puts_the_issues_markup_around_the_right_words(real_graphs):  # noqa: F811
    """The messages the issue showed broken: tags back, well nested, finished, around the German words."""
    enc, dec, spec = real_graphs
    m = load_entry(SHIPPED_TRANSLATOR).manifest
    tok = load_tokenizer(SHIPPED_TRANSLATOR, m.tokenizer)
    session = {f: ort.InferenceSession(str(SHIPPED_TRANSLATOR / f"{f}.onnx")) for f in ("encoder", "decoder_prefix")}
    with_maps = session_fn(session["encoder"], ["cross_keys", "cross_values", "encoder_attentions"])
    prefix = session_fn(session["decoder_prefix"], ["self_attentions", "cross_attentions"])
    texts = [
        "The file <b>%(name)s</b> was deleted.",
        "Press <kbd>Ctrl</kbd>+<kbd>S</kbd> to save.",
        'Click <a href="%s">here</a> to learn more.',
        'Open <i>%s</i> and other files of type "%s" with:',
    ]
    out = translate_all(
        enc, dec, tok, spec, texts, 4, attention=lambda s, h: attention_maps(with_maps, prefix, spec, s, h)
    )
    for source, t in zip(texts, out):
        assert t.finished and tags_kept(source, t.text), t.text
        assert len(without_tags(t.text)) < 1.8 * len(without_tags(source))
    assert "<b>%(name)s</b>" in out[0].text and "<i>%s</i>" in out[3].text
    assert "<kbd>Strg</kbd>" in out[1].text and ">hier</a>" in out[2].text


def test_an_html_page_keeps_scripts_styles_code_and_attributes_and_translates_title_and_alt():
    doc = (
        "<html><head><title>The Manual</title><style>p { color: red; }</style></head><body>\n"
        '<p>Click <a href="x.html" title="Open it">here</a>\n to read &quot;it&quot; &amp; more.</p>'
        '<img src="a.png" alt="A screenshot"><pre>keep  <b>this</b></pre><!-- a comment -->'
        '<script>var x = "<b>not</b>";</script></body></html>'
    )
    parts, _ = html_parts(doc)
    plains = [s.plain for s in segments(parts)]
    assert plains == ["The Manual", 'Click here to read "it" &amp; more.', "A screenshot"]
    verbatim = "".join(p for p in parts if isinstance(p, str))
    for kept in (
        "<style>p { color: red; }</style>",
        "<pre>keep  <b>this</b></pre>",
        '<script>var x = "<b>not</b>";</script>',
    ):
        assert kept in verbatim
    assert segments(parts)[1].elements[0].open == '<a href="x.html" title="Open it">'


def test_an_attribute_values_translation_cannot_close_its_quotes():
    tok = load_tokenizer(SHIPPED_TRANSLATOR, load_entry(SHIPPED_TRANSLATOR).manifest.tokenizer)
    plan = plan_text(
        '<img alt="The &quot;big&quot; picture">', tok, SentinelVocabulary.build(tok, LETTER_SENTINELS), html=True
    )
    (sentence,) = plan.sentences
    assert sentence.quote == '"'
    assert plan.finish([Rendered('Das "große" Bild')]) == '<img alt="Das &quot;große&quot; Bild">'


@pytest.mark.parametrize(
    "text",
    [
        "See <a href='#f1'><span>[</span>1<span>]</span></a> and <b>more <i>text</i> here</b>.",
        "<em>A</em> <b><i>b</i> c <u>d</u></b> e <img src='x.png'/> f <a href='y'></a> g",
        "Could not open <nobr><strong>%1</strong></nobr> in <b>the <i>%2</i> folder</b> now.",
    ],
)
def test_whatever_the_alignment_says_the_tags_come_back_once_each_and_nested(text):
    """Two sentences of random links between target tokens and source words: every tag is inserted once, and
    read in order (sentence by sentence, each boundary's tags before the space, then after it) they nest as in
    the source, also where an element's ends fall in different sentences."""
    (seg,) = segments(split_markup(text))
    source = [(m.start(), m.end()) for m in re.finditer(r"\w+|[^\w\s]", seg.plain)]
    rng = np.random.default_rng(0)
    for _ in range(300):
        cut = int(rng.integers(1, len(source)))  # two sentences: the source's tokens before and after the cut
        parts = []
        for own in (source[:cut], source[cut:]):
            links = [int(k) if k < len(own) else None for k in rng.integers(0, len(own) + 2, 6)]
            parts.append(alignment(["▁w" if rng.random() < 0.7 else "x" for _ in links], links, own))
        order = [t for ins in inserts(seg.elements, parts) for g in sorted(ins) for t in ins[g][0] + ins[g][1]]
        assert tags_kept(text, "".join(order)), order
