"""How long a request may take: its deadline, from the settings and from what its client asks for.

A request must be answered within ``ATTNSERVE_REQUEST_TIMEOUT_S`` of its arrival, unless the client
asks for another time: ``X-Request-Timeout: <seconds>`` on any route that queues work, or the Open
Inference Protocol's ``timeout`` request parameter (microseconds, as Triton's clients send it); with
both, the shorter. No request gets more than ``ATTNSERVE_MAX_REQUEST_TIMEOUT_S``. The engines keep
the deadline (``service/engine/``): past it, a request leaves its queue or decode batch and gets 504
``deadline_exceeded``, counted here by route.
"""

from __future__ import annotations

import re
import time
from typing import Any

from starlette.requests import Request
from starlette.types import Scope

from service.errors import InvalidTimeout
from service.settings import Settings

HEADER = "x-request-timeout"
# Seconds above 0: digits, then optionally a point and at most 9 decimals (so no value rounds to 0 s).
# Spelled as one regular expression, without look-arounds, so that the OpenAPI document states
# exactly this grammar and any JSON Schema tool can check it: a whole part with a digit other than 0,
# or a whole part of zeros and decimals with one.
_NONZERO_DECIMALS = "|".join("0" * zeros + "[1-9]" + f"[0-9]{{0,{8 - zeros}}}" * (zeros < 8) for zeros in range(9))
TIMEOUT_PATTERN = rf"^(?:[0-9]*[1-9][0-9]*(?:\.[0-9]{{1,9}})?|0+\.(?:{_NONZERO_DECIMALS}))$"
_SECONDS = re.compile(TIMEOUT_PATTERN)


def request_deadline(
    request: Request, settings: Settings, asked_s: float | None = None, *, arrived: float | None = None
) -> float:
    """The ``time.monotonic()`` by which ``request`` must be answered.

    ``arrived``: when the request came in (default: now; handlers ask before reading the body);
    ``asked_s``: a timeout the request's body asks for besides the header (the OIP parameter).
    """
    return deadline(settings, header_timeout(request), asked_s, arrived=arrived)


def deadline(settings: Settings, *asked_s: float | None, arrived: float | None = None) -> float:
    """The ``time.monotonic()`` deadline of a request that asks for the timeouts ``asked_s`` (None: not
    asked): the shortest, capped at ``ATTNSERVE_MAX_REQUEST_TIMEOUT_S``; none: ``ATTNSERVE_REQUEST_TIMEOUT_S``.
    Whatever the transport: REST (``request_deadline``) and gRPC (the call's deadline) both end here."""
    asked = [s for s in asked_s if s is not None]
    seconds = min(*asked, settings.max_request_timeout_s) if asked else settings.request_timeout_s
    return (time.monotonic() if arrived is None else arrived) + seconds


def header_timeout(request: Request) -> float | None:
    """``X-Request-Timeout`` in seconds (a plain decimal number above 0), or None without one; 400 if malformed."""
    value = request.headers.get(HEADER)
    if value is None:
        return None
    value = value.strip()
    if not _SECONDS.fullmatch(value):
        raise InvalidTimeout(f"{HEADER}: must be a number of seconds above 0 such as 2.5, got {value[:40]!r}")
    return float(value)


def oip_timeout(parameters: dict[str, Any]) -> float | None:
    """The OIP request parameter ``timeout`` (microseconds, an integer) in seconds; 0 or absent: None."""
    value = parameters.get("timeout")
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise InvalidTimeout(f"parameter timeout: must be a whole number of microseconds, got {value!r}")
    return value / 1e6 if value else None  # Triton reads 0 as "no timeout asked for"


def count_exceeded(scope: Scope) -> None:
    """Count one request answered ``deadline_exceeded`` under its route template."""
    scope["app"].state.metrics.deadline_exceeded(scope["route"].path)
