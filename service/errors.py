"""Domain errors with stable codes: each an exception with the HTTP status it is answered with.

Clients branch on ``error.code`` (stable snake_case), people read ``error.message``. Each transport
turns an error into its answer in one place: HTTP into the body ``{"error": {"code": ...,
"message": ...}}`` with the status (``service/http/errors.py``, used by ``service/http/router.py``),
gRPC into the status code of that HTTP status (``service/grpc/calls.py``); never a stack trace.
"""

from __future__ import annotations

import logging

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


def log_server_error(exc: ServiceError) -> None:
    """5xx answers are logged (the client sees only the message; the request id ties the two)."""
    if exc.status >= 500:
        log.warning("answering %s %s: %s", exc.status, exc.code, exc.message)
