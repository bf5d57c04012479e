"""What markup costs a request: the same messages with their tags and with them taken out, through the service.

``python -m benchmarks.bench_markup --rounds 5``

Starts ``python -m service`` on ``--repository`` as ``make serve`` does and sends, from one client, each
message of ``benchmarks/markup_messages.txt`` (32 UI messages with inline tags from the held-out markup
set, ``make heldout-markup``) and the same message with its tags taken out (``export.text_quality``),
one after the other, the pair's order alternating, at greedy and beam 4. A message with markup pays for
its alignment: one more encoder and teacher-forced decoder run (``contract/projection.py``), and the
segments a block tag cuts it into. Printed per decoding: the median over the rounds of each round's p50
latency of both, their ratio, and the ratio's lowest and highest round. The response cache is off.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.bench_libretranslate_servers import start_attnserve
from export.text_quality import without_tags

ROOT = Path(__file__).resolve().parent.parent
MESSAGES = Path(__file__).with_name("markup_messages.txt")


def round_p50(server, messages: list[str], beam: int, flip: bool) -> tuple[float, float]:
    """(p50 ms with markup, p50 ms stripped) over one pass of the messages, each pair sent back to back."""
    times: dict[bool, list[float]] = {True: [], False: []}
    for i, message in enumerate(messages):
        order = (True, False) if (i % 2 == 0) != flip else (False, True)
        for marked in order:
            text = message if marked else without_tags(message)
            start = time.perf_counter()
            server.post("/translate", {"text": text, "beam_size": beam})
            times[marked].append(1000 * (time.perf_counter() - start))
    return statistics.median(times[True]), statistics.median(times[False])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.bench_markup", description=__doc__.splitlines()[0])
    p.add_argument("--repository", type=Path, default=ROOT / "models")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--messages", type=Path, default=MESSAGES)
    args = p.parse_args(argv)
    messages = [m for m in args.messages.read_text(encoding="utf-8").splitlines() if m.strip()]
    with tempfile.TemporaryDirectory() as tmp:
        server = start_attnserve(args.repository, Path(tmp), extra_env={"ATTNSERVE_RESPONSE_CACHE": "off"})
        try:
            server.wait_ready("/readyz")
            for beam in (1, 4):  # warm-up: every message once
                round_p50(server, messages, beam, False)
            print(f"{len(messages)} messages, one client, {args.rounds} rounds; p50 of each round, ms")
            print(f"{'decoding':<10} {'markup':>8} {'stripped':>9} {'ratio':>6}  low-high")
            for beam in (1, 4):
                rounds = [round_p50(server, messages, beam, r % 2 == 1) for r in range(args.rounds)]
                ratios = [a / b for a, b in rounds]
                marked, plain = (statistics.median(x) for x in zip(*rounds))
                name = "greedy" if beam == 1 else f"beam {beam}"
                print(
                    f"{name:<10} {marked:8.1f} {plain:9.1f} {statistics.median(ratios):6.2f}  "
                    f"{min(ratios):.2f}-{max(ratios):.2f}"
                )
        finally:
            server.proc.terminate()
            server.proc.wait(timeout=30)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
