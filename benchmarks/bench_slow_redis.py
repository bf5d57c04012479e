"""The response cache in front of a slow Redis: ``python -m benchmarks.bench_slow_redis [--base REV]``.

A real ``redis-server`` behind a TCP proxy that delays each of its replies by ``--delay-ms`` (300;
``benchmarks/delay_proxy.py``). Services on the shipped models: ``off`` (no cache), ``on`` (the cache, through
the slow Redis) and, with ``--base``, ``base`` (that revision with the cache, through the same slow Redis),
each a ``python -m service`` of its own, loaded one at a time in an order rotating from round to round.
``--clients`` closed-loop clients send ``POST /translate`` with one sentence of
``benchmarks/translate_sentences.txt`` each (random, so some repeat) for ``--seconds``; printed: each mode's
median over ``--rounds`` rounds of the p50 and p99 latency and requests/s, and each p50 as a ratio to ``off``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from benchmarks.bench_classify import ROOT, Service
from benchmarks.delay_proxy import DelayProxy
from benchmarks.soak import RedisServer

SENTENCES = ROOT / "benchmarks" / "translate_sentences.txt"


async def drive(url: str, texts: list[str], clients: int, seconds: float, seed: int) -> dict:
    latencies: list[float] = []
    until = time.monotonic() + seconds

    async def client(i: int) -> None:
        rng = random.Random(seed * 1000 + i)
        async with httpx.AsyncClient(base_url=url, timeout=60) as http:
            while time.monotonic() < until:
                started = time.monotonic()
                r = await http.post("/translate", json={"text": rng.choice(texts)})
                r.raise_for_status()
                latencies.append(time.monotonic() - started)

    await asyncio.gather(*(client(i) for i in range(clients)))
    latencies.sort()
    return {
        "p50_ms": 1000 * latencies[len(latencies) // 2],
        "p99_ms": 1000 * latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))],
        "req_per_s": len(latencies) / seconds,
    }


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.bench_slow_redis", description=__doc__.splitlines()[0])
    p.add_argument("--base", help="a git revision measured with the cache through the same slow Redis")
    p.add_argument("--repository", type=Path, default=ROOT / "models")
    p.add_argument("--delay-ms", type=float, default=300.0)
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--seconds", type=float, default=15.0)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    from benchmarks.bench_versions import worktree

    texts = [t for t in SENTENCES.read_text("utf-8").splitlines() if t.strip()]
    workdir = Path(tempfile.mkdtemp(prefix="bench-slow-redis-"))
    redis = RedisServer(workdir)
    figures: dict[str, list[dict]] = {}
    with contextlib.ExitStack() as stack, DelayProxy(redis.port, args.delay_ms / 1000) as proxy:
        stack.callback(redis.stop)
        common = {"log_format": "json", "access_log": "false", "redis_url": proxy.url}
        trees = {"off": ROOT, "on": ROOT}
        if args.base:
            trees["base"] = stack.enter_context(worktree(args.base))
        services = {
            mode: Service(mode, args.repository, "vit", workdir, root=tree, **common, **_cache(mode))
            for mode, tree in trees.items()
        }
        for s in services.values():
            stack.callback(s.stop)
        for s in services.values():
            s.wait_ready()
        modes = list(services)
        print(f"{args.clients} clients, Redis {args.delay_ms:g} ms late, {args.rounds} rounds of {args.seconds:g} s")
        for r in range(args.rounds):
            for mode in modes[r % len(modes) :] + modes[: r % len(modes)]:
                result = asyncio.run(drive(services[mode].url, texts, args.clients, args.seconds, r))
                figures.setdefault(mode, []).append(result)
                print(
                    f"  round {r + 1}: {mode:4s} p50 {result['p50_ms']:7.1f} ms  p99 {result['p99_ms']:7.1f} ms  "
                    f"{result['req_per_s']:6.1f} req/s",
                    flush=True,
                )
    off = statistics.median(f["p50_ms"] for f in figures["off"])
    print(f"\n{'mode':5s} {'p50 ms':>8s} {'p99 ms':>8s} {'req/s':>7s} {'p50 / off':>10s}")
    for mode, rounds in figures.items():
        p50 = statistics.median(f["p50_ms"] for f in rounds)
        p99 = statistics.median(f["p99_ms"] for f in rounds)
        rate = statistics.median(f["req_per_s"] for f in rounds)
        print(f"{mode:5s} {p50:8.1f} {p99:8.1f} {rate:7.1f} {p50 / off:9.2f}x")


def _cache(mode: str) -> dict:
    return {} if mode == "off" else {"response_cache": "true"}


if __name__ == "__main__":
    main()
