"""The ASGI layer every request passes through: request id, access log, metrics, body size and time limits.

Plain ASGI middleware rather than ``BaseHTTPMiddleware``: it adds no task per request and does not
buffer bodies, which matters when the whole request budget is about a millisecond.
"""

from __future__ import annotations

import asyncio
import logging
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.errors import BodyTooLarge, InvalidContentLength, RequestTimeout
from service.http.errors import error_answer, internal_error_response
from service.logs import REQUEST_ID_HEADER, AccessLog, bind_request_id, unbind_request_id
from service.metrics import Metrics
from service.tracing import TRACING

access = logging.getLogger("attnserve.access")
log = logging.getLogger("attnserve.http")

# Probes and scrapes are logged at debug level: at one per second they would drown the real traffic.
_QUIET_PATHS = {"/healthz", "/readyz", "/metrics"}


class RequestContextMiddleware:
    """Binds a request id, returns it in ``X-Request-ID``, counts and times the request, logs it.

    Also the last line of defence: an exception escaping the app becomes a JSON 500, logged here
    with the request id and its traceback, and never shown to the client.
    """

    def __init__(self, app: ASGIApp, metrics: Metrics, access_log: bool = True) -> None:
        self.app = app
        self.metrics = metrics
        self.access_log = AccessLog(access) if access_log else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        incoming = None
        for name, value in scope["headers"]:
            if name == b"x-request-id":
                incoming = value.decode("latin-1")
                break
        request_id, token = bind_request_id(incoming)
        headers = [(REQUEST_ID_HEADER.encode(), request_id.encode())]
        status = 500
        response_started = False

        async def send_with_id(message: Message) -> None:
            nonlocal status, response_started
            if message["type"] == "http.response.start":
                status = message["status"]
                response_started = True
                message["headers"] = [*message.get("headers", []), *headers]
            await send(message)

        try:
            if TRACING.enabled and scope["path"] not in _QUIET_PATHS:  # probes and scrapes make no traces
                await self._traced(scope, receive, send_with_id, headers, request_id, lambda: status)
            else:
                await self.app(scope, receive, send_with_id)
        except Exception:
            log.exception("unhandled exception in %s %s", scope["method"], scope["path"])
            status = 500
            if not response_started:
                await internal_error_response(scope["path"])(scope, receive, send_with_id)
        finally:
            elapsed = time.perf_counter() - started
            route = scope.get("route")
            template = getattr(route, "path", None) or "unmatched"
            self.metrics.observe_request(template, scope["method"], status, elapsed)
            if self.access_log:
                level = logging.DEBUG if scope["path"] in _QUIET_PATHS else logging.INFO
                client = scope.get("client")
                self.access_log.log(
                    level,
                    scope["method"],
                    scope["path"],
                    status,
                    round(elapsed * 1000, 3),
                    client[0] if client else None,
                    request_id,
                    scope.get("key_id"),
                )
            unbind_request_id(token)

    async def _traced(self, scope: Scope, receive: Receive, send: Send, headers: list, request_id: str, status) -> None:
        """The request inside its server span (``service/tracing.py``), whose ``traceparent`` is sent back."""
        traceparent = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"traceparent"), None)
        attributes = {
            "http.request.method": scope["method"],
            "url.path": scope["path"],
            "attnserve.request_id": request_id,
        }
        with TRACING.server_span(f"{scope['method']} {scope['path']}", traceparent, attributes) as span:
            headers.append((b"traceparent", TRACING.traceparent(span).encode()))
            try:
                await self.app(scope, receive, send)
            finally:
                route = getattr(scope.get("route"), "path", None)
                if route:
                    span.update_name(f"{scope['method']} {route}")
                    span.set_attribute("http.route", route)
                span.set_attribute("http.response.status_code", status())
                if scope.get("key_id"):
                    span.set_attribute("attnserve.key", scope["key_id"])


class BodyLimitMiddleware:
    """Bounds request bodies in size and in time.

    Size: ``max_body_bytes``, by ``Content-Length`` up front, by counting otherwise (chunked uploads
    that declare no length): 413. Time: the whole body must arrive within ``body_timeout_s`` of the
    request's start, or 408 ``request_timeout`` and the connection is closed; so a client that trickles
    its body (slow-loris) holds a connection that long at most, and never a place in a model's queue,
    which only a whole body reaches. Both errors are raised mid-read, from ``receive``, and reach the
    app's error handlers like any other.
    """

    def __init__(self, app: ASGIApp, max_body_bytes: int, body_timeout_s: float = 10.0) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.body_timeout_s = body_timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.max_body_bytes
        for name, value in scope["headers"]:
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    refusal = InvalidContentLength("Content-Length is not a number")
                    await error_answer(scope["path"], refusal)(scope, receive, send)
                    return
                if declared > limit:
                    too_large = BodyTooLarge(f"request body exceeds the limit of {limit} bytes")
                    await error_answer(scope["path"], too_large)(scope, receive, send)
                    return
                break
        received, complete = 0, False
        until = time.monotonic() + self.body_timeout_s

        async def limited_receive() -> Message:
            nonlocal received, complete
            if complete:  # the body is in: what the app waits for now is a disconnect, for as long as it likes
                return await receive()
            message = await _receive_by(receive, until, self.body_timeout_s)
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise BodyTooLarge(f"request body exceeds the limit of {limit} bytes")
                complete = not message.get("more_body", False)
            return message

        await self.app(scope, limited_receive, send)


async def _receive_by(receive: Receive, until: float, timeout_s: float) -> Message:
    """``receive()``, or 408 when nothing comes before ``until`` (``time.monotonic()``).

    A timer cancels this task at ``until``, as ``asyncio.timeout`` (Python 3.11+) does: the service
    runs on 3.10 too, and ``asyncio.wait_for`` would start a task for every read of every body. A part
    of the body already received is returned even when ``until`` has passed: the wait is what is cut.
    """
    task = asyncio.current_task()
    assert task is not None  # an ASGI app runs in a task
    expired = False

    def expire() -> None:
        nonlocal expired
        expired = True
        task.cancel()

    timer = asyncio.get_running_loop().call_later(max(0.0, until - time.monotonic()), expire)
    try:
        return await receive()
    except asyncio.CancelledError:
        if not expired:
            raise
        if hasattr(task, "uncancel"):  # Python >= 3.11: this cancellation ends here
            task.uncancel()
        raise RequestTimeout(
            f"the request body did not arrive within {timeout_s:g} s", headers={"Connection": "close"}
        ) from None
    finally:
        timer.cancel()
