"""Slow clients cannot lock others out (``service/http/connections.py``), against ``python -m service``.

The attack: thousands of connections, each sending a request line and a header line now and then,
never the blank line that ends the headers (slowloris). uvicorn alone would hold them all until the
process ran out of open files. Here a connection has ``ATTNSERVE_HEADER_TIMEOUT_S`` to complete its
headers, and at ``ATTNSERVE_MAX_CONNECTIONS`` a new connection closes the one that has waited longest.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import resource
import shutil
import socket
import time

import httpx
import pytest

from tests.ci import missing
from tests.conftest import ROOT
from tests.service.service_testing import metric_value, serving

SAMPLE = ROOT / "models" / "vit" / "1" / "sample-9-ankle-boot.png"
HALF_OPEN = 2500
BOUND = 1000
HEADER_TIMEOUT_S = 8.0


@pytest.fixture(scope="module")
def vit_repository(tmp_path_factory):
    repo = tmp_path_factory.mktemp("slow") / "models"
    shutil.copytree(ROOT / "models" / "vit", repo / "vit")
    return repo


@pytest.fixture(scope="module")
def open_files():
    """Enough open files for this process's half-open connections and the server's (which inherits the limit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = HALF_OPEN + 1000
    if soft < needed:
        raised = hard if hard == resource.RLIM_INFINITY else max(hard, needed)
        try:  # raising the hard limit needs root (CAP_SYS_RESOURCE), as CI runs
            resource.setrlimit(resource.RLIMIT_NOFILE, (needed, raised))
        except (ValueError, OSError):
            missing(f"RLIMIT_NOFILE hard limit {hard} < {needed}, and this user may not raise it")
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def metrics(url: str) -> str:
    return httpx.get(f"{url}/metrics", timeout=10).text


def closed(text: str, reason: str) -> float:
    return metric_value(text, "attnserve_http_connections_closed_total", reason=reason)


async def half_open(host: str, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(b"POST /classify HTTP/1.1\r\nHost: x\r\n")
    await writer.drain()
    return reader, writer


async def trickle(writers: list[asyncio.StreamWriter], stop: asyncio.Event) -> None:
    """A header line on every connection once a second: each stays busy-looking, none ever completes."""
    while not stop.is_set():
        for w in writers:
            if not w.is_closing():
                with contextlib.suppress(OSError):
                    w.write(b"X-Slow: 1\r\n")
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), 1.0)


async def until_closed(reader: asyncio.StreamReader, timeout: float) -> bytes | None:
    """What the server sent before closing (b"" if nothing), or None if still open after ``timeout``."""
    try:
        return await asyncio.wait_for(reader.read(), timeout)
    except (ConnectionResetError, BrokenPipeError):
        return b""
    except asyncio.TimeoutError:
        return None


