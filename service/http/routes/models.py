"""``GET /models``: what is loaded, on which execution provider, and how well it measured at export."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from service.core.serving import Serving
from service.http.common import JSON_TYPE, dump_json
from service.http.router import Route
from service.schemas import ModelsResponse


async def list_models(request: Request, serving: Serving) -> Response:
    """Every loaded version of every model, failed ones included with the reason, so an operator sees why;
    `unpinned` marks the version that answers requests naming no version."""
    registry = serving.registry
    defaults = {registry.default_model_name(task) for task in {m.task for m in registry.all()} if task}
    unpinned = registry.models
    models = [
        {**m.describe(), "default": m.name in defaults and unpinned[m.name] is m, "unpinned": unpinned[m.name] is m}
        for m in registry.all()
    ]
    body = ModelsResponse.model_validate({"models": models}).model_dump(mode="json")  # exactly the documented fields
    return Response(dump_json(body), media_type=JSON_TYPE)


ROUTES = [
    Route(
        "GET",
        "/models",
        list_models,
        summary="List the models this process serves",
        tags=("models",),
        response=ModelsResponse,
    )
]
