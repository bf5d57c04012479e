"""The gRPC server: ``grpc.aio`` in the HTTP server's process and event loop, started and stopped with it.

Started by the app's lifespan (``service/http/app.py``) once the service's parts exist, on
``ATTNSERVE_HOST``:``ATTNSERVE_GRPC_PORT`` (0: none), so every way of running the app, ``python -m
service`` or uvicorn in a test, serves gRPC too; a port that cannot be bound stops the startup. It
takes messages up to ``ATTNSERVE_MAX_BODY_BYTES`` (gRPC itself refuses larger ones with
``RESOURCE_EXHAUSTED``). With several uvicorn workers, each binds the port with ``SO_REUSEPORT`` and
the kernel spreads the connections, as it does HTTP's; with one, the port is its alone, so a second
server on the same port fails instead of sharing it. At shutdown it stops taking calls and lets
those in flight finish (``GRACE_S``, as uvicorn's graceful shutdown) before the engines stop.
"""

from __future__ import annotations

import logging

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


async def stop(server: grpc.aio.Server) -> None:
    """Refuse new calls, let those in flight finish (at most ``GRACE_S``), then close."""
    await server.stop(GRACE_S)
    log.info("gRPC server stopped")


def _host(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host  # an IPv6 address
