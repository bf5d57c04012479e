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
from tests.service.service_testing import metric_value, serving, wait_until

SAMPLE = ROOT / "models" / "vit" / "1" / "sample-9-ankle-boot.png"
HALF_OPEN = 2500
BOUND = 1000
HEADER_TIMEOUT_S = 8.0
SLOW_BODIES = 2000
NON_READERS = 2000
STALLING = 20  # of the non-readers, those that pipeline enough to fill the buffers between them and the service
PROBES = 24


@pytest.fixture(scope="module")
def vit_repository(tmp_path_factory):
    repo = tmp_path_factory.mktemp("slow") / "models"
    shutil.copytree(ROOT / "models" / "vit", repo / "vit")
    return repo


@pytest.fixture(scope="module")
def open_files():
    """Enough open files for this process's half-open connections and the server's (which inherits the limit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = max(HALF_OPEN, SLOW_BODIES + NON_READERS) + 1000
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


async def slow_body(host: str, port: int) -> asyncio.StreamWriter:
    """Headers of a 1 MB JSON body at once, then the body a byte at a time (``trickle_body``)."""
    _, writer = await asyncio.open_connection(host, port)
    writer.write(
        b"POST /classify HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000000\r\n\r\n{"
    )
    await writer.drain()
    return writer


async def non_reader(host: str, port: int, requests: bytes) -> asyncio.StreamWriter:
    """Pipelined requests on a socket that reads nothing (a 4 KB receive buffer: the answers back up fast)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, (host, port))
    _, writer = await asyncio.open_connection(sock=sock)
    writer.write(requests)
    return writer


async def trickle_body(writers: list[asyncio.StreamWriter], stop: asyncio.Event) -> None:
    while not stop.is_set():
        for w in writers:
            if not w.is_closing():
                with contextlib.suppress(OSError):
                    w.write(b" ")
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), 1.0)


