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
  deadline as ``X-Request-Timeout`` does (``service/http/deadlines.py``).
"""

from __future__ import annotations

import base64
import binascii
import time

import numpy as np
from starlette.requests import Request
from starlette.responses import Response

from service import __version__
from service.classifier import TASK as IMAGE_CLASSIFICATION
from service.errors import InvalidBase64, InvalidField, ModelNotFound, UnsupportedMediaType, protocol_error_response
from service.http import oip
from service.http.common import JSON_TYPE, answer_or_disconnect, attention_store, dump_json, validated
from service.http.deadlines import oip_timeout, request_deadline
from service.http.model_config import PLATFORM, tensors
from service.http.router import Route
from service.http.routes.classify import attach_attention, decode_images
from service.http.routes.translate import translate_texts
from service.http.serving import Serving
from service.registry import ServedModel, Status
from service.schemas import ClassifyOptions, TranslateRequest
from service.translator import TASK as TRANSLATION

EXTENSIONS = ("binary_tensor_data", "classification", "model_configuration", "statistics")
DECODING_PARAMETERS = ("beam_size", "length_penalty", "num_return_sequences", "max_new_tokens", "return_attention")


def served_model(serving: Serving, request: Request, ready: bool = True) -> ServedModel:
    """The model version the path names (or the one answering unpinned requests); 404 if it is not loaded."""
    name, version = request.path_params["name"], request.path_params.get("version")
    versions = serving.registry.versions.get(name)
    if versions is None or (version is not None and version not in versions):
        what = f"model {name!r}" + (f" version {version!r}" if version is not None else "")
        loaded = ", ".join(m.key for m in serving.registry.all())
        raise ModelNotFound(f"{what} is not loaded (loaded: {loaded})")
    if not ready:
        return versions[version] if version is not None else serving.registry.models[name]
    task = next(iter(versions.values())).task or IMAGE_CLASSIFICATION
    return serving.registry.get(name, task, version)


def json_answer(body: dict | list, status: int = 200) -> Response:
    return Response(dump_json(body), status_code=status, media_type=JSON_TYPE)


async def server_metadata(request: Request, serving: Serving) -> Response:
    """The server's name, version and protocol extensions."""
    return json_answer({"name": "attnserve", "version": __version__, "extensions": list(EXTENSIONS)})


async def server_live(request: Request, serving: Serving) -> Response:
    """200 while the process answers."""
    return json_answer({"live": True})


async def server_ready(request: Request, serving: Serving) -> Response:
    """200 when every model is ready, 503 (saying why) until then."""
    ready, reasons = serving.registry.readiness()
    if not ready:
        return protocol_error_response(
            503, "not_ready", "; ".join(reasons), {"Retry-After": str(serving.settings.retry_after_s)}
        )
    return json_answer({"ready": True})


async def model_ready(request: Request, serving: Serving) -> Response:
    """200 when the model (version) is ready to infer, 503 (saying why) when it is not."""
    model = served_model(serving, request, ready=False)
    if model.status is not Status.READY:
        return protocol_error_response(503, "model_not_ready", f"model {model.key} is {model.status.value}")
    return json_answer({"name": model.name, "ready": True})


async def model_metadata(request: Request, serving: Serving) -> Response:
    """The model's inputs and outputs: name, datatype and shape (-1: any size)."""
    model = served_model(serving, request)
    inputs, outputs = tensors(model)
    versions = list(serving.registry.versions[model.name])
    return json_answer(
        {"name": model.name, "versions": versions, "platform": PLATFORM, "inputs": inputs, "outputs": outputs}
    )


async def infer(request: Request, serving: Serving) -> Response:
    """Run the model on the request's inputs; JSON or binary tensors, as the request asks."""
    arrived = time.monotonic()
    if request.headers.get("content-encoding", "identity").lower() != "identity":
        raise UnsupportedMediaType("compressed inference requests are not accepted; send them uncompressed")
    model = served_model(serving, request)
    with serving.registry.intake.receiving():
        req = oip.read_request(await request.body(), request.headers.get(oip.HEADER_LENGTH))
        deadline = request_deadline(request, serving.settings, oip_timeout(req.parameters), arrived=arrived)
        if model.task == TRANSLATION:
            outputs = await _translate(request, serving, model, req, deadline)
        else:
            outputs = await _classify(request, serving, model, req, deadline)
    return oip.write_response(req, model.name, model.version, outputs)


def _one_input(req: oip.InferRequest, names: tuple[str, ...], model: str) -> oip.Tensor:
    if len(req.inputs) != 1 or next(iter(req.inputs)) not in names:
        raise InvalidField(f"model {model} takes exactly one input, {' or '.join(names)}; got {sorted(req.inputs)}")
    (tensor,) = req.inputs.values()
    if len(tensor.shape) < 1 or tensor.shape[0] < 1:
        raise InvalidField(f"input {tensor.name!r} needs at least one row")
    return tensor


def _wanted(req: oip.InferRequest, available: list[str]) -> list[str]:
    if not req.outputs:
        return available
    unknown = set(req.outputs) - set(available)
    if unknown:
        raise InvalidField(f"no output {sorted(unknown)}; this request can answer {available}")
    return list(req.outputs)


