"""HTTP connections bounded in time and in number, so that slow clients cannot lock others out.

uvicorn closes a keep-alive connection that stays idle, but never one whose request line and headers
are still arriving: a client that opens thousands of connections and sends a header line every few
seconds (slowloris) holds them all, and once the process has used up its open files every other
client is refused. ``GuardedProtocol`` is uvicorn's httptools protocol (the one ``uvicorn[standard]``
picks for ``http="auto"``) with two additions, both kept in the process's ``Connections``:

- a header timeout: a connection must complete its request line and headers within
  ``ATTNSERVE_HEADER_TIMEOUT_S`` of its opening, or else gets 408 and is closed. On a keep-alive
  connection the timer starts with the first byte of the next request: the idle time before it is
  ``ATTNSERVE_KEEP_ALIVE_S``'s, which must stay longer than the proxies' in front (see the settings);
- a write timeout: a connection whose client stops reading (the transport's buffer full, writing paused)
  for ``ATTNSERVE_WRITE_TIMEOUT_S`` is aborted, and the handler waiting to send is released;
- a connection bound: at ``Settings.connection_bound`` open connections a new one first closes the
  connection that has waited longest for a request (its headers incomplete, or idle between requests),
  as nginx reuses its idle connections; legitimate clients send their headers at once, so under a
  slowloris it is the attacker's that go. Failing that, the one whose client has not read its answer the
  longest (writing paused), then the one whose body has been arriving the longest: a trickled body or an
  unread answer holds a connection only until a connection is wanted. Only when every connection has a
  request in progress (received and not stalled) is the new one answered 503 ``overloaded`` and closed.

Counted by ``attnserve_http_connections`` (open now) and ``attnserve_http_connections_closed_total``
(by reason). ``python -m service`` gives uvicorn this protocol; the service's lifespan configures the
process's ``PROCESS`` with its settings and metrics (``service/process.py``).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, Protocol

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from service.observers import UNOBSERVED


class ConnectionObserver(Protocol):
    def open(self, count: int) -> None: ...

    # reason: header_timeout, write_timeout, evicted, evicted_unread, evicted_body, refused
    def closed(self, reason: str) -> None: ...


class Connections:
    """The HTTP connections of one process: how many are open, and which wait for a request, longest first."""

    def __init__(self) -> None:
        self.header_timeout_s = 10.0
        self.write_timeout_s = 30.0
        self.limit = 4096
        self.retry_after_s = 1
        self.observer: ConnectionObserver = UNOBSERVED
        self.open: set[GuardedProtocol] = set()
        # insertion order in each: the longest first
        self.waiting: dict[GuardedProtocol, None] = {}  # for a request: headers incomplete, or idle
        self.unread: dict[GuardedProtocol, None] = {}  # writing paused: the client does not read its answer
        self.receiving: dict[GuardedProtocol, None] = {}  # headers in, the body still arriving

    def configure(
        self,
        header_timeout_s: float,
        limit: int,
        observer: ConnectionObserver,
        retry_after_s: int = 1,
        write_timeout_s: float = 30.0,
    ) -> None:
        self.header_timeout_s, self.limit, self.observer = header_timeout_s, limit, observer
        self.retry_after_s, self.write_timeout_s = retry_after_s, write_timeout_s

    def admit(self, conn: GuardedProtocol) -> bool:
        """Count ``conn`` in, waiting for its first request; at the bound, first close the connection that has
        waited longest for a request, else the one whose answer has gone unread longest, else the one whose body
        has been arriving longest. False when there is none: ``conn`` is to be refused."""
        if len(self.open) >= self.limit:
            for group, reason in (
                (self.waiting, "evicted"),
                (self.unread, "evicted_unread"),
                (self.receiving, "evicted_body"),
            ):
                if group:
                    oldest = next(iter(group))
                    self.forget(oldest)
                    self.observer.closed(reason)
                    oldest.transport.abort()  # nothing to flush that anyone will read
                    break
            else:
                self.observer.closed("refused")
                return False
        self.open.add(conn)
        self.waiting[conn] = None
        self.observer.open(len(self.open))
        return True

    def receiving_body(self, conn: GuardedProtocol) -> None:
        self.waiting.pop(conn, None)
        if conn in self.open:
            self.receiving[conn] = None

    def busy(self, conn: GuardedProtocol) -> None:
        self.waiting.pop(conn, None)
        self.receiving.pop(conn, None)

    def idle(self, conn: GuardedProtocol) -> None:
        if conn in self.open:
            self.waiting[conn] = None

    def stalled(self, conn: GuardedProtocol, stalled: bool) -> None:
        if not stalled:
            self.unread.pop(conn, None)
        elif conn in self.open:
            self.unread[conn] = None

    def forget(self, conn: GuardedProtocol) -> None:
        self.waiting.pop(conn, None)
        self.unread.pop(conn, None)
        self.receiving.pop(conn, None)
        if conn in self.open:
            self.open.discard(conn)
            self.observer.open(len(self.open))


PROCESS = Connections()


class GuardedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, with a request-header timeout and the process's connection bound."""

    _header_timer: asyncio.TimerHandle | None = None
    _write_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if not PROCESS.admit(self):
            message = f"the service holds {PROCESS.limit} connections, each with a request in progress"
            self._answer_and_close(503, "overloaded", message, {"retry-after": str(PROCESS.retry_after_s)})
            return
        self._start_header_timer()

    def data_received(self, data: bytes) -> None:
        if self._header_timer is None and self in PROCESS.waiting:  # the next request on a keep-alive connection
            self._start_header_timer()
        super().data_received(data)

    def on_headers_complete(self) -> None:
        self._cancel_header_timer()
        PROCESS.receiving_body(self)
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        PROCESS.busy(self)
        super().on_message_complete()

    def pause_writing(self) -> None:
        super().pause_writing()
        PROCESS.stalled(self, True)
        if self._write_timer is None:
            self._write_timer = self.loop.call_later(PROCESS.write_timeout_s, self._not_read)

    def resume_writing(self) -> None:
        super().resume_writing()
        PROCESS.stalled(self, False)
        self._cancel_write_timer()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.timeout_keep_alive_task is not None:  # kept alive, no pipelined request: waiting for the next
            PROCESS.idle(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_header_timer()
        self._cancel_write_timer()
        PROCESS.forget(self)
        super().connection_lost(exc)

    def _start_header_timer(self) -> None:
        self._header_timer = self.loop.call_later(PROCESS.header_timeout_s, self._headers_too_slow)

    def _cancel_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _cancel_write_timer(self) -> None:
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None

    def _not_read(self) -> None:
        """The client has not read its answer for the write timeout: drop the connection (and what it buffered),
        which releases the handler waiting to send."""
        self._write_timer = None
        if self.transport.is_closing():
            return
        PROCESS.forget(self)
        PROCESS.observer.closed("write_timeout")
        self.transport.abort()

    def _headers_too_slow(self) -> None:
        self._header_timer = None
        if self.transport.is_closing():
            return
        PROCESS.forget(self)
        PROCESS.observer.closed("header_timeout")
        message = f"the request's headers did not arrive within {PROCESS.header_timeout_s:g} s"
        self._answer_and_close(408, "request_timeout", message)

    def _answer_and_close(self, status: int, code: str, message: str, headers: dict[str, Any] | None = None) -> None:
        """An error answer in the service's format, written before any request was read, then the connection closed."""
        body = json.dumps({"error": {"code": code, "message": message}}).encode()
        lines = {
            "content-type": "application/json",
            "content-length": len(body),
            "connection": "close",
            **(headers or {}),
        }
        head = "".join(f"{name}: {value}\r\n" for name, value in lines.items()).encode("latin-1")
        self.transport.write(STATUS_LINE[status] + head + b"\r\n" + body)
        self.transport.close()
