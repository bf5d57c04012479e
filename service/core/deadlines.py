"""How long a request may take, whatever its transport: its deadline, from the settings and from its client.

A request must be answered within ``ATTNSERVE_REQUEST_TIMEOUT_S`` of its arrival, unless its client
asks for another time: over HTTP with ``X-Request-Timeout`` (``service/http/deadlines.py``), over
gRPC with the call's deadline, and with either the Open Inference Protocol's ``timeout`` request
parameter (microseconds, as Triton's clients send it); with several, the shortest. No request gets
more than ``ATTNSERVE_MAX_REQUEST_TIMEOUT_S``. The engines keep the deadline (``service/engine/``):
past it, a request leaves its queue or decode batch and gets 504 ``deadline_exceeded``.
"""

from __future__ import annotations

import time
from typing import Any

from service.errors import InvalidTimeout
from service.settings import Settings


def deadline(settings: Settings, *asked_s: float | None, arrived: float | None = None) -> float:
    """The ``time.monotonic()`` deadline of a request that asks for the timeouts ``asked_s`` (None: not
    asked): the shortest, capped at ``ATTNSERVE_MAX_REQUEST_TIMEOUT_S``; none: ``ATTNSERVE_REQUEST_TIMEOUT_S``.
    ``arrived``: when the request came in (default: now)."""
    asked = [s for s in asked_s if s is not None]
    seconds = min(*asked, settings.max_request_timeout_s) if asked else settings.request_timeout_s
    return (time.monotonic() if arrived is None else arrived) + seconds


def oip_timeout(parameters: dict[str, Any]) -> float | None:
    """The OIP request parameter ``timeout`` (microseconds, an integer) in seconds; 0 or absent: None."""
    value = parameters.get("timeout")
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise InvalidTimeout(f"parameter timeout: must be a whole number of microseconds, got {value!r}")
    return value / 1e6 if value else None  # Triton reads 0 as "no timeout asked for"
