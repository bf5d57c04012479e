"""The reference pages are checked against the code they describe, both ways.

- docs/configuration.md has one row per field of ``service.settings.Settings``: its variable, its
  default and its description; no row names a variable that is not a field.
- docs/api.md's error table has a row for every (status, code) the service answers with: every
  ``ServiceError`` subclass, the codes given to Starlette's own HTTP errors, and the codes written
  literally in ``service/``; no row names a code the service never answers.
- docs/api.md lists every field of the /classify and /translate request bodies.
- Every ``ATTNSERVE_*`` variable named anywhere in the README or the docs exists (a service setting,
  or one of the client's).
- docs/client.md names every exception class the SDK exports.
"""

from __future__ import annotations

import importlib
import json
import pkgutil
import re

import pytest

from tests.docs.markdown import DOCS, code_spans, documents, name, section, table_rows
from tests.service.service_testing import ROOT

CONFIGURATION = DOCS / "configuration.md"
API = DOCS / "api.md"
CLIENT = DOCS / "client.md"
VARIABLE = re.compile(r"\bATTNSERVE_[A-Z0-9_]*[A-Z0-9]\b")


def render_default(value: object) -> str:
    """A default as the configuration page writes it (as it would be set in the environment)."""
    if value is None:
        return "(unset)"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, tuple | list):
        return json.dumps(list(value), separators=(",", ":"))
    return str(value)


# ---- configuration --------------------------------------------------------------------------------


def settings_fields() -> dict[str, tuple[str, str]]:
    """``ATTNSERVE_<NAME>`` -> (default as written, description) of every Settings field."""
    from service.settings import Settings

    return {
        f"ATTNSERVE_{field_name.upper()}": (render_default(field.default), field.description or "")
        for field_name, field in Settings.model_fields.items()
    }


def configuration_rows() -> dict[str, list[str]]:
    rows = {}
    for cells in table_rows(CONFIGURATION.read_text(encoding="utf-8")):
        spans = code_spans(cells[0])
        if len(cells) == 3 and spans and spans[0].startswith("ATTNSERVE_"):
            assert spans[0] not in rows, f"{spans[0]} has two rows"
            rows[spans[0]] = cells
    return rows


@pytest.mark.parametrize("variable", sorted(settings_fields()))
def test_every_setting_has_its_row(variable):
    default, description = settings_fields()[variable]
    rows = configuration_rows()
    assert variable in rows, f"{variable} is a Settings field but has no row in {name(CONFIGURATION)}"
    _, default_cell, description_cell = rows[variable]
    assert code_spans(default_cell) == [default], f"{variable}: the page says {default_cell}, Settings {default}"
    assert description_cell.startswith(description), f"{variable}: the row does not start with {description!r}"


def test_every_row_is_a_setting():
    assert sorted(set(configuration_rows()) - set(settings_fields())) == []


def client_variables() -> set[str]:
    sources = (ROOT / "client" / "attnserve_client").rglob("*.py")
    return {v for path in sources for v in VARIABLE.findall(path.read_text(encoding="utf-8"))}


@pytest.mark.parametrize("document", documents(), ids=name)
def test_variables_named_in_the_docs_exist(document):
    known = set(settings_fields()) | client_variables()
    named = set(VARIABLE.findall(document.read_text(encoding="utf-8")))
    assert sorted(named - known) == []


# ---- error codes ----------------------------------------------------------------------------------


def service_errors() -> tuple[set[tuple[int, str]], set[str]]:
    """(status, code) pairs the service answers with, and codes found without a status."""
    import service
    from service import errors
    from service.http.router import HTTP_CODES

    for module in pkgutil.walk_packages(service.__path__, "service."):
        if module.name != "service.__main__":
            importlib.import_module(module.name)  # every ServiceError subclass, wherever it is defined
    pairs, stack = set(), [errors.ServiceError]
    while stack:
        cls = stack.pop()
        pairs.add((cls.status, cls.code))
        stack += cls.__subclasses__()
    pairs |= set(HTTP_CODES.items())
    codes = set()
    for path in (ROOT / "service").rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        pairs |= {(int(s), c) for s, c in re.findall(r"error_response\(\s*(\d{3}),\s*\"(\w+)\"", text)}
        codes |= set(re.findall(r"\"code\": \"(\w+)\"", text))
    return pairs, codes


def error_rows() -> set[tuple[int, str]]:
    rows = set()
    for cells in table_rows(section(API, "## Errors")):
        assert cells[0].isdigit() and len(code_spans(cells[1])) == 1, f"not a status and one code: {cells}"
        rows.add((int(cells[0]), code_spans(cells[1])[0]))
    return rows


def test_every_error_code_has_its_row():
    pairs, codes = service_errors()
    rows = error_rows()
    assert sorted(pairs - rows) == []
    assert sorted(codes - {code for _, code in rows}) == []


def test_every_row_is_an_error_the_service_answers():
    pairs, codes = service_errors()
    assert sorted(row for row in error_rows() if row not in pairs and row[1] not in codes) == []


def test_the_client_exceptions_are_documented():
    import attnserve_client

    exceptions = [n for n in attnserve_client.__all__ if n.endswith("Error")]
    assert len(exceptions) >= 10
    text = CLIENT.read_text(encoding="utf-8")
    assert [n for n in exceptions if f"`{n}`" not in text] == []


# ---- request fields -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("heading", "schema"),
    [("## `POST /classify`", "ClassifyJSONRequest"), ("## `POST /translate`", "TranslateRequest")],
)
def test_every_request_field_is_documented(heading, schema):
    from service import schemas

    fields = set(getattr(schemas, schema).model_fields)
    listed = {span for cells in table_rows(section(API, heading)) for span in code_spans(cells[0])}
    assert sorted(fields - listed) == []
    assert "file" in listed or schema != "ClassifyJSONRequest"  # the multipart form's name for `images`


def test_a_stale_row_is_noticed(tmp_path, monkeypatch):
    """The configuration check can fail: a page with a default changed and a row too many is refused."""
    page = CONFIGURATION.read_text(encoding="utf-8")
    page = page.replace("| `ATTNSERVE_PORT` | `8000` |", "| `ATTNSERVE_PORT` | `8080` |")
    page += "\n| variable | default | |\n| --- | --- | --- |\n| `ATTNSERVE_NO_SUCH_SETTING` | `1` | Gone. |\n"
    stale = tmp_path / "configuration.md"
    stale.write_text(page, encoding="utf-8")
    monkeypatch.setitem(globals(), "CONFIGURATION", stale)
    with pytest.raises(AssertionError):
        test_every_setting_has_its_row("ATTNSERVE_PORT")
    with pytest.raises(AssertionError):
        test_every_row_is_a_setting()
