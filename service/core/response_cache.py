"""Answers kept in Redis for every replica: a text translated, or an image classified, once.

Opt-in (``ATTNSERVE_RESPONSE_CACHE``). The unit is a text of ``/translate`` and an image of
``/classify`` (and of the Open Inference Protocol's ``infer`` on the same models, over REST and gRPC):
a request of ten catalog strings of which eight were asked for before decodes only the other two. One
``MGET`` per request looks its entries up; the new answers go back in one pipelined ``SET`` with
Redis's own expiry.

The key of an entry is the sha256 of everything its answer depends on (``docs/configuration.md``,
"Response cache"): the service's version and this module's format, the model's name and version, the
sha256 of every file of the entry actually served (so an int8 variant or a re-exported graph never
shares an fp32 answer), the execution provider, every option that changes the answer, and the text
itself or the image's decoded pixels; with ``response_cache_scope=key`` also the caller's key. Requests
that ask for attention never use the cache: their answer holds an attention id owned by the caller's
key, and their maps would have to be stored anyway; a streamed translation neither (its tokens are the
point of it). Nothing else in an answer is per caller, so entries are shared by every key by default.

The cache never fails a request, nor makes it wait long: a lookup waits at most
``response_cache_budget_ms`` (and never past the request's deadline), a store as long before the answer
goes out and then on in the background. Redis unreachable, or slower than that, makes the request computed
(or answered) as if there were no cache, counted (``result="error"``) and logged at most once a minute;
after such a failure the cache is left alone for ``RETRY_AFTER_S``, so a Redis that is slow costs one request
a second the budget, not every request its delay. Identical texts missed by concurrent requests are decoded
once in a process (``service/core/single_flight.py``).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import struct
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Protocol, TypeVar

import numpy as np

from service.build import identity
from service.core.single_flight import Flights
from service.observers import UNOBSERVED
from service.settings import Settings

log = logging.getLogger("attnserve.response_cache")

KEY_PREFIX = "attnserve:response:"
FORMAT = 1  # raise it when what an entry holds changes: old entries are then never read
RETRY_AFTER_S = 1.0  # after a failed Redis call, answer without the cache for this long
LOG_EVERY_S = 60.0  # at most one warning per this long while Redis keeps failing
OPERATIONS = ("translate", "classify")

T = TypeVar("T")


class CacheObserver(Protocol):
    def looked_up(self, operation: str, result: str, count: int) -> None: ...
    def failed(self, call: str) -> None: ...
    def oversized(self, operation: str, count: int) -> None: ...


@dataclass(frozen=True)
class ModelIdentity:
    """What says which network computed an answer: the same name and version with other files (an int8
    variant, a re-export) or on another provider is another identity."""

    name: str
    version: str
    precision: str
    files: str  # sha256 over the served entry's files and their sha256s
    provider: str | None

    @classmethod
    def of(cls, served: Any) -> ModelIdentity:
        """The identity of a ``registry.ServedModel`` that is ready (its manifest is the served entry's)."""
        m = served.manifest
        files = sorted((name, f.sha256) for name, f in m.files.items()) if m is not None else []
        digest = hashlib.sha256(json.dumps(files).encode()).hexdigest()
        precision = m.variant.precision if m is not None and m.variant is not None else "fp32"
        return cls(served.name, served.version, precision, digest, served.provider)


@dataclass(frozen=True)
class TranslationOptions:
    """Every option of a translation that changes its answer, as resolved for the request (defaults applied)."""

    protect_placeholders: bool  # whether spans are masked: asked for and the model has sentinels
    format: str  # "text" or "html"
    beam_size: int
    length_penalty: float
    num_return_sequences: int
    max_new_tokens: int | None  # as asked; None: the model's rule, capped by
    max_new_tokens_cap: int  # the service's `max_new_tokens`


@dataclass(frozen=True)
class ImageOptions:
    """What changes an image's probabilities besides its pixels: the one copy of weights
    (``share_classifier_weights``) computes scores whose last digits differ."""

    shared_weights: bool


class Keys:
    """The keys of one request's items: a digest of what they share, extended by each item."""

    def __init__(self, operation: str, model: ModelIdentity, options: Any, owner: str | None) -> None:
        head = {
            "format": FORMAT,
            "service": identity(),  # the running code's build: an upgrade never reads the old build's answers
            "operation": operation,
            "model": asdict(model),
            "options": asdict(options),
            "owner": owner,
        }
        self.operation = operation
        self._prefix = f"{KEY_PREFIX}{operation}:"
        self._head = hashlib.sha256(json.dumps(head, sort_keys=True).encode())

    def text(self, text: str) -> str:
        h = self._head.copy()
        h.update(b"text\0" + text.encode("utf-8", "surrogatepass"))
        return self._prefix + h.hexdigest()

    def pixels(self, rows: np.ndarray, prepared: bool) -> list[str]:
        """One key per row (image) of ``rows``: its dtype, shape and bytes, and whether they are the model's
        input already (the protocol's ``pixels``) or decoded pixels yet to be normalised."""
        kind = b"prepared\0" if prepared else b"decoded\0"
        shape = struct.pack(f"<{rows.ndim - 1}q", *rows.shape[1:])
        keys = []
        for row in rows:
            h = self._head.copy()
            h.update(kind + rows.dtype.str.encode() + b"\0" + shape)
            h.update(np.ascontiguousarray(row).data)
            keys.append(self._prefix + h.hexdigest())
        return keys


@dataclass
class CacheReport:
    """How a request fared with the cache, for its transport to tell (HTTP: the ``X-Cache`` header)."""

    outcome: str | None = None  # None: the cache is off; "bypass", "error", "hit", "miss" or "partial"
    hits: int = 0
    items: int = 0

    def bypassed(self) -> None:
        self.outcome = "bypass"

    def looked_up(self, found: list | None, items: int) -> None:
        self.items = items
        if found is None:
            self.outcome = "error"
            return
        self.hits = sum(f is not None for f in found)
        self.outcome = "hit" if self.hits == items else "miss" if self.hits == 0 else "partial"

    def headers(self) -> dict[str, str]:
        if self.outcome is None:
            return {}
        if self.outcome in ("bypass", "error"):
            return {"X-Cache": self.outcome}
        return {"X-Cache": self.outcome, "X-Cache-Hits": f"{self.hits}/{self.items}"}


class ResponseCache:
    """Entries in Redis, looked up and written in one round trip each; never raises for Redis's sake."""

    def __init__(
        self,
        url: str,
        ttl_s: int,
        timeout_s: float,
        max_entry_bytes: int,
        scope: str = "shared",
        observer: CacheObserver | None = None,
        clock: Callable[[], float] = time.monotonic,
        budget_s: float = 0.05,
    ) -> None:
        import redis.asyncio as aioredis  # only a process with the cache on needs the client

        self.ttl_s, self.max_entry_bytes, self.scope, self.budget_s = ttl_s, max_entry_bytes, scope, budget_s
        self.flights = Flights()
        self._stores: set[asyncio.Task] = set()  # stores still running after their request was answered
        self._observer = observer or UNOBSERVED
        self._clock = clock
        self._redis = aioredis.from_url(
            url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s, retry_on_timeout=False
        )
        self._errors = (aioredis.RedisError, OSError)
        self._where = url.rsplit("@", 1)[-1]  # never log a password
        self._skip_until = 0.0  # after a failure: no Redis call before this
        self._failing = False
        self._next_warning = 0.0
        self._unreported = 0
        for operation in OPERATIONS:  # every series from the start, at 0: a hit ratio is defined before the first hit
            for result in ("hit", "miss", "error"):
                self._observer.looked_up(operation, result, 0)

    @classmethod
    def from_settings(cls, settings: Settings, observer: CacheObserver | None = None) -> ResponseCache | None:
        if not settings.response_cache:
            return None
        return cls(
            settings.redis_url,
            settings.response_cache_ttl_s,
            settings.redis_timeout_s,
            settings.response_cache_max_entry_bytes,
            settings.response_cache_scope,
            observer,
            budget_s=settings.response_cache_budget_ms / 1000.0,
        )

    def keys(self, operation: str, model: ModelIdentity, options: Any, key_id: str | None) -> Keys:
        """The keys of a request's items; ``key_id``, the caller's key, counts only with scope ``key``."""
        return Keys(operation, model, options, key_id if self.scope == "key" else None)

    def _budget(self, deadline: float | None) -> float:
        """How long a call may keep its request waiting: the budget, and never past the request's deadline."""
        return self.budget_s if deadline is None else min(self.budget_s, deadline - time.monotonic())

    async def get_many(
        self, operation: str, keys: Sequence[str], decode: Callable[[bytes], T | None], deadline: float | None = None
    ) -> list[T | None] | None:
        """The entry of each key (None: not cached, or unreadable), or None when Redis could not be asked, or did
        not answer within the budget (or the request's ``deadline``, ``time.monotonic()``)."""
        if not keys:
            return []
        budget = self._budget(deadline)
        if self._clock() < self._skip_until or budget <= 0:
            self._observer.looked_up(operation, "error", len(keys))
            return None
        try:
            blobs = await asyncio.wait_for(self._redis.mget(list(keys)), budget)
        except (*self._errors, TimeoutError) as e:
            self._failed("get", e)
            self._observer.looked_up(operation, "error", len(keys))
            return None
        self._recovered()
        found = [decode(b) if b is not None else None for b in blobs]
        hits = sum(f is not None for f in found)
        if hits:
            self._observer.looked_up(operation, "hit", hits)
        if hits < len(found):
            self._observer.looked_up(operation, "miss", len(found) - hits)
        return found

    async def put_many(self, operation: str, entries: dict[str, bytes], deadline: float | None = None) -> None:
        """Keep ``entries`` for ``ttl_s``, those no larger than ``max_entry_bytes``; a failure is counted and logged.

        Waits for the store at most the budget (so the same replica's next request finds it), then lets it go on
        in the background; a store slower than the budget leaves the cache alone as a failed one does."""
        kept = {k: v for k, v in entries.items() if len(v) <= self.max_entry_bytes}
        if len(kept) < len(entries):
            self._observer.oversized(operation, len(entries) - len(kept))
        if not kept or self._clock() < self._skip_until:
            return
        store = asyncio.ensure_future(self._store(kept))
        self._stores.add(store)
        store.add_done_callback(self._stores.discard)
        done, _ = await asyncio.wait([store], timeout=max(0.0, self._budget(deadline)))
        if not done:
            self._failed("set", TimeoutError(f"no answer within {self.budget_s * 1000:g} ms"))

    async def _store(self, kept: dict[str, bytes]) -> None:
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                for key, value in kept.items():
                    pipe.set(key, value, ex=self.ttl_s)
                await pipe.execute()
        except self._errors as e:
            self._failed("set", e)
            return
        self._recovered()

    def _failed(self, call: str, error: BaseException) -> None:
        self._observer.failed(call)
        now = self._clock()
        self._skip_until = now + RETRY_AFTER_S
        self._failing = True
        self._unreported += 1
        if now >= self._next_warning:
            log.warning(
                "response cache: Redis at %s failed (%s: %s); answering without the cache (%d failed calls "
                "since the last message, at most one message a minute)",
                self._where,
                type(error).__name__,
                error,
                self._unreported,
            )
            self._next_warning, self._unreported = now + LOG_EVERY_S, 0

    def _recovered(self) -> None:
        if self._failing:
            self._failing = False
            log.info("response cache: Redis at %s answers again", self._where)

    async def ping(self) -> bool:
        try:
            return bool(await self._redis.ping())
        except self._errors:
            return False

    async def close(self) -> None:
        for store in list(self._stores):  # a store in the background when the process stops is not waited for
            store.cancel()
        await self._redis.aclose()


# What an entry holds, per operation.


def encode_translation(result: dict) -> bytes:
    """A text's result as JSON (the standard library's, as the answer is written: the same floats back)."""
    return json.dumps(result, ensure_ascii=False).encode()


def decode_translation(blob: bytes) -> dict | None:
    try:
        result = json.loads(blob)
    except (ValueError, UnicodeDecodeError):
        return None
    return result if isinstance(result, dict) and "translation" in result else None


def encode_probabilities(row: np.ndarray) -> bytes:
    """An image's softmax row, float64 little-endian: exactly what was computed."""
    return np.ascontiguousarray(row, "<f8").tobytes()


def probabilities_decoder(classes: int) -> Callable[[bytes], np.ndarray | None]:
    def decode(blob: bytes) -> np.ndarray | None:
        if len(blob) != 8 * classes:
            return None  # another model's shape: as good as absent
        return np.frombuffer(blob, "<f8").astype(np.float64)

    return decode
