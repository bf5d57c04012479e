"""A fault drill against ``python -m service``: closed-loop clients, a readiness watcher, the server's log.

Each request's answer is kept with its ``X-Request-ID``. A request is *hit* when the server's log names its id
in the line that reports the fault (every engine failure names the requests it fails); any other request
must be answered 200 with the answer a fault-free run gives (``others_wrong`` and ``others_failed`` count
those that were not). Rows go to ``$FAULT_REPORT`` (JSON lines) for ``tests/faults/table.py``.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from dataclasses import dataclass, field

import httpx
from typing_extensions import Self

from tests.service.service_testing import metric_value


@dataclass
class Answer:
    path: str
    body: dict
    status: int | None  # None: no answer (the connection failed or the client timed out)
    payload: dict | None
    request_id: str | None
    sent: float
    ended: float
    cache: str | None = None  # X-Cache, with the response cache on

    @property
    def code(self) -> str | None:
        error = (self.payload or {}).get("error")
        return error.get("code") if isinstance(error, dict) else None


async def _client(url: str, jobs: list[tuple[str, dict]], start: int, count: int, out: list, headers: dict) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=60.0) as client:
        for i in range(count):
            path, body = jobs[(start + i) % len(jobs)]
            sent = time.monotonic()
            try:
                r = await client.post(path, json=body, headers=headers)
                payload = r.json()
                rid, cache = r.headers.get("x-request-id"), r.headers.get("x-cache")
                out.append(Answer(path, body, r.status_code, payload, rid, sent, time.monotonic(), cache))
            except (httpx.HTTPError, ValueError):
                out.append(Answer(path, body, None, None, None, sent, time.monotonic()))


def load(url: str, jobs: list[tuple[str, dict]], clients: int, per_client: int, headers: dict | None = None) -> list:
    """``clients`` closed-loop clients, ``per_client`` requests each, cycling through ``jobs`` from staggered
    starting points; every answer, in the order they came."""
    out: list[Answer] = []

    async def main() -> None:
        step = max(1, len(jobs) // clients)
        await asyncio.gather(*(_client(url, jobs, i * step, per_client, out, headers or {}) for i in range(clients)))

    asyncio.run(main())
    return out


class ReadyWatch:
    """Polls ``/readyz`` every 50 ms in a thread: the moments it said 503, and the longest run of them."""

    def __init__(self, url: str) -> None:
        self.url, self.samples, self.reasons = url, [], set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        with httpx.Client(timeout=2.0) as client:
            while not self._stop.is_set():
                try:
                    r = client.get(self.url + "/readyz")
                    ready = r.status_code == 200
                    if not ready:
                        self.reasons.add(r.json()["error"]["message"])
                except (httpx.HTTPError, ValueError, KeyError):
                    ready = False
                self.samples.append((time.monotonic(), ready))
                self._stop.wait(0.05)

    def not_ready_s(self) -> float:
        """The longest time /readyz said 503 (0 when it never did)."""
        longest, since = 0.0, None
        for at, ready in self.samples:
            if not ready and since is None:
                since = at
            elif ready and since is not None:
                longest, since = max(longest, at - since), None
        if since is not None:
            longest = max(longest, self.samples[-1][0] - since)
        return round(longest, 2)


def named_in_log(log_lines: list[dict], *phrases: str) -> set[str]:
    """Request ids named by the log lines containing one of ``phrases`` (the lines that report a fault)."""
    ids = set()
    for line in log_lines:
        message = line.get("message", "")
        if any(p in message for p in phrases) and "(" in message:
            ids |= {part.strip() for part in message.rsplit("(", 1)[1].split(")")[0].split(",")}
    return ids


@dataclass
class Outcome:
    fault: str
    answers: list[Answer]
    hit: list[Answer] = field(default_factory=list)
    others: list[Answer] = field(default_factory=list)
    others_failed: list[Answer] = field(default_factory=list)
    others_wrong: list[Answer] = field(default_factory=list)
    not_ready_s: float = 0.0
    metrics: dict = field(default_factory=dict)

    def row(self) -> dict:
        return {
            "fault": self.fault,
            "requests": len(self.answers),
            "hit": len(self.hit),
            "hit_codes": sorted({f"{a.status} {a.code}" for a in self.hit}),
            "answered": sum(a.status == 200 for a in self.answers),
            "others_errors": len(self.others_failed) + len(self.others_wrong),
            "not_ready_s": self.not_ready_s,
            **self.metrics,
        }


def judge(fault: str, answers: list[Answer], hit_ids: set[str], reference) -> Outcome:
    """Sorts the answers into hit (named by the fault's log line, or answered ``hit_status``) and the others,
    which must be 200 and equal ``reference(answer)``."""
    out = Outcome(fault, answers)
    for a in answers:
        if a.request_id in hit_ids:
            out.hit.append(a)
            continue
        out.others.append(a)
        if a.status != 200:
            out.others_failed.append(a)
        elif not reference(a):
            out.others_wrong.append(a)
    return out


def record(outcome: Outcome) -> None:
    """Appends the drill's row to ``$FAULT_REPORT`` when set (the docs' table is made from it)."""
    path = os.environ.get("FAULT_REPORT")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(outcome.row()) + "\n")


def metrics(url: str, *names: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics", timeout=10).text
    return {name: metric_value(text, name) for name in names}
