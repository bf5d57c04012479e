"""Cross-origin requests from the browsers of an allowlist of origins (``ATTNSERVE_CORS_ORIGINS``).

Starlette's CORS middleware, with the service's JSON error body for a refused preflight (the protocol's
under ``/v2``). With no origins configured it is not installed at all: browsers then refuse
cross-origin calls, as before.
"""

from __future__ import annotations

from collections.abc import Sequence

from starlette.datastructures import Headers
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from service.errors import ServiceError
from service.http.errors import error_answer

ALLOWED_HEADERS = (
    "Authorization",
    "Content-Type",
    "X-Request-ID",
    "X-Request-Timeout",
    "Inference-Header-Content-Length",
)
EXPOSED_HEADERS = (
    "X-Request-ID",
    "Retry-After",
    "RateLimit",
    "RateLimit-Policy",
    "traceparent",
    "Inference-Header-Content-Length",
    "Content-Disposition",
)


class CorsRefused(ServiceError):
    status, code = 400, "cors_refused"


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

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "OPTIONS":
            headers = Headers(scope=scope)
            if "origin" in headers and "access-control-request-method" in headers:
                await self._preflight(headers, scope["path"])(scope, receive, send)
                return
        await super().__call__(scope, receive, send)

    def _preflight(self, request_headers: Headers, path: str) -> Response:
        """Starlette's preflight answer; a refusal in the error form of ``path``, saying what was refused."""
        response = self.preflight_response(request_headers)
        if response.status_code != 400:
            return response
        refused = bytes(response.body).decode()  # "Disallowed CORS origin, method": what was refused
        return error_answer(path, CorsRefused(f"{refused} (allowed origins: {', '.join(self.allow_origins)})"))
