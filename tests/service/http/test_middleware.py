"""The two ASGI middlewares on their own: request ids, metrics, access log, last-resort 500s, body limits.

The service's router with the test's own routes, and the middlewares stacked as the app stacks them
(``service/http/app.py``), is driven in process through httpx's ASGI transport. Raw ASGI apps stand
in where a test needs a response that no handler would produce.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import re
from types import SimpleNamespace

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from starlette.responses import JSONResponse

from service.errors import BodyTooLarge, InvalidField, RequestTimeout
from service.http.middleware import BodyLimitMiddleware, RequestContextMiddleware
from service.http.router import Route, Router
from service.logs import JsonFormatter, RequestIdFilter, current_request_id, flush_access_logs
from service.metrics import Metrics

LIMIT = 64
CLIENT = ("10.1.2.3", 45678)
GENERATED_ID = re.compile(r"[0-9a-f]{32}")
SLOW_S = 0.06  # what GET /slow takes at least


class Stack:
    """The app's HTTP side without its models: ``scope["app"]`` is this object, as the router expects."""

    def __init__(
        self, routes: list[Route], metrics: Metrics, access_log: bool, max_body_bytes: int, body_timeout_s: float
    ) -> None:
        self.state = SimpleNamespace(serving=None, calls=[])
        inner = BodyLimitMiddleware(Router(routes), max_body_bytes=max_body_bytes, body_timeout_s=body_timeout_s)
        self.stack = RequestContextMiddleware(inner, metrics=metrics, access_log=access_log)

    async def __call__(self, scope, receive, send) -> None:
        scope["app"] = self
        await self.stack(scope, receive, send)


def make_app(
    metrics: Metrics, *, access_log: bool = True, max_body_bytes: int = LIMIT, body_timeout_s: float = 30.0
) -> Stack:
    async def item(request, serving):
        raw = request.path_params["item_id"]
        if not raw.isdigit():
            raise InvalidField(f"item_id: not a number: {raw!r}")
        return JSONResponse({"item": int(raw), "request_id": current_request_id()})

    async def ok(request, serving):
        return JSONResponse({"status": "ok"})

    async def slow(request, serving):
        await asyncio.sleep(SLOW_S)
        return JSONResponse({})

    async def boom(request, serving):
        raise ValueError("secret internals")

    async def echo(request, serving):
        app.state.calls.append(request.headers.get("content-length"))
        return JSONResponse({"bytes": len(await request.body())})

    routes = [
        Route("GET", "/items/{item_id}", item),
        Route("GET", "/healthz", ok),
        Route("GET", "/slow", slow),
        Route("GET", "/boom", boom),
        Route("POST", "/echo", echo),
        Route("GET", "/v2/items/{item_id}", item),  # an Open Inference Protocol twin of each failing route
        Route("GET", "/v2/boom", boom),
        Route("POST", "/v2/echo", echo),
    ]
    app = Stack(routes, metrics, access_log, max_body_bytes, body_timeout_s)
    return app


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, timeout=30))


def exchange(app, *requests: tuple) -> list[httpx.Response]:
    """Send ``(method, path, kwargs)`` requests in order to ``app``; the responses, bodies read."""

    async def go() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app, client=CLIENT)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return [await client.request(method, path, **kwargs) for method, path, kwargs in requests]

    return run(go())


def get(path: str, **kwargs) -> tuple:
    return "GET", path, kwargs


def post(path: str, **kwargs) -> tuple:
    return "POST", path, kwargs


async def chunks(*parts: bytes):
    """A body without Content-Length: httpx sends it chunked, the ASGI app receives it part by part."""
    for part in parts:
        yield part


def samples(metrics: Metrics) -> dict[tuple[str, frozenset], float]:
    text = metrics.render()[0].decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def requests_total(metrics: Metrics) -> dict[tuple[str, str, str], float]:
    """``{(route, method, status): count}`` of ``attnserve_http_requests_total``."""
    out = {}
    for (name, labels), value in samples(metrics).items():
        if name == "attnserve_http_requests_total":
            d = dict(labels)
            out[(d["route"], d["method"], d["status"])] = value
    return out


def latency(metrics: Metrics, route: str, method: str) -> dict[str, float]:
    """``{"count", "sum", <le>: cumulative count}`` of the request-duration histogram for one route."""
    out = {}
    for (name, labels), value in samples(metrics).items():
        d = dict(labels)
        if (d.get("route"), d.get("method")) != (route, method):
            continue
        if name == "attnserve_http_request_duration_seconds_bucket":
            out[d["le"]] = value
        elif name == "attnserve_http_request_duration_seconds_count":
            out["count"] = value
        elif name == "attnserve_http_request_duration_seconds_sum":
            out["sum"] = value
    return out


