"""Filling gettext catalogs: the rules of ``attnserve_client.po`` on small catalogs, and ``translate_po`` of
both clients on a recording transport (the batches they send, what they do when the service refuses a text).

The translations here are made up, so that each rule is seen on its own; the end-to-end run on a real
Debian template, judged by ``msgfmt --check``, is test_po_e2e.py.
"""

from __future__ import annotations

import json
import subprocess

import httpx
import polib
import pytest
from attnserve_client import InvalidFieldError, TranslatedCatalog, po
from attnserve_client.cli import main

from tests.ci import needs_tool
from tests.client.sdk_testing import error
from tests.service.service_testing import free_port

TEMPLATE = r"""# SOME DESCRIPTIVE TITLE.
#, fuzzy
msgid ""
msgstr ""
"Project-Id-Version: demo 1.0\n"
"Language: \n"
"MIME-Version: 1.0\n"
"Content-Type: text/plain; charset=CHARSET\n"
"Content-Transfer-Encoding: 8bit\n"
"Plural-Forms: nplurals=INTEGER; plural=EXPRESSION;\n"

# A translator's comment.
#. TRANSLATORS: the file menu
#: src/menu.c:12 src/menu.c:40
#, c-format
#| msgid "Open %s"
msgid "Open %s"
msgstr ""

#: src/list.c:7
#, c-format
msgid "%d file"
msgid_plural "%d files"
msgstr[0] ""
msgstr[1] ""

#: src/menu.c:13
msgctxt "menu"
msgid "Open"
msgstr ""

#: src/button.c:3
msgctxt "button"
msgid "Open"
msgstr ""

#: src/help.c:9
msgid ""
"\n"
"Usage: demo FILE\n"
msgstr ""

msgctxt "blank"
msgid ""
msgstr ""

msgid "Quit"
msgstr "Beenden"

#, fuzzy
msgid "Save"
msgstr "Speichern?"

msgid "%d folder"
msgid_plural "%d folders"
msgstr[0] "%d Ordner"
msgstr[1] ""

msgid "Nothing comes back"
msgstr ""

#~ msgid "Obsolete"
#~ msgstr ""
"""

GERMAN = {
    "Open %s": "%s öffnen",
    "%d file": "%d Datei",
    "%d files": "%d Dateien",
    "Open": "Öffnen",
    "\nUsage: demo FILE\n": "Aufruf: demo DATEI",  # the service lost the newlines: put back
    "Nothing comes back": " ",
}


SOURCES = po.sources(po.load(TEMPLATE, language="de"))


def filled(text: str = TEMPLATE, translations=GERMAN, language: str = "de") -> tuple[polib.POFile, po.CatalogSummary]:
    catalog = po.load(text, language=language)
    return catalog, po.fill(catalog, translations)


def entry(catalog: polib.POFile, msgid: str, msgctxt: str | None = None) -> polib.POEntry:
    return catalog.find(msgid, msgctxt=msgctxt) if msgctxt else catalog.find(msgid)


def test_sources_are_the_untranslated_texts_each_once_in_catalog_order():
    assert SOURCES == [
        "Open %s",
        "%d file",
        "%d files",
        "Open",  # for both contexts
        "\nUsage: demo FILE\n",
        "Nothing comes back",
    ]


def test_the_summary_counts_every_entry_once():
    _, summary = filled()
    assert summary == po.CatalogSummary(entries=10, kept=3, filled=5, plural_filled=1, skipped=1, failed=1)
    assert str(summary) == "10 entries: 3 already translated (kept), 5 filled (1 plural), 1 skipped, 1 failed"


def test_a_filled_entry_is_fuzzy_and_keeps_its_comments_references_flags_and_context():
    catalog, _ = filled()
    opened = entry(catalog, "Open %s")
    assert opened.msgstr == "%s öffnen"
    assert opened.flags == ["fuzzy", "c-format"]
    assert (opened.comment, opened.tcomment) == ("TRANSLATORS: the file menu", "A translator's comment.")
    assert opened.occurrences == [("src/menu.c", "12"), ("src/menu.c", "40")]
    assert opened.previous_msgid == "Open %s"
    assert [(e.msgctxt, e.msgstr) for e in catalog if e.msgid == "Open"] == [("menu", "Öffnen"), ("button", "Öffnen")]
    assert '#, fuzzy, c-format\n#| msgid "Open %s"\nmsgid "Open %s"\nmsgstr "%s öffnen"' in str(catalog)


