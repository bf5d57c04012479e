"""What every gRPC call shares with an HTTP request: its API key, deadline, admission, metrics, log and errors.

- Keys: ``authorization: Bearer <key>`` metadata, checked as the header is (``service/core/keys.py``);
  the calls the HTTP side leaves open (``ServerLive``, ``ServerReady``) are open here too.
- Deadlines: the call's gRPC deadline counts as ``X-Request-Timeout`` does; with the OIP ``timeout``
  parameter too, the shorter (``service/core/deadlines.py``).
- Admission: a call that queues work (``ModelInfer``, each request of ``ModelStreamInfer``) counts
  against the process's in-flight bound, the HTTP requests' one (``service/core/admission.py``); past
  it, ``UNAVAILABLE`` with ``retry-after``, as a full queue answers.
- Metrics and the access log: a call counts in ``attnserve_grpc_calls`` and its latency histogram
  ``attnserve_grpc_call_duration_seconds`` by RPC and gRPC status code (and, deprecated, in the HTTP
  series under the route ``grpc:<RPC>`` and method ``GRPC``, until the next release);
  ``x-request-id`` metadata is the request id, and comes back in the trailing metadata.
- Quotas: a call that queues work is charged a request at admission, its work in the operation
  (``service/core/quotas.py``); over the quota, ``RESOURCE_EXHAUSTED`` with ``retry-after`` metadata and a
  ``google.rpc.RetryInfo`` in the status details; ``ratelimit`` and ``ratelimit-policy`` come back in the
  trailing metadata of every metered call, as the HTTP fields.
- Errors: a ``ServiceError`` ends the call with the gRPC code of its HTTP status (``CODES``) and its
  message; ``Retry-After`` comes back as ``retry-after`` trailing metadata. Anything unexpected is
  logged and answered ``INTERNAL`` without a stack trace.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from service.core.admission import InFlight
from service.core.caller import Caller
from service.core.serving import Serving
from service.errors import DeadlineExceeded, ServiceError, log_server_error
from service.logs import AccessLog, bind_request_id, unbind_request_id
from service.tracing import TRACING

access = logging.getLogger("attnserve.access")
log = logging.getLogger("attnserve.grpc")

SERVICE = "inference.GRPCInferenceService"
CODES = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    409: grpc.StatusCode.ABORTED,  # a load or unload of the model is under way
    413: grpc.StatusCode.INVALID_ARGUMENT,  # an image or text too large: retrying cannot help
    415: grpc.StatusCode.INVALID_ARGUMENT,
    422: grpc.StatusCode.INVALID_ARGUMENT,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,  # a quota: retry after its window (RetryInfo)
    499: grpc.StatusCode.CANCELLED,
    500: grpc.StatusCode.INTERNAL,
    503: grpc.StatusCode.UNAVAILABLE,  # a full queue or a model not ready: Triton's answer, worth a retry
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}
INTERNAL_MESSAGE = "internal server error; the request id identifies it in the logs"


def status_code(http_status: int) -> grpc.StatusCode:
    """The gRPC code of an error the HTTP side answers with ``http_status``."""
    return CODES.get(http_status, grpc.StatusCode.INVALID_ARGUMENT if http_status < 500 else grpc.StatusCode.INTERNAL)


def code_name(http_status: int) -> str:
    """The name of the gRPC status code a call ends with when its outcome is ``http_status`` over HTTP (200: ``OK``)."""
    return "OK" if http_status == 200 else status_code(http_status).name


class Calls:
    """The running service as the RPCs see it: its parts, the accepted keys, the in-flight bound, the access log."""

    def __init__(self, serving: Serving) -> None:
        self.serving = serving
        self.keys = serving.keys
        self.in_flight: InFlight = serving.in_flight
        self.access_log = AccessLog(access) if serving.settings.access_log else None

    def authenticate(self, context: grpc.aio.ServicerContext) -> str | None:
        """The presented key's fingerprint (None: keys are off); 401 without an accepted one."""
        if self.keys is None:
            return None
        metadata = {k: v for k, v in context.invocation_metadata() or () if isinstance(v, str)}
        return self.keys.check(metadata.get("authorization"))

    def caller(self, key_id: str | None, context: grpc.aio.ServicerContext) -> Caller:
        """A call as a ``Caller``: its key, its quota (by key, or by the peer's address without keys), the call's
        cancellation watched."""
        quotas = self.serving.quotas
        quota = quotas.for_caller(key_id, peer_address(context.peer())) if quotas is not None else None
        return Caller(key_id, wait, quota, self.keys is not None and self.keys.batch_only(key_id))

    def observe(self, method: str, status: int, started: float, context: Any, request_id: str, key_id: str | None):
        elapsed = time.perf_counter() - started
        self.serving.metrics.observe_call(method, code_name(status), status, elapsed)
        if self.access_log:
            peer = context.peer() if context is not None else None
            level = logging.DEBUG if method in ("ServerLive", "ServerReady") else logging.INFO
            self.access_log.log(
                level, "GRPC", f"/{SERVICE}/{method}", status, round(elapsed * 1000, 3), peer, request_id, key_id
            )


async def wait(answer: asyncio.Future, abandon: Callable[[], None]) -> Any:
    """The answer; when the call is cancelled first (client gone, deadline), the work is abandoned."""
    try:
        return await answer
    except asyncio.CancelledError:
        abandon()
        raise


