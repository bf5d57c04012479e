"""An HTML fragment or page as what is kept verbatim and what is translated (``format: "html"``).

:func:`html_parts` cuts a document the way :func:`contract.markup.split_markup` cuts a message, with what
HTML adds:

- nothing inside ``<script>``, ``<style>``, ``<pre>``, ``<textarea>``, comments, ``<!DOCTYPE>`` or processing
  instructions is translated, nor any attribute but ``title`` and ``alt``;
- ``<code>``, ``<samp>``, ``<tt>`` and ``<var>`` elements are kept whole too, but inside the sentence they
  belong to: each stands in it as a protected span (:data:`CODE`), which the search places like a
  placeholder and :meth:`contract.translation_text.TextPlan.finish` replaces by the element;
- every block element (``<p>``, ``<li>``, ``<h1>``, ``<td>`` ...) and line break ends a segment; the text and
  inline elements (``<b>``, ``<a href>``, ``<span>``, ``<em>``, ``<img>``) between two of them are one
  segment, whose inline tags are put back by alignment (``contract/projection.py``);
- whitespace inside a segment is one space (HTML renders it so), the whitespace around it is kept as it is;
- character references that stand for text (``&quot;``, ``&uuml;``, ``&#8217;``) are read as the characters
  they stand for; ``&lt;``, ``&gt;``, ``&amp;`` and ``&nbsp;`` stay as they are (protected spans);
- the ``title`` and ``alt`` of a tag that ends a segment (``<img alt="…">``, ``<p title="…">``) are segments of
  their own; an inline tag's are kept as they are.
"""

from __future__ import annotations

import html
import re

from contract.markup import BLOCK, BREAKS, Segment, find_tags, has_words, merged, split_markup
from contract.placeholders import _SPANS as SPANS

_VERBATIM = re.compile(
    r"<!--.*?-->|<!\[CDATA\[.*?\]\]>|<![^>]*>|<\?.*?>"
    r"|<(script|style|pre|textarea|code|samp|tt|var)\b[^>]*>.*?</\1\s*>",
    re.DOTALL | re.IGNORECASE,
)
_ATTRIBUTE = re.compile(r"""\b(title|alt)\s*=\s*(?:"([^"]*)"|'([^']*)')""", re.IGNORECASE)
_KEPT_ENTITIES = frozenset({"&lt;", "&gt;", "&amp;", "&nbsp;", "&#60;", "&#62;", "&#38;", "&#160;"})
SEPARATORS = BLOCK | BREAKS | {"img", "hr", "input", "select", "option", "button", "iframe", "object", "video"}
INLINE_CODE = frozenset({"code", "samp", "tt", "var"})
CODE = "{{_attnserve_code_{}}}"  # what stands for the n-th inline code element: a brace span, kept verbatim


def _text(raw: str) -> str:
    """Character references that stand for text, read as their characters; the others kept."""

    def read(m: re.Match) -> str:
        kept = m.lastgroup != "entity" or m.group().lower() in _KEPT_ENTITIES
        return m.group() if kept else html.unescape(m.group())

    return SPANS.sub(read, raw)


def _separator_tag(tag: str) -> list[str | Segment]:
    """A tag that ends a segment, its ``title``/``alt`` values as segments of their own."""
    out: list[str | Segment] = []
    cursor = 0
    for m in _ATTRIBUTE.finditer(tag):
        group = 2 if m.group(2) is not None else 3
        value = m.group(group)
        if not any(c.isalpha() for c in value):
            continue
        quote = '"' if group == 2 else "'"
        out += [tag[cursor : m.start(group)], Segment(" ".join(_text(value).split()), quote=quote)]
        cursor = m.end(group)
    out.append(tag[cursor:])
    return out


def _inline(run: str) -> list[str | Segment]:
    """A run of text and inline tags: one or more segments (``split_markup``) with its outer whitespace kept."""
    lead, trail = len(run) - len(run.lstrip()), len(run.rstrip())
    body = run[lead:trail]
    if not has_words(body):
        return [run]
    return [run[:lead], *split_markup(" ".join(_text(body).split())), run[trail:]]


def html_parts(document: str) -> tuple[list[str | Segment], dict[str, str]]:
    """``document`` as verbatim strings and segments to translate, in order, and what each :data:`CODE` in them
    stands for (``"".join`` of the strings and the segments' translations, their elements put back and their
    code put in, is the translated document)."""
    out: list[str | Segment] = []
    codes: dict[str, str] = {}
    cursor, run = 0, []  # run: the text and inline tags since the last separator

    def close_run() -> None:
        if run:
            out.extend(_inline("".join(run)))
            run.clear()

    pieces = [  # (start, -end, kind, name): at one start the longer first, so a tag inside a kept element is skipped
        (m.start(), -m.end(), "code" if (m.group(1) or "").lower() in INLINE_CODE else "verbatim", "")
        for m in _VERBATIM.finditer(document)
    ]
    pieces += [(t.start, -t.end, "tag", t.name) for t in find_tags(document)]
    for start, end, kind, name in sorted(pieces):
        if start < cursor:
            continue
        end = -end
        run.append(document[cursor:start])
        raw = document[start:end]
        if kind == "code":
            codes[token := CODE.format(len(codes))] = raw
            run.append(token)
        elif kind == "verbatim" or name in SEPARATORS:
            close_run()
            out.extend(_separator_tag(raw) if kind == "tag" else [raw])
        else:
            run.append(raw)
        cursor = end
    run.append(document[cursor:])
    close_run()
    return merged(out), codes