def test_translated_obsolete_blank_and_failed_entries_are_untouched():
    before = {(e.msgctxt, e.msgid): str(e) for e in polib.pofile(TEMPLATE)}
    catalog, _ = filled()
    untouched = [("blank", ""), (None, "Quit"), (None, "Save"), (None, "%d folder"), (None, "Nothing comes back")]
    assert {key: str(e) for e in catalog if (key := (e.msgctxt, e.msgid)) in untouched} == {
        key: before[key] for key in untouched
    }
    assert entry(catalog, "Nothing comes back").flags == []
    obsolete = catalog.obsolete_entries()
    assert len(obsolete) == 1 and obsolete[0].msgstr == "" and not obsolete[0].fuzzy


def test_newlines_at_either_end_follow_the_source():
    catalog, _ = filled(translations={**GERMAN, "Open %s": "\n%s öffnen\n"})
    assert entry(catalog, "\nUsage: demo FILE\n").msgstr == "\nAufruf: demo DATEI\n"
    assert entry(catalog, "Open %s").msgstr == "%s öffnen"


@pytest.mark.parametrize(
    ("plural_forms", "forms"),
    [
        (None, ["%d Datei", "%d Dateien"]),  # a template: German's two forms
        ("nplurals=2; plural=(n != 1);", ["%d Datei", "%d Dateien"]),
        ("nplurals=1; plural=0;", ["%d Dateien"]),
        (
            "nplurals=3; plural=(n==1 ? 0 : n%10>=2 && n%10<=4 && (n%100<10 || n%100>=20) ? 1 : 2);",
            ["%d Datei"] + ["%d Dateien"] * 2,
        ),
    ],
    ids=["template", "nplurals=2", "nplurals=1", "nplurals=3"],
)
def test_plural_forms_follow_the_catalogs_nplurals(plural_forms, forms):
    text = TEMPLATE if plural_forms is None else TEMPLATE.replace("nplurals=INTEGER; plural=EXPRESSION;", plural_forms)
    catalog, _ = filled(text)
    assert list(entry(catalog, "%d file").msgstr_plural.values()) == forms
    assert entry(catalog, "%d file").flags == ["fuzzy", "c-format"]


def test_a_template_gets_the_target_languages_header():
    catalog, _ = filled()
    assert catalog.metadata["Language"] == "de"
    assert catalog.metadata["Plural-Forms"] == "nplurals=2; plural=(n != 1);"
    assert catalog.metadata["Content-Type"] == "text/plain; charset=UTF-8"
    assert catalog.metadata["Project-Id-Version"] == "demo 1.0" and catalog.metadata_is_fuzzy  # the rest is kept
    french, _ = filled(language="fr")
    assert (french.metadata["Language"], french.metadata["Plural-Forms"]) == ("fr", "nplurals=2; plural=(n > 1);")


def test_a_catalogs_own_header_is_kept():
    text = TEMPLATE.replace('"Language: \\n"', '"Language: de_AT\\n"').replace(
        "nplurals=INTEGER; plural=EXPRESSION;", "nplurals=2; plural=n != 1;"
    )
    catalog, _ = filled(text.replace("charset=CHARSET", "charset=UTF-8"))
    assert (catalog.metadata["Language"], catalog.metadata["Plural-Forms"]) == ("de_AT", "nplurals=2; plural=n != 1;")


def test_language_mistakes_are_refused_with_what_to_do():
    with pytest.raises(ValueError, match="the catalog is for language 'fr', not 'de'"):
        filled(TEMPLATE.replace('"Language: \\n"', '"Language: fr\\n"'))
    with pytest.raises(ValueError, match="no Plural-Forms header and none is known for 'xx'"):
        filled(language="xx")
    without_plurals = TEMPLATE.replace('msgid_plural "%d files"', "").replace('msgstr[0] ""\nmsgstr[1] ""', 'msgstr ""')
    assert (
        po.fill(po.load(without_plurals, language="xx"), GERMAN).filled == 5
    )  # no plural entry: no Plural-Forms needed


