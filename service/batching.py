"""Dynamic batching: requests from concurrent clients merged into one onnxruntime run.

Two layers, after TGI's router: ``BatchState`` is the queue and the batch-forming rules as a plain
object (unit-tested without an event loop); ``Batcher`` is one asyncio worker task per model that
owns a ``BatchState``, hands batches to its own threads, one per model instance (onnxruntime never
runs on the event loop), and gives every request exactly one result or one error (Triton's
``execute`` contract).

How long to wait for batch-mates is not a fixed delay. A flat delay makes a lone client pay it on
every request for batch-mates that never come. Instead:
- an idle worker dispatches the first request at once;
- while a batch runs, new requests queue up, and the next batch takes all of them: under load the
  wait is exactly one compute time, and batches grow with the load;
- the worker waits (at most ``max_queue_delay``) only while other requests are known to be on
  their way: received by the HTTP layer but not yet queued (``Intake``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from service.errors import InferenceFailed, Overloaded, ShuttingDown
from service.logs import current_request_id

log = logging.getLogger("attnserve.batching")


class QueueFull(Exception):
    """Admitting the request would exceed the queue bound."""


class Queueable(Protocol):
    @property
    def size(self) -> int: ...

    @property
    def abandoned(self) -> bool: ...


class BatchObserver(Protocol):
    def batch_started(self, images: int, queue_waits: list[float]) -> None: ...
    def batch_finished(self, images: int, compute_seconds: float, ok: bool) -> None: ...
    def queue_depth(self, images: int) -> None: ...
    def dropped(self, requests: int) -> None: ...
    def rejected(self) -> None: ...


class NullObserver:
    def batch_started(self, images: int, queue_waits: list[float]) -> None: ...
    def batch_finished(self, images: int, compute_seconds: float, ok: bool) -> None: ...
    def queue_depth(self, images: int) -> None: ...
    def dropped(self, requests: int) -> None: ...
    def rejected(self) -> None: ...


class BatchState:
    """FIFO of pending requests, bounded in images, cut into batches of whole requests.

    A request is never split: its images run together, so its answer comes from one run. Requests
    whose client went away (``abandoned``) are removed when a batch is formed, before any compute.
    """

    def __init__(self, max_batch_size: int, max_queued: int) -> None:
        if max_batch_size < 1 or max_queued < max_batch_size:
            raise ValueError(f"need 1 <= max_batch_size ({max_batch_size}) <= max_queued ({max_queued})")
        self.max_batch_size = max_batch_size
        self.max_queued = max_queued
        self._items: deque[Any] = deque()
        self.queued = 0  # images, abandoned requests included until they are dropped

    def __len__(self) -> int:
        return len(self._items)

    def admit(self, item: Queueable) -> list[Any]:
        """Queue ``item``; returns the abandoned requests removed to make room for it (usually none).

        Requests whose clients left hold their space until a batch drops them; when the queue looks
        full they are dropped at once, so that nobody is refused for work nobody waits for.
        """
        if not 1 <= item.size <= self.max_batch_size:
            raise ValueError(f"a request of {item.size} images cannot fit a batch of {self.max_batch_size}")
        gone: list[Any] = []
        if self.queued + item.size > self.max_queued:
            kept: deque[Any] = deque()
            for queued in self._items:
                (gone if queued.abandoned else kept).append(queued)
            self._items = kept
            self.queued -= sum(g.size for g in gone)
            if self.queued + item.size > self.max_queued:
                raise QueueFull(f"{self.queued} images queued, bound {self.max_queued}")
        self._items.append(item)
        self.queued += item.size
        return gone

    def is_full(self) -> bool:
        """True when the next batch cannot grow any more, so waiting for batch-mates is pointless."""
        return self.queued >= self.max_batch_size

    def should_wait(self, incoming: int, waited: float, max_delay: float) -> bool:
        """Wait for batch-mates only if some are on their way, there is room, and the delay allows it."""
        return incoming > 0 and not self.is_full() and waited < max_delay

    def take(self) -> tuple[list[Any], list[Any]]:
        """(the next batch, the abandoned requests removed on the way); the batch may be empty."""
        batch: list[Any] = []
        abandoned: list[Any] = []
        rows = 0
        while self._items:
            head = self._items[0]
            if head.abandoned:
                self._items.popleft()
                self.queued -= head.size
                abandoned.append(head)
                continue
            if rows + head.size > self.max_batch_size:
                break
            self._items.popleft()
            self.queued -= head.size
            rows += head.size
            batch.append(head)
        return batch, abandoned

    def drain(self) -> list[Any]:
        """Everything still queued (at shutdown), leaving the state empty."""
        items = list(self._items)
        self._items.clear()
        self.queued = 0
        return items


class Intake:
    """How many requests are being received (body read, images decoded) but are not yet queued.

    Shared by the batchers of one app; a batcher waits for batch-mates only while this is non-zero.
    """

    def __init__(self) -> None:
        self.count = 0
        self._listeners: list[asyncio.Event] = []

    @contextlib.contextmanager
    def receiving(self) -> Iterator[None]:
        self.count += 1
        try:
            yield
        finally:
            self.count -= 1
            for event in self._listeners:
                event.set()

    def subscribe(self, event: asyncio.Event) -> None:
        self._listeners.append(event)

    def unsubscribe(self, event: asyncio.Event) -> None:
        with contextlib.suppress(ValueError):
            self._listeners.remove(event)


@dataclass(eq=False)
class Pending:
    """One request in the queue: its input rows and the future its handler awaits."""

    rows: np.ndarray  # (n, ...) the request's input rows
    future: asyncio.Future
    attention: bool = False  # this request wants the model's attention outputs too
    enqueued_at: float = field(default_factory=time.perf_counter)
    request_id: str | None = field(default_factory=current_request_id)  # to name it in the worker's logs

    @property
    def size(self) -> int:
        return int(self.rows.shape[0])

    @property
    def abandoned(self) -> bool:
        return self.future.done()  # cancelled by the handler when its client disconnected


def _same(x: Any) -> Any:
    return x


class Batcher:
    """One model's queue and the single worker task that owns it.

    Up to ``instances`` batches compute at once (Triton's model instances), each on its own thread
    of one shared onnxruntime session: while one batch computes, the next starts as soon as an
    instance is free instead of waiting for the first batch's answers to be sent. On 2 CPU cores,
    two single-threaded instances served 1.15x to 1.25x the images of one at 64 clients.

    ``run_batch(x, attention)`` runs on the batcher's thread; ``x`` is ``prepare`` of the concatenated
    rows of a batch, and ``finish`` of its result is an array, or a tuple of arrays, with one row per
    input row; each request gets its own rows of each. ``prepare`` and ``finish`` run on the event
    loop, once per batch: keep the thread to work that releases the GIL (a thread that needs the GIL
    while the loop is busy waits up to the interpreter's switch interval, 5 ms, each time).
    ``attention`` is true when some request of the batch asked for attention: only such batches pay for it.
    """

    def __init__(
        self,
        name: str,
        run_batch: Callable[[np.ndarray, bool], Any],
        *,
        prepare: Callable[[np.ndarray], np.ndarray] = _same,
        finish: Callable[[Any], Any] = _same,
        max_batch_size: int,
        max_queue_images: int,
        max_queue_delay_s: float,
        retry_after_s: int = 1,
        instances: int = 1,
        intake: Intake | None = None,
        observer: BatchObserver | None = None,
    ) -> None:
        if instances < 1:
            raise ValueError(f"need at least one instance, got {instances}")
        self.name = name
        self._run_batch = run_batch
        self._prepare = prepare
        self._finish = finish
        self._state = BatchState(max_batch_size, max_queue_images)
        self._max_delay = max_queue_delay_s
        self._retry_after = str(retry_after_s)
        self._intake = intake or Intake()
        self._observer = observer or NullObserver()
        self._wakeup = asyncio.Event()
        self._instances = instances
        self._executor = ThreadPoolExecutor(max_workers=instances, thread_name_prefix=f"ort-{name}")
        self._running: set[asyncio.Task] = set()  # batches computing now, at most ``instances``
        self._task: asyncio.Task | None = None
        self._closed = False

    @property
    def max_batch_size(self) -> int:
        return self._state.max_batch_size

    @property
    def queued_images(self) -> int:
        return self._state.queued

    def start(self) -> None:
        self._intake.subscribe(self._wakeup)
        self._task = asyncio.get_running_loop().create_task(self._worker(), name=f"batcher-{self.name}")

    async def stop(self) -> None:
        """Fail what is still queued and what is computing, stop the worker, release the threads."""
        self._closed = True
        self._intake.unsubscribe(self._wakeup)
        for item in self._state.drain():
            if not item.future.done():
                item.future.set_exception(ShuttingDown(f"model {self.name} is shutting down"))
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for task in list(self._running):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await asyncio.to_thread(self._executor.shutdown, wait=True)  # a running batch finishes off the loop

    def submit(self, rows: np.ndarray, attention: bool = False) -> asyncio.Future:
        """Queue one request's rows; the future resolves to its output rows or a ``ServiceError``.

        Cancelling the future (client gone) removes the request before it is computed.
        """
        if self._closed:
            raise ShuttingDown(f"model {self.name} is shutting down")
        future = asyncio.get_running_loop().create_future()
        try:
            gone = self._state.admit(Pending(rows, future, attention))
        except QueueFull as e:
            self._observer.rejected()
            raise Overloaded(
                f"model {self.name} has {self._state.queued} images queued (bound {self._state.max_queued}); retry later",
                headers={"Retry-After": self._retry_after},
            ) from e
        if gone:
            self._observer.dropped(len(gone))
        self._observer.queue_depth(self._state.queued)
        self._wakeup.set()
        return future

    async def _worker(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not len(self._state) or len(self._running) >= self._instances:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            try:
                await self._gather_batch_mates()
                batch, abandoned = self._state.take()
                if abandoned:
                    self._observer.dropped(len(abandoned))
                self._observer.queue_depth(self._state.queued)
            except Exception:  # the worker must outlive any bug here, or every later request would hang
                log.exception("batcher %s: unexpected error while forming a batch", self.name)
                continue
            if batch:
                task = loop.create_task(self._run(loop, batch))
                self._running.add(task)
                task.add_done_callback(self._batch_done)

    def _batch_done(self, task: asyncio.Task) -> None:
        self._running.discard(task)
        self._wakeup.set()  # an instance is free: queued requests can go

    async def _gather_batch_mates(self) -> None:
        """Wait, within the delay, for requests the HTTP layer is still receiving."""
        start = time.perf_counter()
        while self._state.should_wait(self._intake.count, time.perf_counter() - start, self._max_delay):
            self._wakeup.clear()
            remaining = self._max_delay - (time.perf_counter() - start)
            try:
                await asyncio.wait_for(self._wakeup.wait(), timeout=max(remaining, 0.0))
            except asyncio.TimeoutError:
                return

    async def _run(self, loop: asyncio.AbstractEventLoop, batch: list[Pending]) -> None:
        images = sum(p.size for p in batch)
        started = time.perf_counter()
        self._observer.batch_started(images, [started - p.enqueued_at for p in batch])
        try:
            x = self._prepare(batch[0].rows if len(batch) == 1 else np.concatenate([p.rows for p in batch]))
            attention = any(p.attention for p in batch)
            out = self._finish(await loop.run_in_executor(self._executor, self._run_batch, x, attention))
            outputs = out if isinstance(out, tuple) else (out,)
            if any(len(o) != images for o in outputs):
                raise RuntimeError(f"the model returned {[len(o) for o in outputs]} rows for {images} inputs")
        except asyncio.CancelledError:
            for p in batch:
                if not p.future.done():
                    p.future.set_exception(ShuttingDown(f"model {self.name} is shutting down"))
            raise
        except Exception:
            self._observer.batch_finished(images, time.perf_counter() - started, ok=False)
            log.exception("batch of %d images failed in model %s; failing its requests %s", images, self.name,
                          ", ".join(str(p.request_id) for p in batch))  # fmt: skip
            for p in batch:
                if not p.future.done():
                    p.future.set_exception(InferenceFailed(f"inference failed in model {self.name}; see the server log"))
            return
        self._observer.batch_finished(images, time.perf_counter() - started, ok=True)
        offset = 0
        for p in batch:
            if not p.future.done():
                rows = tuple(o[offset : offset + p.size] for o in outputs)
                p.future.set_result(rows if isinstance(out, tuple) else rows[0])
            offset += p.size
