"""An interactive client beside a bulk one: ``python -m benchmarks.bench_priorities``.

The shipped translator (``python -m service`` as ``make serve`` runs it). Client B sends one sentence of
``benchmarks/translate_sentences.txt`` at a time (closed loop, greedy); client A, when it runs, keeps
``--bulk-connections`` (64) requests of ``--bulk-texts`` (8) sentences each in flight (greedy; a 503 backs off), as
``attnserve-client po translate`` does with a catalog. Each has an API key. Four modes, in an order rotating
from round to round, ``--seconds`` each: B alone, B beside A sending ``priority: batch``, B beside A sending no
priority (interactive, as every request was before priorities), and B beside A on a key whose terms hold it to
``--quota`` (default ``characters=5000/s``) as batch work (A waits out each 429's ``Retry-After``). Printed: B's
p50 and p99 per mode (medians over ``--rounds``) and as a ratio to B alone, A's sentences per second, and the
429s and other errors A got.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import random
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from benchmarks.bench_classify import ROOT, Service

SENTENCES = [t for t in (ROOT / "benchmarks" / "translate_sentences.txt").read_text("utf-8").splitlines() if t.strip()]
MODES = ("alone", "bulk as batch", "bulk as interactive", "bulk on its quota")
KEYS = {"B": "bench-key-interactive", "A": "bench-key-bulk", "A quota": "bench-key-bulk-quota"}


def auth(who: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[who]}"}


async def interactive(url: str, until: float, seed: int) -> list[float]:
    rng, latencies = random.Random(seed), []
    async with httpx.AsyncClient(base_url=url, timeout=120, headers=auth("B")) as client:
        while time.monotonic() < until:
            started = time.monotonic()
            r = await client.post("/translate", json={"text": rng.choice(SENTENCES), "beam_size": 1})
            r.raise_for_status()
            latencies.append(time.monotonic() - started)
    return latencies


async def bulk(url: str, until: float, connections: int, texts: int, priority: str | None, who: str) -> dict:
    counts = {"sentences": 0, "429": 0, "errors": 0}

    async def one(i: int) -> None:
        rng = random.Random(i)
        async with httpx.AsyncClient(base_url=url, timeout=300, headers=auth(who)) as client:
            while time.monotonic() < until:
                body = {"texts": rng.sample(SENTENCES, texts), "beam_size": 1}
                r = await client.post("/translate", json={**body, **({"priority": priority} if priority else {})})
                if r.status_code == 429:  # over its quota: wait out the window, as the SDK does
                    counts["429"] += 1
                    await asyncio.sleep(min(float(r.headers.get("retry-after", "1")), max(0, until - time.monotonic())))
                elif r.status_code == 503:  # the queue is full: back off as the SDK does
                    await asyncio.sleep(float(r.headers.get("retry-after", "1")) / 10)
                elif r.status_code == 200:
                    counts["sentences"] += texts
                else:
                    counts["errors"] += 1

    await asyncio.gather(*(one(i) for i in range(connections)))
    return counts


async def measure(url: str, mode: str, args: argparse.Namespace, seed: int) -> dict:
    until = time.monotonic() + args.seconds
    tasks = [interactive(url, until, seed)]
    if mode != "alone":
        priority = "batch" if mode == "bulk as batch" else None
        who = "A quota" if mode == "bulk on its quota" else "A"
        tasks.append(bulk(url, until, args.bulk_connections, args.bulk_texts, priority, who))
    latencies, *rest = await asyncio.gather(*tasks)
    latencies.sort()
    a = rest[0] if rest else {"sentences": 0, "429": 0, "errors": 0}
    return {
        "p50_ms": 1000 * latencies[len(latencies) // 2],
        "p99_ms": 1000 * latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))],
        "bulk_per_s": a["sentences"] / args.seconds,
        "429": a["429"],
        "errors": a["errors"],
    }


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.bench_priorities", description=__doc__.splitlines()[0])
    p.add_argument("--repository", type=Path, default=ROOT / "models")
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--bulk-connections", type=int, default=64)
    p.add_argument("--bulk-texts", type=int, default=8)
    p.add_argument("--quota", default="characters=5000/s", help="A's quota in the last mode (service/core/quotas.py)")
    args = p.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="bench-priorities-"))
    key_file = folder / "keys"
    terms = {"B": "quota=off", "A": "quota=off", "A quota": f"quota={args.quota} priority=batch"}
    key_file.write_text("".join(f"{hashlib.sha256(KEYS[w].encode()).hexdigest()} {terms[w]}\n" for w in KEYS))
    service = Service("priorities", args.repository, "vit", folder, api_key_hashes_file=key_file)
    figures: dict[str, list[dict]] = {m: [] for m in MODES}
    try:
        service.wait_ready()
        print(
            f"B: 1 client, greedy; A: {args.bulk_connections} connections x {args.bulk_texts} texts; "
            f"{args.rounds} rounds of {args.seconds:g} s",
            flush=True,
        )
        for r in range(args.rounds):
            for mode in MODES[r % len(MODES) :] + MODES[: r % len(MODES)]:
                f = asyncio.run(measure(service.url, mode, args, r))
                figures[mode].append(f)
                print(
                    f"  round {r + 1}: {mode:20s} B p50 {f['p50_ms']:8.1f} ms  p99 {f['p99_ms']:8.1f} ms  "
                    f"A {f['bulk_per_s']:6.1f} sentences/s, {f['429']} x 429, {f['errors']} other errors",
                    flush=True,
                )
    finally:
        service.stop()
    alone = {k: statistics.median(f[k] for f in figures["alone"]) for k in ("p50_ms", "p99_ms")}
    print(f"\n{'mode':20s} {'B p50':>9s} {'B p99':>9s} {'p50/alone':>10s} {'p99/alone':>10s} {'A sent/s':>9s} A 429s")
    for mode, rounds in figures.items():
        p50 = statistics.median(f["p50_ms"] for f in rounds)
        p99 = statistics.median(f["p99_ms"] for f in rounds)
        rate = statistics.median(f["bulk_per_s"] for f in rounds)
        print(
            f"{mode:20s} {p50:6.1f} ms {p99:6.1f} ms {p50 / alone['p50_ms']:9.2f}x {p99 / alone['p99_ms']:9.2f}x "
            f"{rate:9.1f} {sum(f['429'] for f in rounds)} (other errors: {sum(f['errors'] for f in rounds)})"
        )


if __name__ == "__main__":
    main()
