"""Sentence splitting, shared by the corpus builder (training pairs) and the service (long texts).

The rule, documented in ``docs/api.md``: a text is cut at every line break first; a line is cut
after ``.``, ``!`` or ``?`` (not part of ``...``), with any closing quotes or brackets, where
whitespace follows and the next word starts with an uppercase letter (after an optional opening quote
or bracket). A period does not end a sentence after a known abbreviation (``e.g.``, ``etc.``,
``z.B.``, :data:`ABBREVIATIONS`), a single letter (``J.``), or a number (``20.``). No model is
involved, so the same text always splits the same way.
"""

from __future__ import annotations

import re

# Candidate boundary: ., ! or ? (not part of "..."), optional closing quotes/brackets, whitespace,
# then something that can start a sentence (optionally an opening quote or bracket, then an uppercase letter).
_BOUNDARY = re.compile(r"(?<!\.)[.!?][\"'”“»«)\]]*\s+(?=[\"'„“»«(\[]?[A-ZÄÖÜ])")
_LINE_BREAK = re.compile(r"\s*[\n\r\u2028\u2029]\s*")

# Lower-cased words ending in a period that end no sentence (English and German help text).
ABBREVIATIONS = frozenset({
    "e.g.", "i.e.", "etc.", "vs.", "approx.", "incl.", "no.", "fig.", "cf.", "resp.", "min.", "max.", "mr.", "mrs.",
    "dr.", "st.", "ca.", "bzw.", "usw.", "ggf.", "evtl.", "z.b.", "d.h.", "u.a.", "z.t.", "nr.", "abb.", "bspw.",
    "inkl.", "sog.", "vgl.", "bzgl.", "ggfs.", "zb.", "dh.",
})  # fmt: skip


def _ends_sentence(text_before: str) -> bool:
    """Whether the word that carries the period can end a sentence (not ``e.g.``, ``z. B.``, ``20.``)."""
    word = text_before.rsplit(None, 1)[-1].lower() if text_before.strip() else ""
    if word in ABBREVIATIONS or word.rstrip(".").isdigit():
        return False
    return not (len(word) == 2 and word[0].isalpha() and word[1] == ".")  # single letters: "B.", "A."


def _line_cuts(line: str) -> list[tuple[int, int]]:
    """(start, end) of each sentence of one line, whitespace between them left out."""
    cuts, start = [], 0
    for m in _BOUNDARY.finditer(line):
        if m.group(0)[0] == "." and not _ends_sentence(line[start : m.start() + 1]):
            continue
        end = m.start() + len(m.group(0).rstrip())
        cuts.append((start, end))
        start = m.end()
    cuts.append((start, len(line)))
    return cuts


def segments(text: str) -> list[tuple[int, int]]:
    """(start, end) of each sentence of ``text``, in order; what lies between them (and before the first and
    after the last) is whitespace, kept verbatim when the translations are joined."""
    out, start = [], 0
    for piece_end, next_start in [(m.start(), m.end()) for m in _LINE_BREAK.finditer(text)] + [(len(text),) * 2]:
        line = text[start:piece_end]
        lead = len(line) - len(line.lstrip())
        for a, b in _line_cuts(line.strip()):
            if text[start + lead + a : start + lead + b].strip():
                out.append((start + lead + a, start + lead + b))
        start = next_start
    return out


def split_sentences(text: str) -> list[str]:
    """The sentences of ``text`` (:func:`segments`), stripped."""
    return [text[a:b].strip() for a, b in segments(text)]
