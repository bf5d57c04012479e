"""Domain errors with stable codes, and the one place that turns any failure into an HTTP answer.

Clients branch on ``error.code`` (stable snake_case), people read ``error.message``. Every answer
that is not a success, FastAPI's own validation errors, unknown routes and unexpected exceptions
included, has the body ``{"error": {"code": ..., "message": ...}}`` and never a stack trace.
"""

from __future__ import annotations

import json
import logging
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

log = logging.getLogger("attnserve.errors")


class ServiceError(Exception):
    """Base of every error the service answers on purpose; subclasses fix the status and code."""

    status: int = 500
    code: str = "internal_error"

    def __init__(self, message: str, *, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.headers = headers or {}


class UndecodableImage(ServiceError):
    status, code = 400, "undecodable_image"


class InvalidBase64(ServiceError):
    status, code = 400, "invalid_base64"


class InvalidJSON(ServiceError):
    status, code = 400, "invalid_json"


class InvalidMultipart(ServiceError):
    status, code = 400, "invalid_multipart"


class ModelNotFound(ServiceError):
    status, code = 404, "model_not_found"


class AttentionNotFound(ServiceError):
    status, code = 404, "attention_not_found"


class BodyTooLarge(ServiceError):
    status, code = 413, "body_too_large"


class ImageTooLarge(ServiceError):
    status, code = 413, "image_too_large"


class TextTooLong(ServiceError):
    status, code = 413, "text_too_long"


class UnsupportedMediaType(ServiceError):
    status, code = 415, "unsupported_media_type"


class InvalidField(ServiceError):
    status, code = 422, "invalid_field"


class Overloaded(ServiceError):
    """The model's queue is full; the client should retry after ``Retry-After`` seconds."""

    status, code = 503, "overloaded"


class ModelNotReady(ServiceError):
    status, code = 503, "model_not_ready"


class ShuttingDown(ServiceError):
    status, code = 503, "shutting_down"


class AttentionStoreUnavailable(ServiceError):
    """The shared attention store (Redis) cannot be reached, or cannot hold a record this large."""

    status, code = 503, "attention_store_unavailable"


class InferenceFailed(ServiceError):
    """The batch this request was part of failed inside onnxruntime; its batch-mates got the same."""

    status, code = 500, "inference_failed"


# Codes for the HTTP errors Starlette raises itself (unknown route, wrong method, ...).
_HTTP_CODES = {404: "not_found", 405: "method_not_allowed", 413: "body_too_large", 415: "unsupported_media_type"}


def error_body(code: str, message: str) -> bytes:
    return json.dumps({"error": {"code": code, "message": message}}).encode()


def error_response(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> Response:
    """The only way the service builds an error answer, so every one has the same shape."""
    return Response(error_body(code, message), status_code=status, headers=headers, media_type="application/json")


def internal_error_response() -> Response:
    return error_response(500, "internal_error", "internal server error; the request id identifies it in the logs")


def _describe_validation(errors: list[dict[str, Any]]) -> str:
    """``body.top_k: Input should be less than or equal to 10; ...`` from pydantic's error list."""
    parts = []
    for e in errors[:10]:
        where = ".".join(str(p) for p in e.get("loc", ()) if p != "body") or "body"
        parts.append(f"{where}: {e.get('msg', 'invalid')}")
    more = f" (and {len(errors) - 10} more)" if len(errors) > 10 else ""
    return "; ".join(parts) + more


def service_error_response(exc: ServiceError) -> Response:
    if exc.status >= 500:
        log.warning("answering %s %s: %s", exc.status, exc.code, exc.message)
    return error_response(exc.status, exc.code, exc.message, exc.headers)


def validation_error_response(exc: RequestValidationError) -> Response:
    return error_response(422, InvalidField.code, _describe_validation(list(exc.errors())))


async def _service_error(request: Request, exc: ServiceError) -> Response:
    return service_error_response(exc)


async def _validation_error(request: Request, exc: RequestValidationError) -> Response:
    return validation_error_response(exc)


async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
    code = _HTTP_CODES.get(exc.status_code) or _status_code_name(exc.status_code)
    message = exc.detail if isinstance(exc.detail, str) else HTTPStatus(exc.status_code).phrase
    if exc.status_code == 404 and message == "Not Found":
        message = f"no route {request.method} {request.url.path}"
    return error_response(exc.status_code, code, message, getattr(exc, "headers", None))


async def _unexpected_error(request: Request, exc: Exception) -> Response:
    log.error("unhandled exception", exc_info=exc)
    return internal_error_response()


def _status_code_name(status: int) -> str:
    try:
        return HTTPStatus(status).phrase.lower().replace(" ", "_").replace("-", "_")
    except ValueError:
        return "http_error"


def install_error_handlers(app: FastAPI) -> None:
    """Route every failure through ``error_response``; called once by the app factory."""
    app.add_exception_handler(ServiceError, _service_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _unexpected_error)
