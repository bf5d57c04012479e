"""The service under more load than it can take: ``python -m benchmarks.bench_overload [--base REV]``.

256 closed-loop clients on ``POST /classify`` (1 to 4 real Fashion-MNIST test images each, base64
JSON) and 192 on ``POST /translate`` (one real sentence each) for ``--duration`` seconds, each client
an ``httpx.AsyncClient`` on its own keep-alive connection, with the queues small
(``ATTNSERVE_MAX_QUEUE_IMAGES=64``, ``ATTNSERVE_MAX_WAITING_SEQUENCES=256``). It counts the answers
by status, the requests that ended without an answer (``httpx.ReadError``: the connection was reset;
``httpx.RemoteProtocolError``: closed before a response), and the latency of the answers: p50, p99
and max, overall and of the 200s, and the share of 503s (each checked for ``Retry-After``).

The clients run in a process of their own (``--load URL``): on 2 vCPUs they compete with the server
for the CPU either way, but not for its event loop. With ``--base REV`` the service at that git
revision (a temporary ``git worktree``) serves beside this checkout's and the rounds alternate
which one is loaded first, as ``benchmarks/bench_versions.py`` does; only one is loaded at a time.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
SENTENCES = ROOT / "benchmarks" / "translate_sentences.txt"
SETTINGS = {"max_queue_images": 64, "max_waiting_sequences": 256}
CLIENT_TIMEOUT_S = 120.0  # far above any answer: a client gives up on nothing the server would still answer
DROPPED = ("ReadError", "RemoteProtocolError")  # the server closed the connection without an answer


# ---- the load generator (its own process) -----------------------------------------------------
def classify_bodies(count: int = 64) -> list[bytes]:
    """``count`` JSON bodies of 1 to 4 real Fashion-MNIST test images each (base64 PNG)."""
    from benchmarks.bench_classify import encode_png
    from model.data import load_image_dataset  # numpy + Pillow only; no torch

    pngs = [
        base64.b64encode(encode_png(img[..., 0])).decode()
        for img in load_image_dataset("fashion-mnist").test_images[:256]
    ]
    rng = random.Random(0)
    return [json.dumps({"images": rng.sample(pngs, rng.randint(1, 4))}).encode() for _ in range(count)]


def translate_bodies() -> list[bytes]:
    texts = [t for t in SENTENCES.read_text("utf-8").splitlines() if t.strip()]
    return [json.dumps({"text": t}).encode() for t in texts]


def new_client(url: str) -> httpx.AsyncClient:
    # verify=False: plain HTTP, and loading the CA bundle costs 0.1 s of CPU per client (45 s for 448)
    return httpx.AsyncClient(base_url=url, timeout=CLIENT_TIMEOUT_S, verify=False)


async def client_loop(
    client: httpx.AsyncClient, path: str, bodies: list[bytes], until: float, seed: int, out: dict
) -> None:
    """One closed-loop client: the next request as soon as the last one is answered (or failed)."""
    rng = random.Random(seed)
    headers = {"Content-Type": "application/json"}
    async with client:
        answered_at = None
        while time.monotonic() < until:
            start = time.monotonic()
            try:
                r = await client.post(path, content=rng.choice(bodies), headers=headers)
            except httpx.HTTPError as e:
                kind = type(e).__name__
                out["outcomes"][f"{path} {kind}"] += 1
                idle = None if answered_at is None else round(start - answered_at, 3)
                at = round(start - out["started"], 3)
                out["drops"].append(
                    {
                        "path": path,
                        "error": kind,
                        "sent_at_s": at,
                        "after_s": round(time.monotonic() - start, 3),
                        "idle_s": idle,
                    }
                )
                answered_at = None  # httpx opens a new connection for the next request
                continue
            answered_at = time.monotonic()
            elapsed = answered_at - start
            out["outcomes"][f"{path} {r.status_code}"] += 1
            out["latency"].append(elapsed)
            out["by_route"].setdefault(f"{path} {r.status_code}", []).append(elapsed)
            if r.status_code == 200:
                out["latency_ok"].append(elapsed)
            elif r.status_code == 503:
                body = r.json()  # every refusal must be the service's JSON error
                code = body["error"]["code"] if isinstance(body.get("error"), dict) else body.get("error")
                out["refusals"][f"{code}, Retry-After {r.headers.get('retry-after')}"] += 1


async def drive(url: str, classify_clients: int, translate_clients: int, duration: float) -> dict:
    classify, translate = classify_bodies(), translate_bodies()
    out: dict = {
        "outcomes": Counter(),
        "refusals": Counter(),
        "latency": [],
        "latency_ok": [],
        "drops": [],
        "by_route": {},
    }
    clients = [new_client(url) for _ in range(classify_clients + translate_clients)]
    until = time.monotonic() + duration
    loops = [client_loop(c, "/classify", classify, until, i, out) for i, c in enumerate(clients[:classify_clients])]
    loops += [client_loop(c, "/translate", translate, until, i, out) for i, c in enumerate(clients[classify_clients:])]
    started = out["started"] = time.monotonic()
    out["started_wall"] = time.time()
    lag = asyncio.ensure_future(loop_lag(out))
    await asyncio.gather(*loops)
    lag.cancel()
    return summary(out, time.monotonic() - started)


async def loop_lag(out: dict) -> None:
    """The load generator's own event-loop lag: latency it adds to what it measures."""
    out["lag"] = lags = []
    while True:
        t = time.monotonic()
        await asyncio.sleep(0.05)
        lags.append(time.monotonic() - t - 0.05)


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summary(out: dict, seconds: float) -> dict:
    answered = len(out["latency"])
    dropped = sum(n for k, n in out["outcomes"].items() if k.rsplit(" ", 1)[1] in DROPPED)
    status_503 = sum(n for k, n in out["outcomes"].items() if k.endswith(" 503"))
    return {
        "seconds": round(seconds, 2),
        "started_wall": out["started_wall"],
        "outcomes": dict(sorted(out["outcomes"].items())),
        "refusals": dict(out["refusals"]),
        "answered": answered,
        "ok_per_s": len(out["latency_ok"]) / seconds,
        "dropped": dropped,
        "share_503": status_503 / answered if answered else 0.0,
        **{f"{name}_s": percentile(out["latency"], q) for name, q in (("p50", 0.5), ("p99", 0.99))},
        "max_s": max(out["latency"], default=float("nan")),
        "ok_p50_s": percentile(out["latency_ok"], 0.5),
        "ok_p99_s": percentile(out["latency_ok"], 0.99),
        "by_route": {
            k: f"{len(v)}: p50 {percentile(v, 0.5):.2f} s, p99 {percentile(v, 0.99):.2f} s, max {max(v):.2f} s"
            for k, v in sorted(out["by_route"].items())
        },
        "client_lag_p99_s": percentile(out.get("lag", []), 0.99),
        "client_lag_max_s": max(out.get("lag", []), default=0.0),
        "drops": out["drops"][:20],
    }


