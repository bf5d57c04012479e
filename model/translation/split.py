"""The near-duplicate-aware train/valid/test split of the corpus.

Hashing each English sentence alone puts ``Choose Format - Character.`` in training and
``Choose Format - Paragraph.`` in the test split: the test then measures recall of boilerplate, not
translation. So pairs are first grouped, and a whole group goes to one split:

- two sentences are linked when their words are equal, case folded and punctuation dropped
  (``Fill color:`` and ``FILL COLOR``), or when their *masks* are equal: digits written as ``0``
  and every capitalised word after the first written as ``N`` (names and UI labels), so
  ``Choose Format - Character`` and ``Choose Edit - Paste`` share the mask ``choose N N``;
- sentences of at least :data:`MIN_EDIT_WORDS` words are also linked when their masks differ by one
  word (a word replaced, added or left out), found through the masks with one word deleted;
- links are transitive (union-find), and a group's split is a hash of its smallest mask, so the
  split of a sentence does not depend on the order or the machine the corpus is built on.

A group larger than ``max_group`` pairs is a template family rather than a near-duplicate cluster
(it would take one split's whole share of a domain): it goes to training.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence

SPLITS = ("train", "valid", "test")
MIN_EDIT_WORDS = 5  # shorter sentences differ by one word from far too many others ("Insert a row.")
_WORD = re.compile(r"\w+")
_DIGIT = re.compile(r"\d")


def mask(source: str) -> tuple[str, ...]:
    """The words of ``source`` with digits and names masked: ``Open Tools - Options 2`` -> ``(open, N, N, 0)``.

    In a sentence without lower-case letters (``OPEN THE FILE``) no word can be told for a name.
    """
    words = _WORD.findall(source)
    names = any(c.islower() for c in source)
    return tuple("N" if names and i and w[0].isupper() else _DIGIT.sub("0", w.casefold()) for i, w in enumerate(words))


def link_keys(source: str) -> list[tuple[str, ...]]:
    """The keys that link a sentence to its near-duplicates: its folded words, its mask, its mask less each word."""
    words = mask(source)
    keys = [("=", *(w.casefold() for w in _WORD.findall(source))), words]
    if len(words) >= MIN_EDIT_WORDS:
        keys += [words[:i] + words[i + 1 :] for i in range(len(words))]  # a shorter one's mask is among them
    return keys


class _UnionFind:
    def __init__(self, n: int) -> None:
        self.parent = list(range(n))

    def find(self, i: int) -> int:
        while self.parent[i] != i:
            self.parent[i] = self.parent[self.parent[i]]
            i = self.parent[i]
        return i

    def union(self, a: int, b: int) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)


def group_sentences(sources: Sequence[str]) -> list[int]:
    """A group id per sentence: sentences linked directly or through others share one."""
    uf = _UnionFind(len(sources))
    first: dict[tuple[str, ...], int] = {}
    for i, source in enumerate(sources):
        for key in link_keys(source):
            if (j := first.setdefault(key, i)) != i:
                uf.union(i, j)
    return [uf.find(i) for i in range(len(sources))]


def _fraction(key: tuple[str, ...]) -> float:
    digest = hashlib.sha256(" ".join(key).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def assign_splits(
    sources: Sequence[str], valid_fraction: float, test_fraction: float, max_group: int
) -> tuple[list[str], dict[str, int]]:
    """``train``/``valid``/``test`` per sentence, whole groups at a time; also counts of the groups formed.

    A group's place comes from a hash of its smallest mask: stable across runs, machines and orderings.
    """
    groups = group_sentences(sources)
    members: dict[int, list[int]] = {}
    for i, g in enumerate(groups):
        members.setdefault(g, []).append(i)
    split_of: list[str] = [""] * len(sources)
    largest = 0
    forced = 0
    for idx in members.values():
        largest = max(largest, len(idx))
        if len(idx) > max_group:
            split, forced = "train", forced + len(idx)
        else:
            u = _fraction(min(mask(sources[i]) for i in idx))
            split = "valid" if u < valid_fraction else "test" if u < valid_fraction + test_fraction else "train"
        for i in idx:
            split_of[i] = split
    stats = {"groups": len(members), "largest_group": largest, "in_groups_over_max": forced}
    return split_of, stats
