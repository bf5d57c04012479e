"""The router on its own (matching, 404/405, query validation, error mapping) and the OpenAPI document
it is declared with; then the real app: every request, hot routes included, goes through one stack."""

from __future__ import annotations

import asyncio
import base64
import json
import re
from types import SimpleNamespace

import httpx
import pytest
from openapi_spec_validator import validate
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse

from service.core.keys import Keys
from service.errors import InvalidTimeout, Overloaded
from service.http.deadlines import TIMEOUT_PATTERN, header_timeout
from service.http.openapi import openapi_document
from service.http.router import Route, Router
from service.http.routes import ROUTES
from service.settings import Settings
from tests.service.service_testing import metric_value


class Page(BaseModel):
    size: int = Field(10, ge=1, le=100, description="Items per page.")
    sort: str = "name"


async def show(request, serving):
    return JSONResponse({"route": "show", "params": request.path_params, "serving": serving})


async def show_png(request, serving):
    return JSONResponse({"route": "png", "params": request.path_params})


async def listing(request, serving, page: Page):
    return JSONResponse({"route": "listing", "size": page.size, "sort": page.sort})


async def busy(request, serving):
    raise Overloaded("full", headers={"Retry-After": "3"})


async def gone(request, serving):
    raise HTTPException(410, "it went away")


async def broken(request, serving):
    raise RuntimeError("a bug")


ROUTES_UNDER_TEST = [
    Route("GET", "/things/{name}.png", show_png),
    Route("GET", "/things/{name}", show),
    Route("POST", "/things/{name}", show),
    Route("GET", "/things", listing, query=Page),
    Route("POST", "/busy", busy),
    Route("GET", "/gone", gone),
    Route("GET", "/broken", broken),
]


def call(method: str, path: str, query: str = "") -> tuple[int, dict, dict]:
    """One request straight into the router: (status, headers, JSON body)."""
    sent: list[dict] = []
    scope = {
        "type": "http",
        "method": method,
        "path": path,
        "query_string": query.encode(),
        "headers": [],
        "app": SimpleNamespace(state=SimpleNamespace(serving="the-serving")),
    }

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    asyncio.run(Router(ROUTES_UNDER_TEST)(scope, receive, send))
    start, body = sent[0], b"".join(m.get("body", b"") for m in sent[1:])
    headers = {k.decode(): v.decode() for k, v in start["headers"]}
    return start["status"], headers, (httpx.Response(200, content=body).json() if body else {})


def test_exact_and_parameterised_paths_are_matched_in_declaration_order():
    assert call("GET", "/things")[2] == {"route": "listing", "size": 10, "sort": "name"}
    assert call("GET", "/things/abc")[2] == {"route": "show", "params": {"name": "abc"}, "serving": "the-serving"}
    assert call("GET", "/things/abc.png")[2] == {"route": "png", "params": {"name": "abc"}}  # declared first
    assert call("POST", "/things/x")[0] == 200


def test_head_is_answered_by_the_get_route():
    status, headers, _ = call("HEAD", "/things/abc")
    assert status == 200 and headers["content-type"] == "application/json"


def test_unknown_paths_are_404_and_unknown_methods_405_with_allow():
    status, _, body = call("GET", "/nothing/here")
    assert (status, body["error"]["code"]) == (404, "not_found")
    assert body["error"]["message"] == "no route GET /nothing/here"
    status, headers, body = call("DELETE", "/things/abc")
    assert (status, body["error"]["code"]) == (405, "method_not_allowed")
    assert headers["allow"] == "GET, HEAD, POST"


@pytest.mark.parametrize(
    ("query", "expected"),
    [("size=3&sort=age", (200, 3)), ("size=0", (422, "size: ")), ("size=x", (422, "size: ")), ("other=1", (200, 10))],
)
def test_declared_query_parameters_are_validated_once_before_the_handler(query, expected):
    status, _, body = call("GET", "/things", query)
    if status == 200:
        assert (status, body["size"]) == expected
    else:
        assert status == expected[0] and body["error"]["code"] == "invalid_field"
        assert body["error"]["message"].startswith(expected[1])


def test_service_and_http_errors_become_the_json_error_body_and_anything_else_propagates():
    status, headers, body = call("POST", "/busy")
    assert (status, body, headers["retry-after"]) == (503, {"error": {"code": "overloaded", "message": "full"}}, "3")
    status, _, body = call("GET", "/gone")
    assert (status, body) == (410, {"error": {"code": "gone", "message": "it went away"}})
    with pytest.raises(RuntimeError, match="a bug"):  # RequestContextMiddleware logs it and answers 500
        call("GET", "/broken")


def test_a_route_declared_twice_is_refused():
    with pytest.raises(ValueError, match="GET /things is declared twice"):
        Router([Route("GET", "/things", show), Route("GET", "/things", show)])


