"""Readers for the Debian sources of English-German text, each yielding raw ``(english, german)`` pairs.

- ``trans-de-en``: the Ding dictionary, one entry a line, ``german :: english``; each side is a
  ``|``-separated list of aligned sub-entries, and some sub-entries are example sentences.
- ``libreoffice-help-en-us`` + ``libreoffice-help-de``: the same HTML help pages in both languages,
  whose paragraphs and headings carry the same ``id`` (``par_id3145669``, ``hd_id3154788``).
- ``libreoffice-l10n-de``: gettext ``.mo`` catalogs of the UI, English msgid -> German msgstr.
- ``wesnoth-1.16-*`` and ``freeciv-data``: the German ``.mo`` catalogs of two games, whose story
  dialogue, unit descriptions and nation histories are the most general prose in the archive.
- ``cataclysm-dda-data`` and ``widelands-data``: two more games' German catalogs: survivors' talk,
  item descriptions and messages of everyday things; tribe encyclopedias and scenario stories.
  Their strings often hold placeholders in angle brackets (``<npcname> calms down.``), left out.
- ``tuxpaint-stamps-default``: one short description of each picture stamp ("A red kangaroo."),
  with its translations as ``de.utf8=...`` lines below it.
- ``naev-data``, ``freedroidrpg-data``, ``freedink-data``: three role-playing games' German catalogs,
  mostly characters' dialogue; each game's colour and bold codes go, its run-time variables are left out.

Readers only extract; the generic cleaning rules (model/translation/cleaning.py) run afterwards.
"""

from __future__ import annotations

import logging
import re
import struct
from collections import Counter
from collections.abc import Callable, Iterator
from html.parser import HTMLParser
from pathlib import Path

from tqdm import tqdm

from model.translation.masking import protect_entries

log = logging.getLogger("attnserve.translation.sources")

Pair = tuple[str, str]

# Where each package keeps its text, relative to the folder it was unpacked into.
DING_FILE = "usr/share/trans/de-en"
HELP_DIR = "usr/share/libreoffice/help"
UI_CATALOG_DIR = "usr/lib/libreoffice/program/resource/de/LC_MESSAGES"

# ---- Ding dictionary ----------------------------------------------------------------------------

_DING_ANNOTATION = re.compile(r"\s*(?:\{[^{}]*\}|\[[^\[\]]*\]|<[^<>]*>|\([^()]*\))")
_DING_WORD_ALTERNATIVES = re.compile(r"(?<![\w/])(\w[\w'’-]*)(?:/\w[\w'’-]*)+")
_DING_TEMPLATE = re.compile(r"\b(?:sb|sth|jd|jdn|jdm|jds|etw)\.")
_SENTENCE_SHAPE = re.compile(r"^[\"'„“‚»]?[A-ZÄÖÜ0-9].*[.!?][\"'“”‘’«]?$")


def ding_sentence(part: str) -> str | None:
    """One Ding sub-entry as a plain sentence, or ``None`` when it is a word or phrase, not a sentence.

    Annotations go (``{f}``, ``[ugs.]``, ``<alt. spelling>``, and optional words in parentheses,
    which read well without them), then the first of ``;``-separated synonyms and of ``a/b``
    alternatives is kept. Phrase alternatives (``... weinen / kann ich ...``) cannot be resolved
    into one sentence and templates with ``sb.``/``etw.`` are no sentences: both give ``None``.
    """
    part = _DING_ANNOTATION.sub("", part).split("; ")[0].strip()
    part = _DING_WORD_ALTERNATIVES.sub(r"\1", part)
    if "/" in part or _DING_TEMPLATE.search(part) or len(part.split()) < 3:
        return None
    return part if _SENTENCE_SHAPE.match(part) else None


def ding_example_pairs(line: str) -> list[Pair]:
    """The ``(english, german)`` example sentences of one dictionary line (most lines have none)."""
    if line.startswith("#") or " :: " not in line:
        return []
    german, english = line.rstrip("\n").split(" :: ", 1)
    de_parts, en_parts = german.split(" | "), english.split(" | ")
    if len(de_parts) != len(en_parts):  # sub-entries are aligned by position; a mismatch is a broken line
        return []
    pairs = []
    for de, en in zip(de_parts, en_parts):
        de_s, en_s = ding_sentence(de), ding_sentence(en)
        if de_s and en_s:
            pairs.append((en_s, de_s))
    return pairs


