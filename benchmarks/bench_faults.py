"""A translation lane whose loop raises under load: ``python -m benchmarks.bench_faults [--base REV]``.

``--clients`` (32) closed-loop clients POST ``/translate`` (one real sentence of
``benchmarks/translate_sentences.txt`` each, beam 1 and the model's default beam alternately) to the shipped
translator for ``--duration`` seconds, each on its own keep-alive connection; ``--fault-at`` seconds in, one
lane's loop raises once, on the event loop, right after it admitted waiting requests into its batch. The fault
comes from a ``sitecustomize`` this benchmark puts on the service's path: it wraps ``Scheduler._admit`` and
raises the first time it admits something after a trigger file appeared, so this checkout and a ``--base``
revision are faulted alike (``ATTNSERVE_FAULTS=lane:raise@N`` does the same in the service itself, by count).

Printed per tree: answers by status, the requests that never ended (client timeout ``--timeout``), the 500s
and whether each names its request id, the requests answered after the fault, and p99 per second (of the
requests sent in that second; a request without an answer counts as the timeout) with the seconds from the
fault until p99 stays within 1.5x its value before the fault, counted from the first second whose requests it
reached (``recovered_s``; None: not within the run), and the answers per second before and after it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
SENTENCES = ROOT / "benchmarks" / "translate_sentences.txt"

SHIM = """
import os, pathlib
from service.engine import scheduler as _scheduler

_TRIGGER = pathlib.Path(os.environ["BENCH_FAULTS_TRIGGER"])
_admit = _scheduler.Scheduler._admit


def _admit_then_fail(self, lane):
    joining = _admit(self, lane)
    if joining and _TRIGGER.exists():
        try:
            _TRIGGER.unlink()
        except FileNotFoundError:
            return joining
        raise RuntimeError("fault injected by benchmarks/bench_faults.py")
    return joining


_scheduler.Scheduler._admit = _admit_then_fail
"""


async def client_loop(url: str, texts: list[str], until: float, seed: int, timeout: float, out: list) -> None:
    rng = random.Random(seed)
    async with httpx.AsyncClient(base_url=url, timeout=timeout, verify=False) as client:
        while time.monotonic() < until:
            body = {"text": rng.choice(texts), **({"beam_size": 1} if seed % 2 else {})}
            sent = time.monotonic()
            try:
                r = await client.post("/translate", json=body)
            except httpx.HTTPError as e:
                out.append((sent, time.monotonic(), type(e).__name__, None, None))
                continue
            named = None
            if r.status_code == 500:
                rid = r.headers.get("x-request-id", "")
                named = bool(rid) and rid in r.json().get("error", {}).get("message", "")
            out.append((sent, time.monotonic(), r.status_code, named, r.headers.get("x-request-id")))


async def drive(url: str, clients: int, duration: float, fault_at: float, trigger: Path, timeout: float) -> dict:
    texts = [t for t in SENTENCES.read_text("utf-8").splitlines() if t.strip()]
    out: list = []
    start = time.monotonic()
    until = start + duration

    async def fault() -> None:
        await asyncio.sleep(fault_at)
        trigger.touch()

    faulting = asyncio.ensure_future(fault())
    await asyncio.gather(*(client_loop(url, texts, until, i, timeout, out) for i in range(clients)))
    await faulting
    return summarize(out, start, fault_at, timeout, duration)


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] if ordered else float("nan")


def summarize(out: list, start: float, fault_at: float, timeout: float, duration: float) -> dict:
    statuses = Counter(str(status) for _, _, status, _, _ in out)
    seconds: dict[int, list[float]] = {}
    for sent, ended, status, _, _ in out:
        latency = timeout if not isinstance(status, int) else ended - sent
        seconds.setdefault(int(sent - start), []).append(latency)
    per_second = {s: round(p99(v), 3) for s, v in sorted(seconds.items())}
    before = p99([lat for s, v in seconds.items() if 2 <= s < fault_at - 3 for lat in v])  # all ended by the fault
    recovered = None
    failed = [int(sent - start) for sent, _, status, _, _ in out if status != 200]
    hit = min(failed, default=int(fault_at))  # the first second whose requests the fault reached
    late = [s for s in per_second if s >= hit and s < int(duration) - 1]
    for s in late:
        if all(per_second[t] <= 1.5 * before for t in late if t >= s):
            recovered = max(0.0, s - fault_at)
            break
    after = [row for row in out if row[0] - start >= fault_at]
    return {
        "answers": dict(sorted(statuses.items())),
        "failed_500_named": sum(1 for *_, named, _ in out if named),
        "failed_500": statuses.get("500", 0),
        "never_answered": sum(1 for _, _, status, _, _ in out if not isinstance(status, int)),
        "sent_after_fault": len(after),
        "ok_after_fault": sum(1 for row in after if row[2] == 200),
        "ok_per_s_before": round(sum(1 for row in out if row[2] == 200 and row[1] - start < fault_at) / fault_at, 1),
        "ok_per_s_after": round(sum(1 for row in after if row[2] == 200) / (duration - fault_at), 1),
        "p99_before_s": round(before, 3),
        "p99_per_second": per_second,
        "recovered_s": recovered,
    }


def run_tree(name: str, tree: Path, repository: Path, workdir: Path, args) -> dict:
    from benchmarks.bench_classify import Service

    shim = workdir / f"shim-{name}"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text(SHIM)
    trigger = workdir / f"trigger-{name}"
    os.environ["BENCH_FAULTS_TRIGGER"] = str(trigger)  # read by the shim in the service's process
    service = Service(name, repository, "translator", workdir, root=tree, path=(shim,))
    try:
        service.wait_ready()
        result = asyncio.run(drive(service.url, args.clients, args.duration, args.fault_at, trigger, args.timeout))
    finally:
        service.stop()
    log = service.log_path.read_text("utf-8", "replace")
    result["log_lines_naming_the_fault"] = sum("fault injected by benchmarks" in line for line in log.splitlines())
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", help="a git revision served and faulted beside this checkout")
    parser.add_argument("--repository", type=Path, default=ROOT / "models")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--duration", type=float, default=30.0)
    parser.add_argument("--fault-at", type=float, default=10.0)
    parser.add_argument("--timeout", type=float, default=30.0, help="client timeout (s)")
    args = parser.parse_args()
    from benchmarks.bench_versions import worktree

    results = {}
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        trees = {"head": ROOT}
        if args.base:
            trees = {"base": stack.enter_context(worktree(args.base)), **trees}
        for name, tree in trees.items():
            results[name] = run_tree(name, tree, args.repository.resolve(), Path(tmp), args)
            print(name, json.dumps(results[name]), flush=True)


if __name__ == "__main__":
    main()
