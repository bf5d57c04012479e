"""A soak of the real service: ``python -m benchmarks.soak --minutes 30``.

Starts a ``redis-server`` (the shared attention store) and ``python -m service`` (uvicorn, HTTP and
gRPC, on free loopback ports) on ``--repository``, then for ``--minutes``:

- every route of the mix in :mod:`benchmarks.soak_routes` is called ``--rate`` times a second, one
  request at a time: ``POST /classify`` and ``POST /translate`` (greedy, beam, streamed; with and
  without attention), the attention maps (JSON, PNG, npz, and ids past their TTL), OIP REST and gRPC
  ``ModelInfer`` on both models, the health, readiness, model list and metrics routes;
- every ``--cycle-minutes`` one model (the classifier and the translator in turn) is unloaded
  through ``POST /v2/repository/models/{name}/unload``, left unloaded ``--unloaded-seconds``, and
  loaded again. While it is away its routes must answer as documented (404 ``model_not_found``;
  during the unload and load calls also 200 or 503): those answers are counted apart, not as errors;
- every ``--sample-seconds`` it prints the server process's RSS, open file descriptors and threads
  (``/proc/<pid>/``) and the Redis key count (``DBSIZE``).

At the end it prints the answers by route and status and a verdict line, and exits 1 when the
verdict fails: an unexpected status, a malformed answer, a connection error or an ERROR line in the
service's log; RSS growing by more than ``--rss-growth-mib`` after the warm-up (the first
``--warmup-minutes``, at most a third of the run): the median of the last third of the samples
taken with every model loaded against the median of the first third after the warm-up, a trend
rather than one peak (the service gives freed heap pages back every ``ATTNSERVE_MEMORY_RELEASE_S``,
so RSS saws up and down between samples); file descriptors or threads rising above the warm-up
baseline by more than ``--fd-slack``/``--thread-slack``; or more Redis keys than the ids answered
within the last TTL allow (each key expires after ``--attention-ttl-s``; Redis leaves at most about
10% of expired keys behind before it reclaims them).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import redis

from benchmarks.bench_classify import ROOT, Service
from benchmarks.soak_routes import Models, Soak, routes, unload_and_load
from contract.manifest import latest_versions, read_manifest

STALE_KEYS = 1.1  # Redis reclaims expired keys once they are about 10% of the keys with a TTL
KEYS_SLACK = 10  # ids stored but not yet answered (one in flight per attention route), and rounding


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """``redis-server`` on a loopback port, with no persistence, in ``workdir``."""

    def __init__(self, workdir: Path) -> None:
        exe = shutil.which("redis-server")
        if exe is None:
            raise SystemExit("redis-server is not installed: run `make system-deps`")
        self.port = free_port()
        args = ["--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        args += ["--dir", str(workdir), "--maxmemory", "512mb", "--maxmemory-policy", "allkeys-lru"]
        self.proc = subprocess.Popen([exe, *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.client = redis.Redis(port=self.port, socket_timeout=5)
        deadline = time.monotonic() + 20
        while True:
            try:
                self.client.ping()
                return
            except redis.ConnectionError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise SystemExit(f"redis-server did not start on port {self.port}") from None
                time.sleep(0.1)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def stop(self) -> None:
        self.client.close()
        self.proc.terminate()
        self.proc.wait(timeout=20)


def process_sample(pid: int) -> dict[str, float]:
    status = Path(f"/proc/{pid}/status").read_text()
    return {
        "rss_mib": round(int(re.search(r"^VmRSS:\s+(\d+) kB", status, re.MULTILINE)[1]) / 1024, 1),
        "threads": int(re.search(r"^Threads:\s+(\d+)", status, re.MULTILINE)[1]),
        "fds": len(os.listdir(f"/proc/{pid}/fd")),
        **memory_kinds(pid),
    }


def memory_kinds(pid: int) -> dict[str, float]:
    """RSS split into anonymous memory (the heap, onnxruntime's arenas) and file-backed pages (mapped
    weights, libraries), from ``/proc/<pid>/smaps_rollup``; empty where the kernel has no such file."""
    try:
        rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return {}
    kb = {m[1]: int(m[2]) for m in re.finditer(r"^(\w+):\s+(\d+) kB", rollup, re.MULTILINE)}
    anon = kb.get("Anonymous", 0)
    return {"anon_mib": round(anon / 1024, 1), "file_mib": round((kb.get("Rss", 0) - anon) / 1024, 1)}


async def sample_every(soak: Soak, pid: int, store: RedisServer, every_s: float, end_at: float) -> None:
    """One sample now, one every ``every_s``, one at ``end_at`` (when every model is loaded again)."""
    while True:
        now = time.monotonic()
        sample = {"t_s": round(now - soak.started, 1), **process_sample(pid), "redis_keys": store.client.dbsize()}
        sample["redis_keys_bound"] = math.ceil(STALE_KEYS * soak.ids_answered_since(now - soak.ttl_s)) + KEYS_SLACK
        sample["unloaded"] = [name for name, m in soak.models.items() if m.state != "serving"]
        sample["requests"], sample["problems"] = soak.total(), soak.unexpected() + soak.connection_errors()
        soak.samples.append(sample)
        print(
            f"{sample['t_s']:7.0f} s  RSS {sample['rss_mib']:6.1f} MiB"
            + (f" (anon {sample['anon_mib']:6.1f}, file {sample['file_mib']:5.1f})" if "anon_mib" in sample else "")
            + f"  fds {sample['fds']:3d}  "
            f"threads {sample['threads']:3d}  Redis keys {sample['redis_keys']:4d} (bound {sample['redis_keys_bound']})"
            f"  requests {sample['requests']:6d}  problems {sample['problems']}"
            + (f"  [{', '.join(sample['unloaded'])} away]" if sample["unloaded"] else ""),
            flush=True,
        )
        if now >= end_at:
            return
        await asyncio.sleep(min(every_s, end_at - now))


def judge(samples: list[dict], warmup_s: float, bounds: argparse.Namespace, failures: list[str]) -> dict:
    """The resource half of the verdict: appends to ``failures``, returns the figures it judged."""
    loaded = [s for s in samples if not s["unloaded"]]
    baseline = next((s for s in loaded if s["t_s"] >= warmup_s), loaded[-1])
    after = [s for s in samples if s["t_s"] >= baseline["t_s"]]
    end = samples[-1]
    figures = {
        key: {"start": samples[0][key], "baseline": baseline[key], "max": max(s[key] for s in samples), "end": end[key]}
        for key in ("rss_mib", "fds", "threads", "redis_keys")
    }
    steady = [s["rss_mib"] for s in loaded if s["t_s"] >= baseline["t_s"]]
    third = max(1, len(steady) // 3)
    first, last = statistics.median(steady[:third]), statistics.median(steady[-third:])
    growth = last - first
    figures["rss_mib"] |= {"first_third_median": first, "last_third_median": last, "growth": round(growth, 1)}
    if growth > bounds.rss_growth_mib:
        failures.append(
            f"RSS grew {growth:.1f} MiB after the warm-up: median {first:.1f} MiB in the first third of the "
            f"samples with every model loaded, {last:.1f} MiB in the last (bound {bounds.rss_growth_mib} MiB)"
        )
    for key, slack in (("fds", bounds.fd_slack), ("threads", bounds.thread_slack)):
        high = max(s[key] for s in after)
        if high > baseline[key] + slack:  # growth only: fewer at the end (clients closing) is no leak
            failures.append(f"{key} went from {baseline[key]} to max {high}, end {end[key]} (bound baseline + {slack})")
    over = [s for s in samples if s["redis_keys"] > s["redis_keys_bound"]]
    if over:
        s = over[0]
        failures.append(f"{s['redis_keys']} Redis keys at {s['t_s']:.0f} s, over the TTL bound {s['redis_keys_bound']}")
    return figures


def log_errors(log_path: Path) -> list[str]:
    """ERROR and CRITICAL lines of the service's JSON log."""
    out = []
    for line in log_path.read_text().splitlines():
        try:
            level = json.loads(line).get("level")
        except json.JSONDecodeError:
            continue  # a line that is not the service's (a library printing): not an error report
        if level in ("error", "critical"):
            out.append(line)
    return out