def test_the_service_openapi_document_is_valid_and_documents_every_declared_route():
    doc = openapi_document(ROUTES, title="attnserve", version="0", summary="")
    validate(doc)  # OpenAPI 3.1 schema, and every $ref resolves
    documented = {(m.upper(), p) for p, ops in doc["paths"].items() for m in ops}
    assert documented == {(r.method, r.path) for r in ROUTES if r.documented}
    translate = doc["paths"]["/translate"]["post"]
    assert translate["requestBody"]["required"] is True
    assert "TranslateRequest" in translate["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    classify = doc["paths"]["/classify"]["post"]["requestBody"]["content"]
    assert set(classify) == {"application/json", "multipart/form-data"}
    assert classify["multipart/form-data"]["schema"]["required"] == ["file"]
    params = {p["name"]: p for p in doc["paths"]["/attention/{attention_id}"]["get"]["parameters"]}
    assert params["attention_id"]["in"] == "path" and params["layer"]["in"] == "query"
    assert set(params) == {"attention_id", "kind", "layer", "head", "fusion", "format"}
    for path in ("/translate", "/classify"):  # the response cache's report on the answers it can come from
        assert set(doc["paths"][path]["post"]["responses"]["200"]["headers"]) == {"X-Cache", "X-Cache-Hits"}


def test_the_document_states_the_running_service_limits_headers_keys_and_error_bodies():
    settings = Settings(model_repository="models", max_texts_per_request=3, max_top_k=7, api_key_hashes=("a" * 64,))
    router = Router(ROUTES, Keys(settings.api_key_hashes))
    doc = openapi_document(ROUTES, title="attnserve", version="0", summary="", settings=settings, guarded=router.guards)
    validate(doc)
    assert "x-settings" not in json.dumps(doc)  # every marker replaced by its setting's value
    schemas = doc["components"]["schemas"]
    texts = schemas["TranslateRequest"]["properties"]["texts"]["anyOf"][0]
    assert texts["maxItems"] == 3 and texts["items"]["maxLength"] == settings.max_text_chars
    assert schemas["ClassifyJSONRequest"]["properties"]["top_k"]["maximum"] == 7
    multipart = doc["paths"]["/classify"]["post"]["requestBody"]["content"]["multipart/form-data"]["schema"]
    assert multipart["properties"]["file"]["minItems"] == 1 and multipart["properties"]["top_k"]["maximum"] == 7
    for route in ROUTES:
        if not route.documented:
            continue
        op = doc["paths"][route.path][route.method.lower()]
        headers = {p["name"] for p in op.get("parameters", ()) if p["in"] == "header"}
        assert ("X-Request-Timeout" in headers) is route.deadline, route.path
        assert ("504" in op["responses"]) is route.deadline, route.path
        assert ("401" in op["responses"]) is router.guards(route) is ("security" in op), route.path
        if route.body is not None:
            assert {"408", "413"} <= set(op["responses"]), route.path
        error = op["responses"].get("404", op["responses"].get("401"))
        if error is not None:
            oip = route.path.startswith("/v2")
            assert error["content"]["application/json"]["schema"]["$ref"].endswith(
                "ProtocolErrorResponse" if oip else "/ErrorResponse"
            ), route.path
    assert doc["components"]["securitySchemes"]["bearer"] == {
        "type": "http",
        "scheme": "bearer",
        "description": "An API key (see docs/security.md).",
    }
    assert "401" not in doc["paths"]["/healthz"]["get"]["responses"]
    assert (
        "401" not in openapi_document(ROUTES, title="", version="", summary="")["paths"]["/models"]["get"]["responses"]
    )


@pytest.mark.parametrize(
    ("value", "accepted"),
    [("2.5", True), ("0.000000001", True), ("007", True), ("0", False), ("0.0", False), ("0.0000000001", False)],
)
def test_the_documented_x_request_timeout_pattern_is_the_grammar_the_service_checks(value, accepted):
    assert bool(re.search(TIMEOUT_PATTERN, value)) is accepted
    request = SimpleNamespace(headers={"x-request-timeout": value})
    if accepted:
        assert header_timeout(request) == float(value)
    else:
        with pytest.raises(InvalidTimeout):
            header_timeout(request)


def test_every_request_goes_through_the_one_stack(thread_server, fashion_pngs):
    srv = thread_server()
    app = srv._server.config.app
    with srv:
        srv.wait_ready()
        image = base64.b64encode(fashion_pngs[0]).decode()
        ok = httpx.post(srv.url + "/classify", json={"images": [image]}, headers={"X-Request-ID": "one-1"})
        bad = httpx.post(srv.url + "/classify", json={"images": [image], "top_k": 0})
        wrong_method = httpx.get(srv.url + "/classify")
        docs = srv.get("/docs")
        schema = srv.get("/openapi.json").json()
        metrics = srv.get("/metrics").text
    assert app.openapi() == schema
    assert ok.status_code == 200 and ok.headers["x-request-id"] == "one-1"
    assert ok.json()["results"][0]["top_k"][0]["label"]
    assert bad.status_code == 422 and bad.json()["error"]["code"] == "invalid_field"
    assert wrong_method.status_code == 405 and wrong_method.json()["error"]["code"] == "method_not_allowed"
    assert docs.status_code == 200 and "/openapi.json" in docs.text and "x-request-id" in docs.headers
    assert "post" in schema["paths"]["/classify"]
    assert metric_value(metrics, "attnserve_http_requests_total", route="/classify", method="POST", status="200") == 1
    assert metric_value(metrics, "attnserve_http_requests_total", route="/classify", method="POST", status="422") == 1
    assert metric_value(metrics, "attnserve_http_requests_total", route="/classify", method="GET", status="405") == 1
    assert metric_value(metrics, "attnserve_http_requests_total", route="/docs", method="GET", status="200") == 1
