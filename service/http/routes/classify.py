"""``POST /classify``: images in (JSON base64 or multipart files), top-k labels out.

One handler for both encodings, so both share validation, decoding and batching exactly and can
never disagree. The handler decodes the images, then queues them on the model's batcher, which
normalises them as they are queued, runs onnxruntime on an instance thread and ranks each batch
on the event loop; if the client disconnects or the request's deadline passes meanwhile, it is
dropped before compute.
"""

from __future__ import annotations

import base64
import binascii

import numpy as np
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import Response

from service.attention.capture import store_records, vit_record, vit_summary
from service.classifier import Classifier
from service.errors import (
    ImageTooLarge,
    InvalidBase64,
    InvalidField,
    InvalidMultipart,
    ServiceError,
    UnsupportedMediaType,
)
from service.http.common import (
    JSON_TYPE,
    KeyedStore,
    answer_or_disconnect,
    attention_store,
    dump_json,
    parse_json_body,
    validated,
)
from service.http.deadlines import request_deadline
from service.http.router import Route
from service.http.serving import Serving
from service.images import ImageDecoder
from service.schemas import ClassifyJSONRequest, ClassifyOptions, ClassifyResponse, bounded_by
from service.settings import Settings

MULTIPART_TYPE = "multipart/form-data"
FORM_OPTION_FIELDS = ("top_k", "model", "return_attention", "rollout_fusion")


async def classify(request: Request, serving: Serving) -> Response:
    """Top-k labels with softmax scores for each image, in request order."""
    registry, settings, decoder = serving.registry, serving.settings, serving.decoder
    deadline = request_deadline(request, settings)
    with registry.intake.receiving():
        images, options = await _read_request(request, settings)
        served = registry.get(options.model)
        classifier, batcher = served.classifier, served.batcher
        if classifier is None or batcher is None:  # READY models always have both
            raise RuntimeError(f"model {served.key} is ready without a session")
        _check_options(options, classifier, settings)
        rows = await decode_images(images, classifier, decoder)
        future = batcher.submit(rows, attention=options.return_attention, deadline=deadline)
    ranked = await answer_or_disconnect(future, request.receive, future.cancel)
    results = [{"top_k": top} for top in classifier.top_k(ranked, options.top_k)]
    if options.return_attention:  # the batch computed attention, since this request asked for it
        store = attention_store(request, serving.attention)
        await attach_attention(results, ranked.attention, rows, classifier, options, store)
    body = {"model": classifier.name, "version": classifier.version, "results": results}
    return Response(dump_json(body), media_type=JSON_TYPE)


async def attach_attention(
    results: list[dict],
    maps: np.ndarray | None,
    rows: np.ndarray,
    classifier: Classifier,
    options: ClassifyOptions,
    store: KeyedStore,
) -> None:
    spec = classifier.attention
    assert spec is not None and maps is not None  # _check_options refused the request otherwise
    records = []
    for result, attention, pixels in zip(results, maps, rows):
        result["attention"] = vit_summary(spec, attention, options.rollout_fusion)
        records.append(vit_record(classifier.name, classifier.version, spec, attention, pixels, result["top_k"][0]))
    await store_records(store, records, results)


async def _read_request(request: Request, settings: Settings) -> tuple[list[bytes], ClassifyOptions]:
    media_type = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media_type == JSON_TYPE:
        images, options = await _read_json(request, settings)
    elif media_type == MULTIPART_TYPE:
        images, options = await _read_multipart(request, settings)
    else:
        shown = media_type or "none"
        raise UnsupportedMediaType(f"content type {shown!r} is not accepted; send {JSON_TYPE} or {MULTIPART_TYPE}")
    return images, options


def _check_count(images: int, settings: Settings) -> None:
    """Each body reader calls it once, as soon as it knows the count (JSON: before any base64 is decoded)."""
    if images > settings.max_images_per_request:
        raise InvalidField(f"{images} images in one request; at most {settings.max_images_per_request}")


async def _read_json(request: Request, settings: Settings) -> tuple[list[bytes], ClassifyOptions]:
    parsed = parse_json_body(await request.body(), ClassifyJSONRequest)
    _check_count(len(parsed.images), settings)
    images = [_decode_base64(text, i, settings.max_image_bytes) for i, text in enumerate(parsed.images)]
    return images, parsed


