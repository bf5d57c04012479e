"""An interactive client beside a bulk one: ``python -m benchmarks.bench_priorities``.

The shipped models (``python -m service`` as ``make serve`` runs it, gRPC on). Client B sends one piece of work
at a time (closed loop): a sentence of ``benchmarks/translate_sentences.txt`` (greedy) with ``--task translate``,
one real Fashion-MNIST test image with ``--task classify``. Client A, when it runs, keeps ``--bulk-connections``
(64) requests of ``--bulk-items`` (8) sentences or images each in flight, as ``attnserve-client po translate``
does with a catalog (a 503 backs off a tenth of its ``Retry-After``, a 429 waits all of it, as the SDK does).
A runs in a process of its own, so that B's clock never waits for A's client. Each has an API key. Over
``--transport http`` (``/translate``, ``/classify``) or ``grpc`` (the Open Inference Protocol's ``ModelInfer``,
``grpc.aio``). With ``--replicas 2`` two services share one ``redis-server`` for their quotas
(``ATTNSERVE_QUOTA_STORE=redis``); B's requests alternate between them and A's connections are split between
them, as a balancer would.

Modes (``--modes``), in an order rotating from round to round, ``--seconds`` each: B ``alone``; B beside A
sending ``priority: batch`` (``bulk as batch``); beside A sending no priority (``bulk as interactive``, every
request before priorities); beside A on a key whose terms hold it to ``--quota`` as batch work (``bulk on its
quota``; default ``characters=5000/s`` or ``images=400/s``). Printed: B's p50 and p99 per mode (medians over
``--rounds``) and as a ratio to B alone, A's items per second, and the 429s and other errors A got.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import multiprocessing
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

import grpc
import httpx

from benchmarks.bench_classify import ROOT, Service, _free_port, load_test_images, pick_model
from service.grpc.generated import grpc_service_pb2 as pb
from service.grpc.generated.grpc_service_pb2_grpc import GRPCInferenceServiceStub
from service.memory import available_cores

SENTENCES = [t for t in (ROOT / "benchmarks" / "translate_sentences.txt").read_text("utf-8").splitlines() if t.strip()]
MODES = ("alone", "beside idle load", "bulk as batch", "bulk as interactive", "bulk on its quota")
KEYS = {"B": "bench-key-interactive", "A": "bench-key-bulk", "A quota": "bench-key-bulk-quota"}
QUOTAS = {"translate": "characters=5000/s", "classify": "images=400/s"}


class Caller:
    """One connection's requests of ``task`` over ``transport`` to ``target`` (a URL or host:port) as ``who``;
    ``send`` answers (status, Retry-After) in HTTP's terms whatever the transport."""

    def __init__(self, task: str, transport: str, target: str, who: str) -> None:
        self.task, self.transport, self.token = task, transport, f"Bearer {KEYS[who]}"
        if transport == "http":
            self.http = httpx.AsyncClient(base_url=target, timeout=300, headers={"Authorization": self.token})
        else:
            self.channel = grpc.aio.insecure_channel(target)
            self.stub = GRPCInferenceServiceStub(self.channel)

    async def send(self, items: list, priority: str | None) -> tuple[int, float]:
        if self.transport == "http":
            if self.task == "translate":
                body = {"texts": items, "beam_size": 1}
            else:
                body = {"images": [base64.b64encode(i).decode() for i in items], "top_k": 1}
            r = await self.http.post(f"/{self.task}", json={**body, **({"priority": priority} if priority else {})})
            return r.status_code, float(r.headers.get("retry-after", "1"))
        request = pb.ModelInferRequest(
            model_name="translator" if self.task == "translate" else "vit",
            inputs=[
                pb.ModelInferRequest.InferInputTensor(
                    name="text" if self.task == "translate" else "images",
                    datatype="BYTES",
                    shape=[len(items)],
                    contents=pb.InferTensorContents(
                        bytes_contents=[i.encode() if isinstance(i, str) else i for i in items]
                    ),
                )
            ],
        )
        if self.task == "translate":
            request.parameters["beam_size"].int64_param = 1
        if priority:
            request.parameters["priority"].string_param = priority
        try:
            await self.stub.ModelInfer(request, metadata=(("authorization", self.token),), timeout=300)
            return 200, 0.0
        except grpc.aio.AioRpcError as e:
            trailing = dict(e.trailing_metadata() or ())
            status = {grpc.StatusCode.RESOURCE_EXHAUSTED: 429, grpc.StatusCode.UNAVAILABLE: 503}.get(e.code(), 500)
            return status, float(trailing.get("retry-after", "1"))

    async def close(self) -> None:
        await (self.http.aclose() if self.transport == "http" else self.channel.close())


