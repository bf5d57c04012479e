"""Domain errors with stable codes, and the one function that builds an error answer.

Clients branch on ``error.code`` (stable snake_case), people read ``error.message``. Every answer
that is not a success, validation errors, unknown routes and unexpected exceptions included, has
the body ``{"error": {"code": ..., "message": ...}}`` and never a stack trace; under ``/v2``, where
the Open Inference Protocol's clients read it, the protocol's ``{"error": "<message>"}`` instead
(``error_format``). Which exception becomes which answer is decided in one place,
``service/http/router.py`` (and, for exceptions nobody expected, ``service/http/middleware.py``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable

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


class InvalidContentLength(ServiceError):
    status, code = 400, "invalid_content_length"


class InvalidMultipart(ServiceError):
    status, code = 400, "invalid_multipart"


class InvalidTimeout(ServiceError):
    """``X-Request-Timeout`` or the OIP ``timeout`` parameter is not a positive number."""

    status, code = 400, "invalid_timeout"


class ModelNotFound(ServiceError):
    status, code = 404, "model_not_found"


class AttentionNotFound(ServiceError):
    status, code = 404, "attention_not_found"


class RequestTimeout(ServiceError):
    """The request's body did not arrive within ``ATTNSERVE_BODY_TIMEOUT_S`` (a stalled or trickling
    client); the answer closes the connection."""

    status, code = 408, "request_timeout"


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


class DeadlineExceeded(ServiceError):
    """The request's deadline passed before its answer was ready: it was dropped from its queue before
    compute, or left the running decode batch at the next step."""

    status, code = 504, "deadline_exceeded"


def error_body(code: str, message: str) -> bytes:
    return json.dumps({"error": {"code": code, "message": message}}).encode()


def error_response(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> Response:
    """The only way the service builds an error answer, so every one has the same shape."""
    return Response(error_body(code, message), status_code=status, headers=headers, media_type="application/json")


def protocol_error_response(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> Response:
    """The Open Inference Protocol's error answer, ``{"error": "<message>"}`` (``code`` stays in the log)."""
    body = json.dumps({"error": message}).encode()
    return Response(body, status_code=status, headers=headers, media_type="application/json")


ErrorFormat = Callable[[int, str, str, "dict[str, str] | None"], Response]
PROTOCOL_PREFIX = "/v2"


def is_protocol_path(path: str) -> bool:
    """Whether ``path`` is under ``/v2``, the Open Inference Protocol's, whether a route serves it or not."""
    return path == PROTOCOL_PREFIX or path.startswith(PROTOCOL_PREFIX + "/")


def error_format(path: str) -> ErrorFormat:
    """How an error answer to ``path`` is built, whatever failed and wherever: with the protocol's body
    under ``/v2`` (Triton's clients cannot read any other), with the service's everywhere else."""
    return protocol_error_response if is_protocol_path(path) else error_response


def error_answer(path: str, error: ServiceError) -> Response:
    """``error`` as the answer to a request for ``path``, outside the router (middleware)."""
    return error_format(path)(error.status, error.code, error.message, error.headers)


def internal_error_response(path: str = "/") -> Response:
    message = "internal server error; the request id identifies it in the logs"
    return error_format(path)(500, "internal_error", message, None)


def log_server_error(exc: ServiceError) -> None:
    """5xx answers are logged (the client sees only the message; the request id ties the two)."""
    if exc.status >= 500:
        log.warning("answering %s %s: %s", exc.status, exc.code, exc.message)
