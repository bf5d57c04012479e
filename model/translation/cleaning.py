"""Cleaning rules for parallel text: each a small pure function, in the order :func:`clean_text` applies them.

Text rules (:data:`TEXT_RULES`) rewrite one side of a pair; pair filters (:data:`PAIR_FILTERS`)
then accept or reject the cleaned pair as a whole. docs/training/translation-data.md explains each rule in a
sentence; tests pin each one.
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass

from contract.tokenizer import normalize_text

# ---- text rules ---------------------------------------------------------------------------------

_TAG = re.compile(r"</?[A-Za-z][\w:.-]*(?:\s[^<>]*)?/?>")


def strip_markup(text: str) -> str:
    """Remove XML/HTML/XHP tags and decode entities: ``<emph>Bold</emph> &amp; more`` -> ``Bold & more``.

    Tags are removed first so that an escaped ``&lt;b&gt;`` written as text survives as ``<b>``.
    """
    return html.unescape(_TAG.sub(" ", text))


_PRODUCT_NAMES = re.compile(r"%PRODUCTNAME\b|\$\[officename\]")


def expand_product_name(text: str) -> str:
    """``%PRODUCTNAME`` (UI catalogs) and ``$[officename]`` (help sources) -> ``LibreOffice``.

    They stand for a name, not a value, so replacing them keeps the sentence whole; the help pages
    already ship with the name substituted.
    """
    return _PRODUCT_NAMES.sub("LibreOffice", text)


_PLACEHOLDER = re.compile(
    r"""<%\w+>                                 # <%1>, with its brackets
      | \$\(\w+\)                              # $(ARG1)
      | \$(?:[a-z]\w*|\d)\$                    # $columnname$, $1$
      | (?<![\w$])\$\d\b                       # $1 (one digit: $30 is money; $A$1 is a cell)
      | \$[A-Z][A-Z_]{3,}\b                    # $DEPLOYED (not $AB, a column)
      | %\{\w+\}                               # %{link}
      | %\d+\$?[sd]?                           # %1, %1$s
      | %[-+0\#]*\d*(?:\.\d+)?(?:ll|l|h)?[sdiuxXfgeEc]\b  # printf: %s %d %.2f %ld
      | %[A-Z][A-Z0-9_]*\b                     # %COLUMNNUMBER, %CRASHID
      | \#\w+\#                                # #servicename#
      | \#\d+\b                                # #1
      | \{\w*\}                                # {0}, {name}, {}
    """,
    re.VERBOSE,
)


def strip_placeholders(text: str) -> str:
    """Remove format placeholders (``%s``, ``%1``, ``%NAME``, ``$(ARG1)``, ``$1``, ``{0}``, ``#1`` ...).

    They are filled in at run time, carry no language, and a translator must not learn to invent them.
    """
    return _PLACEHOLDER.sub(" ", text)


_URL = re.compile(
    r"\b(?:https?|ftp|file)://\S+?(?=[.,;:!?)\]»\"']*(?:\s|$))|\bwww\.[\w-]+(?:\.[\w-]+)+\S*?(?=[.,;:!?)\]»\"']*(?:\s|$))"
)


def strip_urls(text: str) -> str:
    """Remove URLs (``http://``, ``https://``, ``ftp://``, ``file://``, ``www.``), keeping punctuation after them."""
    return _URL.sub(" ", text)


_TILDE = re.compile(r"~(?=\w)")
_AMPERSAND = re.compile(r"(?<![\w&])&(?=\w)")


def strip_accelerators(text: str) -> str:
    """Remove keyboard-accelerator markers: ``~Save`` / ``Pa~ges`` -> ``Save`` / ``Pages``; ``&File`` -> ``File``.

    An ``&`` is taken as a marker only at the start of a word, so ``Find & Replace`` and ``R&D`` stay.
    """
    return _AMPERSAND.sub("", _TILDE.sub("", text))


_WORD_WITH_UNDERSCORE = re.compile(r"\w*_\w*")
_MNEMONIC_UNDERSCORE = re.compile(r"_(?=[^\W\d_])|^_(?=\d)")  # before a letter; before a digit at word start


def strip_mnemonic_underscores(text: str) -> str:
    """Remove GTK mnemonic underscores of UI catalogs: ``_Add`` / ``H_inzufügen`` -> ``Add`` / ``Hinzufügen``.

    Only applied to UI message catalogs (in help text an underscore belongs to a name such as
    ``file_name``), and only to a word's single underscore, before a letter or starting the word
    (``_1024``): ``A_B_C`` and ``Ausdruck_1`` are names, not mnemonics.
    """

    def fix(word: re.Match[str]) -> str:
        w = word.group(0)
        return _MNEMONIC_UNDERSCORE.sub("", w) if w.count("_") == 1 else w

    return _WORD_WITH_UNDERSCORE.sub(fix, text)


# Not ``<>``: it is the not-equal operator in spreadsheet help.
_EMPTY_BRACKETS = re.compile(r"\(\s*\)|\[\s*\]|'(?:|\s+)'|\"\s*\"|“\s*”|„\s*“|»\s*«|‘\s*’|‚\s*‘")
_SPACE_BEFORE_PUNCT = re.compile(r"\s+([.,;:!?)\]])(?!\.)")  # not before an ellipsis: "available ... at"


def tidy_punctuation(text: str) -> str:
    """Remove what stripping leaves behind: empty brackets or quotes and spaces before punctuation.

    ``The path '' already exists .`` -> ``The path already exists.``
    """
    while (tidier := _EMPTY_BRACKETS.sub(" ", text)) != text:  # ("") -> () -> nothing
        text = tidier
    return _SPACE_BEFORE_PUNCT.sub(r"\1", " ".join(text.split()))


TextRule = Callable[[str], str]

# The order matters: markup first (tags may hide placeholders), names before placeholders (%PRODUCTNAME),
# URLs before placeholders (``%20`` inside a URL) and accelerators (``~user``), tidy and normalise last.
TEXT_RULES: tuple[TextRule, ...] = (
    strip_markup,
    expand_product_name,
    strip_urls,
    strip_placeholders,
    strip_accelerators,
    tidy_punctuation,
    normalize_text,
)


def clean_text(text: str, *, ui_strings: bool = False) -> str:
    """Apply :data:`TEXT_RULES` in order; ``ui_strings`` adds :func:`strip_mnemonic_underscores`."""
    if ui_strings:
        text = strip_mnemonic_underscores(text)
    for rule in TEXT_RULES:
        text = rule(text)
    return text


# ---- pair filters -------------------------------------------------------------------------------


@dataclass(frozen=True)
class FilterConfig:
    """Thresholds of the pair filters; written into stats.json so a corpus says how it was made."""

    min_words: int = 1
    max_words: int = 60  # per side; ~100 subword tokens, longer pairs cost attention memory for little gain
    max_chars: int = 400
    max_ratio: float = 3.0  # longer / shorter side, in characters
    ratio_min_chars: int = 20  # short UI labels vary too much for a ratio to mean anything

    def as_dict(self) -> dict:
        return asdict(self)


def letters_ok(source: str, target: str, config: FilterConfig = FilterConfig()) -> bool:
    """Both sides hold a letter: a side of only digits and symbols (``(-32768 - 32767)``) teaches no language."""
    return any(c.isalpha() for c in source) and any(c.isalpha() for c in target)


def not_copy(source: str, target: str, config: FilterConfig = FilterConfig()) -> bool:
    """Reject identical sides (``LN`` -> ``LN``, untranslated strings): they teach copying, not translating.

    Compared case-insensitively, so ``Name`` -> ``name`` counts as a copy too.
    """
    return source.casefold() != target.casefold()


def length_ok(source: str, target: str, config: FilterConfig = FilterConfig()) -> bool:
    """Both sides hold between ``min_words`` and ``max_words`` words and at most ``max_chars`` characters."""
    return all(
        config.min_words <= len(side.split()) <= config.max_words and len(side) <= config.max_chars
        for side in (source, target)
    )


def ratio_ok(source: str, target: str, config: FilterConfig = FilterConfig()) -> bool:
    """Reject pairs whose character lengths differ by more than ``max_ratio`` (likely misaligned).

    Pairs whose longer side is shorter than ``ratio_min_chars`` pass: ``Up`` -> ``Nach oben`` is fine.
    """
    short, long_ = sorted((len(source), len(target)))
    return long_ < config.ratio_min_chars or long_ <= config.max_ratio * max(short, 1)


PairFilter = Callable[[str, str, FilterConfig], bool]

# Named filters in the order they run; stats.json counts the pairs left after each.
PAIR_FILTERS: tuple[tuple[str, PairFilter], ...] = (
    ("has_letters", letters_ok),
    ("not_copy", not_copy),
    ("length", length_ok),
    ("ratio", ratio_ok),
)


def dedupe_key(source: str, target: str) -> tuple[str, str]:
    """Pairs are duplicates when their cleaned sides are equal; the first one read is kept."""
    return source, target
