"""Markup through ``POST /translate`` and the Open Inference Protocol on a real uvicorn server (127.0.0.1).

What a user who sends UI strings or HTML relies on: the tags come back, nested as they were, around the
German words their English wrapped, in a translation that ended by itself; ``format: "html"`` translates a
document's text and leaves its scripts, styles, code and attributes alone; both answers are cached apart.
"""

from __future__ import annotations

from html.parser import HTMLParser

import httpx
import numpy as np
import pytest
import tritonclient.http as triton

from export.text_quality import tags_kept, without_tags
from tests.conftest import ROOT
from tests.service.service_testing import serving

SHIPPED = ROOT / "models"
MARKUP = [  # the messages the issue showed rambling, and one of each kind of markup
    "The file <b>%(name)s</b> was deleted.",
    "Press <kbd>Ctrl</kbd>+<kbd>S</kbd> to save.",
    'Click <a href="%s">here</a> to learn more.',
    'Open <i>%s</i> and other files of type "%s" with:',
    "<b>Warning:</b> the file could not be saved.",
    "<qt>Could not open <nobr><strong>%1</strong></nobr>.</qt>",
    "Saved.<br/>The document was written to the disk.",
]
PAGE = """<!DOCTYPE html>
<html><head><title>Using the printer</title><style>h1 { color: #333; }</style></head>
<body>
<h1>Printing a document</h1>
<p>Open the <b>File</b> menu and choose <a href="print.html" class="x">Print</a>.
   The printer prints the whole document.</p>
<img src="dialog.png" alt="The print dialog">
<pre>lpr -P office report.txt</pre>
<ul><li>Select the pages you want to print.</li><li>Click <em>OK</em>.</li></ul>
<script>document.title = "<b>keep</b>";</script>
</body></html>"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with serving(tmp_path_factory.mktemp("markup"), SHIPPED) as srv:
        yield srv


def post(server, **body) -> httpx.Response:
    return httpx.post(server.url + "/translate", json=body, timeout=120)


@pytest.mark.parametrize("beam", [1, 4])
def test_tags_come_back_nested_in_a_finished_translation_that_does_not_ramble(server, beam):
    results = post(server, texts=MARKUP, beam_size=beam).json()["results"]
    for source, r in zip(MARKUP, results):
        assert r["finished"] and tags_kept(source, r["translation"]), (source, r["translation"])
        assert len(without_tags(r["translation"])) < 1.8 * len(without_tags(source)) + 10
    assert "<b>%(name)s</b>" in results[0]["translation"]
    assert results[4]["translation"].startswith("<b>") and results[5]["translation"].startswith("<qt>")


def test_the_tags_are_listed_with_the_placeholders_in_the_order_of_the_text(server):
    (r,) = post(server, text='Click <a href="%s">here</a> to open %d files.').json()["results"]
    assert [(p["text"], p["kind"], p["restored"]) for p in r["placeholders"]] == [
        ('<a href="%s">', "tag", True),
        ("</a>", "tag", True),
        ("%d", "printf", True),
    ]


class Structure(HTMLParser):
    """The tags of a document in order, and the text of its script, style and pre elements."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[str] = []
        self.kept: list[str] = []
        self.attrs: list[tuple] = []
        self._raw = 0

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.attrs.append(tuple((k, v) for k, v in attrs if k not in ("title", "alt")))
        self._raw += tag in ("script", "style", "pre")

    def handle_endtag(self, tag):
        self.tags.append("/" + tag)
        self._raw -= tag in ("script", "style", "pre")

    def handle_data(self, data):
        if self._raw:
            self.kept.append(data)


def structure(document: str) -> Structure:
    s = Structure()
    s.feed(document)
    return s


def test_an_html_page_keeps_its_structure_code_and_attributes_and_translates_its_text(server):
    (r,) = post(server, text=PAGE, format="html", beam_size=1).json()["results"]
    page, german = structure(PAGE), structure(r["translation"])
    assert german.tags == page.tags and german.kept == page.kept and german.attrs == page.attrs
    assert "Drucken" in r["translation"] or "drucken" in r["translation"]
    assert 'alt="The print dialog"' not in r["translation"]  # alt is text: translated
    assert r["finished"]


def test_html_and_text_answers_are_told_apart_and_bad_formats_refused(server):
    text = post(server, text="<p>Open the file.</p>").json()["results"][0]["translation"]
    html = post(server, text="<p>Open the file.</p>", format="html").json()["results"][0]["translation"]
    assert text.startswith("<p>") and html.startswith("<p>")
    r = post(server, text="Open.", format="markdown")
    assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_field"


def test_the_open_inference_protocol_takes_the_format_parameter(server):
    client = triton.InferenceServerClient(server.url.removeprefix("http://"))
    texts = triton.InferInput("text", [1], "BYTES")
    texts.set_data_from_numpy(np.array([b"<p>Open the <b>file</b>.</p>"], dtype=object))
    out = client.infer("translator", [texts], parameters={"format": "html"}).as_numpy("translation")
    assert structure(out[0].decode()).tags == ["p", "b", "/b", "/p"]


def test_a_document_with_nothing_to_translate_comes_back_as_it_is_with_or_without_attention(server):
    for body in ({"text": "<p></p><br>"}, {"text": "<script>x()</script>", "return_attention": True}):
        (r,) = post(server, format="html", **body).json()["results"]
        assert r["translation"] == body["text"] and r["finished"] and r["sentences"] == []


def test_crossed_tags_stay_one_sentence_and_each_comes_back(server):
    """``<b>the <i>file</b> now</i>`` does not nest: its unpaired ends are points, the sentence is not cut."""
    (r,) = post(server, text="<p>Open <b>the <i>file</b> now</i>.</p>", format="html").json()["results"]
    assert len(r["sentences"]) == 1 and all(r["translation"].count(t) == 1 for t in ("<b>", "</b>", "<i>", "</i>"))
