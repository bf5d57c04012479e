"""Quotas per caller: requests, and each task's work (characters to translate, images to classify), per window.

A policy is a list of limits, ``requests=600/min,characters=100000/min,images=600/min`` (windows ``s``,
``min``, ``h``). Whose: an API key's own (its line in the key file), else every key's default
(``ATTNSERVE_QUOTA``); without keys, each client address's (``ATTNSERVE_ANONYMOUS_QUOTA``, the loopback
exempt by ``ATTNSERVE_QUOTA_EXEMPT``). A request is charged one ``requests`` when it is admitted (before its
body is read) and its work once the body is parsed; a charge that would take any of its limits past the
amount is refused whole, 429 ``quota_exceeded`` with ``Retry-After`` (the seconds until the window that
refused it ends), and counts nothing.

Windows are fixed (the epoch cut into ``window`` seconds), counted in this process (``memory``) or in
Redis (``ATTNSERVE_QUOTA_STORE=redis``: one Lua script per charge, so that every replica sharing the Redis
shares the quota). A Redis that fails or does not answer within ``redis_timeout_s`` lets the request
through (the failure is counted and logged once a minute): a quota protects the service, it must not be
what takes it down.

Every answer of a metered route carries the IETF ``RateLimit-Policy`` and ``RateLimit`` fields
(draft-ietf-httpapi-ratelimit-headers-09): ``"requests";q=600;w=60`` and ``"requests";r=598;t=17``.
"""

from __future__ import annotations

import functools
import ipaddress
import logging
import math
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from service.errors import ServiceError

log = logging.getLogger("attnserve.quotas")

MEASURES = ("requests", "characters", "images")
WINDOWS = {"s": 1, "min": 60, "h": 3600}
_LIMIT = re.compile(r"^(\w+)=(\d+)/(\w+)$")
OFF = ("", "off", "none")


@dataclass(frozen=True)
class Limit:
    measure: str  # one of MEASURES
    amount: int  # at most this much per window
    window_s: int


def parse_policy(text: str) -> tuple[Limit, ...]:
    """``requests=600/min,characters=100000/min`` as limits; ``off`` (or nothing): none. A ValueError names what
    is wrong."""
    if text.strip().lower() in OFF:
        return ()
    limits: dict[str, Limit] = {}
    for part in text.split(","):
        m = _LIMIT.match(part.strip())
        if m is None:
            raise ValueError(f"quota {part.strip()!r}: write MEASURE=AMOUNT/WINDOW, e.g. requests=600/min")
        measure, amount, unit = m[1], int(m[2]), m[3]
        if measure not in MEASURES:
            raise ValueError(f"quota {part.strip()!r}: measure {measure!r} is not one of {', '.join(MEASURES)}")
        if unit not in WINDOWS:
            raise ValueError(f"quota {part.strip()!r}: window {unit!r} is not one of {', '.join(WINDOWS)}")
        if measure in limits:
            raise ValueError(f"quota {text!r}: {measure} is limited twice")
        limits[measure] = Limit(measure, amount, WINDOWS[unit])
    return tuple(limits.values())


class QuotaExceeded(ServiceError):
    status, code = 429, "quota_exceeded"


@dataclass
class Standing:
    """Where one limit stands for a caller after a charge: what is left of it and when its window ends."""

    limit: Limit
    remaining: int
    reset_s: int


class Counter:
    """Counts per (partition, limit, window); ``take`` adds ``costs`` to every limit or, if any would pass its
    amount, to none. Returns (taken, each limit's count after it, or now if refused)."""

    async def take(self, partition: str, limits: Sequence[Limit], costs: Sequence[int], now: float):
        raise NotImplementedError

    async def close(self) -> None:
        pass


