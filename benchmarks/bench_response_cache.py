"""The response cache on real catalogs: hit ratio and throughput with the cache off and on, interleaved.

``python -m benchmarks.bench_response_cache``

The German catalogs of Debian's core tools (``data/cache``, which ``make heldout`` fills; or any
``.mo``/``.po`` files given with ``--catalogs``) hold the English strings a client sends to
``POST /translate`` as ``attnserve-client po translate`` does: each catalog's distinct msgids (and
plurals), 32 per request, one catalog after another. The GNU tools share many strings (gnulib's
messages, option errors, ``--help`` lines), so a fleet that translates several of them finds some
strings already done. ``--fraction`` keeps the strings whose sha256 falls in that fraction of the
range, the same strings in every catalog, so shared strings stay shared; strings over
``--max-chars`` are left out (the long ``--help`` blocks would dominate the time).

Two services on the shipped models (``python -m service``; one ``redis-server``, no persistence):
``off`` without the cache, and the cache on, measured twice: ``cold`` (Redis emptied first: what the
first replica to translate these catalogs sees) and ``warm`` (the same catalogs again: another
replica, a CI run, the next release's unchanged strings). ``--clients`` clients run at once, each
taking the next catalog; ``warm`` goes through the catalogs ``--warm-repeats`` times, since one pass
takes a fraction of a second. Each round runs ``off`` and ``cold`` then ``warm``, in an order rotating
from round to round; the medians over ``--rounds`` rounds are printed, with each mode's hit ratio
(strings answered from the cache, read from the service's ``/metrics``), requests/s, strings/s and
the median request latency, then the ratios to ``off`` with the lowest and highest of a single round.
Both services' answers are checked identical for every string before measuring.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import statistics
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import polib

from benchmarks.bench_classify import ROOT, Service
from benchmarks.soak import RedisServer

CATALOGS = ROOT / "data" / "cache"
TOOLS = ("coreutils", "tar", "diffutils", "findutils", "grep", "make", "gettext", "man-db", "dpkg", "bash")
BATCH = 32  # attnserve-client po translate's batch (the service's default max_texts_per_request)
MODES = ("off", "cold", "warm")
LOOKUPS = re.compile(
    r'^attnserve_response_cache_lookups_total\{operation="translate",result="(\w+)"\} (\S+)$', re.MULTILINE
)


@dataclass
class Mode:
    name: str
    rounds: list[dict] = field(default_factory=list)

    def median(self, key: str) -> float:
        return statistics.median(r[key] for r in self.rounds)


def default_catalogs() -> list[Path]:
    found = []
    for tool in TOOLS:
        found += sorted((CATALOGS / tool).glob("usr/share/locale/de/LC_MESSAGES/*.mo"))
    return found


def catalog_strings(path: Path, fraction: float, max_chars: int) -> list[str]:
    """The distinct texts ``po translate`` would send of the catalog at ``path``, those in ``fraction``."""
    catalog = polib.mofile(str(path)) if path.suffix == ".mo" else polib.pofile(str(path))
    texts = (t for e in catalog if e.msgid for t in ([e.msgid, e.msgid_plural] if e.msgid_plural else [e.msgid]))
    limit = int(fraction * 2**64)
    kept = (t for t in texts if t.strip() and len(t) <= max_chars)
    return list(dict.fromkeys(t for t in kept if int.from_bytes(hashlib.sha256(t.encode()).digest()[:8]) < limit))


def lookups(service: Service) -> dict[str, float]:
    text = httpx.get(service.url + "/metrics", timeout=10).text
    return {m[1]: float(m[2]) for m in LOOKUPS.finditer(text)}


def translate_all(service: Service, catalogs: list[list[str]], clients: int, options: dict, repeat: int = 1) -> dict:
    """Every catalog through ``service`` (``repeat`` times), ``clients`` at a time, ``BATCH`` strings per request."""
    queue = [i for _ in range(repeat) for i in range(len(catalogs))]
    lock = threading.Lock()
    latencies: list[float] = []
    failures: list[str] = []

    def client() -> None:
        with httpx.Client(base_url=service.url, timeout=600) as http:
            while True:
                with lock:
                    if not queue:
                        return
                    texts = catalogs[queue.pop(0)]
                for start in range(0, len(texts), BATCH):
                    began = time.perf_counter()
                    r = http.post("/translate", json={"texts": texts[start : start + BATCH], **options})
                    took = time.perf_counter() - began
                    with lock:
                        latencies.append(took)
                        if r.status_code != 200:
                            failures.append(f"{r.status_code} {r.text[:200]}")

    before = lookups(service)
    cpu = service.cpu_seconds()
    started = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(min(clients, len(catalogs)))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - started
    if failures:
        raise SystemExit(f"{len(failures)} requests failed, the first: {failures[0]}")
    after = lookups(service)
    looked = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in ("hit", "miss", "error")}
    strings = repeat * sum(len(c) for c in catalogs)
    asked = sum(looked.values())
    return {
        "seconds": seconds,
        "requests": len(latencies),
        "strings": strings,
        "req_per_s": len(latencies) / seconds,
        "strings_per_s": strings / seconds,
        "p50_ms": statistics.median(latencies) * 1000,
        "hit_ratio": looked["hit"] / asked if asked else 0.0,
        "errors": looked["error"],
        "server_cpu_ms_per_request": (service.cpu_seconds() - cpu) * 1000 / len(latencies),
    }


def check_answers(services: dict[str, Service], redis: RedisServer, catalogs: list[list[str]], options: dict) -> None:
    """Every string gets the same translation without the cache, from it cold, and from it warm."""
    redis.client.flushdb()
    texts = [t for c in catalogs for t in c]
    answers = {}
    for name, service in (("off", services["off"]), ("cold", services["on"]), ("warm", services["on"])):
        got = []
        with httpx.Client(base_url=service.url, timeout=600) as http:
            for start in range(0, len(texts), BATCH):
                r = http.post("/translate", json={"texts": texts[start : start + BATCH], **options})
                r.raise_for_status()
                got += r.json()["results"]
        answers[name] = got
    for name in ("cold", "warm"):
        differ = [t for t, a, b in zip(texts, answers["off"], answers[name]) if a["translation"] != b["translation"]]
        if differ:
            raise SystemExit(
                f"{name}: {len(differ)} translations differ from the service without a cache: {differ[:3]}"
            )
    if answers["cold"] != answers["warm"]:
        raise SystemExit("warm answers differ from cold ones")


def in_round_order(r: int) -> list[str]:
    """``off`` first in even rounds, last in odd ones; ``warm`` always right after ``cold``."""
    return ["off", "cold", "warm"] if r % 2 == 0 else ["cold", "warm", "off"]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.bench_response_cache", description=__doc__.splitlines()[0])
    p.add_argument("--repository", type=Path, default=ROOT / "models", help="model repository (default: models/)")
    p.add_argument(
        "--catalogs", type=Path, nargs="+", help=f"catalogs (.mo/.po; default: {', '.join(TOOLS)} in data/cache)"
    )
    p.add_argument("--fraction", type=float, default=0.3, help="share of each catalog's strings kept (by sha256)")
    p.add_argument("--max-chars", type=int, default=200, help="longest string kept")
    p.add_argument("--clients", type=int, default=2, help="catalogs translated at once")
    p.add_argument("--beam-size", type=int, help="beam of every request (default: the model's, as po translate)")
    p.add_argument("--warm-repeats", type=int, default=10, help="warm: the catalogs this many times (it is quick)")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds (median kept)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    paths = args.catalogs or default_catalogs()
    if not paths:
        raise SystemExit(f"no catalogs in {CATALOGS}: run `make heldout` (it downloads them) or give --catalogs")
    catalogs = [s for s in (catalog_strings(p, args.fraction, args.max_chars) for p in paths) if s]
    strings = sum(len(c) for c in catalogs)
    distinct = len({t for c in catalogs for t in c})
    options = {} if args.beam_size is None else {"beam_size": args.beam_size}
    load1 = os.getloadavg()[0]
    print(
        f"{len(catalogs)} catalogs ({', '.join(p.stem for p in paths)}): {strings} strings, {distinct} distinct "
        f"({1 - distinct / strings:.1%} repeated across catalogs); {BATCH} per request, {args.clients} clients, "
        f"beam {args.beam_size or 'the model default'}, {args.rounds} rounds; {os.cpu_count()} CPUs, "
        f"load average {load1:.2f}",
        flush=True,
    )
    workdir = Path(tempfile.mkdtemp(prefix="bench-response-cache-"))
    redis = RedisServer(workdir)
    common = {"log_format": "json", "access_log": "false", "redis_url": redis.url}
    services = {
        "off": Service("off", args.repository, "vit", workdir, **common),
        "on": Service("on", args.repository, "vit", workdir, response_cache="true", **common),
    }
    modes = {name: Mode(name) for name in MODES}
    try:
        for s in services.values():
            s.wait_ready()
        check_answers(services, redis, catalogs[:2], options)
        for r in range(args.rounds):
            for name in in_round_order(r):
                if name == "cold":
                    redis.client.flushdb()
                service = services["off" if name == "off" else "on"]
                repeat = args.warm_repeats if name == "warm" else 1
                modes[name].rounds.append(figures := translate_all(service, catalogs, args.clients, options, repeat))
                print(
                    f"  round {r + 1}/{args.rounds}: {name:4s}: {figures['req_per_s']:8.2f} req/s "
                    f"{figures['strings_per_s']:8.1f} str/s, hits {figures['hit_ratio']:6.1%}, "
                    f"p50 {figures['p50_ms']:8.1f} ms",
                    flush=True,
                )
    finally:
        for s in services.values():
            s.stop()
        redis.stop()
    report(modes)
    return 0


def report(modes: dict[str, Mode]) -> None:
    print(f"\n{'mode':5s} {'hit ratio':>9s} {'req/s':>9s} {'str/s':>9s} {'p50 ms':>9s} {'srv ms/req':>10s}")
    for m in modes.values():
        print(
            f"{m.name:5s} {m.median('hit_ratio'):9.1%} {m.median('req_per_s'):9.2f} {m.median('strings_per_s'):9.1f} "
            f"{m.median('p50_ms'):9.1f} {m.median('server_cpu_ms_per_request'):10.2f}"
        )
    off = modes["off"]
    for name in ("cold", "warm"):
        m = modes[name]
        ratios = [a["req_per_s"] / b["req_per_s"] for a, b in zip(m.rounds, off.rounds)]
        print(
            f"{name} vs off: {m.median('req_per_s') / off.median('req_per_s'):.3f}x req/s "
            f"(rounds {min(ratios):.3f}x to {max(ratios):.3f}x), hit ratio {m.median('hit_ratio'):.1%}"
        )
    print(json.dumps({name: m.rounds for name, m in modes.items()}))


if __name__ == "__main__":
    raise SystemExit(main())
