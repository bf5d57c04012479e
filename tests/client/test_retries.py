"""Retries, on scripted transports (``httpx.MockTransport``), for both clients.

What a user relies on: a call survives a dropped connection, a timeout, a full queue (429/503) or a
load balancer's 502/504 within ``max_retries``, waits as long as the service's ``Retry-After`` asks (never less), backs off
exponentially otherwise, and never repeats a request the service refused for a reason retrying
cannot fix.
"""

from __future__ import annotations

import email.utils
import time

import httpx
import pytest
from attnserve_client import (
    APIConnectionError,
    APITimeoutError,
    BadRequestError,
    DeadlineExceededError,
    InternalServerError,
    InvalidFieldError,
    NotFoundError,
    OverloadedError,
    ServiceUnavailableError,
)
from attnserve_client._base import RetryPolicy

from tests.client.sdk_testing import Script, error, sse

HEALTHY = httpx.Response(200, json={"status": "ok"})


@pytest.mark.parametrize(
    "failure",
    [
        httpx.ConnectError("connection refused"),
        httpx.ReadTimeout("read timed out"),
        httpx.RemoteProtocolError("server disconnected without sending a response"),
        error(503, "overloaded", **{"Retry-After": "1"}),
        error(503, "model_not_ready", **{"Retry-After": "1"}),
        error(503, "shutting_down"),
        httpx.Response(429, text="slow down"),
        error(502, "internal_error", "the replica closed the connection without an answer"),
        httpx.Response(502, text="<html>502 Bad Gateway</html>"),
        error(504, "internal_error", "the replica did not answer in time"),
    ],
    ids=["refused", "timeout", "dropped", "overloaded", "not ready", "shutting down", "429", "502", "502 html", "504"],
)
def test_transient_failures_are_retried_until_an_answer(make_client, failure):
    script = Script(failure, failure, HEALTHY)
    client = make_client(script, max_retries=2)
    slept = client.record_sleeps()
    assert client.health().status == "ok"
    assert len(script.requests) == 3 and len(slept) == 2
    assert len({r.headers["X-Request-ID"] for r in script.requests}) == 1  # one id ties the attempts together


@pytest.mark.parametrize(
    ("failure", "raised"),
    [
        (httpx.ConnectError("connection refused"), APIConnectionError),
        (httpx.ConnectTimeout("timed out"), APITimeoutError),
        (error(503, "overloaded"), OverloadedError),
        (error(503, "model_not_ready"), ServiceUnavailableError),
    ],
)
def test_retries_are_bounded_by_max_retries(make_client, failure, raised):
    for max_retries in (0, 3):
        script = Script(failure)
        client = make_client(script, max_retries=max_retries)
        slept = client.record_sleeps()
        with pytest.raises(raised):
            client.health()
        assert len(script.requests) == max_retries + 1 and len(slept) == max_retries


@pytest.mark.parametrize(
    ("status", "code", "raised"),
    [
        (400, "undecodable_image", BadRequestError),
        (404, "model_not_found", NotFoundError),
        (422, "invalid_field", InvalidFieldError),
        (500, "inference_failed", InternalServerError),
        (500, "internal_error", InternalServerError),
        (504, "deadline_exceeded", DeadlineExceededError),
    ],
)
def test_refusals_are_never_retried(make_client, status, code, raised):
    script = Script(error(status, code), HEALTHY)
    client = make_client(script, max_retries=5)
    slept = client.record_sleeps()
    with pytest.raises(raised):
        client.translate("Open the file.")
    assert len(script.requests) == 1 and slept == []


@pytest.mark.parametrize("as_date", [False, True], ids=["seconds", "date"])
def test_retry_after_is_honoured_never_shortened(make_client, as_date):
    retry_after = email.utils.formatdate(time.time() + 3, usegmt=True) if as_date else "3"
    script = Script(error(503, "overloaded", **{"Retry-After": retry_after}), HEALTHY)
    client = make_client(script)
    slept = client.record_sleeps()
    client.health()
    (waited,) = slept
    assert 2.0 <= waited <= 3 * 1.25  # an HTTP date has one-second resolution; jitter only lengthens the wait


def test_a_retry_after_too_long_to_wait_in_a_call_is_raised_at_once(make_client):
    script = Script(error(503, "overloaded", **{"Retry-After": "3600"}), HEALTHY)
    client = make_client(script)
    slept = client.record_sleeps()
    with pytest.raises(OverloadedError) as caught:
        client.health()
    assert caught.value.retry_after == 3600 and slept == [] and len(script.requests) == 1


def test_without_retry_after_the_backoff_is_exponential_with_jitter(make_client):
    script = Script(httpx.ConnectError("refused"))
    client = make_client(script, max_retries=6)
    slept = client.record_sleeps()
    with pytest.raises(APIConnectionError):
        client.health()
    policy = client.retry_policy
    for attempt, waited in enumerate(slept):
        nominal = min(policy.initial_delay * 2**attempt, policy.max_delay)
        assert 0.75 * nominal <= waited <= nominal
    assert slept[-1] <= policy.max_delay and len(set(slept)) > 1


def test_backoff_and_retry_after_arithmetic():
    lowest, highest = RetryPolicy(random=lambda: 0.0), RetryPolicy(random=lambda: 1.0)
    assert [lowest.delay(a, None) for a in range(6)] == [0.5, 1.0, 2.0, 4.0, 8.0, 8.0]
    assert [highest.delay(a, None) for a in range(3)] == [0.375, 0.75, 1.5]
    assert (lowest.delay(0, 2.0), highest.delay(0, 2.0)) == (2.0, 2.5)
    assert lowest.delay(0, 61.0) is None


def test_opening_a_stream_is_retried_but_its_refusal_is_raised(make_client):
    done = {"model": "translator", "version": "1", "results": []}
    answer = httpx.Response(200, content=sse(("done", done)), headers={"Content-Type": "text/event-stream"})
    script = Script(error(503, "overloaded", **{"Retry-After": "0"}), answer)
    client = make_client(script)
    client.record_sleeps()
    assert [e.type for e in client.translate_stream("Open the file.")] == ["done"]
    assert len(script.requests) == 2
    client = make_client(Script(error(422, "invalid_field", "stream: true takes exactly one text")))
    with pytest.raises(InvalidFieldError, match="exactly one text"):
        client.translate_stream("")


def test_readiness_is_asked_once_and_not_ready_is_an_answer(make_client):
    body = {
        "error": {"code": "not_ready", "message": "vit/1: warming"},
        "status": "not_ready",
        "models": {"vit/1": "warming"},
    }
    script = Script(httpx.Response(503, json=body, headers={"Retry-After": "1"}))
    readiness = make_client(script).ready()
    assert not readiness.ready and readiness.reason == "vit/1: warming" and readiness.models == {"vit/1": "warming"}
    assert len(script.requests) == 1
