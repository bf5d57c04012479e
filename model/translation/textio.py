"""Parallel text files: a user's own TSV or two aligned files in, the corpus TSV splits out.

A bad line in a user's file is counted, reported with its line number, and skipped: never dropped
without a word, and never a reason to throw the whole file away.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger("attnserve.translation.textio")

Pair = tuple[str, str]


class TextFileError(ValueError):
    """A user's file cannot be read at all (missing, a folder, not UTF-8, mismatched line counts)."""


@dataclass
class BadLines:
    """Skipped lines by reason, with the first few line numbers of each to show the user."""

    counts: Counter = field(default_factory=Counter)
    examples: dict[str, list[int]] = field(default_factory=dict)
    max_examples: int = 5

    def add(self, line_number: int, reason: str) -> None:
        self.counts[reason] += 1
        shown = self.examples.setdefault(reason, [])
        if len(shown) < self.max_examples:
            shown.append(line_number)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def summary(self) -> str:
        """``3 bad lines skipped: no tab (2, lines 4, 9); empty target (1, line 12)``."""
        parts = []
        for reason, n in sorted(self.counts.items()):
            lines = self.examples[reason]
            more = ", ..." if n > len(lines) else ""
            parts.append(f"{reason} ({n}, line{'s' if len(lines) > 1 else ''} {', '.join(map(str, lines))}{more})")
        return f"{self.total} bad line{'s' if self.total != 1 else ''} skipped: " + "; ".join(parts)

    def as_dict(self) -> dict:
        return {"total": self.total, "by_reason": dict(sorted(self.counts.items())), "first_lines": self.examples}


def _read_lines(path: Path) -> list[str]:
    try:
        with open(path, encoding="utf-8-sig") as f:  # drops a BOM; universal newlines end lines at \r\n and \r too
            lines = f.read().split("\n")  # not splitlines(): U+2028 or \x0c inside a line must not shift alignment
    except FileNotFoundError:
        raise TextFileError(f"{path} does not exist") from None
    except IsADirectoryError:
        raise TextFileError(f"{path} is a folder, not a text file") from None
    except UnicodeDecodeError as e:
        raise TextFileError(f"{path} is not UTF-8 text (byte {e.start}: {e.reason})") from None
    except OSError as e:
        raise TextFileError(f"cannot read {path}: {e.strerror or e}") from None
    return lines[:-1] if lines and lines[-1] == "" else lines


def parse_tsv_line(line: str) -> Pair | str:
    """``source<TAB>target`` -> the pair, or the reason the line is bad."""
    fields = line.split("\t")
    if len(fields) < 2:
        return "no tab"
    if len(fields) > 2:
        return "more than one tab"
    source, target = fields
    if not source.strip() and not target.strip():
        return "both sides empty"
    if not source.strip():
        return "empty source"
    if not target.strip():
        return "empty target"
    return source, target


def read_tsv(path: Path) -> tuple[list[Pair], BadLines]:
    """Pairs of a ``source<TAB>target`` file; blank lines are ignored, bad ones counted in ``BadLines``."""
    pairs, bad = [], BadLines()
    for number, line in enumerate(_read_lines(path), start=1):
        if not line.strip():
            continue
        parsed = parse_tsv_line(line)
        if isinstance(parsed, str):
            bad.add(number, parsed)
        else:
            pairs.append(parsed)
    return pairs, bad


def read_aligned(source_path: Path, target_path: Path) -> tuple[list[Pair], BadLines]:
    """Pairs of two files aligned line by line; a line with one empty side is counted and skipped."""
    sources, targets = _read_lines(source_path), _read_lines(target_path)
    if len(sources) != len(targets):
        raise TextFileError(
            f"{source_path} has {len(sources)} lines but {target_path} has {len(targets)}: "
            "they must be aligned line by line"
        )
    pairs, bad = [], BadLines()
    for number, (source, target) in enumerate(zip(sources, targets), start=1):
        if not source.strip() and not target.strip():
            continue
        if not source.strip() or not target.strip():
            bad.add(number, "empty source" if not source.strip() else "empty target")
        else:
            pairs.append((source, target))
    return pairs, bad


def write_tsv(path: Path, pairs: Iterable[Pair]) -> int:
    """Write ``source<TAB>target`` lines; cleaned text holds no tab or newline (normalize_text)."""
    n = 0
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for source, target in pairs:
            f.write(f"{source}\t{target}\n")
            n += 1
    return n
