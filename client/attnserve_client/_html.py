"""Cutting an HTML document in two where the service's ``format: "html"`` would cut it anyway.

The service translates a page as segments that never cross a block element's tag (``<p>``, ``<div>``,
``<li>``, ``<h1>`` ...), and keeps ``<script>``, ``<style>``, ``<pre>``, ``<code>``, ``<textarea>`` and
comments as they are. A page cut just before a block tag outside those is therefore translated, part by
part, into the same pieces as in one request: ``attnserve-client html translate`` cuts a page this way
when the service refuses it whole (413: over ``ATTNSERVE_MAX_HTML_CHARS`` characters, or more sentences
than the model queues at once).
"""

from __future__ import annotations

import re

_KEPT = re.compile(
    r"<!--.*?-->|<!\[CDATA\[.*?\]\]>|<(script|style|pre|code|textarea)\b[^>]*>.*?</\1\s*>",
    re.DOTALL | re.IGNORECASE,
)
_BLOCK_TAG = re.compile(
    r"</?(?:address|article|aside|blockquote|body|caption|dd|div|dl|dt|figcaption|figure|footer|form|h[1-6]"
    r"|header|hr|li|main|nav|ol|p|pre|section|table|tbody|td|tfoot|th|thead|tr|ul)(?=[\s/>])",
    re.IGNORECASE,
)


def cut_points(document: str) -> list[int]:
    """Where ``document`` may be cut: before each block element's tag that is outside the kept elements,
    with text before it (so neither part is empty)."""
    kept = [m.span() for m in _KEPT.finditer(document)]
    first = len(document) - len(document.lstrip())  # the first character that is not whitespace
    points, k = [], 0
    for m in _BLOCK_TAG.finditer(document):
        while k < len(kept) and kept[k][1] <= m.start():
            k += 1
        inside = k < len(kept) and kept[k][0] < m.start()
        if not inside and m.start() > first:
            points.append(m.start())
    return points


def halves(document: str) -> tuple[str, str] | None:
    """``document`` cut in two at the cut point nearest its middle; ``None`` when it has none."""
    points = cut_points(document)
    if not points:
        return None
    middle = min(points, key=lambda p: abs(p - len(document) / 2))
    return document[:middle], document[middle:]