def _decode_base64(text: str, index: int, max_bytes: int) -> bytes:
    if text.startswith("data:"):
        header, _, text = text.partition(",")
        if not header.endswith(";base64"):
            raise InvalidBase64(f"images[{index}]: a data URL must be base64-encoded")
    if len(text) // 4 * 3 > max_bytes + 2:
        raise ImageTooLarge(f"images[{index}]: image exceeds the limit of {max_bytes} bytes")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        pass
    try:  # line-wrapped output of the `base64` tool: whitespace is the only thing we forgive
        return base64.b64decode("".join(text.split()), validate=True)
    except (binascii.Error, ValueError) as e:
        raise InvalidBase64(f"images[{index}]: not valid base64 ({e})") from e


async def _read_multipart(request: Request, settings: Settings) -> tuple[list[bytes], ClassifyOptions]:
    try:
        form = await request.form(max_fields=len(FORM_OPTION_FIELDS) + 8, max_part_size=1024)
    except StarletteHTTPException as e:
        raise InvalidMultipart(f"malformed multipart body: {e.detail}") from e
    try:
        images: list[bytes] = []
        fields: dict[str, str] = {}
        for key, value in form.multi_items():
            if key == "file":
                if not isinstance(value, UploadFile):
                    raise InvalidField("`file` must be a file part (curl -F 'file=@image.png')")
                images.append(await value.read())
            elif key in FORM_OPTION_FIELDS:
                if key in fields or isinstance(value, UploadFile):
                    raise InvalidField(f"form field {key!r} must be given once, as text")
                fields[key] = value
            else:
                raise InvalidField(
                    f"unknown form field {key!r}; expected `file` parts and {', '.join(FORM_OPTION_FIELDS)}"
                )
    finally:
        await form.close()
    if not images:
        raise InvalidField("no `file` part in the multipart body")
    _check_count(len(images), settings)
    return images, validated(ClassifyOptions, fields)


def _check_options(options: ClassifyOptions, classifier: Classifier, settings: Settings) -> None:
    if options.return_attention and classifier.attention is None:
        raise InvalidField(f"model {classifier.name} exports no attention output; omit return_attention")
    limit = min(settings.max_top_k, len(classifier.labels))
    if options.top_k > limit:
        raise InvalidField(
            f"top_k: must be at most {limit} (model {classifier.name} has {len(classifier.labels)} labels, "
            f"the service allows {settings.max_top_k})"
        )


async def decode_images(images: list[bytes], classifier: Classifier, decoder: ImageDecoder) -> np.ndarray:
    prep = classifier.preprocessing
    pixels = []
    for i, data in enumerate(images):
        try:
            pixels.append(await decoder.decode(data, prep.image_size, prep.color_mode, prep.resize, prep.resize_size))
        except ServiceError as e:
            if len(images) > 1:
                e.message = f"images[{i}]: {e.message}"
            raise
    return prep.stack(pixels)


def _multipart_schema() -> dict:
    """The multipart form: `file` parts, and ``ClassifyOptions``' fields as text parts (so never null)."""
    fields = {}
    for name, prop in ClassifyOptions.model_json_schema()["properties"].items():
        prop.pop("title", None)
        for branch in prop.pop("anyOf", ()):
            if branch.get("type") != "null":
                prop.update(branch)
        if prop.get("default", "") is None:
            del prop["default"]
        fields[name] = prop
    file = {
        "type": "array",
        "items": {"type": "string", "format": "binary"},
        "minItems": 1,
        "description": "One `file` part per image (a file part: `curl -F file=@image.png`).",
        **bounded_by(maxItems="max_images_per_request"),
    }
    return {
        "type": "object",
        "required": ["file"],
        "properties": {"file": file, **fields},
        "additionalProperties": False,
    }


ROUTES = [
    Route(
        "POST",
        "/classify",
        classify,
        summary="Classify one or more images",
        tags=("classification",),
        body={
            JSON_TYPE: {"schema": ClassifyJSONRequest},
            MULTIPART_TYPE: {"schema": _multipart_schema(), "encoding": {"file": {"contentType": "image/*"}}},
        },
        response=ClassifyResponse,
        deadline=True,
        errors={
            400: "Undecodable image, invalid base64, JSON or multipart body, invalid `X-Request-Timeout`.",
            404: "Unknown model.",
            413: "Body or image too large (bytes or pixels).",
            415: "Content type is neither JSON nor multipart.",
            422: "Invalid field (top_k out of range, too many or no images, an unknown field, ...).",
            500: "Inference failed; the request id identifies it in the logs.",
            503: "Queue full, too many requests in flight, or model not ready; see `Retry-After`.",
            504: "The request's deadline passed before its answer was ready.",
        },
    )
]
