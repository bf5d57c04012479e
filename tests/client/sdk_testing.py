"""Helpers for the SDK tests: one synchronous face for both clients, and scripted transports.

``BlockingAsyncClient`` drives an ``AsyncClient`` on one event loop of its own, so that a single
test body exercises ``Client`` and ``AsyncClient`` alike (the ``api``/``make_client`` fixtures are
parametrized over both) and every async code path still runs for real.
"""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import Callable, Iterator

import httpx
from attnserve_client import AsyncClient, AsyncTranslationStream, Client


class BlockingAsyncClient:
    def __init__(self, **kwargs) -> None:
        self.loop = asyncio.new_event_loop()
        self.client = AsyncClient(**kwargs)

    def __getattr__(self, name: str):
        attribute = getattr(self.client, name)
        if not inspect.iscoroutinefunction(attribute):
            return attribute

        def call(*args, **kwargs):
            result = self.loop.run_until_complete(attribute(*args, **kwargs))
            return BlockingStream(result, self.loop) if isinstance(result, AsyncTranslationStream) else result

        return call

    def record_sleeps(self) -> list[float]:
        slept: list[float] = []

        async def sleep(seconds: float) -> None:
            slept.append(seconds)

        self.client._sleep = sleep
        return slept

    def close(self) -> None:
        self.loop.run_until_complete(self.client.close())
        self.loop.close()


class BlockingStream:
    """An ``AsyncTranslationStream`` iterated one event at a time from synchronous code."""

    def __init__(self, stream: AsyncTranslationStream, loop: asyncio.AbstractEventLoop) -> None:
        self.stream, self.loop = stream, loop
        self._events = stream.__aiter__()

    def __iter__(self) -> Iterator:
        while True:
            try:
                yield self.loop.run_until_complete(self._events.__anext__())
            except StopAsyncIteration:
                return

    def __getattr__(self, name: str):
        return getattr(self.stream, name)

    def close(self) -> None:
        """What leaving ``async for`` early and then ``await stream.close()`` does."""
        self.loop.run_until_complete(self._events.aclose())
        self.loop.run_until_complete(self.stream.close())


def make(kind: str, handler: Callable[[httpx.Request], httpx.Response] | None = None, **kwargs):
    """A ``Client`` or a ``BlockingAsyncClient``; with ``handler``, its HTTP goes to an ``httpx.MockTransport``."""
    if handler is not None:
        transport = httpx.MockTransport(handler)
        kwargs["http_client"] = (
            httpx.Client(transport=transport) if kind == "sync" else httpx.AsyncClient(transport=transport)
        )
        kwargs.setdefault("base_url", "http://attnserve.test")
    if kind == "sync":
        client = Client(**kwargs)
        client.record_sleeps = lambda: _record_sync_sleeps(client)
        return client
    return BlockingAsyncClient(**kwargs)


def _record_sync_sleeps(client: Client) -> list[float]:
    slept: list[float] = []
    client._sleep = slept.append
    return slept


def error(status: int, code: str, message: str = "it went wrong", **headers: str) -> httpx.Response:
    """An error answer shaped exactly like the service's."""
    body = {"error": {"code": code, "message": message}}
    return httpx.Response(status, json=body, headers={"X-Request-ID": "req-1", **headers})


def sse(*events: tuple[str, dict]) -> bytes:
    return b"".join(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode() for name, data in events)


class Script:
    """A MockTransport handler answering a fixed sequence of responses (or raising transport errors), recording requests."""

    def __init__(self, *outcomes: httpx.Response | Exception) -> None:
        self.outcomes = list(outcomes)
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        request.read()
        outcome = self.outcomes.pop(0) if len(self.outcomes) > 1 else self.outcomes[0]
        if isinstance(outcome, Exception):
            raise outcome
        return httpx.Response(outcome.status_code, headers=outcome.headers, content=outcome.read())  # a fresh copy
