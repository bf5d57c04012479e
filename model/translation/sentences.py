"""Sentence splitting for help paragraphs and UI messages, and aligning the sentences of a pair.

A paragraph pair is split into sentence pairs only when both sides split into the same number of
sentences, the usual heuristic when no sentence aligner is at hand; otherwise the paragraph pair is
kept whole (it is still a correct translation) and the length filter decides.
"""

from __future__ import annotations

from contract.sentences import split_sentences

__all__ = ["align_sentences", "split_sentences"]


def align_sentences(source: str, target: str) -> list[tuple[str, str]]:
    """Sentence pairs when both sides split into the same number of sentences, else the pair itself."""
    src, tgt = split_sentences(source), split_sentences(target)
    if len(src) == len(tgt):
        return list(zip(src, tgt))
    return [(source, target)]
