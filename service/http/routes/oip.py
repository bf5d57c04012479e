"""The Open Inference Protocol (KServe v2 REST) for both models, on the same engines as the native routes.

What Triton's ``tritonclient``, KServe and Seldon MLServer clients speak: server and model health,
model metadata, and ``POST /v2/models/{name}[/versions/{version}]/infer``. A request is queued on the
model's own batcher or scheduler, with the native routes' requests, so both are batched together and
overload answers the same (503 with ``Retry-After``); errors have the protocol's ``{"error": ...}`` body.

- Image classifier: one input, ``images`` (BYTES [N]: encoded image files, base64 strings in JSON)
  or ``pixels`` (FP32 [N, C, H, W], preprocessed as the model was trained); output ``probabilities``
  (FP64 [N, classes]), or with the classification extension (``"classification": k`` on the output)
  the k best as ``"score:index:label"`` (BYTES [N, k]).
- Translator: input ``text`` (BYTES [N]); output ``translation`` (BYTES [N], or [N, k] with
  ``num_return_sequences`` k > 1); request parameters ``beam_size``, ``length_penalty``,
  ``num_return_sequences``, ``max_new_tokens`` as on ``POST /translate``.
- ``return_attention: true`` (request parameter) adds ``attention_id`` (BYTES [N]): ids that
  ``GET /attention/{id}`` serves.
- ``timeout`` (request parameter, microseconds, as Triton's clients send it) shortens the request's
  deadline as ``X-Request-Timeout`` does (``service/core/deadlines.py``).
"""

from __future__ import annotations

import time

from starlette.requests import Request
from starlette.responses import Response

from service.core.deadlines import oip_timeout
from service.core.serving import Serving
from service.errors import InvalidField, UnsupportedMediaType
from service.http import oip
from service.http.common import JSON_TYPE, dump_json, http_caller
from service.http.deadlines import request_deadline
from service.http.errors import protocol_error_response
from service.http.router import Route
from service.oip import operations
from service.registry import ServedModel, Status


def served_model(serving: Serving, request: Request, ready: bool = True) -> ServedModel:
    """The model version the path names (or the one answering unpinned requests); 404 if it is not loaded."""
    name, version = request.path_params["name"], request.path_params.get("version")
    return operations.served_model(serving, name, version, ready)


def json_answer(body: dict | list, status: int = 200) -> Response:
    return Response(dump_json(body), status_code=status, media_type=JSON_TYPE)


async def server_metadata(request: Request, serving: Serving) -> Response:
    """The server's name, version and protocol extensions."""
    return json_answer(operations.server_metadata())


async def server_live(request: Request, serving: Serving) -> Response:
    """200 while the process answers."""
    return json_answer({"live": True})


async def server_ready(request: Request, serving: Serving) -> Response:
    """200 when every model is ready, 503 (saying why) until then, and while draining."""
    ready, reasons = serving.readiness()
    if not ready:
        headers = {"Retry-After": str(serving.settings.retry_after_s)}
        if serving.draining.active:
            return protocol_error_response(503, "draining", "; ".join(reasons), headers)
        return protocol_error_response(503, "not_ready", "; ".join(reasons), headers)
    return json_answer({"ready": True})


async def model_ready(request: Request, serving: Serving) -> Response:
    """200 when the model (version) is ready to infer, 503 (saying why) when it is not."""
    model = served_model(serving, request, ready=False)
    if serving.draining.active:
        return protocol_error_response(503, "draining", f"model {model.key}: the service is draining")
    if model.status is not Status.READY:
        return protocol_error_response(503, "model_not_ready", f"model {model.key} is {model.status.value}")
    if model.failing:
        return protocol_error_response(503, "model_not_ready", f"model {model.key}: {model.failing}")
    return json_answer({"name": model.name, "ready": True})


async def model_metadata(request: Request, serving: Serving) -> Response:
    """The model's inputs and outputs: name, datatype and shape (-1: any size)."""
    return json_answer(operations.model_metadata(serving, served_model(serving, request)))


async def infer(request: Request, serving: Serving) -> Response:
    """Run the model on the request's inputs; JSON or binary tensors, as the request asks."""
    arrived = time.monotonic()
    if request.headers.get("content-encoding", "identity").lower() != "identity":
        raise UnsupportedMediaType("compressed inference requests are not accepted; send them uncompressed")
    model = served_model(serving, request)
    with serving.registry.intake.receiving():
        req = oip.read_request(await request.body(), request.headers.get(oip.HEADER_LENGTH))
    deadline = request_deadline(request, serving.settings, oip_timeout(req.parameters), arrived=arrived)
    outputs = await operations.infer(serving, http_caller(request), model, req, deadline)
    return oip.write_response(req, model.name, model.version, outputs)


async def repository_index(request: Request, serving: Serving) -> Response:
    """Every version folder of the repository with its state (READY, LOADING, UNLOADING, UNAVAILABLE);
    `{"ready": true}` keeps the ready ones only."""
    raw = await request.body()
    options = oip.json_object(raw) if raw.strip() else {}
    if not isinstance(options.get("ready", False), bool):
        raise InvalidField("`ready` must be true or false")
    entries = serving.lifecycle.index()
    if options.get("ready") is True:
        entries = [e for e in entries if e["state"] == "READY"]
    return json_answer(entries)