def read_ding(root: Path, progress: bool = True) -> Iterator[Pair]:
    path = root / DING_FILE
    with open(path, encoding="utf-8") as f:
        for line in tqdm(f, desc="ding examples", unit=" lines", disable=not progress, leave=False):
            yield from ding_example_pairs(line)


# ---- LibreOffice help pages ---------------------------------------------------------------------

_PARAGRAPH_ID = re.compile(r"(?:par|hd)_id\w+$")
_BLOCKS = {"p", "h1", "h2", "h3", "h4", "h5", "h6"}
_CODE_CLASSES = {"code", "codeintable", "smathcode", "bascode"}  # Basic/Math code is not translated


class _HelpParagraphs(HTMLParser):
    """Collects the text of each paragraph or heading with a translation id.

    Platform and module variants (``<span hidden="true" class="MAC">Command</span>``) are skipped:
    the page's script shows one of them, and the default variant is the one without a class.
    """

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.paragraphs: dict[str, str] = {}
        self._current: tuple[str, str] | None = None  # (id, tag)
        self._text: list[str] = []
        self._spans: list[bool] = []  # per open span: does it hide a variant?

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if self._current is None:
            pid = a.get("id") or ""
            if tag in _BLOCKS and _PARAGRAPH_ID.match(pid) and a.get("class") not in _CODE_CLASSES:
                self._current, self._text, self._spans = (pid, tag), [], []
        elif tag == "span":
            self._spans.append("hidden" in a and bool(a.get("class")))
        elif tag == "br":
            self._text.append(" ")

    def handle_endtag(self, tag: str) -> None:
        if self._current is None:
            return
        if tag == "span" and self._spans:
            self._spans.pop()
        elif tag == self._current[1]:
            self.paragraphs.setdefault(self._current[0], "".join(self._text))
            self._current = None

    def handle_data(self, data: str) -> None:
        if self._current is not None and not any(self._spans):
            self._text.append(data)


def help_paragraphs(page_html: str) -> dict[str, str]:
    """Paragraph id -> text of one help page (the first occurrence of an id wins)."""
    parser = _HelpParagraphs()
    parser.feed(page_html)
    parser.close()
    return parser.paragraphs


def help_paragraph_pairs(english_html: str, german_html: str) -> list[Pair]:
    """Align the paragraphs of one page in both languages by their shared id."""
    en, de = help_paragraphs(english_html), help_paragraphs(german_html)
    return [(text, de[pid]) for pid, text in en.items() if pid in de and text.strip() and de[pid].strip()]


def read_help(en_root: Path, de_root: Path, progress: bool = True) -> Iterator[Pair]:
    en_dir, de_dir = en_root / HELP_DIR / "en-US", de_root / HELP_DIR / "de"
    pages = sorted(en_dir.rglob("*.html"))
    if not pages:
        raise ValueError(f"no help pages under {en_dir}: unpack libreoffice-help-en-us again (--refresh)")
    for page in tqdm(pages, desc="help pages", unit=" pages", disable=not progress, leave=False):
        german = de_dir / page.relative_to(en_dir)
        if german.is_file():
            yield from help_paragraph_pairs(page.read_text(encoding="utf-8"), german.read_text(encoding="utf-8"))


# ---- LibreOffice UI message catalogs --------------------------------------------------------------

_MO_MAGIC = {0x950412DE: "<", 0xDE120495: ">"}


def parse_mo(data: bytes) -> list[tuple[str, str]]:
    """``(msgid, msgstr)`` of a GNU gettext ``.mo`` file, as stored (context and plurals included).

    A dozen lines of struct reading instead of ``gettext.GNUTranslations``, whose catalog is private
    and drops the plural msgid.
    """
    if len(data) < 20 or struct.unpack("<I", data[:4])[0] not in _MO_MAGIC:
        raise ValueError("not a gettext .mo file (bad magic number)")
    order = _MO_MAGIC[struct.unpack("<I", data[:4])[0]]
    _, count, originals, translations = struct.unpack(order + "4I", data[4:20])

    def string(table: int, i: int) -> str:
        length, offset = struct.unpack(order + "2I", data[table + 8 * i : table + 8 * i + 8])
        return data[offset : offset + length].decode("utf-8")

    return [(string(originals, i), string(translations, i)) for i in range(count)]


