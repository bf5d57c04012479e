"""Cross-origin requests from the browsers of an allowlist of origins (``ATTNSERVE_CORS_ORIGINS``).

Starlette's CORS middleware, with the service's JSON error body for a refused preflight. With no
origins configured it is not installed at all: browsers then refuse cross-origin calls, as before.
"""

from __future__ import annotations

from collections.abc import Sequence

from starlette.datastructures import Headers
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import Response
from starlette.types import ASGIApp

from service.errors import error_response

ALLOWED_HEADERS = (
    "Authorization",
    "Content-Type",
    "X-Request-ID",
    "X-Request-Timeout",
    "Inference-Header-Content-Length",
)
EXPOSED_HEADERS = ("X-Request-ID", "Retry-After", "Inference-Header-Content-Length", "Content-Disposition")


class Cors(CORSMiddleware):
    def __init__(self, app: ASGIApp, origins: Sequence[str]) -> None:
        super().__init__(
            app,
            allow_origins=list(origins),
            allow_methods=["GET", "POST"],
            allow_headers=list(ALLOWED_HEADERS),
            expose_headers=list(EXPOSED_HEADERS),
            max_age=600,
        )

    def preflight_response(self, request_headers: Headers) -> Response:
        response = super().preflight_response(request_headers)
        if response.status_code != 400:
            return response
        refused = bytes(response.body).decode()  # "Disallowed CORS origin, method": what was refused
        return error_response(400, "cors_refused", f"{refused} (allowed origins: {', '.join(self.allow_origins)})")