# ---- the services and the rounds --------------------------------------------------------------
@contextlib.contextmanager
def services(base: str | None, repository: Path, workdir: Path, head_settings: dict[str, str]):
    from benchmarks.bench_classify import Service, pick_model
    from benchmarks.bench_versions import worktree

    repository = repository.resolve()
    model, _, _ = pick_model(repository, None)
    with contextlib.ExitStack() as stack:
        trees = {"head": ROOT}
        if base:
            trees = {"base": stack.enter_context(worktree(base)), **trees}
        settings = {"base": SETTINGS, "head": {**SETTINGS, **head_settings}}
        running = {v: Service(v, repository, model, workdir, root=tree, **settings[v]) for v, tree in trees.items()}
        try:
            for s in running.values():
                s.wait_ready()
            yield running
        finally:
            for s in running.values():
                s.stop()


def server_side(log: Path, offset: int) -> dict:
    """The service's own latency of its answers since ``offset`` in its log (access log lines): from the
    request's headers to its answer, without the time in front of the app (accept, read, the client)."""
    durations = []
    with open(log, "rb") as f:
        f.seek(offset)
        for raw in f:
            try:
                entry = json.loads(raw)
            except json.JSONDecodeError:
                continue
            if entry.get("logger") == "attnserve.access" and entry.get("path") in ("/classify", "/translate"):
                durations.append(entry["duration_ms"] / 1000)
    return {"server_p50_s": percentile(durations, 0.5), "server_p99_s": percentile(durations, 0.99)}


