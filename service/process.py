"""The process ``python -m service`` runs: one serving core, and HTTP and gRPC as peers over it.

uvicorn runs the process (its worker processes, its signals, its graceful shutdown of HTTP) and
calls ``worker_app`` in each process that serves. The app it gets is the HTTP transport's
(``service/http/app.py``) with this module's lifespan, which:

- starts the core (``service/core/serving.running``: the registry loading the models in the
  background, the attention store, the image decoder) and hands it to HTTP (``app.state.serving``);
- starts the gRPC transport (``service/grpc/server.py``) on the same core, when
  ``ATTNSERVE_GRPC_PORT`` is set, so both reach the same queues under the same keys and in-flight bound;
- on SIGTERM or SIGINT lets both transports drain at once: uvicorn stops taking connections and lets
  the HTTP requests in flight finish, while gRPC stops taking calls and lets those in flight finish
  (``stop_with_uvicorn``); then the core stops. So the process ends within one grace period, inside
  a container's stop timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import threading
from collections.abc import AsyncIterator

from fastapi import FastAPI

from service.core.admission import InFlight
from service.core.keys import load_keys
from service.core.serving import running
from service.http.app import App
from service.http.app import create_app as create_http_app
from service.logs import configure_logging
from service.memory import limit_arenas
from service.metrics import Metrics
from service.settings import Settings

log = logging.getLogger("attnserve.app")

GC_YOUNG_THRESHOLD = 10_000


def create_app(settings: Settings | None = None) -> App:
    """A new, independent service: its own settings, metrics registry, models and queues, served over
    HTTP by the returned app and, from its lifespan, over gRPC."""
    settings = settings or Settings()
    if not logging.getLogger("attnserve").handlers:
        configure_logging(settings.log_level, settings.log_format)
    metrics = Metrics()
    keys = load_keys(settings)
    in_flight = InFlight(settings.requests_in_flight_bound, settings.retry_after_s)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with running(settings, metrics, keys, in_flight) as serving:
            app.state.serving = serving
            grpc_server = None
            if settings.grpc_port:  # imported only when served: grpcio stays out of a process that never uses it
                from service.grpc import server as grpc_serving

                grpc_server = await grpc_serving.start(serving)
                stop_with_uvicorn(lambda: grpc_serving.begin_stop(grpc_server))
            tune_gc()
            try:
                yield
            finally:
                if grpc_server is not None:  # calls in flight finish while the engines still run
                    await grpc_serving.stop(grpc_server)

    return create_http_app(settings, metrics, keys, in_flight, lifespan)


def worker_app() -> App:
    """What uvicorn calls in each process that serves (the only one, or each of ``ATTNSERVE_WORKERS``,
    which are started fresh, not forked): the process-wide malloc setting first, then the service."""
    arenas = limit_arenas()  # before onnxruntime and the worker pools start their threads
    if arenas is not None:
        log.info("malloc arenas capped at %d", arenas, extra={"pid": os.getpid()})
    return create_app()


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


def stop_with_uvicorn(begin_stop) -> None:
    """Call ``begin_stop()`` (in the event loop) when SIGTERM or SIGINT reaches uvicorn, not after uvicorn
    has drained HTTP.

    uvicorn handles both signals with ``signal.signal`` in the main thread while it serves (as
    ``python -m service`` runs it); each handler is wrapped to schedule the stop and then call
    uvicorn's. Elsewhere (uvicorn in a thread, as some tests run it) the lifespan's stop is the only one.
    """
    if threading.current_thread() is not threading.main_thread():
        return
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        previous = signal.getsignal(sig)
        if not callable(previous):  # not uvicorn's: nothing to chain to
            continue

        def handler(signum, frame, previous=previous):
            loop.call_soon_threadsafe(begin_stop)
            previous(signum, frame)

        signal.signal(sig, handler)
