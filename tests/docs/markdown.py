"""Reading the README and the docs pages: code blocks, shell commands, links, headings and tables."""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

from markdown.extensions.toc import slugify

from tests.service.service_testing import ROOT

README = ROOT / "README.md"
DOCS = ROOT / "docs"

_FENCE = re.compile(
    r"^(?P<indent>[ \t]*)(?P<fence>`{3,})(?P<lang>[\w+-]*)[^\n]*\n(?P<body>.*?)^(?P=indent)(?P=fence)[ \t]*$",
    re.MULTILINE | re.DOTALL,
)
_HEADING = re.compile(r"^(#{1,6})[ \t]+(.+?)[ \t]*#*[ \t]*$", re.MULTILINE)
_LINK = re.compile(r"!?\[[^\]]*\]\((?P<target>[^)\s]+)(?:\s+\"[^\"]*\")?\)")
_HTML_SRC = re.compile(r"<(?:img|a)\b[^>]*?\b(?:src|href)=\"(?P<target>[^\"]+)\"")
_INLINE_CODE = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")


def pages() -> list[Path]:
    """Every Markdown page of the docs site."""
    return sorted(DOCS.rglob("*.md"))


def documents() -> list[Path]:
    """The README and every docs page: everything a reader is told to run."""
    return [README, *pages()]


def name(path: Path) -> str:
    return str(path.relative_to(ROOT))


@dataclass(frozen=True)
class Block:
    path: Path
    index: int  # among the file's fenced blocks
    lang: str
    code: str
    section: str  # the heading above it

    @property
    def id(self) -> str:
        return f"{name(self.path)}#{self.index}:{self.lang or 'plain'}"


def blocks(path: Path) -> list[Block]:
    """The fenced code blocks of a file, dedented when they sit inside a list item."""
    text = path.read_text(encoding="utf-8")
    found = []
    for i, m in enumerate(_FENCE.finditer(text)):
        above = [h.group(2) for h in _HEADING.finditer(text, 0, m.start())]
        code = textwrap.dedent(m.group("indent") + m.group("body"))
        found.append(Block(path, i, m.group("lang").lower(), code, above[-1] if above else ""))
    return found


def prose(path: Path) -> str:
    """The file without its fenced code blocks (headings, links and inline code live here)."""
    return _FENCE.sub("", path.read_text(encoding="utf-8"))


def commands(code: str) -> list[str]:
    """The command lines of a shell block: continuation lines joined, blank and comment-only lines dropped."""
    lines, pending = [], ""
    for raw in code.splitlines():
        line = pending + raw.strip()
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        pending = ""
        if line and not line.startswith("#"):
            lines.append(line)
    return lines


def inline_code(path: Path) -> list[str]:
    return _INLINE_CODE.findall(prose(path))


def links(path: Path) -> list[str]:
    """Markdown link and image targets, and the src/href of inline HTML."""
    text = prose(path)
    return [m.group("target") for m in _LINK.finditer(text)] + [m.group("target") for m in _HTML_SRC.finditer(text)]


def heading_text(markdown: str) -> str:
    """A heading as rendered text: code spans, links and emphasis reduced to their words."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", markdown)
    return re.sub(r"[`*_]", "", text)


def anchors(path: Path) -> set[str]:
    """The ids MkDocs gives the headings of a page (GitHub's agree for headings of plain words)."""
    return {slugify(heading_text(h.group(2)), "-") for h in _HEADING.finditer(prose(path))}


def section(path: Path, heading: str) -> str:
    """The text under a heading (``## Errors``), up to the next heading of the same or a higher level."""
    text = path.read_text(encoding="utf-8")
    level = len(heading) - len(heading.lstrip("#"))
    start = text.index(f"\n{heading}\n") + 1
    end = re.compile(rf"^#{{1,{level}}} ", re.MULTILINE).search(text, start + len(heading))
    return text[start : end.start() if end else len(text)]


def table_rows(text: str) -> list[list[str]]:
    """The cells of every Markdown table row in ``text``; header and separator rows left out."""
    lines = text.splitlines()
    separator = re.compile(r"\|[\s:|-]+\|")
    rows = []
    for i, line in enumerate(lines):
        if not line.startswith("|") or separator.fullmatch(line.strip()):
            continue
        if i + 1 < len(lines) and separator.fullmatch(lines[i + 1].strip()):
            continue  # the header
        rows.append([c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]])
    return rows


def code_spans(cell: str) -> list[str]:
    return _INLINE_CODE.findall(cell)
