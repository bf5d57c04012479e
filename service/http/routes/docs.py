"""``GET /openapi.json`` (built from the route declarations), ``GET /docs`` (Swagger UI) and ``GET /redoc``.

Both pages load their scripts and styles from this service (``/docs/assets/``: the files the
``fastapi-offline`` package installs), never from a CDN, so they work on an air-gapped cluster.
"""

from __future__ import annotations

from pathlib import Path

import fastapi_offline
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from starlette.requests import Request
from starlette.responses import Response
from starlette.staticfiles import StaticFiles

from service.core.serving import Serving
from service.http.common import JSON_TYPE, dump_json
from service.http.router import Route

ASSETS = "/docs/assets"
_FILES = StaticFiles(directory=Path(fastapi_offline.__file__).parent / "static")


async def openapi_json(request: Request, serving: Serving) -> Response:
    return Response(dump_json(request.app.openapi()), media_type=JSON_TYPE)


async def swagger_ui(request: Request, serving: Serving) -> Response:
    return get_swagger_ui_html(
        openapi_url="/openapi.json",
        title="attnserve - Swagger UI",
        swagger_js_url=f"{ASSETS}/swagger-ui-bundle.js",
        swagger_css_url=f"{ASSETS}/swagger-ui.css",
        swagger_favicon_url=f"{ASSETS}/favicon.png",
    )


async def redoc(request: Request, serving: Serving) -> Response:
    return get_redoc_html(
        openapi_url="/openapi.json",
        title="attnserve - ReDoc",
        redoc_js_url=f"{ASSETS}/redoc.standalone.js",
        redoc_favicon_url=f"{ASSETS}/favicon.png",
        with_google_fonts=False,
    )


async def asset(request: Request, serving: Serving) -> Response:
    return await _FILES.get_response(request.path_params["path"], request.scope)


ROUTES = [
    Route("GET", "/openapi.json", openapi_json, documented=False, access="open"),
    Route("GET", "/docs", swagger_ui, documented=False, access="open"),
    Route("GET", "/redoc", redoc, documented=False, access="open"),
    Route("GET", ASSETS + "/{path:path}", asset, documented=False, access="open"),
]
