"""One exception class per way a call can fail, built from the service's JSON error body.

The service answers every failure with ``{"error": {"code": "<snake_case>", "message": "..."}}``
and an ``X-Request-ID`` header; each exception carries those, plus the HTTP status, so callers can
catch a class (``except OverloadedError``), branch on ``error.code``, or quote the request id when
reporting a problem.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime

import httpx

__all__ = [
    "APIConnectionError",
    "APIStatusError",
    "APITimeoutError",
    "AttnserveError",
    "AuthenticationError",
    "BadRequestError",
    "InternalServerError",
    "InvalidFieldError",
    "NotFoundError",
    "OverloadedError",
    "PayloadTooLargeError",
    "QuotaExceededError",
    "ServiceUnavailableError",
    "UnsupportedMediaTypeError",
]


class AttnserveError(Exception):
    """Base of every error the client raises; ``except AttnserveError`` catches them all."""

    status: int | None = None

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        code: str | None = None,
        request_id: str | None = None,
        retry_after: float | None = None,
        response: httpx.Response | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status if status is not None else type(self).status
        self.code = code
        self.request_id = request_id
        self.retry_after = retry_after
        self.response = response

    def __str__(self) -> str:
        head = " ".join(str(part) for part in (self.status, self.code) if part is not None)
        tail = f" (request id {self.request_id})" if self.request_id else ""
        return f"{head}: {self.message}{tail}" if head else f"{self.message}{tail}"


class APIConnectionError(AttnserveError):
    """The service could not be reached, or the connection broke before the answer was complete."""


class APITimeoutError(APIConnectionError):
    """No answer within the client's ``timeout``."""


class APIStatusError(AttnserveError):
    """The service answered with an error status; ``status``, ``code`` and ``message`` say which."""


class BadRequestError(APIStatusError):
    """400: the body could not be read (undecodable image, invalid base64, JSON or multipart)."""

    status = 400


class AuthenticationError(APIStatusError):
    """401: the service requires an API key (``api_key=`` or ``ATTNSERVE_API_KEY``) and got none, or a wrong one."""

    status = 401


class NotFoundError(APIStatusError):
    """404: unknown model, unknown or expired attention id, unknown route."""

    status = 404


class RequestTimeoutError(APIStatusError):
    """408: the request's body did not arrive in time (``ATTNSERVE_BODY_TIMEOUT_S``); the connection is closed."""

    status = 408


class PayloadTooLargeError(APIStatusError):
    """413: body, image or text over the service's limits."""

    status = 413


class UnsupportedMediaTypeError(APIStatusError):
    """415: a content type the service does not accept."""

    status = 415


class InvalidFieldError(APIStatusError):
    """422: a field out of range or unknown (``top_k`` too large, empty text, bad layer or head, ...)."""

    status = 422


class InternalServerError(APIStatusError):
    """5xx other than 503: inference failed, or something unexpected (the request id finds it in the logs)."""

    status = 500


class DeadlineExceededError(APIStatusError):
    """504 ``deadline_exceeded``: the request's deadline passed (``timeout=`` / ``X-Request-Timeout``) before
    it was computed or while it was decoded; nothing of it was kept."""

    status = 504


class ServiceUnavailableError(APIStatusError):
    """503: the model is loading, the service is shutting down, or a dependency is unavailable."""

    status = 503


class OverloadedError(ServiceUnavailableError):
    """429, or 503 ``overloaded``: the queue is full; ``retry_after`` says when to come back."""

    status = 503


class QuotaExceededError(OverloadedError):
    """429 ``quota_exceeded``: the API key (or, without keys, the client address) used its quota for now;
    ``retry_after`` says when its window ends (none: the request alone is larger than the whole quota). Retried
    after it like a full queue when it is within the client's ``max_retry_after``."""

    status = 429


# The service's stable error codes (service/errors.py). The code decides where it is known, so an
# ``error`` event in the middle of a stream, which has no status of its own, still gets its class.
_BY_CODE: dict[str, type[APIStatusError]] = {
    **dict.fromkeys(
        (
            "undecodable_image",
            "invalid_base64",
            "invalid_json",
            "invalid_content_length",
            "invalid_multipart",
            "invalid_timeout",
            "model_load_failed",
            "cors_refused",
        ),
        BadRequestError,
    ),
    **dict.fromkeys(("model_not_found", "attention_not_found", "not_found"), NotFoundError),
    **dict.fromkeys(("body_too_large", "image_too_large", "text_too_long"), PayloadTooLargeError),
    "unsupported_media_type": UnsupportedMediaTypeError,
    "unauthorized": AuthenticationError,
    "request_timeout": RequestTimeoutError,
    "deadline_exceeded": DeadlineExceededError,
    "invalid_field": InvalidFieldError,
    **dict.fromkeys(("inference_failed", "internal_error"), InternalServerError),
    "overloaded": OverloadedError,
    "quota_exceeded": QuotaExceededError,
    **dict.fromkeys(
        ("model_not_ready", "not_ready", "shutting_down", "attention_store_unavailable"), ServiceUnavailableError
    ),
}
_BY_STATUS: dict[int, type[APIStatusError]] = {
    400: BadRequestError,
    401: AuthenticationError,
    404: NotFoundError,
    408: RequestTimeoutError,
    413: PayloadTooLargeError,
    415: UnsupportedMediaTypeError,
    422: InvalidFieldError,
    429: OverloadedError,
    503: ServiceUnavailableError,
}  # no 504: a proxy's gateway timeout is not the service's deadline (that one has its code)


def error_class(status: int | None, code: str | None) -> type[APIStatusError]:
    """The class for a status and error code: a known code first, then the status."""
    if code in _BY_CODE:
        return _BY_CODE[code]
    if status in _BY_STATUS:
        return _BY_STATUS[status]
    return InternalServerError if status is None or status >= 500 else APIStatusError


def from_body(body: object, *, status: int | None, request_id: str | None) -> APIStatusError:
    """The exception for an error body (also used for an ``error`` event in the middle of a stream)."""
    detail = body.get("error") if isinstance(body, dict) else None
    code = detail.get("code") if isinstance(detail, dict) else None
    message = detail.get("message") if isinstance(detail, dict) else None
    cls = error_class(status, code)
    return cls(
        str(message or "the service answered an error without a message"),
        status=status or cls.status,
        code=code,
        request_id=request_id,
    )


def from_response(response: httpx.Response) -> APIStatusError:
    """The exception for an error answer; its body must have been read."""
    try:
        body = response.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        body = {"error": {"message": response.text[:500] or response.reason_phrase}}
    error = from_body(body, status=response.status_code, request_id=response.headers.get("x-request-id"))
    error.retry_after = retry_after_seconds(response.headers.get("retry-after"))
    error.response = response
    return error


def from_transport(exc: httpx.TransportError, request_id: str | None) -> APIConnectionError:
    """A connection-level failure (refused, reset, timed out) as the client's own exception."""
    cls = APITimeoutError if isinstance(exc, httpx.TimeoutException) else APIConnectionError
    what = "timed out" if cls is APITimeoutError else "connection failed"
    return cls(f"{what}: {exc or type(exc).__name__}", request_id=request_id)


def retry_after_seconds(value: str | None) -> float | None:
    """``Retry-After`` as seconds: either a number of seconds or an HTTP date."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return max(0.0, (when - datetime.now(timezone.utc)).total_seconds())
