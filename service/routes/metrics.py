"""``GET /metrics``: the app's Prometheus registry in the text exposition format."""

from __future__ import annotations

from fastapi import APIRouter
from starlette.responses import Response

from service.deps import MetricsDep

router = APIRouter(tags=["metrics"])


@router.get("/metrics", summary="Prometheus metrics", response_class=Response)
async def metrics(metrics: MetricsDep) -> Response:
    body, content_type = metrics.render()
    return Response(body, media_type=content_type)