async def repository_load(request: Request, serving: Serving) -> Response:
    """Load what the model's folder and version policy now hold, in the background of the running
    service; answers when done. Unpinned requests move to a new version once it is ready, and the
    versions it replaces are unloaded after they drained."""
    await serving.lifecycle.load(request.path_params["name"])
    return json_answer({})


async def repository_unload(request: Request, serving: Serving) -> Response:
    """Stop routing to every version of the model, let them finish what they have, unload them."""
    await serving.lifecycle.unload(request.path_params["name"])
    return json_answer({})


_TENSOR = {
    "type": "object",
    "required": ["name", "shape", "datatype"],
    "properties": {
        "name": {"type": "string", "minLength": 1},
        "shape": {"type": "array", "items": {"type": "integer", "minimum": 0}},
        "datatype": {"type": "string", "enum": ["BYTES", *oip.NUMERIC]},
        "parameters": {
            "type": ["object", "null"],
            "description": "`binary_data_size`: this input's bytes in the binary part of the body.",
        },
        "data": {"description": "The elements, flat or nested, row-major (BYTES: strings; JSON images: base64)."},
    },
}
_INFER_REQUEST = {
    "type": "object",
    "required": ["inputs"],
    "properties": {
        "id": {"description": "Echoed in the answer, as a string."},
        "inputs": {"type": "array", "minItems": 1, "items": _TENSOR},
        "outputs": {
            "type": ["array", "null"],
            "items": {
                "type": "object",
                "required": ["name"],
                "properties": {"name": {"type": "string"}, "parameters": {"type": ["object", "null"]}},
            },
        },
        "parameters": {
            "type": ["object", "null"],
            "description": "`timeout` (microseconds), `binary_data_output`, `return_attention`; translation: "
            "`beam_size`, `length_penalty`, `num_return_sequences`, `max_new_tokens`.",
        },
    },
}
_BINARY = {"schema": {"type": "string", "format": "binary"}}
_HEADER_LENGTH = {
    "name": "Inference-Header-Content-Length",
    "in": "header",
    "required": False,
    "description": "Binary tensor data extension: the length of the JSON header that starts the body.",
    "schema": {"type": "integer", "minimum": 0},
}


def _routes() -> list[Route]:
    common = {"tags": ("open inference protocol",)}
    errors = {
        404: "No such model or version.",
        503: "Not ready, the queue is full, or too many requests in flight (`Retry-After`).",
    }
    infer_errors = {
        **errors,
        400: "Invalid JSON, or an invalid `timeout` parameter or `X-Request-Timeout`.",
        413: "Body, image or text too large.",
        415: "Compressed body.",
        422: "Inputs, outputs or parameters the model cannot take.",
    }
    body = {JSON_TYPE: {"schema": _INFER_REQUEST}, "application/octet-stream": _BINARY}
    answer = {JSON_TYPE: {"schema": {"type": "object"}}, "application/octet-stream": _BINARY}
    routes = [
        Route("GET", "/v2", server_metadata, summary="Server metadata", **common),
        Route("GET", "/v2/health/live", server_live, summary="Server liveness", access="open", **common),
        Route(
            "GET",
            "/v2/health/ready",
            server_ready,
            summary="Server readiness",
            errors={503: "Not ready."},
            access="open",
            **common,
        ),
    ]
    for prefix in ("/v2/models/{name}", "/v2/models/{name}/versions/{version}"):
        routes += [
            Route("GET", prefix, model_metadata, summary="Model metadata", errors=errors, **common),
            Route("GET", f"{prefix}/ready", model_ready, summary="Model readiness", errors=errors, **common),
            Route(
                "POST",
                f"{prefix}/infer",
                infer,
                summary="Inference",
                body=body,
                response=answer,
                parameters=(_HEADER_LENGTH,),
                errors=infer_errors,
                deadline=True,
                **common,
            ),
        ]
    lifecycle_errors = {404: "No such model folder.", 400: "A version failed to load.", 409: "The model is busy."}
    index_body = {
        JSON_TYPE: {"schema": {"type": "object", "properties": {"ready": {"type": "boolean", "default": False}}}}
    }
    index_errors = {400: "Invalid JSON.", 422: "Not a JSON object, or `ready` is not a boolean."}
    routes.append(
        Route(
            "POST",
            "/v2/repository/index",
            repository_index,
            summary="Repository index",
            body=index_body,
            body_required=False,
            response={JSON_TYPE: {"schema": {"type": "array", "items": {"type": "object"}}}},
            errors=index_errors,
            **common,
        )
    )
    routes += [
        Route("POST", "/v2/repository/models/{name}/load", repository_load, summary="Load a model", errors=lifecycle_errors, **common),
        Route("POST", "/v2/repository/models/{name}/unload", repository_unload, summary="Unload a model", errors=lifecycle_errors, **common),
    ]  # fmt: skip
    return routes


ROUTES = _routes()
