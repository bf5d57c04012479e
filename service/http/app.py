"""The application: one FastAPI app, one middleware stack, one router, and its lifespan.

Every request goes the same way: ``RequestContextMiddleware`` (request id, metrics, access log,
last-resort 500) -> ``BodyLimitMiddleware`` -> ``Router`` (``service/http/router.py``), which finds
the route declared in ``service/http/routes/`` and calls its handler. FastAPI contributes the app
object, its lifespan and state, and the Swagger UI page; the OpenAPI document is built from the
same route declarations (``service/http/openapi.py``).

``create_app`` builds everything cheap (settings, metrics, routes, middleware);
the lifespan does the heavy part (onnxruntime sessions) in the background after the server
started listening, so that ``/readyz`` can say "not yet, and why" instead of refusing connections.
Nothing heavy happens at import time.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
from collections.abc import AsyncIterator
from typing import Any

import onnxruntime as ort
from fastapi import FastAPI
from starlette.types import ASGIApp, Receive, Scope, Send

from service import __version__
from service.attention.store import create_store
from service.http.admission import InFlight
from service.http.auth import Keys, read_hashes
from service.http.cors import Cors
from service.http.middleware import BodyLimitMiddleware, RequestContextMiddleware
from service.http.openapi import openapi_document
from service.http.router import Router
from service.http.routes import ROUTES
from service.http.serving import Serving
from service.images import ImageDecoder, ImageLimits
from service.lifecycle import Lifecycle
from service.logs import configure_logging, flush_access_logs
from service.memory import release_every
from service.metrics import Metrics
from service.registry import Registry
from service.runtime import available_providers, check_gpu_available
from service.settings import Settings

log = logging.getLogger("attnserve.app")


GC_YOUNG_THRESHOLD = 10_000


def tune_gc() -> None:
    """Fewer, cheaper garbage collections on the serving path.

    Every request allocates a few dozen containers, so with CPython's default threshold (700) the
    youngest generation was collected every ~16 requests (0.35 ms each) and the whole heap (80k
    objects: FastAPI, pydantic, numpy...) every few thousand, a 44 ms pause. Measured under 64
    clients: ~25 us of collection per request, 6% of the event loop's CPU. The objects that exist
    at startup live as long as the process: ``gc.freeze`` leaves them out of every collection, and
    a young generation of 10,000 objects is collected ~25 times less often for ~6x the cost.
    """
    gc.freeze()
    young, middle, old = gc.get_threshold()
    gc.set_threshold(max(young, GC_YOUNG_THRESHOLD), middle, old)


@contextlib.asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    settings: Settings = app.state.settings
    check_gpu_available(settings)  # require_gpu without a CUDA-capable onnxruntime: refuse to start at all
    log.info(
        "starting attnserve %s: repository %s, onnxruntime %s offering %s, max_batch_size %d",
        __version__,
        settings.model_repository.resolve(),
        ort.__version__,
        available_providers(),
        settings.max_batch_size,
    )
    registry = Registry(settings, app.state.metrics)
    app.state.registry = registry
    app.state.decoder = ImageDecoder(
        ImageLimits(settings.max_image_bytes, settings.max_image_pixels, settings.image_formats),
        inline_max_pixels=settings.inline_decode_max_pixels,
        threads=settings.decode_threads,
    )
    store = create_store(settings, app.state.metrics.for_attention_store())
    lifecycle = Lifecycle(registry)
    app.state.serving = Serving(settings, app.state.metrics, registry, app.state.decoder, store, lifecycle)
    grpc_server = None
    if settings.grpc_port:  # imported only when served: grpcio stays out of a process that never uses it
        from service.grpc import server as grpc_serving

        grpc_server = await grpc_serving.start(app.state.serving, app.http_router.keys)
        grpc_serving.stop_with_uvicorn(grpc_server)
    loading = asyncio.create_task(registry.load(), name="load-models")
    if settings.repository_poll_s > 0:
        lifecycle.start_polling(settings.repository_poll_s)
    tune_gc()
    releasing = asyncio.create_task(release_every(settings.memory_release_s)) if settings.memory_release_s else None
    try:
        yield
    finally:
        if releasing is not None:
            releasing.cancel()
        if grpc_server is not None:  # calls in flight finish while the engines still run
            await grpc_serving.stop(grpc_server)
        registry.stop_loading()
        loading.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await loading
        await lifecycle.stop()
        await registry.close()
        await store.close()
        app.state.decoder.close()
        flush_access_logs()
        log.info("stopped")


class App(FastAPI):
    """FastAPI whose HTTP requests all go through the service's one stack; lifespan events through FastAPI."""

    def __init__(self, settings: Settings, **kwargs: Any) -> None:
        super().__init__(docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan, **kwargs)
        self.state.settings = settings
        self.state.metrics = Metrics()
        self.routes_table = ROUTES
        hashes = read_hashes(settings.api_key_hashes, settings.api_key_hashes_file)
        in_flight = InFlight(settings.requests_in_flight_bound, settings.retry_after_s)
        self.http_router = Router(ROUTES, Keys(hashes) if hashes else None, settings.protect_metrics, in_flight)
        stack: ASGIApp = BodyLimitMiddleware(
            self.http_router, max_body_bytes=settings.max_body_bytes, body_timeout_s=settings.body_timeout_s
        )
        if settings.cors_origins:  # outside the body limit: a preflight has no body, an error answer gets the headers
            stack = Cors(stack, settings.cors_origins)
        self.stack = RequestContextMiddleware(stack, metrics=self.state.metrics, access_log=settings.access_log)

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


def create_app(settings: Settings | None = None) -> App:
    """A new, independent app: its own settings, metrics registry, models and queues."""
    settings = settings or Settings()
    if not logging.getLogger("attnserve").handlers:
        configure_logging(settings.log_level, settings.log_format)
    return App(
        settings,
        title="attnserve",
        version=__version__,
        summary="Transformer models on onnxruntime, with dynamic batching and their attention maps.",
    )