async def interactive(task: str, transport: str, targets: list[str], items: list, until: float, seed: int) -> list:
    rng, latencies = random.Random(seed), []
    callers = [Caller(task, transport, t, "B") for t in targets]
    try:
        for i in range(1 << 62):
            if time.monotonic() >= until:
                break
            started = time.monotonic()
            status, _ = await callers[i % len(callers)].send([rng.choice(items)], None)
            if status != 200:
                raise SystemExit(f"B got {status}")
            latencies.append(time.monotonic() - started)
    finally:
        for c in callers:
            await c.close()
    return latencies


async def bulk(task, transport, targets, items, until, connections, per_request, priority, who) -> dict:
    counts = {"items": 0, "429": 0, "errors": 0}

    async def one(i: int) -> None:
        rng, caller = random.Random(i), Caller(task, transport, targets[i % len(targets)], who)
        try:
            while time.monotonic() < until:
                status, retry_after = await caller.send(rng.sample(items, per_request), priority)
                if status == 429:  # over its quota: wait out the window, as the SDK does
                    counts["429"] += 1
                    await asyncio.sleep(min(retry_after, max(0, until - time.monotonic())))
                elif status == 503:  # the queue is full: back off as the SDK does
                    await asyncio.sleep(retry_after / 10)
                elif status == 200:
                    counts["items"] += per_request
                else:
                    counts["errors"] += 1
        finally:
            await caller.close()

    await asyncio.gather(*(one(i) for i in range(connections)))
    return counts


def bulk_process(queue, task, transport, targets, items, seconds, *rest) -> None:
    queue.put("started")  # B's clock starts once A's process has started too
    queue.put(asyncio.run(bulk(task, transport, targets, items, time.monotonic() + seconds, *rest)))


def spin() -> None:
    """A core's worth of work that yields to everything else: a busy loop at the lowest priority."""
    os.nice(19)
    while True:
        pass


