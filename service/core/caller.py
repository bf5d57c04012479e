"""Who asks, as the operations see it, whatever the transport: the caller's key and how to await its answer.

An operation that queues work (``service/core/classify.py``, ``translate.py``, the Open Inference
Protocol's ``infer``) needs two things of the transport a request came by: the key it presented,
which owns the attention records it stores, and how to wait for an answer while watching for the
client going away. HTTP builds a ``Caller`` from its request (``service/http/common.http_caller``),
gRPC from its call (``service/grpc/calls.wait``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from service.tracing import TRACING


class KeyedStore:
    """The attention store as one request sees it: the records it stores belong to its API key."""

    def __init__(self, store: Any, owner: str | None) -> None:
        self.store, self.owner = store, owner

    async def put(self, record: Any) -> str:
        record.owner = self.owner
        if not TRACING.enabled:
            return await self.store.put(record)
        with TRACING.span("attention store", {"attnserve.store": type(self.store).__name__}):
            return await self.store.put(record)


Wait = Callable[[asyncio.Future, Callable[[], None]], Awaitable[Any]]


@dataclass(frozen=True)
class Caller:
    """What queued work needs to know of the transport a request came by, so that REST and gRPC handlers
    share one path to the engines: the key it presented (its fingerprint; None: keys are off), which
    owns the attention records it stores, and how to await an answer, ``wait(answer, abandon)``, calling
    ``abandon()`` when the client goes away first (HTTP: ``answer_or_disconnect``; gRPC: the call's
    cancellation); its quota, which the operations charge with the work once they know it; whether its
    key queues as batch work only."""

    key_id: str | None
    wait: Wait
    quota: Any = None  # its ``service.core.quotas.Quota``, charged at admission (None: not limited)
    batch_only: bool = False  # its key's terms queue every request as batch work

    def store(self, store: Any) -> KeyedStore:
        return KeyedStore(store, self.key_id)

    def priority(self, asked: str) -> str:
        """The priority its work queues with: what it asked, unless its key allows batch only."""
        return "batch" if self.batch_only else asked

    async def charge(self, **work: int) -> None:
        """Count the work of the request (``characters=``, ``images=``) against its quota: 429 if over."""
        if self.quota is not None:
            await self.quota.charge(**work)
