"""Error answers over HTTP: the one function that builds them, so every one has the same shape.

Every answer that is not a success, validation errors, unknown routes and unexpected exceptions
included, has the body ``{"error": {"code": ..., "message": ...}}`` with the error's status and
never a stack trace; under ``/v2``, where the Open Inference Protocol's clients read it, the
protocol's ``{"error": "<message>"}`` instead (``error_format``). Which exception becomes which
answer is decided in one place, ``service/http/router.py`` (and, for exceptions nobody expected,
``service/http/middleware.py``).
"""

from __future__ import annotations

import json
from collections.abc import Callable

from starlette.responses import Response

from service.errors import ServiceError


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