def measure(targets: list[str], items: list, mode: str, args: argparse.Namespace, seed: int) -> dict:
    a, queue = None, multiprocessing.get_context("spawn").SimpleQueue()
    spinners = []
    if mode == "beside idle load":
        spinners = [
            multiprocessing.get_context("spawn").Process(target=spin, daemon=True) for _ in range(available_cores())
        ]
        for p in spinners:
            p.start()
        time.sleep(0.5)  # the interpreters started, the loops running
    if mode.startswith("bulk"):
        priority = "batch" if mode == "bulk as batch" else None
        who = "A quota" if mode == "bulk on its quota" else "A"
        bulk_args = (args.task, args.transport, targets, items, args.seconds, args.bulk_connections, args.bulk_items)
        a = multiprocessing.get_context("spawn").Process(target=bulk_process, args=(queue, *bulk_args, priority, who))
        a.start()
        assert queue.get() == "started"
    until = time.monotonic() + args.seconds
    try:
        latencies = sorted(asyncio.run(interactive(args.task, args.transport, targets, items, until, seed)))
    finally:
        for p in spinners:
            p.kill()
            p.join()
    counts = {"items": 0, "429": 0, "errors": 0}
    if a is not None:
        counts = queue.get()
        a.join()
    return {
        "p50_ms": 1000 * latencies[len(latencies) // 2],
        "p99_ms": 1000 * latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))],
        "bulk_per_s": counts["items"] / args.seconds,
        "429": counts["429"],
        "errors": counts["errors"],
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.bench_priorities", description=__doc__.splitlines()[0])
    p.add_argument("--repository", type=Path, default=ROOT / "models")
    p.add_argument("--task", choices=("translate", "classify"), default="translate")
    p.add_argument("--transport", choices=("http", "grpc"), default="http")
    p.add_argument("--replicas", type=int, choices=(1, 2), default=1)
    p.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES), metavar="MODE")
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--bulk-connections", type=int, default=64)
    p.add_argument("--bulk-items", type=int, default=8)
    p.add_argument("--quota", help="A's quota in the last mode (service/core/quotas.py); default by task")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    folder = Path(tempfile.mkdtemp(prefix="bench-priorities-"))
    key_file = folder / "keys"
    quota = args.quota or QUOTAS[args.task]
    terms = {"B": "quota=off", "A": "quota=off", "A quota": f"quota={quota} priority=batch"}
    key_file.write_text("".join(f"{hashlib.sha256(KEYS[w].encode()).hexdigest()} {terms[w]}\n" for w in KEYS))
    if args.task == "translate":
        items: list = SENTENCES
    else:
        items = load_test_images(pick_model(args.repository, "vit")[2])[0]
    redis = None
    if args.replicas > 1:
        from benchmarks.soak import RedisServer

        redis = RedisServer(folder)
    services, targets = [], []
    try:
        for n in range(args.replicas):
            grpc_port = _free_port()
            shared = {"quota_store": "redis", "redis_url": redis.url} if redis else {}
            settings = {"api_key_hashes_file": key_file, "grpc_port": grpc_port, **shared}
            services.append(Service(f"priorities-{n}", args.repository, "vit", folder, **settings))
            targets.append(services[-1].url if args.transport == "http" else f"127.0.0.1:{grpc_port}")
        for s in services:
            s.wait_ready()
        report(args, quota, run(args, targets, items))
    finally:
        for s in services:
            s.stop()
        if redis is not None:
            redis.stop()


def run(args: argparse.Namespace, targets: list[str], items: list) -> dict[str, list[dict]]:
    print(
        f"{args.task} over {args.transport}, {args.replicas} replica(s). B: 1 client; A: {args.bulk_connections} "
        f"connections x {args.bulk_items} items; {args.rounds} rounds of {args.seconds:g} s",
        flush=True,
    )
    figures: dict[str, list[dict]] = {m: [] for m in args.modes}
    for r in range(args.rounds):
        for mode in args.modes[r % len(args.modes) :] + args.modes[: r % len(args.modes)]:
            f = measure(targets, items, mode, args, r)
            figures[mode].append(f)
            print(
                f"  round {r + 1}: {mode:20s} B p50 {f['p50_ms']:8.1f} ms  p99 {f['p99_ms']:8.1f} ms  "
                f"A {f['bulk_per_s']:6.1f} items/s, {f['429']} x 429, {f['errors']} other errors",
                flush=True,
            )
    return figures


def report(args: argparse.Namespace, quota: str, figures: dict[str, list[dict]]) -> None:
    base = figures.get("alone")
    alone = {k: statistics.median(f[k] for f in base) for k in ("p50_ms", "p99_ms")} if base else None
    print(f"\nA's quota: {quota}")
    print(f"{'mode':20s} {'B p50':>9s} {'B p99':>9s} {'p50/alone':>10s} {'p99/alone':>10s} {'A items/s':>9s} A 429s")
    for mode, rounds in figures.items():
        p50 = statistics.median(f["p50_ms"] for f in rounds)
        p99 = statistics.median(f["p99_ms"] for f in rounds)
        rate = statistics.median(f["bulk_per_s"] for f in rounds)
        ratios = f"{p50 / alone['p50_ms']:9.2f}x {p99 / alone['p99_ms']:9.2f}x" if alone else f"{'':>10s} {'':>10s}"
        print(
            f"{mode:20s} {p50:6.1f} ms {p99:6.1f} ms {ratios} {rate:9.1f} {sum(f['429'] for f in rounds)} "
            f"(other errors: {sum(f['errors'] for f in rounds)})"
        )


if __name__ == "__main__":
    main()
