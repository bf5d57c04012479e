"""Triton's extensions of the Open Inference Protocol that its tools read: the model configuration.

``GET /v2/models/{name}[/versions/{version}]/config`` answers ``service/http/model_config.py``'s
configuration of the version the path names (or of the one answering unpinned requests).
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from service.http.common import JSON_TYPE
from service.http.model_config import model_config
from service.http.router import Route
from service.http.routes.oip import json_answer, served_model
from service.http.serving import Serving


async def model_configuration(request: Request, serving: Serving) -> Response:
    """Triton's model configuration (``model_config.proto`` as JSON): tensors, batching, instances."""
    model = served_model(serving, request)
    policy = serving.registry.policies[model.name]
    return json_answer(model_config(model, policy, serving.settings))


_CONFIG = {JSON_TYPE: {"schema": {"type": "object", "required": ["name", "platform", "max_batch_size", "input", "output"]}}}  # fmt: skip


def _routes() -> list[Route]:
    common = {"tags": ("open inference protocol",), "errors": {404: "No such model or version."}}
    routes = []
    for prefix in ("/v2/models/{name}", "/v2/models/{name}/versions/{version}"):
        routes.append(
            Route(
                "GET",
                f"{prefix}/config",
                model_configuration,
                summary="Model configuration",
                response=_CONFIG,
                **common,
            )
        )
    return routes


ROUTES = _routes()
