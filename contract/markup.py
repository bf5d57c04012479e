"""Inline markup that does not pass through the model: taken out before translation, put back by alignment.

A tag is no word: a model that must write ``<b>`` and ``</b>`` somewhere in its German either leaves them
out or, when its search is forced to place them, rambles on until it has. So :func:`split_markup` cuts
a text into what is kept verbatim and what is translated:

- **separators** stay where they are, with the whitespace around them: block elements (``<p>``, ``<div>``,
  ``<li>``, ``<qt>``, ``<html>`` ...), line breaks (``<br/>``, KDE's ``<nl/>``), and an inline pair whose
  two ends lie in different segments. What lies between two separators is a *segment*, translated on
  its own;
- a pair that wraps a whole segment (``<b>Alignment</b>``) wraps its whole translation: it joins the
  separators around it;
- every other inline tag (``<b>``, ``<i>``, ``<a href="…">``, ``<span …>``, ``<filename>``, a void
  ``<img/>``, a tag without a partner, as in crossed ``<b><i></b></i>``) is taken out of the segment: an
  :class:`Element` records the characters of the plain text it wrapped. After translation
  :func:`contract.projection.inserts` finds the target tokens aligned to those characters' source tokens
  and the element is put back around the whole German words they belong to. The elements' target ranges are made to nest as their source ranges did, so the output is
  well nested by construction, whatever the alignment says.

Text that holds no letter outside its tags and placeholders (``%1 %2Ch (%3<em>%4</em>)``) is no
segment: it is kept verbatim.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from contract.placeholders import _SPANS as SPANS

# Elements that start a new block, and elements without content: their tags separate segments.
BLOCK = frozenset({
    "address", "article", "aside", "blockquote", "body", "caption", "center", "dd", "details", "dialog", "dir", "div",
    "dl", "dt", "fieldset", "figcaption", "figure", "footer", "form", "frameset", "h1", "h2", "h3", "h4", "h5", "h6",
    "head", "header", "hgroup", "hr", "html", "legend", "li", "main", "menu", "nav", "ol", "option", "p", "para",
    "pre", "qt", "section", "summary", "table", "tbody", "td", "tfoot", "th", "thead", "title", "tr", "ul",
})  # fmt: skip
BREAKS = frozenset({"br", "nl", "hr", "wbr"})  # void elements that break a line: separators too
VOID = frozenset({"area", "base", "col", "embed", "img", "input", "link", "meta", "param", "source", "track"})
_NAME = re.compile(r"</?([A-Za-z][\w:.-]*)")


@dataclass(frozen=True)
class Tag:
    text: str
    name: str  # lower case
    start: int
    end: int
    closing: bool
    void: bool  # self-closing or an element without content


@dataclass(frozen=True)
class Element:
    """An inline element taken out of a segment: its tags and the plain-text characters ``[start, end)`` it
    wrapped (``start == end``: a void element or an empty pair, a point). ``parent`` is the index of the element
    around it, or None."""

    open: str
    close: str  # "" for a void element
    start: int
    end: int
    parent: int | None


@dataclass(frozen=True)
class Segment:
    """Text to translate: ``plain`` without its inline tags, and those tags as elements over it."""

    plain: str
    elements: tuple[Element, ...] = ()
    quote: str = ""  # the quote around it, where it is an attribute's value: escaped in its translation


def find_tags(text: str) -> list[Tag]:
    out = []
    for m in SPANS.finditer(text):
        if m.lastgroup != "tag":
            continue
        t = m.group()
        name = _NAME.match(t).group(1).lower()
        out.append(Tag(t, name, m.start(), m.end(), t.startswith("</"), t.endswith("/>") or name in VOID | BREAKS))
    return out


def _partners(tags: Sequence[Tag]) -> dict[int, int]:
    """Opening tag index -> its closing tag index, and back (by name, innermost first; unmatched: absent)."""
    pairs: dict[int, int] = {}
    stack: list[int] = []
    for i, t in enumerate(tags):
        if t.void:
            continue
        if not t.closing:
            stack.append(i)
            continue
        for j in range(len(stack) - 1, -1, -1):
            if tags[stack[j]].name == t.name:
                pairs[stack[j]], pairs[i] = i, stack[j]
                del stack[j:]
                break
    return pairs


def has_words(text: str) -> bool:
    """Whether ``text`` holds a letter outside its protected spans (placeholders, entities)."""
    return any(c.isalpha() for c in SPANS.sub(" ", text))


def split_markup(text: str) -> list[str | Segment]:
    """``text`` as verbatim strings (separators, whitespace, text without words) and segments to translate,
    in order: ``"".join`` of the verbatim strings and the segments' translations, with their elements put
    back, is the translated text."""
    tags = find_tags(text)
    pairs = _partners(tags)
    separator = {i for i, t in enumerate(tags) if t.name in BLOCK | BREAKS}
    while True:  # a pair whose ends lie in different segments is kept as it stands, around them
        cut = sorted(separator)
        crossing = {
            i
            for i, j in pairs.items()
            if i not in separator and any(min(i, j) < s < max(i, j) for s in cut) and j not in separator
        }
        if not crossing:
            break
        separator |= crossing | {pairs[i] for i in crossing}
    out: list[str | Segment] = []
    cursor, inline = 0, []
    for i, t in enumerate(tags + [None]):
        if t is not None and i not in separator:
            inline.append(i)
            continue
        end = t.start if t is not None else len(text)
        out += _segment(text, cursor, end, [tags[k] for k in inline])
        if t is not None:
            out.append(t.text)
            cursor = t.end
        inline = []
    return merged(out)


def _segment(text: str, start: int, end: int, tags: list[Tag]) -> list[str | Segment]:
    """The stretch ``text[start:end]`` with its inline ``tags`` (in text order) as [leading verbatim, segment,
    trailing verbatim]; pairs that wrap all of it, and the whitespace at its ends, move outward."""
    partner = _partners(tags)
    # Peel pairs that wrap everything else of the stretch, outermost first, and lone tags at its ends.
    head, tail = [], []
    lo, hi = 0, len(tags)
    a, b = start, end
    while lo < hi:
        first, last = tags[lo], tags[hi - 1]
        if lo not in partner and not text[a : first.start].strip():  # a lone tag before all the text
            head.append(text[a : first.end])
            a, lo = first.end, lo + 1
        elif hi - 1 not in partner and not text[last.end : b].strip():  # a lone tag after all of it
            tail.insert(0, text[last.start : b])
            b, hi = last.start, hi - 1
        elif not first.closing and partner.get(lo) == hi - 1:
            if text[a : first.start].strip() or text[last.end : b].strip():
                break
            head.append(text[a : first.end])
            tail.insert(0, text[last.start : b])
            a, b = first.end, last.start
            lo, hi = lo + 1, hi - 1
        else:
            break
    inner = tags[lo:hi]
    plain, marks = [], []  # marks[k]: where inner[k] stood in the plain text
    cursor = a
    for t in inner:
        piece = text[cursor : t.start]
        if plain and plain[-1].endswith(" ") and piece.startswith(" "):
            piece = piece.lstrip(" ")  # "foo <b> bar" loses one of its two spaces with the tag
        plain.append(piece)
        marks.append(sum(map(len, plain)))
        cursor = t.end
    piece = text[cursor:b]
    plain.append(piece.lstrip(" ") if plain and plain[-1].endswith(" ") and inner else piece)
    body = "".join(plain)
    lead = len(body) - len(body.lstrip())
    trail = len(body.rstrip())
    if not has_words(body):
        return [*head, text[a:b], *tail]
    inner_partner = _partners(inner)
    elements: list[Element] = []
    open_at: dict[int, int] = {}  # inner index of an opening tag -> its element
    stack: list[int] = []
    for k, t in enumerate(inner):
        at = min(max(marks[k], lead), trail) - lead
        if t.closing:
            if k in inner_partner:
                e = open_at[inner_partner[k]]
                old = elements[e]
                elements[e] = Element(old.open, t.text, old.start, at, old.parent)
                if stack and stack[-1] == e:
                    stack.pop()
            else:  # a closing tag without a partner: a point, where it stood
                elements.append(Element(t.text, "", at, at, stack[-1] if stack else None))
            continue
        parent = stack[-1] if stack else None
        elements.append(Element(t.text, "", at, at, parent))
        if not t.void and k in inner_partner:
            open_at[k] = len(elements) - 1
            stack.append(len(elements) - 1)
    segment = Segment(body[lead:trail], tuple(elements))
    return [*head, body[:lead], segment, body[trail:], *tail]


def merged(parts: list[str | Segment]) -> list[str | Segment]:
    out: list[str | Segment] = []
    for p in parts:
        if isinstance(p, str):
            if not p:
                continue
            if out and isinstance(out[-1], str):
                out[-1] += p
                continue
        out.append(p)
    return out


# ---- putting elements back --------------------------------------------------------------------------------


def nest(ranges: list[tuple[int, int]], parents: Sequence[int | None]) -> list[tuple[int, int]]:
    """Target ranges ``[start, end)`` (token boundaries) made to nest as the source elements did: a child is
    clipped to its parent's range, and siblings that overlap are made to touch (the later-starting one is
    clipped to begin where the earlier ends). An element clipped away becomes a point."""
    out = list(ranges)
    children: dict[int | None, list[int]] = {}
    for i, p in enumerate(parents):
        children.setdefault(p, []).append(i)

    def visit(parent: int | None, lo: int, hi: int) -> None:
        kids = sorted(children.get(parent, []), key=lambda i: (max(lo, min(out[i][0], hi)), i))
        floor = lo
        for i in kids:
            s, e = out[i]
            s, e = max(s, floor, lo), min(max(e, s), hi)
            s = min(s, hi)
            e = max(e, s)
            out[i] = (s, e)
            if e > s:
                floor = e
            visit(i, s, e)

    visit(None, -(1 << 30), 1 << 30)
    return out
