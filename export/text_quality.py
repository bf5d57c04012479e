"""What a translator reading a translation of software text would check, beyond its spans being there.

A constrained search guarantees that every placeholder and tag comes back; it does not guarantee German
around them. These judges look at the rest: whether the markup nests as the source's did, whether the
search ended by itself (``finished``), whether the text rambles (longer than :data:`RUNAWAY` times the
reference's), and whether a number placeholder was glued to a noun (``%d-Dateien``).
"""

from __future__ import annotations

import re
from collections import Counter

from contract.markup import find_tags
from contract.placeholders import find_spans
from contract.tokenizer import normalize_text

RUNAWAY = 1.8  # a translation's text longer than this many times the reference's rambles
# A span glued by a hyphen to a capitalised word: "%d-Dateien", "{count}-Elemente".
_COMPOUND = re.compile(r"-[A-ZÄÖÜ]")


def without_tags(text: str) -> str:
    """The text with its tags taken out (a tag between two words leaves one space), whitespace normalised."""
    out, cursor = [], 0
    for t in find_tags(text):
        out += [text[cursor : t.start], " " if t.name in ("br", "nl", "p", "li", "div", "tr", "td") else ""]
        cursor = t.end
    out.append(text[cursor:])
    return normalize_text("".join(out))


def tags_kept(source: str, translation: str) -> bool:
    """The translation holds the source's tags (as a multiset of their texts) and they nest: every closing tag
    closes the innermost element still open whose name it has, as in the source."""
    if Counter(t.text for t in find_tags(source)) != Counter(t.text for t in find_tags(translation)):
        return False
    return _nests(translation) or not _nests(source)


def _nests(text: str) -> bool:
    stack: list[str] = []
    for t in find_tags(text):
        if t.void:
            continue
        if not t.closing:
            stack.append(t.name)
        elif t.name in stack:
            if stack[-1] != t.name:
                return False
            stack.pop()
    return True


def runaway(translation: str, reference: str) -> bool:
    return len(without_tags(translation)) > RUNAWAY * max(1, len(without_tags(reference)))


def span_compounds(text: str) -> int:
    """Protected spans glued by a hyphen to a capitalised word after them."""
    return sum(bool(_COMPOUND.match(text, s.end)) for s in find_spans(text) if s.kind != "tag")
