"""The running service's parts, built once at start-up and stopped at shutdown, whatever serves them.

``running`` builds them (models loaded in the background, so that readiness can say "not yet, and
why"), yields a ``Serving``, and stops them in order when the transports are done: loading and
polling first, then the engines (queued work answered or refused), the attention store, the response
cache, the image decoder. Every HTTP handler and gRPC call receives the same ``Serving``, so a handler
never reaches into globals, and both transports share the keys and the in-flight bound as they share
the queues.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import onnxruntime as ort

from service import __version__
from service.attention.store import AttentionStore, create_store
from service.core.admission import InFlight
from service.core.keys import Keys
from service.core.quotas import Quotas
from service.core.response_cache import ResponseCache
from service.images import ImageDecoder, ImageLimits
from service.lifecycle import Lifecycle
from service.logs import flush_access_logs
from service.memory import release_every
from service.metrics import Metrics
from service.registry import Registry
from service.runtime import available_providers, check_gpu_available
from service.settings import Settings

log = logging.getLogger("attnserve.app")


class Draining:
    """Whether the process is draining: from its first SIGTERM or SIGINT (``service/process.py``) it answers
    as before while its readiness says no, so that load balancers stop sending to it before it stops
    accepting."""

    def __init__(self) -> None:
        self.since: float | None = None  # time.monotonic() of the signal

    @property
    def active(self) -> bool:
        return self.since is not None

    def begin(self) -> None:
        if self.since is None:
            self.since = time.monotonic()


@dataclass(frozen=True)
class Serving:
    settings: Settings
    metrics: Metrics
    registry: Registry
    decoder: ImageDecoder
    attention: AttentionStore
    lifecycle: Lifecycle
    keys: Keys | None  # None: keys are off
    in_flight: InFlight  # requests that queue work, over every transport
    draining: Draining = field(default_factory=Draining)
    responses: ResponseCache | None = None  # the response cache in Redis (None: off)
    quotas: Quotas | None = None  # who is limited how (None: nobody)

    def readiness(self) -> tuple[bool, list[str]]:
        """(ready, reasons), as ``Registry.readiness``; never ready once draining, whatever the models."""
        if self.draining.active:
            return False, ["draining: the service is stopping and will soon refuse connections"]
        return self.registry.readiness()


@contextlib.asynccontextmanager
async def running(
    settings: Settings, metrics: Metrics, keys: Keys | None, in_flight: InFlight
) -> AsyncIterator[Serving]:
    """The service's parts, its models loading in the background; stopped when the block ends."""
    check_gpu_available(settings)  # require_gpu without a CUDA-capable onnxruntime: refuse to start at all
    log.info(
        "starting attnserve %s: repository %s, onnxruntime %s offering %s, max_batch_size %d",
        __version__,
        settings.model_repository.resolve(),
        ort.__version__,
        available_providers(),
        settings.max_batch_size,
    )
    registry = Registry(settings, metrics)
    decoder = ImageDecoder(
        ImageLimits(settings.max_image_bytes, settings.max_image_pixels, settings.image_formats),
        inline_max_pixels=settings.inline_decode_max_pixels,
        threads=settings.decode_threads,
    )
    store = create_store(settings, metrics.for_attention_store())
    responses = ResponseCache.from_settings(settings, metrics.for_response_cache())
    lifecycle = Lifecycle(registry)
    quotas = Quotas.from_settings(settings, keys.terms if keys is not None else None, metrics)
    serving = Serving(
        settings, metrics, registry, decoder, store, lifecycle, keys, in_flight, responses=responses, quotas=quotas
    )
    loading = asyncio.create_task(registry.load(), name="load-models")
    if settings.repository_poll_s > 0:
        lifecycle.start_polling(settings.repository_poll_s)
    releasing = asyncio.create_task(release_every(settings.memory_release_s)) if settings.memory_release_s else None
    try:
        yield serving
    finally:
        if releasing is not None:
            releasing.cancel()
        registry.stop_loading()
        loading.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await loading
        await lifecycle.stop()
        await registry.close()
        await store.close()
        if responses is not None:
            await responses.close()
        if quotas is not None:
            await quotas.close()
        decoder.close()
        flush_access_logs()
        log.info("stopped")
