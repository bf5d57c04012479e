"""``POST /classify`` is served as a lane: outside FastAPI's middleware and routing, same answers."""

from __future__ import annotations

import base64

import httpx

from service.fastlane import App
from tests.service.service_testing import metric_value


class SeenByFastAPI:
    """A middleware inside FastAPI's stack: records the paths that went through it."""

    def __init__(self, app, seen: list[str]) -> None:
        self.app, self.seen = app, seen

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            self.seen.append(f"{scope['method']} {scope['path']}")
        await self.app(scope, receive, send)


def test_classify_skips_fastapi_and_everything_else_goes_through_it(thread_server, fashion_pngs):
    seen: list[str] = []
    srv = thread_server()
    app = srv._server.config.app
    assert isinstance(app, App) and {("POST", "/classify"), ("POST", "/translate")} <= set(app.lanes)
    app.add_middleware(SeenByFastAPI, seen=seen)  # the stack is built on the first request, so this one counts
    with srv:
        srv.wait_ready()
        seen.clear()
        image = base64.b64encode(fashion_pngs[0]).decode()
        ok = httpx.post(srv.url + "/classify", json={"images": [image]}, headers={"X-Request-ID": "lane-1"})
        bad = httpx.post(srv.url + "/classify", json={"images": [image], "top_k": 0})
        wrong_method = httpx.get(srv.url + "/classify")
        schema = srv.get("/openapi.json").json()
        metrics = srv.get("/metrics").text
    assert ok.status_code == 200 and ok.headers["x-request-id"] == "lane-1"
    assert ok.json()["results"][0]["top_k"][0]["label"]
    assert bad.status_code == 422 and bad.json()["error"]["code"] == "invalid_field"
    assert wrong_method.status_code == 405 and wrong_method.json()["error"]["code"] == "method_not_allowed"
    assert "post" in schema["paths"]["/classify"]  # still documented
    assert seen == ["GET /classify", "GET /openapi.json", "GET /metrics"]  # no POST /classify went through FastAPI
    assert metric_value(metrics, "attnserve_http_requests_total", route="/classify", method="POST", status="200") == 1
    assert metric_value(metrics, "attnserve_http_requests_total", route="/classify", method="POST", status="422") == 1
