"""Requests per second through HAProxy with 1, 2 and 3 replicas of the Compose profile ``scale``.

``docker compose --profile scale up -d haproxy``, then ``python -m benchmarks.bench_replicas``

Drives a running profile (HAProxy on ``--url``, its statistics on ``--stats``), changing how many
replicas serve by stopping and starting their containers with the ``docker`` CLI (``DOCKER_HOST``
is honoured; a container is found by its Compose service label, ``--replicas``): for each count,
the first ``count`` replicas run and the others are stopped, and a run starts once HAProxy's
statistics show exactly those UP. A stopped replica costs no CPU, so a count of one is one
replica's throughput, not three with two idle.

wrk (C, epoll; ``apt-get install wrk``) sends ``--clients`` closed-loop connections to HAProxy for
``--duration`` seconds (after ``--warmup`` seconds not counted), on each route in turn: ``POST /classify`` with one real Fashion-MNIST test
image per request (PNG in JSON, the ten samples of ``models/vit/1`` in turn), and ``POST /translate``
with one sentence of ``benchmarks/translate_sentences.txt`` per request (the model's default beam).
The counts run in an order rotating from round to round, for ``--rounds`` rounds; it prints each
configuration's median requests/s, p50 and p99, and each count's ratio to one replica with the lowest
and highest ratio of a single round. Beside them, the CPU time the serving replicas and HAProxy
spent per request (their processes' user + system time, read from /proc when Docker runs on this
machine): a rate moves with whatever else the machine runs, the CPU a request costs much less. Any
answer but 2xx, or a socket error, stops the benchmark. At the end every replica runs again.

On one machine, replicas share its cores: they add throughput only where one replica leaves cores
idle, and HAProxy and wrk take their share of the same cores (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import base64
import csv
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.bench_classify import write_script

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = sorted((ROOT / "models" / "vit" / "1").glob("sample-*.png"))
SENTENCES = (ROOT / "benchmarks" / "translate_sentences.txt").read_text().splitlines()


@dataclass
class Run:
    route: str
    replicas: int
    rounds: list[dict] = field(default_factory=list)

    def median(self, key: str) -> float:
        return statistics.median(r[key] for r in self.rounds)


# ---- the replicas ------------------------------------------------------------------------------------
def docker(args: argparse.Namespace, *command: str, timeout: float = 120) -> str:
    proc = subprocess.run([args.docker, *command], capture_output=True, text=True, timeout=timeout, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{args.docker} {' '.join(command)} failed: {proc.stderr.strip()}")
    return proc.stdout


def container(args: argparse.Namespace, service: str) -> str:
    found = docker(args, "ps", "-aq", "--filter", f"label=com.docker.compose.service={service}").split()
    if len(found) != 1:
        raise SystemExit(f"{len(found)} containers of the Compose service {service}: is the profile `scale` up?")
    return found[0]


def cpu_seconds(args: argparse.Namespace, services: list[str]) -> float | None:
    """User + system CPU time of every process of ``services``' containers (HAProxy's master and worker),
    or None where their processes are not on this machine."""
    total = 0.0
    for service in services:
        for pid in docker(args, "top", container(args, service), "-eo", "pid").split()[1:]:
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                return None
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def statuses(args: argparse.Namespace) -> dict[str, str]:
    """HAProxy's status of each server of the HTTP backend (``UP``, ``DOWN``, ...)."""
    with urllib.request.urlopen(f"{args.stats};csv", timeout=5) as r:
        rows = csv.DictReader(io.StringIO(r.read().decode().removeprefix("# ")))
        return {row["svname"]: row["status"] for row in rows if row["pxname"] == args.backend}


def serve_with(args: argparse.Namespace, count: int) -> None:
    """The first ``count`` replicas running and UP in HAProxy, the others stopped and out."""
    running, stopped = args.replicas[:count], args.replicas[count:]
    for service in stopped:
        docker(args, "stop", container(args, service))
    for service in running:
        docker(args, "start", container(args, service))
    wanted = {s: "UP" if s in running else "DOWN" for s in args.replicas}
    deadline = time.monotonic() + 180
    while {s: statuses(args).get(s) for s in args.replicas} != wanted:
        if time.monotonic() > deadline:
            raise SystemExit(f"HAProxy does not see {wanted}: {statuses(args)}")
        time.sleep(0.2)
    time.sleep(1)  # one more check round: every replica's pool of connections to HAProxy is open


# ---- the load ----------------------------------------------------------------------------------------
def bodies() -> dict[str, tuple[list[bytes], str]]:
    classify = [json.dumps({"images": [base64.b64encode(p.read_bytes()).decode()]}).encode() for p in SAMPLES]
    translate = [json.dumps({"text": s}).encode() for s in SENTENCES]
    return {"/classify": (classify, "application/json"), "/translate": (translate, "application/json")}


