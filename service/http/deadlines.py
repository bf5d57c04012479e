"""A request's deadline over HTTP: ``X-Request-Timeout``, and the deadline counted by route.

``X-Request-Timeout: <seconds>`` on any route that queues work asks for a deadline as the OIP
``timeout`` parameter and a gRPC call's deadline do; ``service/core/deadlines.py`` makes the
deadline of what a request asks for. A request answered 504 ``deadline_exceeded`` is counted here by
route.
"""

from __future__ import annotations

import re

from starlette.requests import Request
from starlette.types import Scope

from service.core.deadlines import deadline
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


def header_timeout(request: Request) -> float | None:
    """``X-Request-Timeout`` in seconds (a plain decimal number above 0), or None without one; 400 if malformed."""
    value = request.headers.get(HEADER)
    if value is None:
        return None
    value = value.strip()
    if not _SECONDS.fullmatch(value):
        raise InvalidTimeout(f"{HEADER}: must be a number of seconds above 0 such as 2.5, got {value[:40]!r}")
    return float(value)


def count_exceeded(scope: Scope) -> None:
    """Count one request answered ``deadline_exceeded`` under its route template."""
    scope["app"].state.metrics.deadline_exceeded(scope["route"].path)