async def _classify(
    request: Request, serving: Serving, model: ServedModel, req: oip.InferRequest, deadline: float
) -> list:
    classifier, batcher, settings = model.classifier, model.batcher, serving.settings
    assert classifier is not None and batcher is not None  # a ready classifier has both
    tensor = _one_input(req, ("images", "pixels"), model.name)
    attention = req.parameters.get("return_attention", False) is True
    if attention and classifier.attention is None:
        raise InvalidField(f"model {model.name} exports no attention output; omit return_attention")
    if tensor.shape[0] > settings.max_images_per_request:
        raise InvalidField(f"{tensor.shape[0]} images in one request; at most {settings.max_images_per_request}")
    if tensor.name == "images":
        if tensor.datatype != "BYTES" or len(tensor.shape) != 1:
            raise InvalidField("input 'images' is BYTES [N]: one encoded image file per row")
        files = [_image_bytes(v, i, tensor) for i, v in enumerate(tensor.data)]
        rows = pixels = await decode_images(files, classifier, serving.decoder)
        future = batcher.submit(rows, attention=attention, deadline=deadline)
    else:
        if tensor.datatype != "FP32" or list(tensor.shape[1:]) != list(classifier.input_shape):
            raise InvalidField(f"input 'pixels' is FP32 [N, {', '.join(map(str, classifier.input_shape))}]")
        rows = np.ascontiguousarray(tensor.data, np.float32)
        if not np.isfinite(rows).all():
            raise InvalidField("input 'pixels' holds NaN or infinite values")
        pixels = classifier.preprocessing.denormalize(rows) if attention else rows
        future = batcher.submit(rows, attention=attention, prepared=True, deadline=deadline)
    ranked = await answer_or_disconnect(future, request.receive, future.cancel)
    outputs = []
    for name in _wanted(req, ["probabilities", *(["attention_id"] if attention else [])]):
        if name == "attention_id":
            outputs.append(
                (name, "BYTES", await _attention_ids(request, classifier, ranked, pixels, serving, attention))
            )
            continue
        k = req.outputs.get(name, {}).get("classification")
        if not k:
            outputs.append((name, "FP64", ranked.probabilities))
            continue
        limit = min(settings.max_top_k, len(classifier.labels))
        if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= limit:
            raise InvalidField(f"classification: must be an integer from 1 to {limit}")
        labels = [[f"{t['score']}:{t['index']}:{t['label']}" for t in top] for top in classifier.top_k(ranked, k)]
        outputs.append((name, "BYTES", np.array(labels, dtype=object)))
    return outputs


def _image_bytes(value: bytes, index: int, tensor: oip.Tensor) -> bytes:
    """Binary rows are the file itself; JSON rows are base64 text (JSON cannot hold raw bytes)."""
    if "binary_data_size" in tensor.parameters:
        return value
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as e:
        raise InvalidBase64(f"images[{index}]: in JSON, an image is base64 text ({e})") from e


async def _attention_ids(
    request: Request, classifier, ranked, pixels: np.ndarray, serving: Serving, asked: bool
) -> np.ndarray:
    if not asked:
        raise InvalidField("output 'attention_id' needs the request parameter return_attention: true")
    results = [{"top_k": top} for top in classifier.top_k(ranked, 1)]
    store = attention_store(request, serving.attention)
    await attach_attention(results, ranked.attention, pixels, classifier, ClassifyOptions(), store)
    return np.array([r.get("attention_id") or "" for r in results], dtype=object)


async def _translate(
    request: Request, serving: Serving, model: ServedModel, req: oip.InferRequest, deadline: float
) -> list:
    tensor = _one_input(req, ("text",), model.name)
    if tensor.datatype != "BYTES" or len(tensor.shape) != 1:
        raise InvalidField("input 'text' is BYTES [N]: one UTF-8 text per row")
    if tensor.shape[0] > serving.settings.max_texts_per_request:
        raise InvalidField(f"{tensor.shape[0]} texts in one request; at most {serving.settings.max_texts_per_request}")
    try:
        texts = [v.decode("utf-8") for v in tensor.data]
    except UnicodeDecodeError as e:
        raise InvalidField(f"input 'text' is not UTF-8: {e}") from e
    options = {k: v for k, v in req.parameters.items() if k in DECODING_PARAMETERS}
    body = validated(TranslateRequest, {"texts": texts, "model": model.name, **options})
    result = await translate_texts(request, serving, model, body, deadline)
    rows = result["results"]
    outputs = []
    for name in _wanted(req, ["translation", *(["attention_id"] if body.return_attention else [])]):
        if name == "attention_id":
            if not body.return_attention:
                raise InvalidField("output 'attention_id' needs the request parameter return_attention: true")
            outputs.append((name, "BYTES", np.array([r.get("attention_id") or "" for r in rows], dtype=object)))
        elif body.num_return_sequences > 1:
            nbest = [[h["translation"] for h in r["nbest"]] for r in rows]
            outputs.append((name, "BYTES", np.array(nbest, dtype=object)))
        else:
            outputs.append((name, "BYTES", np.array([r["translation"] for r in rows], dtype=object)))
    return outputs


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
    errors = {404: "No such model or version.", 503: "Not ready, or the queue is full (`Retry-After`)."}
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
