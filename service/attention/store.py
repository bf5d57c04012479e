"""Where attention records wait for ``GET /attention/{id}``: in this process, or in a shared Redis.

Ids are unguessable (128 random bits, URL-safe). Every record expires after the TTL.

- :class:`MemoryStore` (default) keeps records in an LRU bounded by their total size: adding one
  evicts the least recently used until it fits. Ids are only valid on the replica that made them.
- :class:`RedisStore` keeps each record as one ``.npz`` value with Redis's own expiry, so every
  replica sharing the Redis serves every id. The total size is bounded by Redis itself (run it with
  ``--maxmemory`` and ``--maxmemory-policy allkeys-lru``, as docker-compose does). When Redis cannot
  be reached within ``redis_timeout_s``, ``put``/``get`` raise :class:`StoreUnavailable`: the
  predictions are still answered (without an id), and ``GET /attention`` answers 503.
"""

from __future__ import annotations

import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Protocol

from service.attention.record import AttentionRecord, RecordError
from service.errors import AttentionStoreUnavailable
from service.observers import UNOBSERVED
from service.settings import Settings

KEY_PREFIX = "attnserve:attention:"


class StoreUnavailable(AttentionStoreUnavailable):
    pass


class StoreObserver(Protocol):
    def stored(self, records: int, nbytes: int) -> None: ...
    def evicted(self, reason: str, count: int = 1) -> None: ...
    def failed(self, operation: str) -> None: ...


def new_id() -> str:
    """128 random bits, URL-safe, never starting with "-" (which a shell command would take for an option)."""
    while (attention_id := secrets.token_urlsafe(16)).startswith("-"):
        pass
    return attention_id


class MemoryStore:
    kind = "memory"

    def __init__(
        self,
        ttl_s: float,
        max_bytes: int,
        observer: StoreObserver | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ttl_s, self.max_bytes = ttl_s, max_bytes
        self._clock = clock
        self._observer = observer or UNOBSERVED
        self._records: OrderedDict[str, tuple[AttentionRecord, float]] = OrderedDict()  # id -> (record, expiry)
        self.nbytes = 0

    def __len__(self) -> int:
        return len(self._records)

    async def put(self, record: AttentionRecord) -> str:
        size = record.nbytes
        if size > self.max_bytes:
            raise StoreUnavailable(
                f"attention maps of {size} bytes exceed the store's size cap ({self.max_bytes} bytes)"
            )
        self._expire()
        evicted = 0
        while self.nbytes + size > self.max_bytes:
            _, (old, _) = self._records.popitem(last=False)
            self.nbytes -= old.nbytes
            evicted += 1
        if evicted:
            self._observer.evicted("size", evicted)
        key = new_id()
        self._records[key] = (record, self._clock() + self.ttl_s)
        self.nbytes += size
        self._observer.stored(len(self._records), self.nbytes)
        return key

    async def get(self, key: str) -> AttentionRecord | None:
        item = self._records.get(key)
        if item is None:
            return None
        record, expiry = item
        if self._clock() >= expiry:
            self._drop(key)
            self._observer.evicted("ttl")
            return None
        self._records.move_to_end(key)
        return record

    def _expire(self) -> None:
        now, expired = self._clock(), 0
        for key in [k for k, (_, exp) in self._records.items() if exp <= now]:
            self._drop(key)
            expired += 1
        if expired:
            self._observer.evicted("ttl", expired)

    def _drop(self, key: str) -> None:
        record, _ = self._records.pop(key)
        self.nbytes -= record.nbytes
        self._observer.stored(len(self._records), self.nbytes)

    async def ping(self) -> bool:
        return True

    async def close(self) -> None:
        self._records.clear()
        self.nbytes = 0


class RedisStore:
    kind = "redis"

    def __init__(self, url: str, ttl_s: int, timeout_s: float, observer: StoreObserver | None = None) -> None:
        import redis.asyncio as aioredis  # only this backend needs the client

        self.ttl_s = ttl_s
        self._observer = observer or UNOBSERVED
        self._redis = aioredis.from_url(
            url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s, retry_on_timeout=False
        )
        # unreachable, too slow, or refusing (full: maxmemory with noeviction answers OOM to every write)
        self._errors = (aioredis.RedisError, OSError)
        self._refusals = aioredis.ResponseError
        self._where = url.rsplit("@", 1)[-1]  # never log a password

    async def put(self, record: AttentionRecord) -> str:
        key = new_id()
        try:
            await self._redis.set(KEY_PREFIX + key, record.to_bytes(), ex=self.ttl_s)
        except self._errors as e:
            self._observer.failed("put")
            what = "refused the maps" if isinstance(e, self._refusals) else "is unreachable"
            raise StoreUnavailable(f"the attention store (Redis at {self._where}) {what}: {e}") from e
        return key

    async def get(self, key: str) -> AttentionRecord | None:
        try:
            blob = await self._redis.get(KEY_PREFIX + key)
        except self._errors as e:
            self._observer.failed("get")
            raise StoreUnavailable(f"the attention store (Redis at {self._where}) is unreachable: {e}") from e
        if blob is None:
            return None
        try:
            return AttentionRecord.from_bytes(blob)
        except RecordError:
            return None  # written by an incompatible version: as good as expired

    async def ping(self) -> bool:
        try:
            return bool(await self._redis.ping())
        except self._errors:
            return False

    async def close(self) -> None:
        await self._redis.aclose()


AttentionStore = MemoryStore | RedisStore


def create_store(settings: Settings, observer: StoreObserver | None = None) -> AttentionStore:
    if settings.attention_store == "redis":
        return RedisStore(settings.redis_url, settings.attention_ttl_s, settings.redis_timeout_s, observer)
    return MemoryStore(settings.attention_ttl_s, settings.attention_max_bytes, observer)
