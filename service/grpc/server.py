"""The gRPC server: ``grpc.aio`` in the HTTP server's process and event loop, started and stopped with it.

Started by the app's lifespan (``service/http/app.py``) once the service's parts exist, on
``ATTNSERVE_HOST``:``ATTNSERVE_GRPC_PORT`` (0: none), so every way of running the app, ``python -m
service`` or uvicorn in a test, serves gRPC too; a port that cannot be bound stops the startup. It
takes messages up to ``ATTNSERVE_MAX_BODY_BYTES`` (gRPC itself refuses larger ones with
``RESOURCE_EXHAUSTED``). With several uvicorn workers, each binds the port with ``SO_REUSEPORT`` and
the kernel spreads the connections, as it does HTTP's; with one, the port is its alone, so a second
server on the same port fails instead of sharing it. At shutdown it stops taking calls and lets
those in flight finish (``GRACE_S``, as uvicorn's graceful shutdown) before the engines stop; the
signal that starts uvicorn's shutdown starts gRPC's too (``stop_with_uvicorn``), so both drain at
once and the process ends within one grace period, inside a container's stop timeout.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
import weakref

import grpc

from service.grpc.calls import Calls
from service.grpc.generated.grpc_service_pb2_grpc import add_GRPCInferenceServiceServicer_to_server
from service.grpc.service import InferenceService
from service.http.auth import Keys
from service.http.serving import Serving

log = logging.getLogger("attnserve.grpc")
GRACE_S = 30.0


async def start(serving: Serving, keys: Keys | None) -> grpc.aio.Server:
    """A started gRPC server of ``serving``, listening on the settings' host and gRPC port."""
    settings = serving.settings
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", settings.max_body_bytes),
            ("grpc.so_reuseport", 1 if settings.workers > 1 else 0),
        ]
    )
    add_GRPCInferenceServiceServicer_to_server(InferenceService(Calls(serving, keys)), server)
    address = f"{_host(settings.host)}:{settings.grpc_port}"
    try:
        server.add_insecure_port(address)
    except RuntimeError as e:
        raise RuntimeError(f"cannot serve gRPC on {address} (ATTNSERVE_GRPC_PORT; 0 turns gRPC off): {e}") from e
    await server.start()
    log.info("serving gRPC on %s", address)
    return server


_stopping: weakref.WeakKeyDictionary[grpc.aio.Server, asyncio.Task] = weakref.WeakKeyDictionary()


def begin_stop(server: grpc.aio.Server) -> asyncio.Task:
    """Start stopping ``server``, once however often asked; the task ends when it has stopped."""
    task = _stopping.get(server)
    if task is None:
        task = _stopping[server] = asyncio.get_running_loop().create_task(_stop(server), name="grpc-stop")
    return task


async def stop(server: grpc.aio.Server) -> None:
    """Refuse new calls, let those in flight finish (at most ``GRACE_S``), then close."""
    await begin_stop(server)


async def _stop(server: grpc.aio.Server) -> None:
    await server.stop(GRACE_S)
    log.info("gRPC server stopped")


def stop_with_uvicorn(server: grpc.aio.Server) -> None:
    """Begin ``stop`` when SIGTERM or SIGINT reaches uvicorn, not after uvicorn has drained HTTP.

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
            loop.call_soon_threadsafe(begin_stop, server)
            previous(signum, frame)

        signal.signal(sig, handler)


def _host(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host  # an IPv6 address
