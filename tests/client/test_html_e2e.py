"""``attnserve-client html translate`` on a real page from a Debian package, judged by Python's ``html.parser``.

Starts ``python -m service`` on the shipped models (the ``server`` fixture, 127.0.0.1 only) and fetches
``debian-faq`` with ``apt-get download`` + ``dpkg -x`` (``model.translation.debian``, ~500 kB) for
``usr/share/doc/debian/FAQ/getting-debian.en.html``: in bookworm (11.1), chapter 2 of the Debian FAQ, a
DocBook XHTML page of ~10 kB with a ``<style>``, headings, a table of contents, definition lists, ~30
links, ``<em>``/``<strong>``/``<code>`` and two ``<pre>`` blocks. Greedy decoding translates it in a few
seconds. The translation must keep the page's structure exactly (the same start and end tags in the same
order, every attribute but ``title``/``alt`` unchanged, ``<script>``/``<style>``/``<pre>``/``<code>``
byte for byte) while most of its visible text changes. A page the service refuses whole (more sentences
than the model queues at once) is sent in parts cut before block tags, with the same result.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

import httpx
import pytest
from attnserve_client._html import cut_points, halves
from attnserve_client.cli import html_output_path, main

from model.translation import debian
from tests.ci import missing
from tests.client.sdk_testing import Script

PACKAGE = "debian-faq"
PAGE = "usr/share/doc/debian/FAQ/getting-debian.en.html"
VERBATIM = {"script", "style", "pre", "code"}  # kept byte for byte by the service
BLOCKS = {"title", "p", "li", "dt", "dd", "th", "td", "h1", "h2", "h3", "h4", "h5", "h6", "div", "table", "tr"}
TRANSLATED = {"model": "translator", "version": "3", "results": []}


def needed(available: bool, what: str) -> None:
    if not available:
        missing(f"{what} is missing")  # CI installs them (make system-deps) and reaches Debian's registry


@dataclass
class Parsed:
    """What a document is made of, as ``html.parser`` reads it."""

    tags: list[tuple[str, str]] = field(default_factory=list)  # ("start" | "end" | "startend", name), in order
    attributes: list[tuple[str, list[tuple[str, str | None]]]] = field(default_factory=list)  # but title/alt
    hrefs: list[str] = field(default_factory=list)
    verbatim: list[tuple[str, str]] = field(default_factory=list)  # (tag, its raw content) of VERBATIM elements
    blocks: list[str] = field(default_factory=list)  # visible text between block tags, outside VERBATIM


class _Reader(HTMLParser):
    def __init__(self, document: str) -> None:
        super().__init__(convert_charrefs=True)
        self.document = document
        self.line_starts = [0] + [i + 1 for i, c in enumerate(document) if c == "\n"]
        self.parsed = Parsed()
        self.inside: list[tuple[str, int]] = []  # VERBATIM elements open: (tag, offset where their content starts)
        self.text: list[str] = []

    def position(self) -> int:
        line, column = self.getpos()
        return self.line_starts[line - 1] + column

    def close_block(self) -> None:
        text = " ".join("".join(self.text).split())
        if any(c.isalpha() for c in text):
            self.parsed.blocks.append(text)
        self.text.clear()

    def tag(self, kind: str, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.parsed.tags.append((kind, tag))
        self.parsed.attributes.append((tag, [(k, v) for k, v in attrs if k not in ("title", "alt")]))
        self.parsed.hrefs += [v or "" for k, v in attrs if k == "href"]
        if tag in BLOCKS or tag == "br":
            self.close_block()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tag("start", tag, attrs)
        if tag in VERBATIM:
            self.inside.append((tag, self.position() + len(self.get_starttag_text() or "")))

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tag("startend", tag, attrs)

    def handle_endtag(self, tag: str) -> None:
        if self.inside and self.inside[-1][0] == tag:
            name, start = self.inside.pop()
            self.parsed.verbatim.append((name, self.document[start : self.position()]))
        self.tag("end", tag, [])

    def handle_data(self, data: str) -> None:
        if not self.inside:
            self.text.append(data)


def parse(document: str) -> Parsed:
    reader = _Reader(document)
    reader.feed(document)
    reader.close()
    reader.close_block()
    return reader.parsed


@pytest.fixture(scope="module")
def page(tmp_path_factory) -> Path:
    needed(shutil.which("apt-get") is not None and shutil.which("dpkg") is not None, "apt-get or dpkg")
    try:
        unpacked = debian.fetch(PACKAGE, tmp_path_factory.mktemp("debian-cache"))
    except debian.PackageError as e:
        needed(False, f"{PACKAGE} ({e})")
    return unpacked.root / PAGE


@pytest.fixture(scope="module")
def translated(page, server, tmp_path_factory) -> tuple[Path, str]:
    """The page translated by the command line (greedy, for speed): (the written page, what it printed)."""
    output = tmp_path_factory.mktemp("html") / "getting-debian.de.html"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        status = main(["--base-url", server.url, "html", "translate", str(page), "-o", str(output), "--beam-size", "1"])
    assert status == 0
    return output, printed.getvalue()


def test_the_page_is_the_one_described(page):
    source = parse(page.read_text(encoding="utf-8"))
    names = {name for _, name in source.tags}
    assert {"style", "pre", "code", "em", "a", "h1", "h2", "dl", "img"} <= names
    assert len(source.hrefs) >= 25 and len(source.blocks) >= 40 and len(page.read_bytes()) < 20_000


def test_the_structure_links_and_verbatim_parts_are_kept(page, translated):
    output, printed = translated
    english, german = page.read_text(encoding="utf-8"), output.read_text(encoding="utf-8")
    assert printed == f"{output}: {len(german)} characters written (from {len(english)} in {page})\n"
    source, result = parse(english), parse(german)
    assert result.tags == source.tags
    assert result.attributes == source.attributes
    assert result.hrefs == source.hrefs
    assert result.verbatim == source.verbatim
    assert {name for name, _ in source.verbatim} == VERBATIM - {"script"}  # the page has no script
    assert german.startswith('<?xml version="1.0" encoding="UTF-8" standalone="no"?>\n<!DOCTYPE html PUBLIC')


def test_most_visible_text_is_translated(page, translated, record_property):
    source, result = parse(page.read_text(encoding="utf-8")), parse(translated[0].read_text(encoding="utf-8"))
    assert len(result.blocks) == len(source.blocks)
    changed = sum(e != g for e, g in zip(source.blocks, result.blocks))
    record_property("html_blocks_changed", f"{changed}/{len(source.blocks)}")
    assert changed >= 0.8 * len(source.blocks)
    assert any(word in " ".join(result.blocks) for word in ("Sie", "die", "der", "und", "ist"))


def test_json_names_the_output(page, server, tmp_path, capsys):
    output = tmp_path / "out.html"
    argv = ["html", "translate", str(page), "-o", str(output), "--beam-size", "1", "--json", "--base-url", server.url]
    assert main(argv) == 0
    printed = json.loads(capsys.readouterr().out)
    characters = len(output.read_text(encoding="utf-8"))
    assert printed == {"input": str(page), "output": str(output), "characters": characters, "requests": 1}


def test_the_default_output_is_the_page_with_de_before_its_extension(tmp_path):
    assert html_output_path(Path("docs/page.html")) == Path("docs/page.de.html")
    assert html_output_path(Path("getting-debian.en.html")) == Path("getting-debian.de.html")
    assert html_output_path(Path("README")) == Path("README.de")
    assert html_output_path(Path("a.b.htm")) == Path("a.b.de.htm")


def test_default_output_and_a_fragment(server, tmp_path, capsys):
    fragment = tmp_path / "fragment.html"
    fragment.write_text('<p>Open the <a href="file.txt">file</a>.</p>\n<pre>keep  this</pre>\n', encoding="utf-8")
    assert main(["--base-url", server.url, "html", "translate", str(fragment)]) == 0
    written = tmp_path / "fragment.de.html"
    assert capsys.readouterr().out.startswith(f"{written}: ")
    german = written.read_text(encoding="utf-8")
    assert parse(german).tags == parse(fragment.read_text(encoding="utf-8")).tags
    assert '<a href="file.txt">' in german and german.endswith("<pre>keep  this</pre>\n") and "Open" not in german


def test_a_page_is_cut_only_before_block_tags_outside_kept_elements():
    page = (
        "\n<h1>Title</h1>\n<!-- <p>not here</p> -->\n<p>One <b>two</b>.</p>"
        "<pre>a\n<p>not here</p></pre><script>'<div>'</script><ul><li>Three.</li></ul>"
    )
    points = cut_points(page)
    assert [page[p : p + 4] for p in points] == ["</h1", "<p>O", "</p>", "<pre", "<ul>", "<li>", "</li", "</ul"]
    first, second = halves(page)
    assert first + second == page and second.startswith("<pre")
    assert halves("<p>One paragraph, nowhere to cut.") is None and cut_points("  <p>Leading.</p>") == [13]


def test_a_page_the_service_refuses_whole_is_sent_in_parts(server, tmp_path, capsys):
    """More sentences than the model queues at once (512 decoder rows: 413), then halves, each translated alone."""
    page = tmp_path / "long.html"
    body = "".join(f'<p>Open file {i} in the <a href="f{i}.txt">editor</a>.</p>\n' for i in range(530))
    page.write_text(f"<html><body>\n{body}<pre>keep</pre>\n</body></html>\n", encoding="utf-8")
    output = tmp_path / "long.de.html"
    assert main(["--base-url", server.url, "html", "translate", str(page), "--beam-size", "1"]) == 0
    english, german = page.read_text(encoding="utf-8"), output.read_text(encoding="utf-8")
    assert capsys.readouterr().out == (
        f"{output}: {len(german)} characters written (from {len(english)} in {page}; "
        "sent in 2 parts, the service refused it whole)\n"
    )
    source, result = parse(english), parse(german)
    assert result.tags == source.tags and result.hrefs == source.hrefs and result.verbatim == source.verbatim
    assert sum(e != g for e, g in zip(source.blocks, result.blocks)) >= 0.8 * len(source.blocks)


def test_failures_are_one_line_on_stderr_and_a_nonzero_status(server, tmp_path, capsys):
    status = main(["--base-url", server.url, "html", "translate", str(tmp_path / "missing.html")])
    err = capsys.readouterr().err
    assert status == 2 and "missing.html" in err and len(err.splitlines()) == 1
    latin1 = tmp_path / "latin1.html"
    latin1.write_bytes("<p>Café</p>".encode("latin-1"))
    status = main(["--base-url", server.url, "html", "translate", str(latin1)])
    err = capsys.readouterr().err
    assert status == 2 and "not UTF-8" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "latin1.de.html").exists()
    blank = tmp_path / "blank.html"
    blank.write_text("  \n", encoding="utf-8")
    status = main(["--base-url", server.url, "html", "translate", str(blank)])
    err = capsys.readouterr().err
    assert status == 1 and "422 invalid_field" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "blank.de.html").exists()


def test_translate_format_html_on_the_command_line(server, capsys):
    status = main(["--base-url", server.url, "translate", "<p>Open the <b>file</b>.</p>", "--format", "html"])
    out = capsys.readouterr().out
    assert status == 0 and out.startswith("<p>") and out.rstrip("\n").endswith("</p>") and "<b>" in out
    assert main(["--base-url", server.url, "translate", "<p>Open.</p>", "--format", "html", "--stream"]) == 2


def test_the_sdk_sends_format_html(api):
    """Both clients, on the real service: the tags come back around the translated words, and a ``<pre>``
    is kept as it is (as text, tags are a message's placeholders and ``pre`` holds words to translate)."""
    translation = api.translate("<p>Open the <b>file</b>.</p>", format="html", beam_size=1).results[0].translation
    assert translation.startswith("<p>") and translation.endswith("</p>")
    assert translation.index("<b>") < translation.index("</b>") and "Datei" in translation and "Open" not in translation
    code = "<p>Open the file.</p><pre>Open the file.</pre>"
    assert api.translate(code, format="html", beam_size=1).results[0].translation.endswith("<pre>Open the file.</pre>")
    assert "<pre>Open the file.</pre>" not in api.translate(code, beam_size=1).results[0].translation


@pytest.mark.parametrize(("options", "field"), [({}, None), ({"format": "text"}, None), ({"format": "html"}, "html")])
def test_format_is_sent_only_when_not_text(make_client, options, field):
    """An older service, which knows no ``format``, still translates plain text."""
    script = Script(httpx.Response(200, json=TRANSLATED))
    make_client(script).translate("<p>Open.</p>", **options)
    assert json.loads(script.requests[0].content).get("format", None) == field