def test_trickled_bodies_and_unread_answers_lock_no_one_out(vit_repository, tmp_path, open_files):
    """2,000 connections trickle a body and 2,000 pipeline requests and read nothing (20 of them enough to stall
    the service's writes), with a body timeout long enough to hold them all: a client arriving meanwhile is
    served every time, because at the bound trickled bodies and unread answers are evicted; the writes that
    stall are dropped at the write timeout."""
    settings = {"max_connections": str(BOUND), "body_timeout_s": "60", "write_timeout_s": "5"}
    with serving(tmp_path, vit_repository, **settings) as srv:
        host, port = srv.url.removeprefix("http://").rsplit(":", 1)
        image = SAMPLE.read_bytes()
        light = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n" * 20
        heavy = b"GET /openapi.json HTTP/1.1\r\nHost: x\r\n\r\n" * 200  # 10 MB of answers

        async def attack() -> dict:
            bodies, readers = [], []
            for i in range(0, NON_READERS, 250):
                readers += await asyncio.gather(
                    *(non_reader(host, int(port), heavy if i + j < STALLING else light) for j in range(250))
                )
            await asyncio.sleep(1)  # answered, unread; the light ones wait for their next request
            for i in range(0, SLOW_BODIES, 250):  # at the bound these take the place of those waiting
                bodies += await asyncio.gather(*(slow_body(host, int(port)) for _ in range(250)))
            await asyncio.sleep(1)  # every connection now held has a body arriving, or an answer unread
            stop = asyncio.Event()
            trickling = asyncio.create_task(trickle_body(bodies, stop))
            answers = []
            async with httpx.AsyncClient(
                base_url=srv.url, timeout=10, limits=httpx.Limits(max_keepalive_connections=0)
            ) as client:
                for _ in range(PROBES):  # each on a new connection
                    try:
                        r = await client.post("/classify", files={"file": ("shoe.png", image, "image/png")})
                        answers.append(r.status_code)
                    except httpx.HTTPError as e:
                        answers.append(type(e).__name__)
                    await asyncio.sleep(0.25)
            await asyncio.sleep(6)  # past the write timeout
            text = await asyncio.to_thread(metrics, srv.url)
            stop.set()
            await trickling
            for w in bodies + readers:
                w.close()
            return {"answers": answers, "metrics": text}

        out = asyncio.run(attack())
        text = out["metrics"]
        reasons = ("evicted", "evicted_unread", "evicted_body", "write_timeout", "refused")
        counted = {r: closed(text, r) for r in reasons}
        print(f"\nslow bodies and unread answers: probes {out['answers']}, closed {counted}")
        assert out["answers"] == [200] * PROBES
        assert counted["refused"] == 0
        assert counted["evicted_body"] > 0 and counted["evicted"] > 0  # attackers went, oldest first
        assert counted["write_timeout"] + counted["evicted_unread"] >= 1  # a stalled write went one way or the other


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

        # at the bound, connections whose bodies are still arriving: a new one closes the one arriving longest
        receiving = [
            raw(
                port,
                b"POST /classify HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n",
            )
            for _ in range(3)
        ]
        time.sleep(0.3)
        probe = raw(port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_response(probe).startswith(b"HTTP/1.1 200")
        assert read_all(receiving[0]) == b""  # dropped, without an answer nobody would wait for
        probe.close()
        for s in receiving:
            s.close()
        time.sleep(0.3)
        text = metrics(srv.url)
        assert closed(text, "evicted_body") == 1 and closed(text, "header_timeout") == 2
        assert closed(text, "refused") == 0 and closed(text, "evicted") == 0


class Transport:
    def __init__(self) -> None:
        self.aborted = False

    def abort(self) -> None:
        self.aborted = True


class Conn:
    """What ``Connections`` uses of a protocol: its transport."""

    def __init__(self) -> None:
        self.transport = Transport()


def test_the_bound_evicts_the_waiting_then_the_unread_then_the_receiving_and_refuses_only_the_busy():
    from service.http.connections import Connections

    closes: list[str] = []

    class Observer:
        def open(self, count: int) -> None:
            pass

        def closed(self, reason: str) -> None:
            closes.append(reason)

    conns = Connections()
    conns.configure(10.0, 4, Observer())
    idle, unread, slow_body, busy = Conn(), Conn(), Conn(), Conn()
    for c in (idle, unread, slow_body, busy):
        assert conns.admit(c)
    conns.receiving_body(slow_body)  # headers in, body arriving
    conns.receiving_body(unread)
    conns.busy(unread)  # its request read whole, its answer written ...
    conns.stalled(unread, True)  # ... and not read
    conns.receiving_body(busy)
    conns.busy(busy)
    newcomers = [Conn() for _ in range(3)]
    for c in newcomers:
        assert conns.admit(c)
        conns.receiving_body(c)
        conns.busy(c)  # each newcomer's request then runs: it is not to be evicted
    assert closes == ["evicted", "evicted_unread", "evicted_body"]
    assert idle.transport.aborted and unread.transport.aborted and slow_body.transport.aborted
    assert not conns.admit(Conn()) and closes[-1] == "refused" and not busy.transport.aborted


def test_a_client_that_reads_nothing_is_dropped_at_the_write_timeout(vit_repository, tmp_path):
    """10 MB of answers pipelined on a connection that reads none: once its buffers are full the service waits
    ``write_timeout_s`` for it, then drops it; the handler that waited to send is released."""
    with serving(tmp_path, vit_repository, write_timeout_s="1") as srv:
        port = int(srv.url.rsplit(":", 1)[1])
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", port))
        sock.sendall(b"GET /openapi.json HTTP/1.1\r\nHost: x\r\n\r\n" * 200)
        wait_until(lambda: closed(metrics(srv.url), "write_timeout") == 1, timeout=30, what="the write timeout")
        assert metric_value(metrics(srv.url), "attnserve_http_connections") == 1  # the one asking for the metrics
        sock.close()
