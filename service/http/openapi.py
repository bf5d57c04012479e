"""The OpenAPI document, built from the same ``Route`` declarations the router serves.

Request bodies, query parameters and answers are described by the pydantic models the handlers
validate and answer with; their JSON schemas go to ``components/schemas``. A route cannot be
served without being documented, nor documented differently from how it is served.

What depends on the running service is written in from it: the limits its settings set (fields
marked with ``service.schemas.bounded_by``), and, with API keys on, the bearer scheme and the 401
of every route the router guards. The answers every route of a kind gives are added here, once:
408 and 413 where there is a body (``BodyLimitMiddleware``), the ``X-Request-Timeout`` header with
its 400 and 504 where the route queues work under a deadline (``service/http/deadlines.py``).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from service.http.deadlines import TIMEOUT_PATTERN
from service.http.router import Route
from service.schemas import SETTINGS_KEY
from service.settings import Settings

JSON = "application/json"
REF = "#/components/schemas/{model}"
BEARER = "bearer"

BODY_ERRORS = {
    408: "The body did not arrive within `ATTNSERVE_BODY_TIMEOUT_S`; the connection is closed.",
    413: "Body over `ATTNSERVE_MAX_BODY_BYTES`.",
}
DEADLINE_ERRORS = {
    400: "An invalid `X-Request-Timeout`.",
    504: "The request's deadline passed before its answer was ready.",
}
UNAUTHORIZED = "No API key, or one that is not accepted (`WWW-Authenticate: Bearer`)."
TIMEOUT_HEADER = {
    "name": "X-Request-Timeout",
    "in": "header",
    "required": False,
    "description": "Seconds this request may take (a decimal number above 0, such as `2.5`), instead of "
    "`ATTNSERVE_REQUEST_TIMEOUT_S`; at most `ATTNSERVE_MAX_REQUEST_TIMEOUT_S`. Past it: 504 `deadline_exceeded`.",
    "schema": {"type": "string", "pattern": TIMEOUT_PATTERN},
}
CACHE_HEADERS = {  # the response cache's report (service/core/response_cache.py CacheReport), with the cache on
    "X-Cache": {
        "description": "With `ATTNSERVE_RESPONSE_CACHE` on: `hit` (every text or image from the cache), `miss` "
        "(none), `partial`, `bypass` (attention asked for: never cached) or `error` (Redis failed: computed).",
        "schema": {"type": "string", "enum": ["hit", "miss", "partial", "bypass", "error"]},
    },
    "X-Cache-Hits": {
        "description": "With `hit`, `miss` or `partial`: texts or images answered from the cache, of all, as `n/N`.",
        "schema": {"type": "string", "pattern": "^[0-9]+/[0-9]+$"},
    },
}
RESPONSE_HEADERS = {
    401: {"WWW-Authenticate": {"required": True, "schema": {"type": "string"}}},
    503: {"Retry-After": {"description": "Seconds to wait before retrying.", "schema": {"type": "string"}}},
}


def openapi_document(
    routes: list[Route],
    *,
    title: str,
    version: str,
    summary: str,
    settings: Settings | None = None,
    guarded: Callable[[Route], bool] = lambda route: False,
) -> dict[str, Any]:
    """The document of ``routes``; ``settings`` fill in the limits (without them they are left out),
    ``guarded`` says which routes need an API key (the router's ``guards``)."""
    documented = [r for r in routes if r.documented]
    refs, components = _schemas(documented)
    paths: dict[str, dict] = {}
    names = [r.handler.__name__ for r in documented]
    for route in documented:
        op = _operation(route, refs, guarded(route))
        if names.count(route.handler.__name__) > 1:  # one handler on several paths: ids must stay unique
            op["operationId"] = "_".join([route.handler.__name__, *re.findall(r"\w+", route.path)])
        paths.setdefault(route.path, {})[route.method.lower()] = op
    doc: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {"title": title, "version": version, "summary": summary},
        "paths": paths,
        "components": {"schemas": components},
    }
    if any(guarded(r) for r in documented):
        doc["components"]["securitySchemes"] = {
            BEARER: {"type": "http", "scheme": "bearer", "description": "An API key (see docs/security.md)."}
        }
    return _with_limits(doc, settings)


def _schemas(routes: list[Route]) -> tuple[dict, dict]:
    """Every model the routes name, in the mode it is used in, as ``$ref``s into one components table."""
    used: list[tuple[type[BaseModel], str]] = []
    for route in routes:
        used.append((route.error_model, "serialization"))
        used += [(m, "validation") for m in _models(route.body)]
        used += [(m, "serialization") for m in _models(route.response)]
        used += [(extra["model"], "serialization") for extra in route.extra_responses.values() if "model" in extra]
    keys, top = models_json_schema(list(dict.fromkeys(used)), ref_template=REF)
    return keys, top.get("$defs", {})