class MemoryCounter(Counter):
    """This process's windows: a replica beside it keeps its own."""

    def __init__(self) -> None:
        self._counts: dict[tuple[str, str, int, int], int] = {}
        self._prune_at = 0.0

    async def take(self, partition, limits, costs, now):
        keys = [(partition, lim.measure, lim.window_s, int(now // lim.window_s)) for lim in limits]
        counts = [self._counts.get(k, 0) for k in keys]
        if any(c + cost > lim.amount for c, cost, lim in zip(counts, costs, limits) if cost):
            return False, counts
        for k, cost in zip(keys, costs):
            if cost:
                self._counts[k] = self._counts.get(k, 0) + cost
        if now >= self._prune_at:  # windows that ended are forgotten
            self._counts = {k: v for k, v in self._counts.items() if (k[3] + 1) * k[2] > now}
            self._prune_at = now + 10
        return True, [self._counts.get(k, 0) for k in keys]


# KEYS: a count per limit; ARGV: per limit its amount, the cost, the window's end (ms, for PEXPIREAT).
# Nothing is added unless every limit has room; the counts come back either way.
TAKE = """
local n = #KEYS
local counts = {}
for i = 1, n do
  counts[i] = tonumber(redis.call('GET', KEYS[i]) or '0')
  local cost = tonumber(ARGV[3 * i - 1])
  if cost > 0 and counts[i] + cost > tonumber(ARGV[3 * i - 2]) then
    return {0, unpack(counts)}
  end
end
for i = 1, n do
  local cost = tonumber(ARGV[3 * i - 1])
  if cost > 0 then
    counts[i] = redis.call('INCRBY', KEYS[i], cost)
    redis.call('PEXPIREAT', KEYS[i], ARGV[3 * i])
  end
end
return {1, unpack(counts)}
"""


class RedisCounter(Counter):
    """Windows in Redis, shared by every replica that uses it; a Redis error or timeout lets the charge through."""

    PREFIX = "attnserve:quota:"

    def __init__(self, url: str, timeout_s: float, failed: Callable[[], None] = lambda: None) -> None:
        import redis.asyncio as aioredis  # only a process that counts in Redis needs the client

        self._redis = aioredis.from_url(
            url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s, retry_on_timeout=False
        )
        self._script = self._redis.register_script(TAKE)
        self._errors = (aioredis.RedisError, OSError, TimeoutError)
        self._failed, self._where, self._next_warning = failed, url.rsplit("@", 1)[-1], 0.0

    async def take(self, partition, limits, costs, now):
        keys, args = [], []
        for lim, cost in zip(limits, costs):
            window = int(now // lim.window_s)
            keys.append(f"{self.PREFIX}{partition}:{lim.measure}:{lim.window_s}:{window}")
            args += [lim.amount, cost, int((window + 1) * lim.window_s * 1000) + 1000]
        try:
            answer = await self._script(keys=keys, args=args)
        except self._errors as e:
            self._failed()
            if time.monotonic() >= self._next_warning:
                log.warning("quotas: Redis at %s failed (%s); requests go through uncounted meanwhile", self._where, e)
                self._next_warning = time.monotonic() + 60
            return True, None
        return bool(answer[0]), [int(c) for c in answer[1:]]

    async def close(self) -> None:
        await self._redis.aclose()


class Quota:
    """One caller's quota as a request sees it: ``charge`` its costs, ``headers`` for its answer."""

    def __init__(
        self,
        counter: Counter,
        partition: str,
        limits: tuple[Limit, ...],
        clock: Callable[[], float] = time.time,
        refused: Callable[[list[str]], None] = lambda measures: None,
    ) -> None:
        self._counter, self.partition, self.limits, self._clock = counter, partition, limits, clock
        self._refused = refused
        self.standing: list[Standing] | None = None

    async def charge(self, **costs: int) -> None:
        """Count ``costs`` (measure=amount; measures the policy does not limit are free), or 429 if any limit
        would pass its amount."""
        now = self._clock()
        wanted = [costs.get(lim.measure, 0) for lim in self.limits]
        if not any(wanted):
            return
        for lim, cost in zip(self.limits, wanted):
            if cost > lim.amount:
                self._refused([lim.measure])
                raise QuotaExceeded(
                    f"this request's {lim.measure} ({cost}) exceed the whole quota of {lim.amount} per "
                    f"{lim.window_s} s: split it"
                )
        taken, counts = await self._counter.take(self.partition, self.limits, wanted, now)
        if counts is None:
            return
        self.standing = [
            Standing(lim, max(0, lim.amount - c), max(1, math.ceil((now // lim.window_s + 1) * lim.window_s - now)))
            for lim, c in zip(self.limits, counts)
        ]
        if not taken:
            over = [s for s, cost in zip(self.standing, wanted) if cost and s.remaining < cost]
            wait = max(s.reset_s for s in over)
            self._refused([s.limit.measure for s in over])
            raise QuotaExceeded(
                f"quota exceeded: {', '.join(f'{s.limit.measure} {s.limit.amount} per {s.limit.window_s} s' for s in over)}"
                f"; retry in {wait} s",
                headers={"Retry-After": str(wait), **self.headers()},
            )

    def headers(self) -> dict[str, str]:
        """``RateLimit-Policy`` and, once a charge has counted, ``RateLimit``."""
        out = {"RateLimit-Policy": ", ".join(f'"{lim.measure}";q={lim.amount};w={lim.window_s}' for lim in self.limits)}
        if self.standing:
            out["RateLimit"] = ", ".join(f'"{s.limit.measure}";r={s.remaining};t={s.reset_s}' for s in self.standing)
        return out


@dataclass(frozen=True)
class KeyTerms:
    """What a key's line in the key file sets for it (None: the defaults)."""

    quota: tuple[Limit, ...] | None = None
    priority: str | None = None  # "batch": its requests queue as batch work whatever they ask


class Quotas:
    """Who is limited how: keys by their own terms or the default, anonymous callers by address."""

    def __init__(
        self,
        counter: Counter,
        default: tuple[Limit, ...],
        anonymous: tuple[Limit, ...],
        exempt: Sequence[str] = (),
        terms: dict[str, KeyTerms] | None = None,
        clock: Callable[[], float] = time.time,
        refused: Callable[[list[str]], None] = lambda measures: None,
    ) -> None:
        self.counter, self.default, self.anonymous = counter, default, anonymous
        self.exempt = [ipaddress.ip_network(n, strict=False) for n in exempt]
        self._exempt = functools.lru_cache(maxsize=4096)(self._is_exempt)  # per request: parse an address once
        self.terms = terms or {}  # by key fingerprint
        self._clock, self._refused = clock, refused

    @classmethod
    def from_settings(cls, settings: Any, terms: dict[str, KeyTerms] | None, metrics: Any) -> Quotas | None:
        """The settings' quotas (``terms``: each key's, by fingerprint; None: keys are off), or None if nobody is
        limited. Says at start where the windows are counted."""
        default = parse_policy(settings.quota) if terms is not None else ()
        anonymous = parse_policy(settings.anonymous_quota) if terms is None else ()
        if not (default or anonymous or any(t.quota for t in (terms or {}).values())):
            return None
        if settings.quota_store == "redis":
            counter: Counter = RedisCounter(
                settings.redis_url, settings.redis_timeout_s, metrics.quota_store_errors.inc
            )
            where = "in Redis, shared by every replica that uses it"
        else:
            counter = MemoryCounter()
            where = "in this process (quota_store=memory): each replica counts its own, N replicas allow N times"
        whose = "per API key" if terms is not None else "per client address (anonymous_quota)"
        log.info("quotas %s, counted %s", whose, where)
        return cls(counter, default, anonymous, settings.quota_exempt, terms, refused=metrics.quota_refused)

    def for_caller(self, key_id: str | None, address: str | None) -> Quota | None:
        """The quota of a request by key ``key_id`` (None: keys are off) from ``address``; None: not limited."""
        if key_id is not None:
            terms = self.terms.get(key_id)
            limits = terms.quota if terms is not None and terms.quota is not None else self.default
            return Quota(self.counter, f"key:{key_id}", limits, self._clock, self._refused) if limits else None
        if not self.anonymous or address is None or self._exempt(address):
            return None
        return Quota(self.counter, f"address:{address}", self.anonymous, self._clock, self._refused)

    def _is_exempt(self, address: str) -> bool:
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:  # a Unix socket's peer, a test client's name
            return True
        return any(ip in net for net in self.exempt)

    async def close(self) -> None:
        await self.counter.close()