@needs_tool("msgfmt", "Debian's gettext: make system-deps")
def test_the_written_catalog_passes_msgfmt_check(tmp_path):
    catalog, _ = filled()
    catalog.save(str(tmp_path / "de.po"))
    proc = subprocess.run(
        ["msgfmt", "--check", "--use-fuzzy", "-o", "/dev/null", str(tmp_path / "de.po")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr


# ---- the clients: requests and answers -------------------------------------------------------------


class FakeTranslator:
    """A MockTransport handler answering POST /translate with ``GERMAN`` (else "DE " + text), recording batches.

    Texts in ``too_long`` are refused with 413 ``text_too_long``, as the service refuses a whole request.
    """

    def __init__(self, too_long: frozenset[str] = frozenset()) -> None:
        self.batches: list[list[str]] = []
        self.bodies: list[dict] = []
        self.too_long = too_long

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.read())
        texts = body["texts"]
        self.bodies.append(body)
        self.batches.append(texts)
        if self.too_long & set(texts):
            return error(413, "text_too_long", "texts[0] is too long")
        results = [
            {"translation": GERMAN.get(t, "DE " + t), "source_tokens": [], "target_tokens": [], "finished": True}
            for t in texts
        ]
        return httpx.Response(200, json={"model": "translator", "version": "3", "results": results})


def test_translate_po_sends_each_text_once_in_batches_and_fills_the_catalog(make_client):
    translator = FakeTranslator()
    client = make_client(translator)
    result = client.translate_po(TEMPLATE, batch_size=4, beam_size=4, model="translator:3")
    assert isinstance(result, TranslatedCatalog)
    assert translator.batches == [SOURCES[:4], SOURCES[4:]]
    assert all(b["beam_size"] == 4 and b["model"] == "translator:3" for b in translator.bodies)
    assert result.summary == po.CatalogSummary(entries=10, kept=3, filled=5, plural_filled=1, skipped=1, failed=1)
    assert str(result.catalog) == str(filled()[0])


def test_translate_po_reads_and_writes_files(make_client, tmp_path):
    (tmp_path / "demo.pot").write_text(TEMPLATE)
    client = make_client(FakeTranslator())
    result = client.translate_po(tmp_path / "demo.pot", output=tmp_path / "de.po")
    assert (tmp_path / "de.po").read_text() == str(result.catalog)
    assert client.translate_po(str(tmp_path / "de.po")).summary.filled == 0  # nothing left but what failed
    with pytest.raises(FileNotFoundError, match="missing.pot"):
        client.translate_po(str(tmp_path / "missing.pot"))
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        client.translate_po(TEMPLATE, batch_size=0)


def test_a_text_refused_as_too_long_fails_alone(make_client):
    translator = FakeTranslator(too_long=frozenset({"Open"}))
    result = make_client(translator).translate_po(TEMPLATE, batch_size=8)
    assert translator.batches == [SOURCES] + [[text] for text in SOURCES]
    assert result.summary.failed == 3 and result.summary.filled == 3  # "Open" in both contexts, and the blank answer
    assert entry(result.catalog, "Open", "menu").msgstr == ""


def test_a_language_mistake_is_refused_before_anything_is_sent(make_client):
    translator = FakeTranslator()
    with pytest.raises(ValueError, match="the catalog is for language 'fr'"):
        make_client(translator).translate_po(TEMPLATE.replace('"Language: \\n"', '"Language: fr\\n"'))
    assert translator.batches == []


def test_other_refusals_are_raised(make_client):
    client = make_client(lambda request: error(422, "invalid_field", "texts: at most 32 texts per request"))
    with pytest.raises(InvalidFieldError, match="at most 32 texts"):
        client.translate_po(TEMPLATE)


def test_the_command_line_refuses_a_bad_setting_in_one_line(tmp_path, capsys):
    (tmp_path / "demo.pot").write_text(TEMPLATE)
    unused = f"http://127.0.0.1:{free_port()}"
    for argv, message in [
        ([str(tmp_path / "missing.pot")], f"{tmp_path / 'missing.pot'}: no such file"),
        ([str(tmp_path / "demo.pot"), "--batch-size", "0"], "batch_size must be >= 1, got 0"),
    ]:
        assert main(["po", "translate", *argv, "-o", str(tmp_path / "de.po"), "--base-url", unused]) == 2
        assert capsys.readouterr().err == f"attnserve-client: {message}\n"
    assert not (tmp_path / "de.po").exists()
