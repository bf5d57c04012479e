"""The HTTP transport's application: one FastAPI app, one middleware stack, one router.

Every request goes the same way: ``RequestContextMiddleware`` (request id, metrics, access log,
last-resort 500) -> ``BodyLimitMiddleware`` -> ``Router`` (``service/http/router.py``), which finds
the route declared in ``service/http/routes/`` and calls its handler with the running service's
parts (``service/core/serving.Serving``, on ``app.state.serving``). FastAPI contributes the app
object, its lifespan and state, and the Swagger UI page; the OpenAPI document is built from the
same route declarations (``service/http/openapi.py``).

The app is built around the parts of the core the router needs before the first request (the
settings, the metrics, the accepted keys, the in-flight bound); the process (``service/process.py``)
gives it the lifespan that starts the core, sets ``app.state.serving`` and starts gRPC beside it.
Nothing heavy happens here, or at import time.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

from fastapi import FastAPI
from starlette.types import ASGIApp, Receive, Scope, Send

from service import __version__
from service.core.admission import InFlight
from service.core.keys import Keys
from service.http.cors import Cors
from service.http.middleware import BodyLimitMiddleware, RequestContextMiddleware
from service.http.openapi import openapi_document
from service.http.router import Router
from service.http.routes import ROUTES
from service.metrics import Metrics
from service.settings import Settings

Lifespan = Callable[[FastAPI], AbstractAsyncContextManager[None]]


class App(FastAPI):
    """FastAPI whose HTTP requests all go through the service's one stack; lifespan events through FastAPI."""

    def __init__(
        self,
        settings: Settings,
        metrics: Metrics,
        keys: Keys | None,
        in_flight: InFlight,
        lifespan: Lifespan | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan, **kwargs)
        self.state.settings = settings
        self.state.metrics = metrics
        self.routes_table = ROUTES
        self.http_router = Router(ROUTES, keys, settings.protect_metrics, in_flight)
        stack: ASGIApp = BodyLimitMiddleware(
            self.http_router, max_body_bytes=settings.max_body_bytes, body_timeout_s=settings.body_timeout_s
        )
        if settings.cors_origins:  # outside the body limit: a preflight has no body, an error answer gets the headers
            stack = Cors(stack, settings.cors_origins)
        self.stack = RequestContextMiddleware(stack, metrics=metrics, access_log=settings.access_log)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            scope["app"] = self
            await self.stack(scope, receive, send)
        else:
            await super().__call__(scope, receive, send)

    def openapi(self) -> dict[str, Any]:
        if self.openapi_schema is None:
            self.openapi_schema = openapi_document(
                self.routes_table,
                title=self.title,
                version=self.version,
                summary=self.summary or "",
                settings=self.state.settings,
                guarded=self.http_router.guards,
            )
        return self.openapi_schema


def create_app(
    settings: Settings, metrics: Metrics, keys: Keys | None, in_flight: InFlight, lifespan: Lifespan | None = None
) -> App:
    """The HTTP app over the core's parts; ``lifespan`` sets ``app.state.serving`` before the first request."""
    return App(
        settings,
        metrics,
        keys,
        in_flight,
        lifespan,
        title="attnserve",
        version=__version__,
        summary="Transformer models on onnxruntime, with dynamic batching and their attention maps.",
    )