def ui_message_pairs(entries: list[tuple[str, str]]) -> list[Pair]:
    """English -> German UI strings: context dropped, plural forms paired, header and untranslated skipped."""
    pairs = []
    for msgid, msgstr in entries:
        if not msgid or not msgstr:
            continue
        forms = msgid.split("\x04", 1)[-1].split("\x00")  # "context\x04singular\x00plural"
        translated = msgstr.split("\x00")
        pairs.extend((en, de) for en, de in zip(forms, translated) if en and de)
    return pairs


def read_ui_catalogs(root: Path, progress: bool = True) -> Iterator[Pair]:
    catalogs = sorted((root / UI_CATALOG_DIR).glob("*.mo"))
    if not catalogs:
        raise ValueError(f"no .mo catalogs under {root / UI_CATALOG_DIR}: unpack libreoffice-l10n-de again (--refresh)")
    for path in tqdm(catalogs, desc="UI catalogs", unit=" files", disable=not progress, leave=False):
        try:
            yield from ui_message_pairs(parse_mo(path.read_bytes()))
        except (ValueError, struct.error) as e:
            raise ValueError(f"{path}: {e}") from e


# ---- game catalogs (Wesnoth, Freeciv) ------------------------------------------------------------

WESNOTH_LOCALE_DIR = "usr/share/games/wesnoth/1.16/locale/de/LC_MESSAGES"
FREECIV_LOCALE_DIR = "usr/share/locale/de/LC_MESSAGES"

_WESNOTH_CONTEXT = re.compile(r"^[\w ]+\^(?=\S)")  # "teamname^Southeast": the part before ^ is a hint
_FREECIV_CONTEXT = re.compile(r"^\?[\w ]+:(?=\S)")  # "?plural:Frisians", "?improvement:You bought"
_MARKUP_ATTRIBUTE = re.compile(r"\b(?:dst|src|align|float|font_size|color)='[^']*'|\btext='([^']*)'")
# Text filled in at run time: Wesnoth's $variable and $variable|, Freeciv's printf and %[...] tags.
_RUNTIME_TEXT = re.compile(r"\$[A-Za-z_{]|%[-+ 0#]*\d*(?:\.\d+)?[a-zA-Z]|%\[|\{[A-Z_]+\}")


def game_message_pairs(entries: list[tuple[str, str]]) -> list[Pair]:
    """Game catalog strings as plain text pairs.

    Context hints go (``teamname^``, ``?plural:``); help markup keeps only its visible text
    (``<header>text='Units'</header>`` -> ``Units``); strings with text filled in at run time
    (``$unit.name``, ``%s``) are left out whole, because a sentence with a hole in it is no
    translation example.
    """
    pairs = []
    for en, de in ui_message_pairs(entries):
        en, de = (_FREECIV_CONTEXT.sub("", _WESNOTH_CONTEXT.sub("", side)) for side in (en, de))
        if _RUNTIME_TEXT.search(en) or _RUNTIME_TEXT.search(de):
            continue
        en, de = (_MARKUP_ATTRIBUTE.sub(lambda m: m.group(1) or "", side) for side in (en, de))
        pairs.append((en, de))
    return pairs


def read_game_catalogs(
    roots: list[Path],
    subdir: str,
    progress: bool = True,
    pairs_of: Callable[[list[tuple[str, str]]], list[Pair]] = game_message_pairs,
    protect: bool = False,
) -> Iterator[Pair]:
    """Every German ``.mo`` catalog under ``root/subdir`` of each unpacked package, in name order.

    ``protect``: an entry whose text carries the same protected spans as its translation is masked
    first (model/translation/masking.py), so that ``pairs_of`` no longer leaves it out for its placeholders.
    """
    catalogs = sorted(path for root in roots for path in (root / subdir).glob("*.mo"))
    if not catalogs:
        raise ValueError(f"no .mo catalogs under {subdir} of {', '.join(map(str, roots))}: unpack again (--refresh)")
    for path in tqdm(catalogs, desc="game catalogs", unit=" files", disable=not progress, leave=False):
        try:
            entries = parse_mo(path.read_bytes())
            yield from pairs_of(protect_entries(entries) if protect else entries)
        except (ValueError, struct.error) as e:
            raise ValueError(f"{path}: {e}") from e


# ---- catalogs with placeholders in angle brackets (Cataclysm: DDA, Widelands) ----------------------

CATACLYSM_LOCALE_DIR = "usr/share/locale/de/LC_MESSAGES"
WIDELANDS_LOCALE_DIR = "usr/share/games/widelands/data/locale/de/LC_MESSAGES"

