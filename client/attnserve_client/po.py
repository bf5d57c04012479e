"""Fill the untranslated entries of a gettext catalog (``.po``/``.pot``) with machine translations.

``Client.translate_po``, ``AsyncClient.translate_po`` and ``attnserve-client po translate`` read a
catalog (``load``), send the texts of its untranslated entries (``sources``) to ``POST /translate`` in
``batches``, and write the answers back (``fill``); this module holds the rules, the clients the
requests. The rules, so that a translator can review the result with the usual tools:

- Only entries with nothing translated are filled: an empty ``msgstr``, or, for a plural entry, every
  ``msgstr[i]`` empty. Translated entries (fuzzy or not), obsolete entries and the header are untouched.
- A filled entry is flagged ``fuzzy`` (machine output awaits review) and keeps its context
  (``msgctxt``), comments, references and other flags (``c-format`` ...).
- A plural entry gets ``msgstr[0]`` from ``msgid`` and every other form from ``msgid_plural``; with
  ``nplurals=1``, its only form from ``msgid_plural``. ``nplurals`` comes from the catalog's
  ``Plural-Forms``; a template without one (``nplurals=INTEGER``) gets the target language's, with
  ``Language`` when it has none and ``charset=UTF-8`` when it says ``CHARSET``.
- A translation begins and ends with a newline exactly when its source text does (added or removed
  after translation): ``msgfmt --check`` refuses an entry where they differ.
- Blank ``msgid``s are skipped; an entry whose translation comes back empty, or whose text the
  service refuses as too long, fails and stays untranslated. The summary counts both.
- Each distinct text is translated once, however many entries share it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import polib

__all__ = ["CatalogSummary", "TranslatedCatalog", "batches", "fill", "load", "sources"]

DEFAULT_BATCH_SIZE = 32  # the service's default ATTNSERVE_MAX_TEXTS_PER_REQUEST
FUZZY = "fuzzy"

# Plural-Forms of common target languages, from the GNU gettext manual ("Plural forms").
_SLAVIC_EAST = "n%10==1 && n%100!=11 ? 0 : n%10>=2 && n%10<=4 && (n%100<10 || n%100>=20) ? 1 : 2"
PLURAL_FORMS: dict[str, str] = {
    **dict.fromkeys(["ja", "ko", "th", "vi", "zh"], "nplurals=1; plural=0;"),
    **dict.fromkeys(
        ["bg", "ca", "da", "de", "el", "en", "eo", "es", "et", "fi", "it", "nb", "nl", "nn", "pt", "sv"],
        "nplurals=2; plural=(n != 1);",
    ),
    **dict.fromkeys(["fr", "pt_BR"], "nplurals=2; plural=(n > 1);"),
    **dict.fromkeys(["ru", "uk"], f"nplurals=3; plural=({_SLAVIC_EAST});"),
    "pl": "nplurals=3; plural=(n==1 ? 0 : n%10>=2 && n%10<=4 && (n%100<10 || n%100>=20) ? 1 : 2);",
    **dict.fromkeys(["cs", "sk"], "nplurals=3; plural=((n==1) ? 0 : (n>=2 && n<=4) ? 1 : 2);"),
}


@dataclass(frozen=True)
class CatalogSummary:
    """What happened to each entry of a catalog (the header and obsolete entries are not counted)."""

    entries: int
    kept: int  # already translated, fuzzy or not: untouched
    filled: int  # machine-translated now and flagged fuzzy
    plural_filled: int  # of ``filled``, the plural entries
    skipped: int  # a blank msgid: nothing to translate
    failed: int  # an empty translation, or a text the service refused as too long

    def __str__(self) -> str:
        return (
            f"{self.entries} entries: {self.kept} already translated (kept), {self.filled} filled "
            f"({self.plural_filled} plural), {self.skipped} skipped, {self.failed} failed"
        )


@dataclass(frozen=True)
class TranslatedCatalog:
    """The filled catalog (``str()`` is its PO text, ``.save(path)`` writes it) and its summary."""

    catalog: polib.POFile
    summary: CatalogSummary


def load(source: str | os.PathLike[str], *, language: str) -> polib.POFile:
    """The catalog of a path, or of PO text (a ``str`` holding a newline: PO text always has several lines),
    with a template's header completed for ``language``.

    Refused before anything is translated (``ValueError``) when the catalog names another language, or
    has plural entries to fill and no ``Plural-Forms`` is known.
    """
    if isinstance(source, str) and "\n" in source:
        catalog = polib.pofile(source)
    else:
        path = os.fspath(source)
        if not os.path.isfile(path):  # polib would parse a missing path as PO text
            raise FileNotFoundError(f"{path}: no such file")
        catalog = polib.pofile(path)
    _complete_header(catalog, language)
    if _nplurals(catalog) is None and any(e.msgid_plural and _untranslated(e) for e in catalog):
        raise ValueError(f"the catalog has no Plural-Forms header and none is known for {language!r}: add one")
    return catalog


def sources(catalog: polib.POFile) -> list[str]:
    """The distinct texts to translate, in catalog order: the msgids (and plurals) of the untranslated entries."""
    texts = (text for entry in catalog if _untranslated(entry) for text in _texts(entry) if text.strip())
    return list(dict.fromkeys(texts))


def batches(texts: Sequence[str], size: int) -> Iterator[list[str]]:
    if size < 1:
        raise ValueError(f"batch_size must be >= 1, got {size}")
    for start in range(0, len(texts), size):
        yield list(texts[start : start + size])


def fill(catalog: polib.POFile, translations: Mapping[str, str]) -> CatalogSummary:
    """Write ``translations`` (source text -> translation) into the untranslated entries of a ``load``ed catalog."""
    nplurals = _nplurals(catalog)
    counts = dict.fromkeys(["entries", "kept", "filled", "plural_filled", "skipped", "failed"], 0)
    for entry in catalog:
        if entry.obsolete:
            continue
        counts["entries"] += 1
        if not _untranslated(entry):
            counts["kept"] += 1
        elif not all(text.strip() for text in _texts(entry)):
            counts["skipped"] += 1
        elif not all(translations.get(text, "").strip() for text in _texts(entry)):
            counts["failed"] += 1
        else:
            singular, *plural = (_match_newlines(text, translations[text]) for text in _texts(entry))
            if plural:
                if nplurals is None:
                    raise ValueError("the catalog has no Plural-Forms header: load() it with a language that has one")
                forms = [plural[0]] if nplurals == 1 else [singular] + plural * (nplurals - 1)
                entry.msgstr_plural = dict(enumerate(forms))
                counts["plural_filled"] += 1
            else:
                entry.msgstr = singular
            if FUZZY not in entry.flags:
                entry.flags.insert(0, FUZZY)
            counts["filled"] += 1
    return CatalogSummary(**counts)


def _texts(entry: polib.POEntry) -> list[str]:
    return [entry.msgid, entry.msgid_plural] if entry.msgid_plural else [entry.msgid]


def _untranslated(entry: polib.POEntry) -> bool:
    if entry.obsolete:
        return False
    if entry.msgid_plural:
        return not any(entry.msgstr_plural.values())
    return not entry.msgstr


def _match_newlines(source: str, translation: str) -> str:
    body = translation.strip("\n")
    return ("\n" if source.startswith("\n") else "") + body + ("\n" if source.endswith("\n") else "")


def _complete_header(catalog: polib.POFile, language: str) -> None:
    meta = catalog.metadata
    named = meta.get("Language", "")
    if named and _primary(named) != _primary(language):
        raise ValueError(f"the catalog is for language {named!r}, not {language!r}: pass that language")
    meta["Language"] = named or language
    if "CHARSET" in meta.get("Content-Type", "CHARSET"):
        meta["Content-Type"] = "text/plain; charset=UTF-8"
        catalog.encoding = "utf-8"
    if _nplurals(catalog) is None and (forms := PLURAL_FORMS.get(language) or PLURAL_FORMS.get(_primary(language))):
        meta["Plural-Forms"] = forms


def _nplurals(catalog: polib.POFile) -> int | None:
    found = re.search(r"nplurals\s*=\s*(\d+)", catalog.metadata.get("Plural-Forms", ""))
    return int(found.group(1)) if found and int(found.group(1)) > 0 else None  # a template's nplurals=INTEGER: None


def _primary(language: str) -> str:
    return re.split(r"[_@.-]", language, maxsplit=1)[0].lower()
