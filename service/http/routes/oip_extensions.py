"""Triton's extensions of the Open Inference Protocol that its tools read: model configuration, statistics.

- ``GET /v2/models/{name}[/versions/{version}]/config``: ``service/oip/model_config.py``'s
  configuration of the version the path names (or of the one answering unpinned requests);
- ``GET /v2/models/stats``, ``GET /v2/models/{name}[/versions/{version}]/stats``: the statistics of
  every loaded version, of every version of the model, or of the one version
  (``service/statistics.py``, read from the Prometheus metrics).
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from service.core.serving import Serving
from service.http.common import JSON_TYPE
from service.http.router import Route
from service.http.routes.oip import json_answer, served_model
from service.oip import operations


async def model_configuration(request: Request, serving: Serving) -> Response:
    """Triton's model configuration (``model_config.proto`` as JSON): tensors, batching, instances."""
    return json_answer(operations.model_configuration(serving, served_model(serving, request)))


async def statistics(request: Request, serving: Serving) -> Response:
    """Inference, execution and batch statistics since the service started, as Triton's ``ModelStatistics``."""
    name, version = request.path_params.get("name"), request.path_params.get("version")
    return json_answer({"model_stats": operations.statistics(serving, name, version)})


_CONFIG = {JSON_TYPE: {"schema": {"type": "object", "required": ["name", "platform", "max_batch_size", "input", "output"]}}}  # fmt: skip
_STATS = {JSON_TYPE: {"schema": {"type": "object", "required": ["model_stats"], "properties": {"model_stats": {"type": "array", "items": {"type": "object"}}}}}}  # fmt: skip


def _routes() -> list[Route]:
    common = {"tags": ("open inference protocol",), "errors": {404: "No such model or version."}}
    routes = [Route("GET", "/v2/models/stats", statistics, summary="Statistics of every model", response=_STATS, tags=common["tags"])]  # fmt: skip
    for prefix in ("/v2/models/{name}", "/v2/models/{name}/versions/{version}"):
        routes += [
            Route("GET", f"{prefix}/config", model_configuration, summary="Model configuration", response=_CONFIG, **common),
            Route("GET", f"{prefix}/stats", statistics, summary="Model statistics", response=_STATS, **common),
        ]  # fmt: skip
    return routes


ROUTES = _routes()
