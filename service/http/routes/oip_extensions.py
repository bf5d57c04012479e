"""Triton's extensions of the Open Inference Protocol that its tools read: model configuration, statistics.

- ``GET /v2/models/{name}[/versions/{version}]/config``: ``service/http/model_config.py``'s
  configuration of the version the path names (or of the one answering unpinned requests);
- ``GET /v2/models/stats``, ``GET /v2/models/{name}[/versions/{version}]/stats``: the statistics of
  every loaded version, of every version of the model, or of the one version
  (``service/statistics.py``, read from the Prometheus metrics).
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from service.http.common import JSON_TYPE
from service.http.model_config import model_config
from service.http.router import Route
from service.http.routes.oip import json_answer, served_model
from service.http.serving import Serving
from service.statistics import model_statistics


async def model_configuration(request: Request, serving: Serving) -> Response:
    """Triton's model configuration (``model_config.proto`` as JSON): tensors, batching, instances."""
    model = served_model(serving, request)
    policy = serving.registry.policies[model.name]
    return json_answer(model_config(model, policy, serving.settings))


async def statistics(request: Request, serving: Serving) -> Response:
    """Inference, execution and batch statistics since the service started, as Triton's ``ModelStatistics``."""
    if "name" not in request.path_params:
        models = serving.registry.all()
    elif "version" in request.path_params:
        models = [served_model(serving, request, ready=False)]
    else:
        served_model(serving, request, ready=False)  # 404 when unknown
        models = list(serving.registry.versions[request.path_params["name"]].values())
    stats = model_statistics(serving.metrics, [(m.name, m.version, m.task) for m in models])
    return json_answer({"model_stats": stats})


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
