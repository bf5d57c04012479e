"""The OpenAPI document, built from the same ``Route`` declarations the router serves.

Request bodies, query parameters and answers are described by the pydantic models the handlers
validate and answer with; their JSON schemas go to ``components/schemas``. A route cannot be
served without being documented, nor documented differently from how it is served.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from service.http.router import Route
from service.schemas import ErrorResponse

JSON = "application/json"
REF = "#/components/schemas/{model}"


def openapi_document(routes: list[Route], *, title: str, version: str, summary: str) -> dict[str, Any]:
    documented = [r for r in routes if r.documented]
    refs, components = _schemas(documented)
    paths: dict[str, dict] = {}
    names = [r.handler.__name__ for r in documented]
    for route in documented:
        op = _operation(route, refs)
        if names.count(route.handler.__name__) > 1:  # one handler on several paths: ids must stay unique
            op["operationId"] = "_".join([route.handler.__name__, *re.findall(r"\w+", route.path)])
        paths.setdefault(route.path, {})[route.method.lower()] = op
    return {
        "openapi": "3.1.0",
        "info": {"title": title, "version": version, "summary": summary},
        "paths": paths,
        "components": {"schemas": components},
    }


def _schemas(routes: list[Route]) -> tuple[dict, dict]:
    """Every model the routes name, in the mode it is used in, as ``$ref``s into one components table."""
    used: list[tuple[type[BaseModel], str]] = [(ErrorResponse, "serialization")]
    for route in routes:
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


def _operation(route: Route, refs: dict) -> dict[str, Any]:
    doc = (route.handler.__doc__ or "").strip()
    op: dict[str, Any] = {"tags": list(route.tags), "summary": route.summary, "operationId": route.handler.__name__}
    if doc:
        op["description"] = " ".join(doc.split())
    params = [{"name": p, "in": "path", "required": True, "schema": {"type": "string"}} for p in route.path_params]
    params += _query_parameters(route.query)
    if params:
        op["parameters"] = params
    if route.body is not None:
        op["requestBody"] = {"required": True, "content": _content(route.body, refs, "validation")}
    op["responses"] = _responses(route, refs)
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


def _responses(route: Route, refs: dict) -> dict[str, Any]:
    content = _content(route.response, refs, "serialization") if route.response is not None else {JSON: {}}
    out: dict[str, Any] = {"200": {"description": "Successful answer.", "content": content}}
    error = {JSON: {"schema": refs[(ErrorResponse, "serialization")]}}
    for status, description in sorted(route.errors.items()):
        out[str(status)] = {"description": description, "content": error}
    for status, extra in route.extra_responses.items():
        content = {JSON: {"schema": refs[(extra["model"], "serialization")]}} if "model" in extra else extra["content"]
        out[str(status)] = {"description": extra["description"], "content": content}
    return out