def run_load(url: str, args: argparse.Namespace) -> dict:
    cmd = [sys.executable, "-m", "benchmarks.bench_overload", "--load", url, "--duration", str(args.duration)]
    cmd += ["--classify-clients", str(args.classify_clients), "--translate-clients", str(args.translate_clients)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=args.duration + 300, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"load generator failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.splitlines()[-1])


def line(version: str, r: dict) -> str:
    return (
        f"{version}: {r['answered']} answered ({r['ok_per_s']:.0f} 200s/s), {r['dropped']} closed without an answer, "
        f"503 {r['share_503']:.1%}; "
        f"p50 {r['p50_s']:.2f} s, p99 {r['p99_s']:.2f} s, max {r['max_s']:.2f} s (200s: p50 {r['ok_p50_s']:.2f} s, "
        f"p99 {r['ok_p99_s']:.2f} s); in the service: p50 {r['server_p50_s']:.2f} s, p99 {r['server_p99_s']:.2f} s"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.bench_overload", description=__doc__.splitlines()[0])
    p.add_argument("--base", help="a git revision to compare this checkout with, interleaved")
    p.add_argument("--repository", type=Path, default=ROOT / "models", help="with a classifier and a translator")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument(
        "--head-setting",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a setting of this checkout's service only",
    )
    p.add_argument("--duration", type=float, default=15.0, help="seconds of load per run")
    p.add_argument("--classify-clients", type=int, default=256)
    p.add_argument("--translate-clients", type=int, default=192)
    p.add_argument("--settle", type=float, default=5.0, help="idle seconds between runs")
    p.add_argument("--load", metavar="URL", help=argparse.SUPPRESS)  # the load generator's own process
    args = p.parse_args(argv)
    if args.load:
        print(json.dumps(asyncio.run(drive(args.load, args.classify_clients, args.translate_clients, args.duration))))
        return 0
    workdir = Path(tempfile.mkdtemp(prefix="bench-overload-"))
    results: dict[str, list[dict]] = {}
    head_settings = dict(item.split("=", 1) for item in args.head_setting)
    with services(args.base, args.repository, workdir, head_settings) as running:
        versions = list(running)
        for r in range(args.rounds):
            for version in versions if r % 2 == 0 else versions[::-1]:
                time.sleep(args.settle)
                offset = running[version].log_path.stat().st_size
                result = run_load(running[version].url, args)
                time.sleep(0.1)  # the access log is written in batches, at most 20 ms after each request
                result.update(server_side(running[version].log_path, offset))
                results.setdefault(version, []).append(result)
                print(f"round {r + 1} {line(version, result)}", flush=True)
                print(f"  {result['by_route']} {result['refusals']}", flush=True)
                print(
                    f"  load generator's loop lag: p99 {result['client_lag_p99_s']:.3f} s, max {result['client_lag_max_s']:.3f} s"
                )
                for drop in result["drops"]:
                    print(f"  dropped: {drop}", flush=True)
    print(f"\nmedians of {args.rounds} rounds ({args.duration:g} s each; logs in {workdir}):")
    for version, rounds in results.items():
        keys = ("p50_s", "p99_s", "max_s", "share_503", "ok_per_s", "server_p50_s", "server_p99_s")
        med = {k: statistics.median(r[k] for r in rounds) for k in keys}
        dropped = sum(r["dropped"] for r in rounds)
        answered = sum(r["answered"] for r in rounds)
        print(
            f"{version}: p50 {med['p50_s']:.2f} s, p99 {med['p99_s']:.2f} s, max {med['max_s']:.2f} s, "
            f"503 {med['share_503']:.1%}, {med['ok_per_s']:.0f} 200s/s (in the service: p50 {med['server_p50_s']:.2f} s, p99 {med['server_p99_s']:.2f} s); "
            f"closed without an answer: {dropped} of {answered + dropped} requests"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
