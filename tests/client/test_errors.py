"""Every error the service can answer becomes its own exception class, for both clients.

The cases come from the service itself (every ``ServiceError`` subclass, Starlette's own HTTP
errors, the readiness probe's code), so a code added there without a mapping here fails this test.
Errors inside a stream (an ``error`` event, a connection that drops, a stream cut before its end)
raise the same classes while iterating.
"""

from __future__ import annotations

import httpx
import pytest
from attnserve_client import (
    APIConnectionError,
    APIStatusError,
    APITimeoutError,
    AttnserveError,
    AuthenticationError,
    BadRequestError,
    DeadlineExceededError,
    InternalServerError,
    InvalidFieldError,
    NotFoundError,
    OverloadedError,
    PayloadTooLargeError,
    QuotaExceededError,
    RequestTimeoutError,
    ServiceUnavailableError,
    UnsupportedMediaTypeError,
)
from attnserve_client.errors import error_class

from tests.client.sdk_testing import Script, error, sse

BY_STATUS = {
    400: BadRequestError,
    401: AuthenticationError,
    404: NotFoundError,
    405: APIStatusError,
    408: RequestTimeoutError,
    409: APIStatusError,
    413: PayloadTooLargeError,
    415: UnsupportedMediaTypeError,
    422: InvalidFieldError,
    429: OverloadedError,
    499: APIStatusError,
    500: InternalServerError,
    503: ServiceUnavailableError,
}
BY_CODE = {
    "overloaded": OverloadedError,
    "quota_exceeded": QuotaExceededError,
    "deadline_exceeded": DeadlineExceededError,
}  # where the code is more precise than the status


def service_errors() -> list[tuple[int, str]]:
    """(status, code) of every error the service answers, read from its code."""
    import service.http.app  # noqa: F401 - imports every route module, and with them every ServiceError subclass
    from service.errors import ServiceError
    from service.http.router import HTTP_CODES

    def subclasses(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from subclasses(sub)

    found = {(e.status, e.code) for e in subclasses(ServiceError)} | set(HTTP_CODES.items())
    return sorted(found | {(503, "not_ready")})


def expected(status: int, code: str) -> type[APIStatusError]:
    return BY_CODE.get(code) or BY_STATUS[status]


@pytest.mark.parametrize(("status", "code"), service_errors(), ids=lambda v: str(v))
def test_every_service_error_becomes_its_class_with_status_code_message_and_request_id(make_client, status, code):
    script = Script(error(status, code, "what went wrong", **{"Retry-After": "7"}))
    client = make_client(script, max_retries=0)
    with pytest.raises(expected(status, code)) as caught:
        client.translate("Open the file.")
    e = caught.value
    assert (e.status, e.code, e.message, e.request_id, e.retry_after) == (status, code, "what went wrong", "req-1", 7.0)
    assert str(e) == f"{status} {code}: what went wrong (request id req-1)"
    assert e.response.status_code == status and isinstance(e, AttnserveError)


@pytest.mark.parametrize(("status", "code"), service_errors(), ids=lambda v: str(v))
def test_an_error_event_inside_a_stream_raises_the_same_class(make_client, status, code):
    token = {"index": 0, "token": "▁Öffnen", "text": "Öffnen"}
    body = sse(("token", token), ("error", {"error": {"code": code, "message": "decoding failed"}}))
    client = make_client(Script(httpx.Response(200, content=body, headers={"X-Request-ID": "req-2"})))
    # An event has no status of its own: the code's class gives it; a code without a class of its own
    # (none the service sends after a stream began) is a server error.
    raised = expected(status, code) if expected(status, code) is not APIStatusError else InternalServerError
    events = []
    with pytest.raises(raised) as caught:
        events.extend(client.translate_stream("Open the file."))
    assert [e.text for e in events] == ["Öffnen"]
    assert (caught.value.code, caught.value.message, caught.value.request_id) == (code, "decoding failed", "req-2")
    assert caught.value.status == raised.status


@pytest.mark.parametrize(
    ("response", "raised", "message"),
    [
        (httpx.Response(502, text="<html>Bad Gateway</html>"), InternalServerError, "<html>Bad Gateway</html>"),
        (httpx.Response(504), InternalServerError, "Gateway Timeout"),
        (httpx.Response(401, json={"detail": "no"}), APIStatusError, "without a message"),
        (httpx.Response(429, headers={"Retry-After": "2"}), OverloadedError, "Too Many Requests"),
    ],
    ids=["proxy html", "empty body", "foreign json", "429 from a gateway"],
)
def test_answers_that_are_not_the_services_own_still_map_by_status(make_client, response, raised, message):
    with pytest.raises(raised, match=message) as caught:
        make_client(Script(response), max_retries=0).health()
    assert caught.value.status == response.status_code and caught.value.code is None


def test_the_class_tree():
    assert issubclass(APITimeoutError, APIConnectionError) and issubclass(OverloadedError, ServiceUnavailableError)
    assert all(issubclass(cls, APIStatusError) for cls in BY_STATUS.values())
    assert not issubclass(APIConnectionError, APIStatusError)
    assert error_class(None, "inference_failed") is InternalServerError and error_class(418, None) is APIStatusError


class _Breaks(httpx.SyncByteStream, httpx.AsyncByteStream):
    """A body whose connection drops after its first bytes."""

    def __init__(self, first: bytes) -> None:
        self.first = first

    def __iter__(self):
        yield self.first
        raise httpx.ReadError("connection reset by peer")

    async def __aiter__(self):
        yield self.first
        raise httpx.ReadError("connection reset by peer")


def test_a_connection_dropped_mid_stream_is_a_connection_error(make_client):
    first = sse(("token", {"index": 0, "token": "▁Öffnen", "text": "Öffnen"}))
    client = make_client(lambda request: httpx.Response(200, stream=_Breaks(first)))
    stream = client.translate_stream("Open the file.")
    events = []
    with pytest.raises(APIConnectionError, match="connection reset"):
        events.extend(stream)
    assert len(events) == 1 and stream.response.is_closed


def test_a_stream_that_ends_without_its_done_event_failed(make_client):
    client = make_client(Script(httpx.Response(200, content=sse(("token", {"index": 0, "token": "a", "text": "a"})))))
    with pytest.raises(APIConnectionError, match="before its done event"):
        list(client.translate_stream("Open the file."))
