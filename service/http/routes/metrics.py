"""``GET /metrics``: the app's Prometheus registry in the text exposition format."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from service.core.serving import Serving
from service.http.router import Route


async def metrics(request: Request, serving: Serving) -> Response:
    """Request, batching, decoding and attention-store metrics of this process."""
    body, content_type = serving.metrics.render()
    return Response(body, media_type=content_type)


ROUTES = [
    Route(
        "GET",
        "/metrics",
        metrics,
        summary="Prometheus metrics",
        tags=("metrics",),
        access="metrics",
        response={"text/plain": {"schema": {"type": "string"}}},
    )
]