def _models(declared: type[BaseModel] | dict | None) -> list[type[BaseModel]]:
    if isinstance(declared, type):
        return [declared]
    return [c["schema"] for c in (declared or {}).values() if isinstance(c.get("schema"), type)]


def _content(declared: type[BaseModel] | dict, refs: dict, mode: str) -> dict[str, Any]:
    """``media type -> {"schema": ...}``, models replaced by their ``$ref``."""
    content = declared if isinstance(declared, dict) else {JSON: {"schema": declared}}
    return {
        media: {**c, "schema": refs[(c["schema"], mode)]} if isinstance(c.get("schema"), type) else c
        for media, c in content.items()
    }


def _operation(route: Route, refs: dict, guarded: bool) -> dict[str, Any]:
    doc = (route.handler.__doc__ or "").strip()
    op: dict[str, Any] = {"tags": list(route.tags), "summary": route.summary, "operationId": route.handler.__name__}
    if doc:
        op["description"] = " ".join(doc.split())
    params = [{"name": p, "in": "path", "required": True, "schema": {"type": "string"}} for p in route.path_params]
    params += _query_parameters(route.query)
    params += copy.deepcopy(list(route.parameters))
    if route.deadline:
        params.append(copy.deepcopy(TIMEOUT_HEADER))
    if params:
        op["parameters"] = params
    if route.body is not None:
        op["requestBody"] = {
            "required": route.body_required,
            "content": copy.deepcopy(_content(route.body, refs, "validation")),
        }
    op["responses"] = _responses(route, refs, guarded)
    if guarded:
        op["security"] = [{BEARER: []}]
    return op


def _query_parameters(model: type[BaseModel] | None) -> list[dict]:
    if model is None:
        return []
    schema = model.model_json_schema(ref_template=REF)
    required = set(schema.get("required", ()))
    out = []
    for name, prop in schema.get("properties", {}).items():
        description = prop.pop("description", None)
        prop.pop("title", None)
        param = {"name": name, "in": "query", "required": name in required, "schema": prop}
        if description:
            param["description"] = description
        out.append(param)
    return out


def _errors(route: Route, guarded: bool) -> dict[int, str]:
    """The route's own error descriptions, then those of every route of its kind it did not describe."""
    errors = dict(route.errors)
    for applies, common in ((route.body is not None, BODY_ERRORS), (route.deadline, DEADLINE_ERRORS)):
        if applies:
            for status, description in common.items():
                errors.setdefault(status, description)
    if guarded:
        errors[401] = UNAUTHORIZED
    return errors


def _responses(route: Route, refs: dict, guarded: bool) -> dict[str, Any]:
    content = _content(route.response, refs, "serialization") if route.response is not None else {JSON: {}}
    out: dict[str, Any] = {"200": {"description": "Successful answer.", "content": content}}
    if route.headers:
        out["200"]["headers"] = route.headers
    error = {JSON: {"schema": refs[(route.error_model, "serialization")]}}
    for status, description in sorted(_errors(route, guarded).items()):
        out[str(status)] = {"description": description, "content": error}
        if status in RESPONSE_HEADERS:
            out[str(status)]["headers"] = RESPONSE_HEADERS[status]
    for status, extra in route.extra_responses.items():
        content = {JSON: {"schema": refs[(extra["model"], "serialization")]}} if "model" in extra else extra["content"]
        out[str(status)] = {"description": extra["description"], "content": content}
    return dict(sorted(out.items()))


def _with_limits(node: Any, settings: Settings | None) -> Any:
    """``node`` with every ``bounded_by`` marker replaced by the keywords it names, valued from ``settings``.

    A keyword goes on each branch of a nullable field's ``anyOf`` that is not ``null``, where
    documentation tools look for it.
    """
    if isinstance(node, list):
        return [_with_limits(n, settings) for n in node]
    if not isinstance(node, dict):
        return node
    node = {k: _with_limits(v, settings) for k, v in node.items()}
    marker = node.pop(SETTINGS_KEY, None)
    if marker is None or settings is None:
        return node
    keywords = _resolve(marker, settings)
    branches = [b for b in node.get("anyOf", ()) if b.get("type") != "null"]
    for target in branches or [node]:
        _merge(target, keywords)
    return node


def _resolve(marker: dict, settings: Settings) -> dict:
    return {k: _resolve(v, settings) if isinstance(v, dict) else getattr(settings, v) for k, v in marker.items()}


def _merge(target: dict, keywords: dict) -> None:
    for key, value in keywords.items():
        if isinstance(value, dict) and isinstance(target.get(key), dict):
            _merge(target[key], value)
        else:
            target[key] = value
