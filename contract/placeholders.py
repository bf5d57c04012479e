"""Protected spans: what a translation must carry over verbatim, masked before decoding and put back after.

Software strings hold text that a program fills in or parses at run time: printf conversions
(``%s``, ``%5.2f``, ``%1$s``, ``%(name)s``, ``%%``), positional ``%1`` and ``%1%``, named
``%PRODUCTNAME``, any other ``%`` and letter (``%Y``, ``%_d``: dates), braces (``{name}``, ``{0}``,
``{0:N2}``, ``{}``), XML/HTML tags and entities, web and mail addresses (``https://debian.org/``,
``kget@kde.org``: a translation that rewrites one points nowhere), backslash escapes (``\\n``, ``\\t``,
``\\x41``) and percent-encoded bytes (``%0A``). :func:`find_spans` finds them; :func:`mask` replaces each by a
*sentinel*, a string the translator's tokenizer keeps as one token (the manifest names them), so the
model translates the words around it and the decoder's constrained search (``contract/constraints.py``)
emits each sentinel exactly once; :func:`restore` puts the originals back where the model put their
sentinels.

Order. A conversion that takes its argument by position in the argument list (``%s``, ``%d``,
``{}``) must keep its place among the others of its kind, or a C or Python program reads the wrong
argument; so must a closing tag after its opening tag. Each span lists the spans that must come before
it (``after``), and the search honours that. Named and numbered ones (``%1$s``, ``%(n)d``, ``{0}``,
``%1``) may move freely.

Spacing. A sentinel is written as a word of its own: where a span touches a letter or digit
(``<b>bold</b>``, ``%dx``) a space is put between them in the masked text, and taken out again on
that side when the span is restored, so ``<b>fett</b>`` comes back without spaces inside the tag.

Keyboard accelerators (``&File``, ``_File``) are a separate, simpler rule (:func:`strip_accelerator`):
when a text holds exactly one marker before a letter, the marker is removed before translation and
put back (:func:`place_accelerator`) before the first word of the translation that starts with the
same letter (case-insensitive), else before the translation's first letter.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

# One alternation, so that the leftmost longest kind wins where two could start at the same place.
_SPANS = re.compile(
    r"""
    (?P<printf>%%                                                     # a literal percent sign, as printf writes it
      | %\([A-Za-z_][\w.-]*\)[-+0\#]*\d*(?:\.\d+)?[diouxXeEfFgGcrsa]  # Python named: %(name)s
      | %(?:\d+\$)?[-+0\#']*(?:\d+|\*(?:\d+\$)?)?(?:\.(?:\d+|\*(?:\d+\$)?))?
         (?:(?:hh|h|ll|l|L|q|j|z|Z|t|I64|I32|I)?[diouxXeEfFgGaAcspnm]  # C: %s %5.2f %ld %1$s %zu %m, %dx%d
           | <PRI\w+>)                                                # <inttypes.h> in gettext: %<PRIdMAX>
    )
    | (?P<percent>%[0-9A-Fa-f]{2}(?![0-9A-Za-z]))                      # percent-encoded byte: %0A, %20
    | (?P<positional>%L?\d{1,2}(?:%(?![A-Za-z]))?(?!\d))                # Qt/KDE positional %1 %L1, Boost %1%
    | (?P<name>%[A-Za-z_][A-Za-z0-9_]+%?)                              # a named variable: %PRODUCTNAME, %value
    | (?P<strftime>%[-_0^\#]?[EO]?[A-Za-z])                           # dates and others: %Y %H %_d %Oy %L
    | (?P<brace>\{\{|\}\}|\{[A-Za-z_0-9]*(?:[.\[][\w\]\[.]*)?(?:![rsa])?(?::[^{}\s]*)?\})  # {name} {0} {0:N2} {} {{
    | (?P<tag></?[A-Za-z][\w:.-]*(?:\s+[\w:.-]+(?:\s*=\s*(?:"[^"]*"|'[^']*'|[^\s"'<>]+))?)*\s*/?>)
    | (?P<url>(?:https?|ftp)://[^\s<>"'{}]*[^\s<>"'{}.,;:!?)\]]                 # https://example.org/a
      | www\.[A-Za-z0-9-]+\.[^\s<>"'{}]*[^\s<>"'{}.,;:!?)\]]                     # www.debian.org
      | (?<![\w.@-])[a-z0-9-]+(?:\.[a-z0-9-]+)*\.(?:org|com|net|edu|gov|io|info|de|eu)\b(?![\w-])  # security.debian.org
      | [A-Za-z0-9._+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+)                     # kget@kde.org
    | (?P<entity>&(?:[A-Za-z][A-Za-z0-9]{1,31}|\#\d{1,7}|\#[xX][0-9A-Fa-f]{1,6});)
    | (?P<escape>\\(?:x[0-9A-Fa-f]{2}|u[0-9A-Fa-f]{4}|[0-7]{1,3}|[nrtabfve\\"']))
    """,
    re.VERBOSE,
)
KINDS = ("printf", "percent", "positional", "name", "strftime", "brace", "tag", "url", "entity", "escape")
_TAG_NAME = re.compile(r"</?([A-Za-z][\w:.-]*)")


@dataclass(frozen=True)
class Span:
    """One protected span of a text: where it is, what it is, and which spans must precede it."""

    start: int
    end: int
    text: str
    kind: str  # one of KINDS
    after: tuple[int, ...] = ()  # indices of the spans a translation must place before this one

    @property
    def sequential(self) -> bool:
        """Takes the next argument by its place (``%s``, ``{}``): keeps its order among the others."""
        if self.kind == "printf":  # %% and glibc's %m take no argument
            return (
                self.text not in ("%%", "%m") and not self.text.startswith("%(") and not re.match(r"%\d+\$", self.text)
            )
        return self.kind == "brace" and self.text == "{}"


def find_spans(text: str) -> list[Span]:
    """The protected spans of ``text``, left to right, with their order constraints."""
    found = [(m.start(), m.end(), m.group(), m.lastgroup) for m in _SPANS.finditer(text)]
    spans: list[Span] = []
    last_sequential: int | None = None
    open_tags: list[tuple[str, int]] = []
    for i, (start, end, span_text, kind) in enumerate(found):
        span = Span(start, end, span_text, kind)
        after: list[int] = []
        if span.sequential:
            if last_sequential is not None:
                after.append(last_sequential)
            last_sequential = i
        if kind == "tag" and not span_text.endswith("/>"):
            name = _TAG_NAME.match(span_text).group(1).lower()
            if span_text.startswith("</"):
                for j in range(len(open_tags) - 1, -1, -1):
                    if open_tags[j][0] == name:
                        after.append(open_tags[j][1])
                        del open_tags[j:]
                        break
            else:
                open_tags.append((name, i))
        spans.append(Span(start, end, span_text, kind, tuple(after)))
    return spans


WORD, SPAN, MARK = "word", "span", "mark"  # what a span touched on one side: a letter or digit, a span, other text
_OPENING = "([{«„“‚‘\"'/"  # marks a sentinel may follow without a space


@dataclass(frozen=True)
class Masked:
    """A text with its protected spans replaced by sentinels (``sentinels[i]`` stands for ``spans[i]``)."""

    text: str
    spans: tuple[Span, ...]
    sentinels: tuple[str, ...]
    glued: tuple[tuple[str | None, str | None], ...]  # per span, what it touched on its (left, right), None: a space


class TooManySpans(ValueError):
    """A sentence holds more protected spans than there are sentinels free for it."""


def _touches(text: str, at: int, neighbour_span: bool) -> str | None:
    if neighbour_span:
        return SPAN
    if not 0 <= at < len(text) or text[at].isspace():
        return None
    return WORD if text[at].isalnum() else MARK


def spacing(text: str, span: Span, left: str | None, right: str | None) -> tuple[bool, bool]:
    """Whether masking puts a space before and after the sentinel of ``span``, which touched ``left`` and ``right``."""
    return left in (WORD, SPAN) or (left == MARK and text[span.start - 1] not in _OPENING), right == WORD


def mask(text: str, pool: Sequence[str]) -> Masked:
    """``text`` with each protected span replaced by the first sentinel of ``pool`` that the text does not
    already contain (so a sentinel in the output can only come from a span). A sentinel is set off by a
    space from a letter, digit or sentinel it touches, and from a mark before it (``Warning:</b>``) other than
    an opening bracket or quote."""
    spans = find_spans(text)
    free = [s for s in pool if s not in text]
    if len(spans) > len(free):
        raise TooManySpans(
            f"{len(spans)} protected spans (placeholders, tags, escapes) in one sentence; at most {len(free)}"
        )
    parts, glued, cursor = [], [], 0
    for i, (span, sentinel) in enumerate(zip(spans, free)):
        left = _touches(text, span.start - 1, i > 0 and spans[i - 1].end == span.start)
        right = _touches(text, span.end, i + 1 < len(spans) and spans[i + 1].start == span.end)
        space_left, space_right = spacing(text, span, left, right)
        parts += [text[cursor : span.start], " " if space_left else "", sentinel, " " if space_right else ""]
        glued.append((left, right))
        cursor = span.end
    parts.append(text[cursor:])
    return Masked("".join(parts), tuple(spans), tuple(free[: len(spans)]), tuple(glued))


def _kind(c: str) -> str | None:
    return None if not c else WORD if c.isalnum() else MARK


def restore(translation: str, masked: Masked, marks: Sequence[str] | None = None) -> tuple[str, list[bool]]:
    """Put the spans back where their sentinels (or ``marks[i]``, when the caller marked them otherwise) are
    in ``translation``: (the text, whether each span came back exactly once; one that did not is left out).

    A span that touched a word, a mark or another span on one side in the source touches its neighbour there
    again where the model put it next to the same kind of thing: the space between them is taken out."""
    marks = list(masked.sentinels if marks is None else marks)
    found = [translation.count(m) == 1 for m in marks]
    kept = [i for i, ok in enumerate(found) if ok]
    if not kept:
        return translation, found
    pattern = re.compile("|".join(f"(?P<s{i}>{re.escape(marks[i])})" for i in kept))
    texts, order, cursor = [], [], 0  # texts[k] is before span order[k]; texts[-1] after the last
    for m in pattern.finditer(translation):
        texts.append(translation[cursor : m.start()])
        order.append(int(m.lastgroup[1:]))
        cursor = m.end()
    texts.append(translation[cursor:])
    for k, i in enumerate(order):
        left, right = masked.glued[i]
        before, after = texts[k], texts[k + 1]
        if (
            left == SPAN
            and k > 0
            and not before.strip(" ")
            or left in (WORD, MARK)
            and _kind(before.rstrip(" ")[-1:]) == left
        ):
            texts[k] = before.rstrip(" ")
        if (
            right == SPAN
            and k + 1 < len(order)
            and not after.strip(" ")
            or right in (WORD, MARK)
            and _kind(after.lstrip(" ")[:1]) == right
        ):
            texts[k + 1] = after.lstrip(" ")
    out = [texts[0]]
    for k, i in enumerate(order):
        span, after = masked.spans[i].text, texts[k + 1]
        if _extends(span, after):  # "%l" + "inhalt" would read as "%li": keep them apart
            after = " " + after
        out += [span, after]
    return "".join(out), found


def _extends(span: str, after: str) -> bool:
    """Whether the text after a restored span would make it a longer span (``%l`` before ``i``)."""
    m = _SPANS.match(span + after[:16])
    return m is not None and m.end() > len(span)


# ---- keyboard accelerators -------------------------------------------------------------------------------------

_AMPERSAND = re.compile(r"(?<![&\w])&(?=[^\W_])")  # &File (not "&&", not an entity: those are spans)
_UNDERSCORE = re.compile(r"(?<![\w])_(?=[^\W_\d])")  # _File (not snake_case, not __dunder__)


@dataclass(frozen=True)
class Accelerator:
    marker: str  # "&" or "_"
    letter: str  # the letter it marked in the source


def strip_accelerator(text: str) -> tuple[str, Accelerator | None]:
    """(``text`` without its keyboard accelerator marker, the marker): only when the text holds exactly one
    marker of one kind before a letter (``&File``, ``_Open``); entities (``&amp;``) are not markers."""
    plain = _SPANS.sub(lambda m: "\0" * len(m.group()), text)  # no marker inside a span
    for marker, pattern in (("&", _AMPERSAND), ("_", _UNDERSCORE)):
        hits = list(pattern.finditer(plain))
        others = _UNDERSCORE if marker == "&" else _AMPERSAND
        if len(hits) == 1 and not others.search(plain):
            at = hits[0].start()
            return text[:at] + text[at + 1 :], Accelerator(marker, text[at + 1])
    return text, None


def place_accelerator(translation: str, accelerator: Accelerator | None) -> str:
    """Put the marker back: before the first word starting with the same letter, else before the first letter."""
    if accelerator is None:
        return translation
    plain = _SPANS.sub(lambda m: "\0" * len(m.group()), translation)
    letter = re.escape(accelerator.letter)
    for pattern in (rf"(?<!\w)(?i:{letter})", r"[^\W\d_]"):
        m = re.search(pattern, plain)
        if m:
            return translation[: m.start()] + accelerator.marker + translation[m.start() :]
    return translation


# The sentinels the corpus builder masks protected spans with (model/translation/masking.py): one piece each.
TRAINING_SENTINELS = tuple(f"\u27e6{i}\u27e7" for i in range(1, 17))
