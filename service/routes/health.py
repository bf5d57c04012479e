"""``GET /healthz`` (the process answers) and ``GET /readyz`` (every model loaded and warmed up).

Kept apart on purpose: an orchestrator restarts a process that fails liveness, but only withholds
traffic from one that is not ready, which is the right reaction to a model still warming up or a
corrupted model file (restarting would not fix it).
"""

from __future__ import annotations

import json

from fastapi import APIRouter
from starlette.responses import Response

from service.deps import RegistryDep, SettingsDep
from service.schemas import HealthResponse, NotReadyResponse, ReadinessResponse

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=HealthResponse, summary="Liveness")
async def healthz() -> dict:
    return {"status": "ok"}


@router.get(
    "/readyz",
    response_model=ReadinessResponse,
    responses={503: {"model": NotReadyResponse, "description": "Not ready; `error.message` says why."}},
    summary="Readiness",
)
async def readyz(registry: RegistryDep, settings: SettingsDep) -> Response:
    ready, reasons = registry.readiness()
    models = {m.key: m.status.value for m in registry.models.values()}
    if ready:
        body: dict = {"status": "ready", "models": models}
        return Response(json.dumps(body), media_type="application/json")
    body = {"error": {"code": "not_ready", "message": "; ".join(reasons)}, "status": "not_ready", "models": models}
    return Response(
        json.dumps(body),
        status_code=503,
        media_type="application/json",
        headers={"Retry-After": str(settings.retry_after_s)},
    )