def test_thousands_of_half_open_connections_lock_no_one_out(vit_repository, tmp_path, open_files):
    settings = {"header_timeout_s": str(HEADER_TIMEOUT_S), "max_connections": str(BOUND)}
    with serving(tmp_path, vit_repository, **settings) as srv:
        host, port = srv.url.removeprefix("http://").rsplit(":", 1)
        image = SAMPLE.read_bytes()

        async def attack() -> dict:
            opened = time.monotonic()
            conns = []
            for i in range(0, HALF_OPEN, 250):  # in waves: the listen backlog takes the rest
                conns += await asyncio.gather(*(half_open(host, int(port)) for _ in range(min(250, HALF_OPEN - i))))
            open_s = time.monotonic() - opened
            stop = asyncio.Event()
            trickling = asyncio.create_task(trickle([w for _, w in conns], stop))
            await asyncio.sleep(0.5)
            waits = {}
            async with httpx.AsyncClient(base_url=srv.url, timeout=10) as client:  # another client, meanwhile
                started = time.monotonic()
                health = await client.get("/healthz")
                waits["healthz"] = time.monotonic() - started
                started = time.monotonic()
                answer = await client.post("/classify", files={"file": ("shoe.png", image, "image/png")})
                waits["classify"] = time.monotonic() - started
            held = time.monotonic() - opened
            ends = await asyncio.gather(*(until_closed(r, HEADER_TIMEOUT_S + 10) for r, _ in conns))
            all_closed_s = time.monotonic() - opened
            stop.set()
            await trickling
            for _, w in conns:
                w.close()
            return {
                "open_s": open_s,
                "held_s": held,
                "all_closed_s": all_closed_s,
                "waits": waits,
                "health": health.status_code,
                "answer": answer,
                "still_open": sum(e is None for e in ends),
                "answered_408": sum(bool(e and e.startswith(b"HTTP/1.1 408")) for e in ends),
            }

        out = asyncio.run(attack())
        text = metrics(srv.url)
        evicted, timed_out, refused = closed(text, "evicted"), closed(text, "header_timeout"), closed(text, "refused")
        print(
            f"\nslow clients: {HALF_OPEN} half-open connections opened in {out['open_s']:.1f} s, bound {BOUND}; "
            f"another client's /healthz {out['waits']['healthz'] * 1000:.0f} ms, /classify "
            f"{out['waits']['classify'] * 1000:.0f} ms; evicted {evicted:.0f}, timed out {timed_out:.0f} "
            f"({out['answered_408']} read the 408), refused {refused:.0f}; all closed {out['all_closed_s']:.1f} s "
            "after the first opened"
        )
        assert out["held_s"] < HEADER_TIMEOUT_S, "the other client came after the timeout: nothing was tested"
        assert out["health"] == 200 and out["waits"]["healthz"] < 2
        assert out["answer"].status_code == 200 and out["waits"]["classify"] < 2
        assert out["answer"].json()["results"][0]["top_k"][0]["label"] == "Ankle boot"
        assert out["still_open"] == 0
        assert evicted + timed_out == HALF_OPEN and refused == 0
        assert evicted >= HALF_OPEN - BOUND and timed_out > 0
        assert metric_value(text, "attnserve_http_connections") <= 2  # the client's and this one


def raw(port: int, data: bytes) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(data)
    return s


def read_response(s: socket.socket) -> bytes:
    """One whole response of a keep-alive connection (its head returned, its body read by Content-Length)."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += s.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(re.search(rb"content-length: (\d+)", head, re.IGNORECASE)[1])
    while len(body) < length:
        body += s.recv(65536)
    return head


def read_all(s: socket.socket) -> bytes:
    out = b""
    with contextlib.suppress(ConnectionResetError):
        while chunk := s.recv(65536):
            out += chunk
    return out


def test_header_timeout_keep_alive_and_refusal_at_the_bound(vit_repository, tmp_path):
    settings = {"header_timeout_s": "1", "max_connections": "3"}
    with serving(tmp_path, vit_repository, **settings) as srv:
        port = int(srv.url.rsplit(":", 1)[1])
        # headers not complete within the timeout: 408 in the service's format, closed
        started = time.monotonic()
        slow = raw(port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        answer = read_all(slow)
        slow.close()
        assert answer.startswith(b"HTTP/1.1 408") and b'"request_timeout"' in answer, answer
        assert 0.8 < time.monotonic() - started < 5

        # a keep-alive connection idle past the header timeout is kept (ATTNSERVE_KEEP_ALIVE_S bounds it), but
        # once its next request has started, that request's headers have the timeout
        kept = raw(port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        first = read_response(kept)
        assert first.startswith(b"HTTP/1.1 200"), first
        time.sleep(2)  # idle, twice the header timeout
        kept.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        second = read_response(kept)
        assert second.startswith(b"HTTP/1.1 200"), second
        kept.sendall(b"GET /healthz HTTP/1.1\r\n")
        started = time.monotonic()
        rest = read_all(kept)
        kept.close()
        assert rest.startswith(b"HTTP/1.1 408") and 0.8 < time.monotonic() - started < 5, rest

        # at the bound, every connection with a request in progress (headers in, body awaited): refused, 503
        busy = [
            raw(
                port,
                b"POST /classify HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n",
            )
            for _ in range(3)
        ]
        time.sleep(0.3)
        refused = raw(port, b"")
        answer = read_all(refused)
        refused.close()
        assert answer.startswith(b"HTTP/1.1 503") and b'"overloaded"' in answer and b"retry-after: 1" in answer, answer
        for s in busy:
            s.close()
        time.sleep(0.3)
        text = metrics(srv.url)
        assert closed(text, "refused") == 1 and closed(text, "header_timeout") == 2 and closed(text, "evicted") == 0
