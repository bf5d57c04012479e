"""Sentence splitting for help paragraphs and UI messages, and aligning the sentences of a pair.

A paragraph pair is split into sentence pairs only when both sides split into the same number of
sentences, the usual heuristic when no sentence aligner is at hand; otherwise the paragraph pair is
kept whole (it is still a correct translation) and the length filter decides.
"""

from __future__ import annotations

import re

# Candidate boundary: ., ! or ? (not part of "..."), optional closing quotes/brackets, whitespace,
# then something that can start a sentence (optionally an opening quote or bracket, then an uppercase letter).
_BOUNDARY = re.compile(r"(?<!\.)[.!?][\"'”“»«)\]]*\s+(?=[\"'„“»«(\[]?[A-ZÄÖÜ])")

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


def split_sentences(text: str) -> list[str]:
    """Split at sentence ends; abbreviations, initials and German ordinals (``20. März``) do not split."""
    sentences, start = [], 0
    for m in _BOUNDARY.finditer(text):
        before = text[start : m.start() + 1]
        if m.group(0)[0] == "." and not _ends_sentence(before):
            continue
        sentences.append(text[start : m.end()].strip())
        start = m.end()
    sentences.append(text[start:].strip())
    return [s for s in sentences if s]


def align_sentences(source: str, target: str) -> list[tuple[str, str]]:
    """Sentence pairs when both sides split into the same number of sentences, else the pair itself."""
    src, tgt = split_sentences(source), split_sentences(target)
    if len(src) == len(tgt):
        return list(zip(src, tgt))
    return [(source, target)]