def peer_address(peer: str | None) -> str | None:
    """The address of a gRPC peer (``ipv4:127.0.0.1:5000``, ``ipv6:[::1]:5000``); None for a Unix socket."""
    kind, _, rest = (peer or "").partition(":")
    if kind == "ipv4":
        return rest.rsplit(":", 1)[0]
    if kind == "ipv6":
        return rest.rsplit(":", 1)[0].strip("[]")
    return None


def quota_metadata(quota: Any) -> tuple[tuple[str, str], ...]:
    """A metered call's ``ratelimit-policy`` and ``ratelimit`` trailing metadata (none unless metered)."""
    return tuple((k.lower(), v) for k, v in quota.headers().items()) if quota is not None else ()


Handler = Callable[[Any, Any, grpc.aio.ServicerContext, Any], Awaitable[Any]]


def rpc(method: str, open_access: bool = False, queues_work: bool = False) -> Callable[[Handler], Callable]:
    """A unary RPC ``handler(self, request, context, key_id)``, with keys, metrics, log and errors around it;
    with ``queues_work``, ``handler(self, request, context, caller)``, charged a request against the caller's quota
    and admitted under the in-flight bound first (after the key, as the HTTP router does)."""

    def wrap(handler: Handler) -> Callable:
        @functools.wraps(handler)
        async def call(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
            calls: Calls = self.calls
            started = time.perf_counter()
            metadata = dict(context.invocation_metadata() or ())
            request_id, token = bind_request_id(metadata.get("x-request-id"))
            status, key_id, caller = 500, None, None
            admitted: InFlight | None = None  # counted until its answer is made, whatever happens
            try:
                if not open_access:
                    key_id = calls.authenticate(context)
                if queues_work:
                    caller = calls.caller(key_id, context)
                    if caller.quota is not None:
                        await caller.quota.charge(requests=1)
                    admitted = calls.in_flight.enter()
                if TRACING.enabled:
                    answer, traced = await traced_call(
                        method,
                        metadata,
                        request_id,
                        key_id,
                        lambda: handler(self, request, context, caller if queues_work else key_id),
                    )
                else:
                    answer, traced = await handler(self, request, context, caller if queues_work else key_id), ()
                status = 200
                quota = caller.quota if caller is not None else None
                context.set_trailing_metadata((("x-request-id", request_id), *quota_metadata(quota), *traced))
                return answer
            except ServiceError as e:
                status = e.status
                await abort(calls, context, e, method, request_id, caller.quota if caller is not None else None)
            except asyncio.CancelledError:
                status = 499
                raise
            except Exception:
                log.exception("unhandled exception in %s", method)
                await context.abort(grpc.StatusCode.INTERNAL, INTERNAL_MESSAGE, (("x-request-id", request_id),))
            finally:
                if admitted is not None:
                    admitted.leave()
                calls.observe(method, status, started, context, request_id, key_id)
                unbind_request_id(token)

        return call

    return wrap


async def traced_call(method: str, metadata: dict, request_id: str, key_id: str | None, call) -> tuple[Any, tuple]:
    """``call()`` inside the call's server span (``service/tracing.py``), continuing the ``traceparent`` metadata;
    returns its answer and the span's ``traceparent`` for the trailing metadata."""
    attributes = {"rpc.system": "grpc", "rpc.method": method, "attnserve.request_id": request_id}
    if key_id:
        attributes["attnserve.key"] = key_id
    with TRACING.server_span(f"{SERVICE}/{method}", metadata.get("traceparent"), attributes) as span:
        return await call(), (("traceparent", TRACING.traceparent(span)),)


def failed(calls: Calls, error: ServiceError, method: str) -> None:
    """Log a 5xx error and count a deadline exceeded, as the HTTP router does."""
    log_server_error(error)
    if isinstance(error, DeadlineExceeded):
        calls.serving.metrics.deadline_exceeded(f"grpc:{method}")


async def abort(
    calls: Calls,
    context: grpc.aio.ServicerContext,
    error: ServiceError,
    method: str,
    request_id: str,
    quota: Any = None,
):
    """End the call with ``error``'s gRPC code and message (raises, as ``context.abort`` does); a quota refusal
    carries a ``google.rpc.RetryInfo`` in its status details."""
    failed(calls, error, method)
    code = status_code(error.status)
    trailing = [("x-request-id", request_id), *quota_metadata(quota)]
    if "Retry-After" in error.headers:
        trailing.append(("retry-after", error.headers["Retry-After"]))
        if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
            trailing.append(
                ("grpc-status-details-bin", retry_details(code, error.message, error.headers["Retry-After"]))
            )
    await context.abort(code, error.message, tuple(trailing))


def retry_details(code: grpc.StatusCode, message: str, seconds: str) -> bytes:
    """A ``google.rpc.Status`` holding a ``RetryInfo`` of ``seconds``: how gRPC clients learn when to retry."""
    from google.protobuf import any_pb2, duration_pb2
    from google.rpc import error_details_pb2, status_pb2

    detail = any_pb2.Any()
    detail.Pack(error_details_pb2.RetryInfo(retry_delay=duration_pb2.Duration(seconds=int(seconds))))
    return status_pb2.Status(code=code.value[0], message=message, details=[detail]).SerializeToString()