def run_wrk(args: argparse.Namespace, script: Path, route: str, duration: int) -> dict:
    cmd = [
        "wrk", f"-t{args.wrk_threads}", f"-c{args.clients}", f"-d{duration}s", "--timeout", "30s",
        "-s", str(script), args.url + route,
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=duration + 90, check=False)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("WRKJSON ")), None)
    if proc.returncode != 0 or line is None:
        raise SystemExit(f"wrk failed ({proc.returncode}): {proc.stdout}\n{proc.stderr}")
    out = json.loads(line.removeprefix("WRKJSON "))
    if out["non_2xx"] or out["errors"]:
        raise SystemExit(f"{route}: {out['non_2xx']} answers not 2xx and {out['errors']} socket errors: {out}")
    out["rps"] = out["requests"] / (out["duration_us"] / 1e6)
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:8000", help="HAProxy's HTTP address")
    p.add_argument("--stats", default="http://127.0.0.1:8404/stats", help="HAProxy's statistics page")
    p.add_argument("--backend", default="api-http", help="HAProxy's backend of the replicas")
    p.add_argument("--haproxy", default="haproxy", help="HAProxy's Compose service")
    p.add_argument(
        "--replicas", nargs="+", default=["api-1", "api-2", "api-3"], help="Compose services, HAProxy's server names"
    )
    p.add_argument("--counts", type=int, nargs="+", default=[1, 2, 3], help="how many replicas serve, in turn")
    p.add_argument("--routes", nargs="+", default=["/classify", "/translate"], choices=["/classify", "/translate"])
    p.add_argument("--clients", type=int, default=32, help="wrk connections")
    p.add_argument("--duration", type=int, default=10, help="seconds per wrk run (whole seconds)")
    p.add_argument("--warmup", type=int, default=2, help="seconds of load before each measured run (0: none)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--wrk-threads", type=int, default=1)
    p.add_argument("--docker", default="docker", help="the docker CLI")
    args = p.parse_args(argv)
    if max(args.counts) > len(args.replicas) or min(args.counts) < 1:
        p.error(f"--counts must be between 1 and {len(args.replicas)}, the number of --replicas")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    for tool in ("wrk", args.docker):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} not found")
    workdir = Path(tempfile.mkdtemp(prefix="bench-replicas-"))
    scripts = {route: write_script(workdir, route.strip("/"), *bodies()[route], route=route) for route in args.routes}
    runs = {(route, n): Run(route, n) for route in args.routes for n in args.counts}
    try:
        for r in range(args.rounds):
            order = args.counts[r % len(args.counts) :] + args.counts[: r % len(args.counts)]
            for count in order:
                serve_with(args, count)
                for route in args.routes:
                    if args.warmup:  # a started replica's first requests are slower
                        run_wrk(args, scripts[route], route, args.warmup)
                    serving = [*args.replicas[:count], args.haproxy]
                    before = cpu_seconds(args, serving)
                    out = run_wrk(args, scripts[route], route, args.duration)
                    after = cpu_seconds(args, serving)
                    out["cpu_us"] = (after - before) / out["requests"] * 1e6 if None not in (before, after) else None
                    runs[(route, count)].rounds.append(out)
                    print(f"round {r + 1}, {count} replica(s), POST {route}: {out['rps']:.1f} req/s", flush=True)
    finally:
        serve_with(args, len(args.replicas))
        shutil.rmtree(workdir, ignore_errors=True)

    print(f"\nthrough HAProxy, {args.clients} wrk connections, {args.rounds} rounds of {args.duration} s, medians:")
    print(
        f"{'route':<16s} {'replicas':>8s} {'req/s':>12s} {'p50':>10s} {'p99':>10s} {'CPU/request':>12s} "
        f"{'vs one replica':>28s}"
    )
    for route in args.routes:
        one = runs[(route, args.counts[0])]
        for count in args.counts:
            run = runs[(route, count)]
            ratios = [b["rps"] / a["rps"] for a, b in zip(one.rounds, run.rounds)]
            versus = (
                f"{run.median('rps') / one.median('rps'):.3f}x ({min(ratios):.3f}x to {max(ratios):.3f}x)"
                if count != args.counts[0]
                else ""
            )
            cpu = [r["cpu_us"] for r in run.rounds if r["cpu_us"] is not None]
            cpu_text = f"{statistics.median(cpu) / 1e3:.2f} ms" if cpu else "n/a"
            print(
                f"POST {route:<11s} {count:>8d} {run.median('rps'):>8.1f} req/s {run.median('p50') / 1e3:>7.1f} ms "
                f"{run.median('p99') / 1e3:>7.1f} ms {cpu_text:>12s} {versus:>28s}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
