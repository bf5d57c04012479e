"""The gRPC server: ``grpc.aio`` over the running service's parts, in the process's event loop.

Started by the process (``service/process.py``) beside the HTTP server, once the core's parts exist,
on ``ATTNSERVE_HOST``:``ATTNSERVE_GRPC_PORT`` (0: none); a port that cannot be bound stops the
startup. It takes messages up to ``ATTNSERVE_MAX_BODY_BYTES`` (gRPC itself refuses larger ones with
``RESOURCE_EXHAUSTED``). With several worker processes, each binds the port with ``SO_REUSEPORT``
and the kernel spreads the connections, as it does HTTP's; with one, the port is its alone, so a
second server on the same port fails instead of sharing it. At shutdown it stops taking calls and
lets those in flight finish (``ATTNSERVE_DRAIN_TIMEOUT_S``, as uvicorn's graceful shutdown) before the
engines stop.

Slow or idle clients are bounded as HTTP's are (``service/http/connections.py``), by what gRPC's core
offers: a connection must complete its HTTP/2 preface and settings within ``ATTNSERVE_HEADER_TIMEOUT_S``
(``grpc.server_handshake_timeout_ms``), the port holds at most ``Settings.connection_bound`` connections
(``grpc.max_allowed_incoming_connections``: gRPC closes a newer one at once, it evicts none), a
connection without a call is closed after ``ATTNSERVE_KEEP_ALIVE_S`` (``grpc.max_connection_idle_ms``,
with a GOAWAY, which clients follow by reconnecting), and one connection opens at most
``MAX_STREAMS_PER_CONNECTION`` calls at once. A call whose message trickles in is bounded only by those
counts and by the client's deadline.
"""

from __future__ import annotations

import asyncio
import logging
import weakref

import grpc

from service.core.serving import Serving
from service.grpc.calls import Calls
from service.grpc.generated.grpc_service_pb2_grpc import add_GRPCInferenceServiceServicer_to_server
from service.grpc.service import InferenceService

log = logging.getLogger("attnserve.grpc")
MAX_STREAMS_PER_CONNECTION = 100  # HTTP/2's recommended minimum; what most servers allow


async def start(serving: Serving) -> grpc.aio.Server:
    """A started gRPC server of ``serving``, listening on the settings' host and gRPC port."""
    settings = serving.settings
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", settings.max_body_bytes),
            ("grpc.so_reuseport", 1 if settings.workers > 1 else 0),
            ("grpc.server_handshake_timeout_ms", int(settings.header_timeout_s * 1000)),
            ("grpc.max_allowed_incoming_connections", settings.connection_bound),
            ("grpc.max_connection_idle_ms", settings.keep_alive_s * 1000),
            ("grpc.max_concurrent_streams", MAX_STREAMS_PER_CONNECTION),
        ]
    )
    add_GRPCInferenceServiceServicer_to_server(InferenceService(Calls(serving)), server)
    address = f"{_host(settings.host)}:{settings.grpc_port}"
    try:
        server.add_insecure_port(address)
    except RuntimeError as e:
        raise RuntimeError(f"cannot serve gRPC on {address} (ATTNSERVE_GRPC_PORT; 0 turns gRPC off): {e}") from e
    await server.start()
    log.info("serving gRPC on %s", address)
    return server


_stopping: weakref.WeakKeyDictionary[grpc.aio.Server, asyncio.Task] = weakref.WeakKeyDictionary()


def begin_stop(server: grpc.aio.Server, grace_s: float) -> asyncio.Task:
    """Start stopping ``server``, once however often asked; the task ends when it has stopped."""
    task = _stopping.get(server)
    if task is None:
        task = _stopping[server] = asyncio.get_running_loop().create_task(_stop(server, grace_s), name="grpc-stop")
    return task


async def stop(server: grpc.aio.Server, grace_s: float) -> None:
    """Refuse new calls, let those in flight finish (at most ``grace_s``), then close."""
    await begin_stop(server, grace_s)


async def _stop(server: grpc.aio.Server, grace_s: float) -> None:
    await server.stop(grace_s)
    log.info("gRPC server stopped")


def _host(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host  # an IPv6 address