class ListHandler(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []
        self.addFilter(RequestIdFilter())  # as the service's handler: the request id bound when logged

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def capture():
    """Factory: ``capture(name, handler)`` sends logger ``name`` to ``handler`` alone, restored afterwards."""
    saved = []

    def attach(name: str, handler: logging.Handler, level: int = logging.DEBUG) -> logging.Handler:
        logger = logging.getLogger(name)
        saved.append((logger, logger.level, logger.propagate, list(logger.handlers)))
        logger.handlers = [handler]
        logger.propagate = False
        logger.setLevel(level)
        return handler

    yield attach
    for logger, level, propagate, handlers in reversed(saved):
        logger.handlers = handlers
        logger.propagate = propagate
        logger.setLevel(level)


# ---- request ids ---------------------------------------------------------------------------------------------
def test_a_request_without_an_id_gets_a_generated_one_bound_while_it_runs_and_returned():
    app = make_app(Metrics())

    async def go():
        transport = httpx.ASGITransport(app=app, client=CLIENT)  # runs the app in this task, in this context
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            responses = [await client.get("/items/1"), await client.get("/items/2")]
        return responses, current_request_id()

    (first, second), left_bound = run(go())
    for r in (first, second):
        assert r.status_code == 200
        assert GENERATED_ID.fullmatch(r.headers["x-request-id"])
        assert r.json()["request_id"] == r.headers["x-request-id"]  # what the endpoint's logs would carry
        assert r.headers["content-type"] == "application/json"  # the app's own headers are kept
    assert first.headers["x-request-id"] != second.headers["x-request-id"]
    assert left_bound is None  # unbound once each request was over


@pytest.mark.parametrize("incoming", ["abc-123", "trace.7:span_9", "X" * 128])
def test_a_safe_client_id_is_kept_and_echoed(incoming):
    (r,) = exchange(make_app(Metrics()), get("/items/5", headers={"X-Request-ID": incoming}))
    assert r.headers["x-request-id"] == incoming
    assert r.json()["request_id"] == incoming
    assert r.headers.get_list("x-request-id") == [incoming]


@pytest.mark.parametrize("incoming", ['x" level=error', "a b", "X" * 129, "id\u00e9"])
def test_an_unsafe_client_id_is_replaced_by_a_generated_one(incoming):
    (r,) = exchange(make_app(Metrics()), get("/items/5", headers={"X-Request-ID": incoming.encode("latin-1")}))
    rid = r.headers["x-request-id"]
    assert rid != incoming and GENERATED_ID.fullmatch(rid)
    assert r.json()["request_id"] == rid


# ---- metrics -------------------------------------------------------------------------------------------------
def test_requests_are_counted_by_route_template_method_and_status():
    metrics = Metrics()
    responses = exchange(
        make_app(metrics),
        get("/items/1"),
        get("/items/2"),
        get("/items/3"),
        get("/no/such/route"),
        ("DELETE", "/items/1", {}),
        get("/items/not-a-number"),
        get("/boom"),
    )
    assert [r.status_code for r in responses] == [200, 200, 200, 404, 405, 422, 500]
    assert requests_total(metrics) == {
        ("/items/{item_id}", "GET", "200"): 3,
        ("unmatched", "GET", "404"): 1,  # no route: one label value, whatever the path
        ("/items/{item_id}", "DELETE", "405"): 1,
        ("/items/{item_id}", "GET", "422"): 1,
        ("/boom", "GET", "500"): 1,
    }
    assert latency(metrics, "/items/{item_id}", "GET")["count"] == 4  # the histogram has no status label
    assert latency(metrics, "unmatched", "GET")["count"] == 1


def test_the_duration_covers_the_whole_request():
    metrics = Metrics()
    (r,) = exchange(make_app(metrics), get("/slow"))
    assert r.status_code == 200
    h = latency(metrics, "/slow", "GET")
    assert h["count"] == 1 and h["+Inf"] == 1
    assert SLOW_S <= h["sum"] < 10
    assert h["0.025"] == 0 and h["0.05"] == 0  # it slept 60 ms: no bucket below that holds it


def test_non_http_scopes_pass_through_both_middlewares_untouched():
    seen = []

    async def inner(scope, receive, send):
        seen.append((scope["type"], receive, send))

    async def receive():
        return {"type": "lifespan.startup"}

    async def send(message):
        pass

    metrics = Metrics()
    app = RequestContextMiddleware(BodyLimitMiddleware(inner, max_body_bytes=LIMIT), metrics=metrics)
    run(app({"type": "lifespan"}, receive, send))
    assert seen == [("lifespan", receive, send)]  # the very callables: nothing wrapped, nothing counted
    assert requests_total(metrics) == {}


# ---- access log ----------------------------------------------------------------------------------------------
def test_each_request_is_logged_with_its_fields_and_probes_only_at_debug(capture):
    handler = capture("attnserve.access", ListHandler())
    responses = exchange(
        make_app(Metrics()),
        get("/items/9", headers={"X-Request-ID": "req-1"}),
        get("/healthz"),
        get("/readyz"),
        get("/metrics"),
        post("/echo", content=b"x" * (LIMIT + 1)),
    )
    records = handler.records
    assert [(r.levelno, r.getMessage()) for r in records] == [
        (logging.INFO, "GET /items/9 200"),
        (logging.DEBUG, "GET /healthz 200"),
        (logging.DEBUG, "GET /readyz 404"),  # quiet by path, matched or not
        (logging.DEBUG, "GET /metrics 404"),
        (logging.INFO, "POST /echo 413"),
    ]
    first = records[0]
    assert (first.method, first.path, first.status, first.client) == ("GET", "/items/9", 200, CLIENT[0])
    assert first.request_id == "req-1"
    assert [r.request_id for r in records] == [r.headers["x-request-id"] for r in responses]
    assert all(isinstance(r.duration_ms, float) and 0 <= r.duration_ms < 10_000 for r in records)


def test_probes_are_not_logged_at_info_level(capture):
    handler = capture("attnserve.access", ListHandler(), level=logging.INFO)
    exchange(make_app(Metrics()), get("/healthz"), get("/items/1"))
    assert [r.getMessage() for r in handler.records] == ["GET /items/1 200"]


def test_access_log_off_logs_nothing_but_still_counts(capture):
    handler = capture("attnserve.access", ListHandler())
    metrics = Metrics()
    exchange(make_app(metrics, access_log=False), get("/items/1"), get("/boom"))
    assert handler.records == []
    assert requests_total(metrics) == {("/items/{item_id}", "GET", "200"): 1, ("/boom", "GET", "500"): 1}


def test_json_access_lines_carry_the_request_id_and_timing(capture):
    """The service's own set-up (one JSON stream handler): lines are batched, then written as JSON."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    handler.addFilter(RequestIdFilter())
    capture("attnserve.access", handler, level=logging.INFO)
    app = make_app(Metrics())  # kept alive until flushed: its access log holds the waiting lines
    responses = exchange(app, get("/slow", headers={"X-Request-ID": "slow-1"}), get("/healthz"))
    flush_access_logs()  # as the service does when it stops
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert len(lines) == 1  # the probe was below the level
    (line,) = lines
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\+00:00", line.pop("ts"))
    duration = line.pop("duration_ms")
    assert SLOW_S * 1000 <= duration < 10_000
    assert line == {
        "level": "info",
        "logger": "attnserve.access",
        "message": "GET /slow 200",
        "request_id": "slow-1",
        "method": "GET",
        "path": "/slow",
        "status": 200,
        "client": CLIENT[0],
    }
    assert responses[0].headers["x-request-id"] == "slow-1"


# ---- the last line of defence --------------------------------------------------------------------------------
def test_an_escaping_exception_is_a_json_500_with_the_traceback_only_in_the_log(capture):
    handler = capture("attnserve.http", ListHandler())
    metrics = Metrics()
    (r,) = exchange(make_app(metrics), get("/boom", headers={"X-Request-ID": "boom-1"}))
    assert r.status_code == 500
    assert r.json() == {
        "error": {
            "code": "internal_error",
            "message": "internal server error; the request id identifies it in the logs",
        }
    }
    assert r.headers["x-request-id"] == "boom-1" and r.headers["content-type"] == "application/json"
    assert "secret" not in r.text and "Traceback" not in r.text
    (record,) = handler.records
    assert (record.levelno, record.getMessage()) == (logging.ERROR, "unhandled exception in GET /boom")
    assert record.request_id == "boom-1"
    assert isinstance(record.exc_info[1], ValueError) and str(record.exc_info[1]) == "secret internals"
    assert requests_total(metrics) == {("/boom", "GET", "500"): 1}


TOO_LARGE = f"request body exceeds the limit of {LIMIT} bytes"


@pytest.mark.parametrize(
    ("method", "path", "kwargs", "status", "code", "message"),
    [
        ("GET", "/nowhere", {}, 404, "not_found", "no route GET {path}"),
        ("DELETE", "/echo", {}, 405, "method_not_allowed", "Method Not Allowed"),
        ("GET", "/items/x", {}, 422, "invalid_field", "item_id: not a number: 'x'"),
        ("GET", "/boom", {}, 500, "internal_error", "internal server error; the request id identifies it in the logs"),
        ("POST", "/echo", {"content": b"x" * (LIMIT + 1)}, 413, "body_too_large", TOO_LARGE),
        ("POST", "/echo", {"content": chunks(b"a" * 40, b"b" * 25)}, 413, "body_too_large", TOO_LARGE),
        ("POST", "/echo", {"content": b"x", "headers": {"Content-Length": "abc"}}, 400, "invalid_content_length", "Content-Length is not a number"),
    ],
)  # fmt: skip
@pytest.mark.parametrize("prefix", ["", "/v2"])
def test_every_error_under_v2_has_the_protocol_body_and_elsewhere_the_service_body(
    prefix, method, path, kwargs, status, code, message
):
    """Wherever the answer is made (router, body limit, last resort), only the path decides its form."""
    path = prefix + path
    if "content" in kwargs and not isinstance(kwargs["content"], bytes):  # a generator is spent once sent
        kwargs = {**kwargs, "content": chunks(b"a" * 40, b"b" * 25)}
    (r,) = exchange(make_app(Metrics()), (method, path, kwargs))
    assert r.status_code == status and r.headers["content-type"] == "application/json"
    message = message.format(path=path)
    assert r.json() == ({"error": message} if prefix else {"error": {"code": code, "message": message}})
    if status == 405:
        assert r.headers["allow"] == "POST"


def test_an_exception_after_the_response_started_sends_nothing_more_and_counts_a_500(capture):
    handler = capture("attnserve.http", ListHandler())

    async def half_answer(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": b"part", "more_body": True})
        raise RuntimeError("failed mid-stream")

    sent = []

    async def send(message):
        sent.append(message)

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    metrics = Metrics()
    scope = {"type": "http", "method": "GET", "path": "/stream", "headers": [(b"x-request-id", b"mid-1")]}
    run(RequestContextMiddleware(half_answer, metrics=metrics)(scope, receive, send))  # does not raise
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]  # no second start
    assert sent[0]["status"] == 200
    assert sent[0]["headers"] == [(b"content-type", b"text/plain"), (b"x-request-id", b"mid-1")]
    assert requests_total(metrics) == {("unmatched", "GET", "500"): 1}  # no route in the scope; counted as failed
    (record,) = handler.records
    assert record.getMessage() == "unhandled exception in GET /stream" and record.request_id == "mid-1"


# ---- body limit ----------------------------------------------------------------------------------------------
def test_a_declared_length_over_the_limit_is_refused_before_the_app_runs():
    metrics = Metrics()
    app = make_app(metrics)
    at_limit, over = exchange(app, post("/echo", content=b"x" * LIMIT), post("/echo", content=b"x" * (LIMIT + 1)))
    assert (at_limit.status_code, at_limit.json()) == (200, {"bytes": LIMIT})
    assert over.status_code == 413
    assert over.json() == {
        "error": {"code": "body_too_large", "message": f"request body exceeds the limit of {LIMIT} bytes"}
    }
    assert GENERATED_ID.fullmatch(over.headers["x-request-id"])  # the outer middleware covers the refusal
    assert app.state.calls == [str(LIMIT)]  # the endpoint never saw the refused request
    assert requests_total(metrics) == {("/echo", "POST", "200"): 1, ("unmatched", "POST", "413"): 1}


@pytest.mark.parametrize("value", ["abc", "1e3", ""])
def test_a_content_length_that_is_not_a_number_is_a_400(value):
    app = make_app(Metrics())
    (r,) = exchange(app, post("/echo", content=b"x", headers={"Content-Length": value}))
    assert r.status_code == 400
    assert r.json() == {"error": {"code": "invalid_content_length", "message": "Content-Length is not a number"}}
    assert app.state.calls == []


def test_an_undeclared_body_is_counted_as_it_arrives_and_refused_once_over():
    app = make_app(Metrics())
    at_limit, over = exchange(
        app,
        post("/echo", content=chunks(b"a" * 30, b"b" * 30, b"c" * 4)),
        post("/echo", content=chunks(b"a" * 40, b"b" * 25)),
    )
    assert app.state.calls == [None, None]  # no Content-Length: the endpoint ran and read until refused
    assert (at_limit.status_code, at_limit.json()) == (200, {"bytes": LIMIT})
    assert over.status_code == 413
    assert over.json() == {
        "error": {"code": "body_too_large", "message": f"request body exceeds the limit of {LIMIT} bytes"}
    }


def test_counting_raises_body_too_large_from_receive_at_the_chunk_that_crosses_the_limit():
    parts = [b"a" * 40, b"b" * 40, b"c" * 40]
    messages = [{"type": "http.request", "body": p, "more_body": i < len(parts) - 1} for i, p in enumerate(parts)]
    got, raised = [], []

    async def reader(scope, receive, send):
        try:
            while True:
                got.append(len((await receive())["body"]))
        except BodyTooLarge as e:
            raised.append(e)

    async def receive():
        return messages.pop(0)

    async def send(message):
        raise AssertionError("the limit middleware answers nothing itself when counting")

    scope = {"type": "http", "method": "POST", "path": "/x", "headers": [(b"transfer-encoding", b"chunked")]}
    run(BodyLimitMiddleware(reader, max_body_bytes=LIMIT)(scope, receive, send))
    assert got == [40]  # the second chunk (80 bytes in all) is never handed to the app
    (e,) = raised
    assert (e.status, e.code, e.message) == (413, "body_too_large", f"request body exceeds the limit of {LIMIT} bytes")


# ---- body time limit -------------------------------------------------------------------------------------------
async def trickle(*parts: bytes, pause: float):
    """A chunked body whose parts come ``pause`` seconds apart."""
    for part in parts:
        await asyncio.sleep(pause)
        yield part


def test_a_body_that_does_not_arrive_in_time_is_a_408_that_closes_the_connection():
    metrics = Metrics()
    app = make_app(metrics, body_timeout_s=0.2)
    in_time, too_slow = exchange(
        app,
        post("/echo", content=trickle(b"a" * 10, b"b" * 10, pause=0.01)),
        post("/echo", content=trickle(b"a" * 10, b"b" * 10, pause=30)),  # the second part would come after 60 s
    )
    assert (in_time.status_code, in_time.json()) == (200, {"bytes": 20})
    assert too_slow.status_code == 408 and too_slow.headers["connection"] == "close"
    assert too_slow.json() == {
        "error": {"code": "request_timeout", "message": "the request body did not arrive within 0.2 s"}
    }
    assert requests_total(metrics) == {("/echo", "POST", "200"): 1, ("/echo", "POST", "408"): 1}


def test_the_time_limit_covers_the_body_only_not_the_wait_for_a_disconnect_after_it():
    messages = [{"type": "http.request", "body": b"x", "more_body": False}]
    got = []

    async def reader(scope, receive, send):
        got.append(await receive())
        got.append(await receive())  # the disconnect watch: it may wait far longer than the body limit

    async def receive():
        if messages:
            return messages.pop(0)
        await asyncio.sleep(0.1)
        return {"type": "http.disconnect"}

    scope = {"type": "http", "method": "POST", "path": "/x", "headers": []}
    run(BodyLimitMiddleware(reader, max_body_bytes=LIMIT, body_timeout_s=0.01)(scope, receive, None))
    assert [m["type"] for m in got] == ["http.request", "http.disconnect"]


def test_a_stalled_body_raises_request_timeout_from_receive_and_the_task_can_go_on():
    raised = []

    async def reader(scope, receive, send):
        try:
            await receive()
        except RequestTimeout as e:
            raised.append(e)
        await asyncio.sleep(0)  # the timeout's cancellation was consumed: the task is not cancelled

    async def receive():
        await asyncio.sleep(60)

    scope = {"type": "http", "method": "POST", "path": "/x", "headers": []}
    run(BodyLimitMiddleware(reader, max_body_bytes=LIMIT, body_timeout_s=0.05)(scope, receive, None))
    (e,) = raised
    assert (e.status, e.code, e.headers) == (408, "request_timeout", {"Connection": "close"})
