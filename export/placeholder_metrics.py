"""Do translations carry their source's placeholders? Two judges, and the count of invented ``%n``.

- **Span agreement** (:func:`agreement`): the translation holds exactly the source's protected spans
  (``contract.placeholders.find_spans``: printf conversions, braces, tags, entities, escapes), as a
  multiset of span texts; their order is free. What the service promises to keep.
- **msgfmt** (:func:`msgfmt_check`): the pairs written as a PO file, each entry flagged with the formats
  its msgid uses (``c-format`` for a printf conversion, ``python-format`` for a named ``%(name)s``,
  ``python-brace-format`` for ``{…}``), checked by GNU ``msgfmt --check-format``: the check a catalog
  must pass before it ships, as strict as a C or Python program is. It judges format strings only (a
  tag or an entity is the span judge's alone) and allows what a program allows (``%2$s %1$d`` for
  ``%s %d``), but rejects non-positional conversions put in another order and a wrong type. An empty
  translation fails (msgfmt would take it for an untranslated entry and check nothing).
- **Invented %n** (:func:`invents_n`): a translation with a ``%n`` (``%hn``, ``%ln``, …) conversion
  its source lacks. printf *writes* through ``%n``: a catalog carrying one is a memory-corruption bug,
  counted on its own whatever the judges say.

Torch-free: the service's tests and a translator's own checks can use it.
"""

from __future__ import annotations

import bisect
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

from contract.placeholders import find_spans
from model.translation.masking import span_texts

_WRITES = re.compile(r"%(?:\d+\$)?[-+0#' ]*\d*(?:\.\d+)?(?:hh|h|ll|l|L|q|j|z|Z|t)?n$")  # printf's %n family
_ERROR_LINE = re.compile(r"^(?P<file>.+?):(?P<line>\d+): (?P<message>.*)$")


class MsgfmtError(RuntimeError):
    """msgfmt is missing, or it failed in a way that names no entry."""


def agreement(source: str, translation: str) -> bool:
    """The translation carries exactly the source's protected spans (a multiset of span texts)."""
    return span_texts(translation) == span_texts(source)


def writes_memory(text: str) -> bool:
    """``text`` holds a printf ``%n`` conversion (``%n``, ``%hn``, ``%1$ln`` …)."""
    return any(s.kind == "printf" and _WRITES.match(s.text) for s in find_spans(text))


def invents_n(source: str, translation: str) -> bool:
    """The translation holds a ``%n`` conversion and its source none."""
    return writes_memory(translation) and not writes_memory(source)


def format_flags(msgid: str) -> list[str]:
    """The gettext format flags of a msgid, by the spans it holds."""
    spans = find_spans(msgid)
    printf = [s.text for s in spans if s.kind == "printf" and s.text != "%%"]
    flags = []
    if printf:
        flags.append("python-format" if any(t.startswith("%(") for t in printf) else "c-format")
    if any(s.kind == "brace" and s.text not in ("{{", "}}") for s in spans):
        flags.append("python-brace-format")
    return flags


def _po_string(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    return '"' + escaped.replace("\n", "\\n").replace("\t", "\\t").replace("\r", "\\r") + '"'


def po_file(pairs: Sequence[tuple[str, str]]) -> tuple[str, list[int]]:
    """A PO file of the pairs (each with its index as msgctxt, so equal msgids stay distinct) and the line
    each pair's entry starts on."""
    lines = ['msgid ""', 'msgstr ""', '"Content-Type: text/plain; charset=UTF-8\\n"']
    starts = []
    for i, (source, translation) in enumerate(pairs):
        lines.append("")
        starts.append(len(lines) + 1)
        if flags := format_flags(source):
            lines.append("#, " + ", ".join(flags))
        lines += [f'msgctxt "{i}"', f"msgid {_po_string(source)}", f"msgstr {_po_string(translation)}"]
    return "\n".join(lines) + "\n", starts


def msgfmt_check(pairs: Sequence[tuple[str, str]], msgfmt: str = "msgfmt") -> list[str | None]:
    """Per pair, msgfmt's complaint (``None``: it passes), from one ``msgfmt --check-format`` run."""
    exe = shutil.which(msgfmt)
    if exe is None:
        raise MsgfmtError(f"'{msgfmt}' not found: install GNU gettext (Debian: apt-get install gettext)")
    text, starts = po_file(pairs)
    errors: list[str | None] = [None if t.strip() else "empty translation" for _, t in pairs]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "translations.po"
        path.write_text(text, encoding="utf-8")
        proc = subprocess.run(
            [exe, "--check-format", "--use-fuzzy", "-o", "/dev/null", str(path)],
            capture_output=True,
            text=True,
            env={**os.environ, "LC_ALL": "C"},  # English messages, whatever the caller's locale
            check=False,
        )
    placed = 0
    for line in proc.stderr.splitlines():
        m = _ERROR_LINE.match(line)
        if m and m["file"] == str(path) and int(m["line"]) >= starts[0]:
            i = bisect.bisect_right(starts, int(m["line"])) - 1
            errors[i] = m["message"] if errors[i] is None else f"{errors[i]}; {m['message']}"
            placed += 1
    if proc.returncode != 0 and not placed:
        raise MsgfmtError(f"msgfmt failed (exit status {proc.returncode}): {proc.stderr.strip()[-500:]}")
    return errors


def judge(sources: Sequence[str], translations: Sequence[str], msgfmt: str = "msgfmt") -> dict:
    """Both judges and the invented ``%n`` count over a set of translations, with every failure listed."""
    spans = [agreement(s, t) for s, t in zip(sources, translations)]
    formats = msgfmt_check(list(zip(sources, translations)), msgfmt)
    invented = [invents_n(s, t) for s, t in zip(sources, translations)]
    n = len(sources)

    def share(passed: int) -> dict:
        return {"passed": passed, "percent": round(100 * passed / n, 2) if n else None}

    failures = [
        {"index": i, "source": s, "translation": t, "spans": ok, "msgfmt": err, "invented_n": bad}
        for i, (s, t, ok, err, bad) in enumerate(zip(sources, translations, spans, formats, invented))
        if not ok or err or bad
    ]
    return {
        "sentences": n,
        "span_agreement": share(sum(spans)),
        "msgfmt": {**share(sum(e is None for e in formats)), "checked": sum(bool(format_flags(s)) for s in sources)},
        "invented_n": sum(invented),
        "failures": failures,
    }
