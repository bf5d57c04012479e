"""``GET /healthz`` (the process answers) and ``GET /readyz`` (every model loaded and warmed up).

Kept apart on purpose: an orchestrator restarts a process that fails liveness, but only withholds
traffic from one that is not ready, which is the right reaction to a model still warming up or a
corrupted model file (restarting would not fix it).
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from service.core.serving import Serving
from service.http.common import JSON_TYPE, dump_json
from service.http.router import Route
from service.schemas import HealthResponse, NotReadyResponse, ReadinessResponse

_OK = dump_json({"status": "ok"})


async def healthz(request: Request, serving: Serving) -> Response:
    """200 while the process answers at all."""
    return Response(_OK, media_type=JSON_TYPE)


async def readyz(request: Request, serving: Serving) -> Response:
    """200 when every model is loaded and warmed up; 503, saying why, until then, and from SIGTERM on
    (``draining``: the process still answers, but a load balancer should send it nothing new)."""
    ready, reasons = serving.readiness()
    models = {m.key: m.status.value for m in serving.registry.models.values()}
    if ready:
        return Response(dump_json({"status": "ready", "models": models}), media_type=JSON_TYPE)
    state = "draining" if serving.draining.active else "not_ready"
    body = {"error": {"code": state, "message": "; ".join(reasons)}, "status": state, "models": models}
    return Response(
        dump_json(body),
        status_code=503,
        media_type=JSON_TYPE,
        headers={"Retry-After": str(serving.settings.retry_after_s)},
    )


ROUTES = [
    Route("GET", "/healthz", healthz, summary="Liveness", tags=("health",), response=HealthResponse, access="open"),
    Route(
        "GET",
        "/readyz",
        readyz,
        summary="Readiness",
        tags=("health",),
        access="open",
        response=ReadinessResponse,
        extra_responses={503: {"model": NotReadyResponse, "description": "Not ready; `error.message` says why."}},
    ),
]
