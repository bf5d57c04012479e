"""The hot routes, served without FastAPI's routing, dependency injection and middleware layers.

``POST /classify`` is answered in well under a millisecond of CPU, and per request FastAPI's own
machinery (seven nested middleware coroutines, matching every route, solving dependencies, parsing
query parameters it never needs) cost about a quarter of that: measured with py-spy under 64 wrk
clients. ``App`` is FastAPI with one shortcut: a request whose method and exact path name a lane
goes straight to that lane's handler, wrapped in the service's own two middlewares (request id,
access log, metrics, body limit) and answered with the same error bodies as every other route.
Everything else, including other methods on the same path (405) and ``/docs``, is plain FastAPI;
the lane's handler stays registered there too, so the OpenAPI schema still describes it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from types import SimpleNamespace
from typing import Any

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from service.errors import ServiceError, service_error_response, validation_error_response
from service.middleware import BodyLimitMiddleware, RequestContextMiddleware

Handler = Callable[[Request, Any], Awaitable[Response]]


class App(FastAPI):
    """FastAPI, plus lanes: ``(method, path)`` -> an ASGI app that skips FastAPI's stack."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lanes: dict[tuple[str, str], ASGIApp] = {}

    def add_lane(self, method: str, path: str, handler: Handler, *, max_body_bytes: int, access_log: bool) -> None:
        """Serve ``method path`` with ``handler(request, app.state.serving)``, already registered as a route."""
        lane: ASGIApp = Lane(handler, path)
        lane = BodyLimitMiddleware(lane, max_body_bytes=max_body_bytes)
        self.lanes[(method, path)] = RequestContextMiddleware(lane, metrics=self.state.metrics, access_log=access_log)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            lane = self.lanes.get((scope["method"], scope["path"]))
            if lane is not None:
                scope["app"] = self
                await lane(scope, receive, send)
                return
        await super().__call__(scope, receive, send)


class Lane:
    """One handler as a bare ASGI app: the route's errors become the service's JSON error bodies."""

    def __init__(self, handler: Handler, path: str) -> None:
        self.handler = handler
        self.route = SimpleNamespace(path=path)  # the metrics' route label, where FastAPI's router puts it

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        scope["route"] = self.route
        request = Request(scope, receive)
        try:
            response = await self.handler(request, scope["app"].state.serving)
        except ServiceError as e:
            response = service_error_response(e)
        except RequestValidationError as e:
            response = validation_error_response(e)
        await response(scope, receive, send)
