"""What ``Client`` and ``AsyncClient`` share: settings, request building, and the retry decision.

The two clients differ only in how they wait (``send`` or ``await send``, ``time.sleep`` or
``asyncio.sleep``); everything that decides something lives here, once, so they cannot drift.
"""

from __future__ import annotations

import logging
import os
import random
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import httpx

from attnserve_client import errors
from attnserve_client._images import Upload
from attnserve_client._version import __version__

log = logging.getLogger("attnserve_client")

T = TypeVar("T")

DEFAULT_BASE_URL = "http://127.0.0.1:8000"
DEFAULT_TIMEOUT = 60.0
DEFAULT_MAX_RETRIES = 2
# Answers that say "not now" rather than "not this request": the service's full queue or warm-up (429,
# 503), and what a proxy or load balancer in front answers when a replica closed the connection without
# an answer (killed, restarting: 502) or did not answer in time (504). Every call the SDK makes is
# idempotent (a classification or translation repeated gives the same answer), so sending it again is
# safe. Not retried: the service's own 504 `deadline_exceeded` (the deadline the caller set has passed:
# another attempt would only exceed it further) and 500 (`inference_failed`, `internal_error`: the same
# input fails the same way, and a retry would only triple the load of a failing request).
RETRYABLE_STATUSES = frozenset({429, 502, 503, 504})
NOT_RETRIED_CODES = frozenset({"deadline_exceeded"})


@dataclass(frozen=True)
class Call(Generic[T]):
    """One API call, described without doing any I/O: the request to send and how to read its answer."""

    method: str
    path: str
    parse: Callable[[httpx.Response], T]
    params: Mapping[str, Any] | None = None
    json: Any = None
    files: list[tuple[str, Upload]] | None = None
    data: Mapping[str, str] | None = None
    accept: str = "application/json"
    answers: frozenset[int] = frozenset()  # error statuses whose body is an answer, not a failure (/readyz's 503)
    retry: bool = True  # idempotent: may be sent again after a failure that is not the request's fault
    stream: bool = False


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with jitter; the service's ``Retry-After`` wins when it gives one.

    A ``Retry-After`` longer than ``max_retry_after`` is not waited for inside a call: the error is
    raised at once, with ``retry_after`` set, for the caller to schedule.
    """

    initial_delay: float = 0.5
    max_delay: float = 8.0
    max_retry_after: float = 60.0
    random: Callable[[], float] = field(default=random.random, repr=False)

    def delay(self, attempt: int, retry_after: float | None) -> float | None:
        """Seconds to wait before retry number ``attempt + 1``, or None not to retry."""
        if retry_after is not None:
            if retry_after > self.max_retry_after:
                return None
            return retry_after * (1 + 0.25 * self.random())  # never earlier than asked; spread the herd
        return min(self.initial_delay * 2**attempt, self.max_delay) * (1 - 0.25 * self.random())


class BaseClient:
    """Settings (keyword arguments, else environment variables, else defaults) and the I/O-free steps."""

    def __init__(
        self,
        *,
        base_url: str | None,
        api_key: str | None,
        timeout: float | httpx.Timeout | None,
        max_retries: int | None,
        deadline: float | None = None,
    ) -> None:
        self.base_url = (base_url or os.environ.get("ATTNSERVE_BASE_URL") or DEFAULT_BASE_URL).rstrip("/")
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must start with http:// or https://, got {self.base_url!r}")
        self.api_key = api_key if api_key is not None else os.environ.get("ATTNSERVE_API_KEY") or None
        self.timeout = timeout if timeout is not None else _env_number("ATTNSERVE_TIMEOUT", float, DEFAULT_TIMEOUT)
        self.max_retries = (
            max_retries if max_retries is not None else _env_number("ATTNSERVE_MAX_RETRIES", int, DEFAULT_MAX_RETRIES)
        )
        if self.max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {self.max_retries}")
        # seconds the service may spend on a request (X-Request-Timeout); None: the service's own default
        self.deadline = deadline if deadline is not None else _env_number("ATTNSERVE_DEADLINE", float, None)
        if self.deadline is not None and not self.deadline > 0:
            raise ValueError(f"deadline must be > 0 seconds, got {self.deadline}")
        self.retry_policy = RetryPolicy()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(base_url={self.base_url!r}, max_retries={self.max_retries})"

    def _build_request(self, http: httpx.Client | httpx.AsyncClient, call: Call[Any]) -> httpx.Request:
        """The request of ``call``; one request id for all its attempts, so the server logs tie them together."""
        headers = {
            "Accept": call.accept,
            "User-Agent": f"attnserve-client/{__version__}",
            "X-Request-ID": uuid.uuid4().hex,
        }
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        if self.deadline is not None:
            headers["X-Request-Timeout"] = format(self.deadline, ".6f").rstrip("0").rstrip(".")
        params = {k: v for k, v in (call.params or {}).items() if v is not None}
        return http.build_request(
            call.method,
            self.base_url + call.path,
            params=params,
            json=call.json,
            files=call.files,
            data=call.data,
            headers=headers,
            timeout=self.timeout,
        )

    def _answer_or_delay(
        self, call: Call[Any], request: httpx.Request, outcome: httpx.Response | httpx.TransportError, attempt: int
    ) -> httpx.Response | float:
        """The answer, or the seconds to wait before retrying, or raise the error of ``outcome``.

        An error response must have been read (streamed calls read error bodies before coming here).
        """
        if isinstance(outcome, httpx.TransportError):
            error: errors.AttnserveError = errors.from_transport(outcome, request.headers["X-Request-ID"])
            retryable = True
        elif outcome.is_success or outcome.status_code in call.answers:
            return outcome
        else:
            error = errors.from_response(outcome)
            retryable = outcome.status_code in RETRYABLE_STATUSES and error.code not in NOT_RETRIED_CODES
        delay = self.retry_policy.delay(attempt, error.retry_after) if call.retry and retryable else None
        if delay is None or attempt >= self.max_retries:
            raise error from (outcome if isinstance(outcome, httpx.TransportError) else None)
        log.info(
            "%s %s: %s; retry %d of %d in %.2f s",
            request.method,
            request.url.path,
            error,
            attempt + 1,
            self.max_retries,
            delay,
        )
        return delay


def _env_number(name: str, kind: type[T], default: T) -> T:
    value = os.environ.get(name)
    if not value:
        return default
    try:
        return kind(value)  # type: ignore[call-arg]
    except ValueError:
        raise ValueError(f"{name}={value!r} is not a valid {kind.__name__}") from None