def report(soak: Soak, figures: dict, failures: list[str], seconds: float) -> None:
    print(f"\nanswers by route over {seconds / 60:.1f} minutes ({soak.total()} requests), p50/p99/max of the 200s:")
    for route in soak.route_names():
        counts = ", ".join(f"{label}: {n}" for label, n in soak.counts_of(route))
        print(f"  {route:46} {counts}{soak.latency_text(route)}")
    print("\nserver process and Redis (start / after warm-up / max / end):")
    for key, unit in (("rss_mib", "MiB"), ("fds", ""), ("threads", ""), ("redis_keys", "")):
        f = figures[key]
        print(f"  {key:11} {f['start']:>7g} / {f['baseline']:>7g} / {f['max']:>7g} / {f['end']:>7g} {unit}")
    rss, fds, threads = figures["rss_mib"], figures["fds"], figures["threads"]
    summary = (
        f"{soak.unexpected()} unexpected answers, {soak.connection_errors()} connection errors, "
        f"{soak.while_unloaded()} documented answers while a model was away; RSS {rss['growth']:+.1f} "
        f"MiB from the first to the last third after warm-up ({rss['first_third_median']:.1f} -> "
        f"{rss['last_third_median']:.1f}, max {rss['max']:.1f}), fds {fds['baseline']} -> {fds['end']}, threads {threads['baseline']} -> {threads['end']}, "
        f"Redis keys max {figures['redis_keys']['max']}"
    )
    print(f"\nverdict: {'PASS' if not failures else 'FAIL'}: {summary}")
    for failure in failures:
        print(f"  FAIL: {failure}")


