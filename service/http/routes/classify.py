"""``POST /classify``: images in (JSON base64 or multipart files), top-k labels out.

One handler for both encodings, so both share validation, decoding and batching exactly and can
never disagree. The handler reads the body into images and options; the classification itself
(decode, queue, rank, attention) is ``service/core/classify.py``'s, which the Open Inference
Protocol's ``infer`` runs too. A client that disconnects before its answer is ready has its images
dropped before compute.
"""

from __future__ import annotations

import base64
import binascii

from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import Response

from service.core import classify as classification
from service.core.response_cache import CacheReport
from service.core.serving import Serving
from service.errors import ImageTooLarge, InvalidBase64, InvalidField, InvalidMultipart, UnsupportedMediaType
from service.http.common import JSON_TYPE, dump_json, http_caller, parse_json_body
from service.http.deadlines import request_deadline
from service.http.openapi import CACHE_HEADERS
from service.http.router import Route
from service.schemas import ClassifyJSONRequest, ClassifyOptions, ClassifyResponse, bounded_by, validated
from service.settings import Settings

MULTIPART_TYPE = "multipart/form-data"
FORM_OPTION_FIELDS = ("top_k", "model", "return_attention", "rollout_fusion", "priority")


async def classify(request: Request, serving: Serving) -> Response:
    """Top-k labels with softmax scores for each image, in request order."""
    deadline = request_deadline(request, serving.settings)
    caller, report = http_caller(request), CacheReport()
    with serving.registry.intake.receiving():
        images, options = await _read_request(request, serving.settings)
        queued = await classification.queue(serving, caller, images, options, deadline, report)
    body = await classification.answer(serving, caller, queued, options)
    return Response(dump_json(body), media_type=JSON_TYPE, headers=report.headers())


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
        headers=CACHE_HEADERS,
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
