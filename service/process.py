"""The process ``python -m service`` runs: one serving core, and HTTP and gRPC as peers over it.

uvicorn runs the process (its worker processes, its signals, its graceful shutdown of HTTP) and
calls ``worker_app`` in each process that serves. The app it gets is the HTTP transport's
(``service/http/app.py``) with this module's lifespan, which:

- starts the core (``service/core/serving.running``: the registry loading the models in the
  background, the attention store, the image decoder) and hands it to HTTP (``app.state.serving``);
- starts the gRPC transport (``service/grpc/server.py``) on the same core, when
  ``ATTNSERVE_GRPC_PORT`` is set, so both reach the same queues under the same keys and in-flight bound;
- bounds the HTTP connections in time and number (``service/http/connections.py``, the protocol
  ``python -m service`` gives uvicorn) with the settings and metrics of this service;
- on SIGTERM or SIGINT drains in the order load balancers need (``drain_on_signals``): at once the
  readiness of both transports says no (``Serving.draining``) while both go on answering; after
  ``ATTNSERVE_DRAIN_DELAY_S`` (or at a second signal) both stop accepting at once, uvicorn letting the
  HTTP requests in flight finish and gRPC the calls in flight, for up to ``ATTNSERVE_DRAIN_TIMEOUT_S``;
  then the core stops. So the process ends within the delay and one grace period, inside a container's
  stop timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import threading
from collections.abc import AsyncIterator, Callable

from fastapi import FastAPI

from service import __version__
from service.core.admission import InFlight
from service.core.keys import load_keys
from service.core.serving import Draining, running
from service.http import connections
from service.http.app import App
from service.http.app import create_app as create_http_app
from service.logs import configure_logging
from service.memory import limit_arenas
from service.metrics import Metrics
from service.settings import Settings
from service.tracing import TRACING

log = logging.getLogger("attnserve.app")

GC_YOUNG_THRESHOLD = 10_000


def create_app(settings: Settings | None = None) -> App:
    """A new, independent service: its own settings, metrics registry, models and queues, served over
    HTTP by the returned app and, from its lifespan, over gRPC."""
    settings = settings or Settings()
    if not logging.getLogger("attnserve").handlers:
        configure_logging(settings.log_level, settings.log_format)
    metrics = Metrics()
    TRACING.configure(__version__)  # from the OTEL_* variables; off unless they ask
    keys = load_keys(settings)
    in_flight = InFlight(settings.requests_in_flight_bound, settings.retry_after_s)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        connections.PROCESS.configure(
            settings.header_timeout_s,
            settings.connection_bound,
            metrics.for_connections(),
            settings.retry_after_s,
            settings.write_timeout_s,
        )
        async with running(settings, metrics, keys, in_flight) as serving:
            app.state.serving = serving
            grpc_server = None
            stops: list[Callable[[], object]] = []
            if settings.grpc_port:  # imported only when served: grpcio stays out of a process that never uses it
                from service.grpc import server as grpc_serving

                grpc_server = await grpc_serving.start(serving)
                stops.append(lambda: grpc_serving.begin_stop(grpc_server, settings.drain_timeout_s))
            drain_on_signals(serving.draining, settings.drain_delay_s, stops)
            tune_gc()
            try:
                yield
            finally:
                if grpc_server is not None:  # calls in flight finish while the engines still run
                    await grpc_serving.stop(grpc_server, settings.drain_timeout_s)
                TRACING.flush()

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


def drain_on_signals(draining: Draining, delay_s: float, stops: list[Callable[[], object]]) -> None:
    """Drain in the order a load balancer needs, on SIGTERM or SIGINT as uvicorn receives them.

    First signal: ``draining`` begins (readiness says no over both transports, which go on accepting and
    answering), so that load balancers' health checks take the process out while it still serves what
    they send meanwhile. ``delay_s`` later, or at once on a second signal (an operator's Ctrl-C twice
    never waits), the transports stop accepting together: each of ``stops`` is called (gRPC) and then
    uvicorn's own handler, which closes the HTTP listener and drains HTTP. A signal after that goes to
    uvicorn unchanged (a third Ctrl-C: uvicorn's force quit).

    uvicorn handles both signals with ``signal.signal`` in the main thread while it serves (as ``python
    -m service`` runs it); its handlers are replaced here and called when their time comes. Elsewhere
    (uvicorn in a thread, as some tests run it) nothing changes: the lifespan's stop is the only one.
    """
    if threading.current_thread() is not threading.main_thread():
        return
    loop = asyncio.get_running_loop()
    uvicorns = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    uvicorns = {sig: handler for sig, handler in uvicorns.items() if callable(handler)}  # not uvicorn's: leave it
    timer: asyncio.TimerHandle | None = None
    stopping = False

    def stop(signum: int) -> None:
        nonlocal stopping
        if timer is not None:
            timer.cancel()
        stopping = True
        for begin_stop in stops:
            begin_stop()
        uvicorns[signum](signum, None)

    def on_signal(signum: int) -> None:
        nonlocal timer
        if stopping:
            uvicorns[signum](signum, None)
        elif draining.active:
            log.info("second signal (%s): no longer accepting", signal.Signals(signum).name)
            stop(signum)
        else:
            draining.begin()
            log.info(
                "%s: draining: not ready, still accepting for %g s (a second signal stops accepting now)",
                signal.Signals(signum).name,
                delay_s,
            )
            if delay_s > 0:
                timer = loop.call_later(delay_s, stop, signum)
            else:
                stop(signum)

    for sig in uvicorns:
        signal.signal(sig, lambda signum, frame: loop.call_soon_threadsafe(on_signal, signum))