def find_models(repository: Path) -> tuple[str, str]:
    """The names of the repository's first classifier and first translator."""
    tasks = {read_manifest(e)["task"]: e.parent.name for e in reversed(latest_versions(repository))}
    if "image-classification" not in tasks or "translation" not in tasks:
        raise SystemExit(f"{repository} must hold a classifier and a translator (it has: {sorted(tasks)})")
    return tasks["image-classification"], tasks["translation"]


async def run(soak: Soak, service: Service, store: RedisServer, args: argparse.Namespace) -> None:
    end_at = soak.started + args.minutes * 60
    await soak.open(service.url, f"127.0.0.1:{args.grpc_port}")
    try:
        workers = [asyncio.create_task(soak.drive(route, end_at)) for route in routes(soak)]
        cycles = asyncio.create_task(unload_and_load(soak, args.cycle_minutes * 60, args.unloaded_seconds, end_at))
        await sample_every(soak, service.proc.pid, store, args.sample_seconds, end_at)
        await asyncio.gather(cycles, *workers)
    finally:
        await soak.close()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.soak", description=__doc__.split("\n\n")[0])
    p.add_argument("--repository", type=Path, default=ROOT / "models")
    p.add_argument("--minutes", type=float, default=30.0)
    p.add_argument("--rate", type=float, default=1.0, help="requests per second of each route of the mix")
    p.add_argument("--sample-seconds", type=float, default=30.0)
    p.add_argument("--cycle-minutes", type=float, default=3.0, help="unload and load a model this often")
    p.add_argument("--unloaded-seconds", type=float, default=30.0)
    p.add_argument("--warmup-minutes", type=float, default=5.0)
    p.add_argument("--attention-ttl-s", type=int, default=120, help="the service's ATTNSERVE_ATTENTION_TTL_S")
    p.add_argument("--rss-growth-mib", type=float, default=32.0)
    p.add_argument("--fd-slack", type=int, default=4)
    p.add_argument("--thread-slack", type=int, default=2)
    p.add_argument("--json", type=Path, help="write the samples, answers and verdict here")
    p.add_argument("--judge", type=Path, metavar="JSON", help="judge the samples of an earlier run's --json instead")
    return p.parse_args(argv)


def stop(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # unwinds like Ctrl-C: the service and Redis are stopped on the way out


def judge_again(path: Path, bounds: argparse.Namespace) -> int:
    """The resource half of the verdict on an earlier run's samples, by this version's rules and bounds."""
    saved = json.loads(path.read_text())
    ran = saved["args"]
    warmup_s = min(float(ran["warmup_minutes"]) * 60, float(ran["minutes"]) * 20)
    failures: list[str] = []
    figures = judge(saved["samples"], warmup_s, bounds, failures)
    rss = figures["rss_mib"]
    print(
        f"{path}: RSS {rss['growth']:+.1f} MiB from the first to the last third after warm-up "
        f"({rss['first_third_median']:.1f} -> {rss['last_third_median']:.1f}, max {rss['max']:.1f})"
    )
    print(f"resource verdict: {'PASS' if not failures else 'FAIL'}")
    for failure in failures:
        print(f"  FAIL: {failure}")
    return 1 if failures else 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.judge:
        return judge_again(args.judge, args)
    signal.signal(signal.SIGTERM, stop)
    classifier, translator = find_models(args.repository)
    args.grpc_port = free_port()
    with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
        store = RedisServer(Path(tmp))
        service = Service(
            "soak",
            args.repository,
            classifier,
            Path(tmp),
            grpc_port=args.grpc_port,
            attention_store="redis",
            redis_url=store.url,
            attention_ttl_s=args.attention_ttl_s,
            intra_op_threads=1,
            access_log="false",
            log_format="json",
        )
        try:
            service.wait_ready()
            soak = Soak(Models(classifier, translator), args.repository, args.rate, args.attention_ttl_s)
            asyncio.run(run(soak, service, store, args))
        finally:
            service.stop()
            store.stop()
            errors = log_errors(service.log_path)
    seconds = time.monotonic() - soak.started
    failures = [f"{n} {what}" for n, what in soak.problems() if n]
    if errors:
        failures.append(f"{len(errors)} ERROR lines in the service's log, the first: {errors[0][:300]}")
    figures = judge(soak.samples, min(args.warmup_minutes * 60, args.minutes * 20), args, failures)
    report(soak, figures, failures, seconds)
    if args.json:
        out = {"args": {k: str(v) for k, v in vars(args).items()}, "seconds": round(seconds, 1)}
        out |= {"samples": soak.samples, "answers": soak.answers_json(), "cycles": soak.cycles}
        out |= {"figures": figures, "failures": failures, "first_problems": soak.first_problems}
        args.json.write_text(json.dumps(out, indent=1))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
