"""The fault suite's rows as the Markdown table of ``docs/reliability.md``:
``FAULT_REPORT=faults.jsonl python -m pytest tests/faults && python -m tests.faults.table faults.jsonl``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

HEADER = (
    "| fault injected | requests | hit | what the hit got | answered 200 | errors seen by others | not ready for | "
    "metrics |\n| --- | --- | --- | --- | --- | --- | --- | --- |"
)
KEYS = {"fault", "requests", "hit", "hit_codes", "answered", "others_errors", "not_ready_s", "note"}


def row(r: dict) -> str:
    counted = ", ".join(
        f"{k.removeprefix('attnserve_')} {v:g}"
        for k, v in r.items()
        if k not in KEYS and isinstance(v, int | float) and v
    )
    ready = f"{r['not_ready_s']:g} s" if r["not_ready_s"] else "never"
    return (
        f"| {r['fault']} | {r['requests']} | {r['hit']} | {', '.join(r['hit_codes']) or '-'} | {r['answered']} | "
        f"{r['others_errors']} | {ready} | {counted or '-'} |"
    )


def main() -> None:
    rows = [json.loads(line) for line in Path(sys.argv[1]).read_text("utf-8").splitlines() if line.strip()]
    print(HEADER)
    for r in rows:
        print(row(r))


if __name__ == "__main__":
    main()
