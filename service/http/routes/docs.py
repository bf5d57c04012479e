"""``GET /openapi.json`` (built from the route declarations) and ``GET /docs`` (Swagger UI on it)."""

from __future__ import annotations

from fastapi.openapi.docs import get_swagger_ui_html
from starlette.requests import Request
from starlette.responses import Response

from service.http.common import JSON_TYPE, dump_json
from service.http.router import Route
from service.http.serving import Serving


async def openapi_json(request: Request, serving: Serving) -> Response:
    return Response(dump_json(request.app.openapi()), media_type=JSON_TYPE)


async def swagger_ui(request: Request, serving: Serving) -> Response:
    return get_swagger_ui_html(openapi_url="/openapi.json", title="attnserve - Swagger UI")


ROUTES = [
    Route("GET", "/openapi.json", openapi_json, documented=False, access="open"),
    Route("GET", "/docs", swagger_ui, documented=False, access="open"),
]