_BOOST_FORMAT = re.compile(r"%\d+%")  # Widelands' "%1%"
_ANGLE_TAG = re.compile(r"<(/?)([A-Za-z]\w*)[^<>]*?(/?)>")
_VOID_TAGS = frozenset({"br", "hr", "img"})


def has_placeholder_tag(text: str) -> bool:
    """Whether ``text`` holds a ``<word>`` that no ``</word>`` closes: Cataclysm's ``<npcname>``, a chat
    command's ``<name>``. That is text filled in at run time, not markup (``<good>fresh</good>``,
    ``<color_red>...</color>``, ``<br>``), and stripping it as a tag would leave a hole in the sentence.
    """
    balance: Counter = Counter()
    for m in _ANGLE_TAG.finditer(text):
        name = m[2].casefold()
        if m[3] or name in _VOID_TAGS:
            continue
        balance["color" if name.startswith("color_") else name] += -1 if m[1] else 1
    return any(balance.values())


def placeholder_free_pairs(entries: list[tuple[str, str]]) -> list[Pair]:
    """:func:`game_message_pairs`, less strings with angle-bracket placeholders or ``%1%`` on either side."""
    return [
        (en, de)
        for en, de in game_message_pairs(entries)
        if not any(has_placeholder_tag(side) or _BOOST_FORMAT.search(side) for side in (en, de))
    ]


# ---- role-playing games' dialogue (Naev, FreedroidRPG, FreeDink) ----------------------------------

NAEV_LOCALE_DIR = "usr/share/naev/dat/gettext/de/LC_MESSAGES"
FREEDROID_LOCALE_DIR = "usr/share/locale/de/LC_MESSAGES"
FREEDINK_LOCALE_DIR = "usr/share/games/dink/dink/l10n/de/LC_MESSAGES"

_NAEV_COLOUR = re.compile(r"\a[0-9A-Za-z]")  # "\anYou have:\a0": colour on, colour off
_FREEDROID_STYLE = re.compile(r"\[/? ?[bnrw]\]")  # "[b]Fire Weapon[/b]", "[r]Warning[n]": bold, colours
_DINK_VARIABLE = re.compile(r"&[a-z_]\w*")  # "$&amount gold": a DinkC variable filled in at run time


def dialogue_pairs(
    entries: list[tuple[str, str]], style: re.Pattern | None = None, runtime: re.Pattern | None = None
) -> list[Pair]:
    """:func:`placeholder_free_pairs`, less strings with a game's own ``runtime`` variables, with the
    game's ``style`` codes (colour, bold) removed so that their text stays."""
    pairs = []
    for en, de in placeholder_free_pairs(entries):
        if runtime is not None and (runtime.search(en) or runtime.search(de)):
            continue
        pairs.append((style.sub("", en), style.sub("", de)) if style is not None else (en, de))
    return pairs


def naev_pairs(entries: list[tuple[str, str]]) -> list[Pair]:
    return dialogue_pairs(entries, style=_NAEV_COLOUR)


def freedroid_pairs(entries: list[tuple[str, str]]) -> list[Pair]:
    return dialogue_pairs(entries, style=_FREEDROID_STYLE)


def freedink_pairs(entries: list[tuple[str, str]]) -> list[Pair]:
    return dialogue_pairs(entries, runtime=_DINK_VARIABLE)


# ---- Tux Paint stamp descriptions ----------------------------------------------------------------

TUXPAINT_STAMPS_DIR = "usr/share/tuxpaint/stamps"


def stamp_description_pair(text: str) -> Pair | None:
    """``(english, german)`` of one stamp's ``.txt``: the English first line, the ``de.utf8=`` line."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines or "=" in lines[0].split(" ", 1)[0]:
        return None
    german = next((line.split("=", 1)[1] for line in lines[1:] if line.startswith("de.utf8=")), "")
    return (lines[0], german.strip()) if german.strip() else None


def read_stamps(root: Path, progress: bool = True) -> Iterator[Pair]:
    files = sorted((root / TUXPAINT_STAMPS_DIR).rglob("*.txt"))
    if not files:
        raise ValueError(f"no stamp descriptions under {root / TUXPAINT_STAMPS_DIR}: unpack again (--refresh)")
    for path in tqdm(files, desc="stamp descriptions", unit=" files", disable=not progress, leave=False):
        if pair := stamp_description_pair(path.read_text(encoding="utf-8", errors="replace")):
            yield pair
