"""Every route declared once, matched by one router, its failures mapped to one kind of answer.

A ``Route`` is everything about an endpoint: method, path, handler and what the OpenAPI document
says about it (``service/http/openapi.py`` builds the document from the same declarations). The
``Router`` is the innermost ASGI app: exact paths by a dictionary lookup, ``{param}`` paths by
their pattern, 404 and 405 for the rest; it calls ``handler(request, serving)`` (plus the
validated query parameters for routes that declare them) and turns a ``ServiceError`` or an HTTP
error raised on the way into the JSON error body of its path (``service.http.errors.error_format``: the
Open Inference Protocol's under ``/v2``, the service's elsewhere). Anything else propagates to
``RequestContextMiddleware``, which logs it and answers 500.

It replaces FastAPI's own routing and dependency injection on the request path: for a request
answered in well under a millisecond of CPU, those cost about a quarter of it (py-spy, 64 clients).
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

from pydantic import BaseModel
from starlette.convertors import Convertor
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import compile_path
from starlette.types import Receive, Scope, Send

from service.core.admission import InFlight
from service.core.keys import Keys
from service.errors import DeadlineExceeded, ServiceError, log_server_error
from service.http.deadlines import count_exceeded
from service.http.errors import error_format, is_protocol_path
from service.schemas import ErrorResponse, ProtocolErrorResponse, validated

Handler = Callable[..., Awaitable[Response]]

# Codes for the HTTP errors raised below the handlers (multipart parser, static files) and by the router.
HTTP_CODES = {404: "not_found", 405: "method_not_allowed", 413: "body_too_large", 415: "unsupported_media_type"}


@dataclass(frozen=True, eq=False)
class Route:
    """One endpoint. ``body``, ``response`` and ``errors`` only document it; ``query`` is also validated.

    ``body``: a pydantic model (a JSON body) or media type -> ``{"schema": model or JSON schema}``;
    ``body_required``: whether a request must have that body;
    ``response``: a pydantic model (200 JSON) or an OpenAPI ``content`` mapping;
    ``errors``: status -> description of the error answers it gives (``error_model`` bodies), besides
    those every route of its kind gives (``service/http/openapi.py`` adds them: 401 with keys on,
    408 and 413 with a body, 400 and 504 with a deadline);
    ``deadline``: the handler queues work under the request's deadline (``X-Request-Timeout``);
    ``headers``: OpenAPI headers of the 200 answer (name -> header object).
    """

    method: str
    path: str
    handler: Handler
    summary: str = ""
    tags: tuple[str, ...] = ()
    query: type[BaseModel] | None = None
    parameters: tuple[dict, ...] = ()  # OpenAPI parameters the handler reads besides path and query (headers)
    body: type[BaseModel] | dict | None = None
    body_required: bool = True
    response: type[BaseModel] | dict | None = None
    errors: dict[int, str] = field(default_factory=dict)
    extra_responses: dict[int, dict] = field(default_factory=dict)
    documented: bool = True
    access: str = "key"  # "key": needs an API key when keys are set; "open": never; "metrics": as /metrics is set
    deadline: bool = False
    headers: dict[str, dict] = field(default_factory=dict)

    @property
    def methods(self) -> tuple[str, ...]:
        return (self.method, "HEAD") if self.method == "GET" else (self.method,)

    @property
    def error_model(self) -> type[BaseModel]:
        """The error body its answers have (``service.http.errors.error_format``), for the OpenAPI document."""
        return ProtocolErrorResponse if is_protocol_path(self.path) else ErrorResponse

    @property
    def path_params(self) -> list[str]:
        return re.findall(r"{(\w+)(?::\w+)?}", self.path)


def http_error_response(
    status: int, message: str | None = None, headers: dict[str, str] | None = None, path: str = "/"
) -> Response:
    """The answer to a request no route takes (404, 405), in the error form of its ``path``."""
    code = HTTP_CODES.get(status) or _status_code_name(status)
    return error_format(path)(status, code, message or HTTPStatus(status).phrase, headers)


def _status_code_name(status: int) -> str:
    try:
        return HTTPStatus(status).phrase.lower().replace(" ", "_").replace("-", "_")
    except ValueError:
        return "http_error"


class Router:
    """The routes as one ASGI app; ``serving`` is read from ``scope["app"].state`` at each request.

    With ``keys``, a route that needs one is answered 401 without a valid key; the key's fingerprint
    is kept in ``scope["key_id"]`` for the access log and for the attention records it owns. With
    ``in_flight``, a route that queues work (``Route.deadline``) is answered 503 ``overloaded`` while
    that many requests of such routes (or gRPC calls that queue work) are in flight (``service/core/admission.py``).
    """

    def __init__(
        self,
        routes: list[Route],
        keys: Keys | None = None,
        protect_metrics: bool = False,
        in_flight: InFlight | None = None,
    ) -> None:
        self.routes = routes
        self.keys = keys
        self.in_flight = in_flight
        self._guarded = {"key", "metrics"} if protect_metrics else {"key"}
        self._exact: dict[str, dict[str, Route]] = {}
        self._patterns: list[tuple[re.Pattern[str], dict[str, Convertor], dict[str, Route]]] = []
        for route in routes:
            if route.path_params:
                regex, _, convertors = compile_path(route.path)
                for pattern, _, by_method in self._patterns:
                    if pattern.pattern == regex.pattern:
                        break
                else:
                    by_method = {}
                    self._patterns.append((regex, convertors, by_method))
            else:
                by_method = self._exact.setdefault(route.path, {})
            for method in route.methods:
                if method in by_method:
                    raise ValueError(f"{method} {route.path} is declared twice")
                by_method[method] = route

    def guards(self, route: Route) -> bool:
        """Whether ``route`` answers 401 without an accepted key."""
        return self.keys is not None and route.access in self._guarded

    def match(self, path: str) -> tuple[dict[str, Route], dict[str, Any]]:
        """The routes of ``path`` by method (empty if none) and its path parameters."""
        by_method = self._exact.get(path)
        if by_method is not None:
            return by_method, {}
        for regex, convertors, by_method in self._patterns:
            m = regex.match(path)
            if m is not None:
                return by_method, {k: convertors[k].convert(v) for k, v in m.groupdict().items()}
        return {}, {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        by_method, params = self.match(scope["path"])
        route = by_method.get(scope["method"])
        if route is None:
            if by_method:
                scope["route"] = next(iter(by_method.values()))  # counted under the path's template
                allow = {"Allow": ", ".join(sorted(by_method))}
                response = http_error_response(405, headers=allow, path=scope["path"])
            else:
                response = http_error_response(404, f"no route {scope['method']} {scope['path']}", path=scope["path"])
            await response(scope, receive, send)
            return
        scope["route"] = route  # the metrics' route label
        scope["path_params"] = params
        request = Request(scope, receive)
        admitted: InFlight | None = None  # counted while its answer is being made and sent, whatever happens
        quota = None
        try:
            try:
                if self.keys is not None and route.access in self._guarded:  # = self.guards(route), inlined
                    scope["key_id"] = self.keys.check(request.headers.get("authorization"))
                serving = scope["app"].state.serving
                if route.deadline and serving.quotas is not None:  # a request that queues work is metered
                    client = scope.get("client")
                    quota = scope["quota"] = serving.quotas.for_caller(scope.get("key_id"), client and client[0])
                    if quota is not None:
                        await quota.charge(requests=1)
                if route.deadline and self.in_flight is not None:  # before the body is read: refusing costs little
                    admitted = self.in_flight.enter()
                if route.query is None:
                    response = await route.handler(request, serving)
                else:
                    query = validated(route.query, dict(request.query_params))
                    response = await route.handler(request, serving, query)
            except ServiceError as e:
                log_server_error(e)
                if isinstance(e, DeadlineExceeded):
                    count_exceeded(scope)
                response = error_format(scope["path"])(e.status, e.code, e.message, e.headers)
            except HTTPException as e:
                code = HTTP_CODES.get(e.status_code) or _status_code_name(e.status_code)
                message = e.detail if isinstance(e.detail, str) else HTTPStatus(e.status_code).phrase
                response = error_format(scope["path"])(e.status_code, code, message, e.headers)
            if quota is not None:  # every answer of a metered route says where the caller's quota stands
                response.headers.update(quota.headers())
            await response(scope, receive, send)
        finally:
            if admitted is not None:
                admitted.leave()
