"""Dynamic batching: requests from concurrent clients merged into one onnxruntime run.

Two layers, after TGI's router: ``BatchState`` is the queue and the batch-forming rules as a plain
object (unit-tested without an event loop); ``Batcher`` owns a ``BatchState`` behind a lock, one
thread per model instance that takes batches from it and runs them (onnxruntime never runs on the
event loop), and gives every request exactly one result or one error (Triton's ``execute``
contract): handlers queue from the event loop, answers are handed back to it.

How long to wait for batch-mates is not a fixed delay. A flat delay makes a lone client pay it on
every request for batch-mates that never come. Instead:
- an idle instance takes the first request at once;
- while batches run, new requests queue up, and the next free instance takes all of them: under
  load the wait is about one compute time, and batches grow with the load;
- a free instance waits (at most ``max_queue_delay``) only while another batch computes and other
  requests are known to be on their way: received by the HTTP layer but not yet queued (``Intake``).

A request may carry a deadline: when it passes, the request is answered 504 at once, and the queue
drops it before compute (as it drops a request whose client went away).

A request is ``interactive`` (the default) or ``batch``: a batch is formed of interactive requests when
any wait, else of batch ones, so bulk images never stretch an interactive request's run; a batch request
that has waited ``batch_max_wait_s`` goes first. Within ``INTERACTIVE_HOLD_S`` of an interactive batch, batch work
computes on every instance but one, so the next interactive request finds one free.

An instance thread whose loop raises outside onnxruntime (a bug, an injected fault) answers the batch it
held 500, logs the traceback once and goes on under ``service/engine/supervision.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from service.engine.admission import Admission
from service.engine.supervision import Supervision
from service.faults import NONE, Faults
from service.logs import current_request_id
from service.observers import UNOBSERVED
from service.tracing import TRACING

log = logging.getLogger("attnserve.batching")

# For this long after interactive work, batch work keeps out of its way: here it computes on every instance but one,
# in the scheduler it joins no lane that stepped interactive work. An interactive client's next request is a round
# trip away, and found every instance busy with 32 bulk images (~20 ms), or its lane re-encoding and stepping bulk
# rows it then set aside again.
INTERACTIVE_HOLD_S = 0.05


class QueueFull(Exception):
    """Admitting the request would exceed the queue bound."""


class Queueable(Protocol):
    @property
    def size(self) -> int: ...

    @property
    def abandoned(self) -> bool: ...

    priority: str
    enqueued_at: float


class BatchObserver(Protocol):
    def batch_started(self, images: int, queue_waits: list[float]) -> None: ...
    def batch_finished(self, images: int, compute_seconds: float, ok: bool) -> None: ...
    def queue_depth(self, images: int) -> None: ...
    def dropped(self, requests: int) -> None: ...
    def rejected(self) -> None: ...
    def restarted(self) -> None: ...
    def answered(self, seconds: float, ok: bool) -> None: ...


class BatchState:
    """FIFO of pending requests, bounded in images, cut into batches of whole requests.

    A request is never split: its images run together, so its answer comes from one run. Requests
    whose client went away or whose deadline passed (``abandoned``) are removed when a batch is
    formed, before any compute.
    """

    def __init__(
        self, max_batch_size: int, max_queued: int, batch_max_wait_s: float = 10.0, clock=time.perf_counter
    ) -> None:
        if max_batch_size < 1 or max_queued < max_batch_size:
            raise ValueError(f"need 1 <= max_batch_size ({max_batch_size}) <= max_queued ({max_queued})")
        self.max_batch_size = max_batch_size
        self.max_queued = max_queued
        self.batch_max_wait_s = batch_max_wait_s
        self._clock = clock
        self._items: deque[Any] = deque()  # interactive requests
        self._bulk: deque[Any] = deque()  # batch-priority requests
        self.queued = 0  # images, abandoned requests included until they are dropped

    def __len__(self) -> int:
        return len(self._items) + len(self._bulk)

    def admit(self, item: Queueable) -> list[Any]:
        """Queue ``item``; returns the abandoned requests removed to make room for it (usually none).

        Requests whose clients left hold their space until a batch drops them; when the queue looks
        full they are dropped at once, so that nobody is refused for work nobody waits for.
        """
        if not 1 <= item.size <= self.max_batch_size:
            raise ValueError(f"a request of {item.size} images cannot fit a batch of {self.max_batch_size}")
        gone: list[Any] = []
        if self.queued + item.size > self.max_queued:
            for name in ("_items", "_bulk"):
                kept: deque[Any] = deque()
                for queued in getattr(self, name):
                    (gone if queued.abandoned else kept).append(queued)
                setattr(self, name, kept)
            self.queued -= sum(g.size for g in gone)
            if self.queued + item.size > self.max_queued:
                raise QueueFull(f"{self.queued} images queued, bound {self.max_queued}")
        (self._bulk if item.priority == "batch" else self._items).append(item)
        self.queued += item.size
        return gone

    def _next_queue(self) -> deque[Any]:
        """Where the next batch comes from: batch work past its wait limit, else interactive work, else batch work."""
        if self._bulk and (not self._items or self._clock() - self._bulk[0].enqueued_at >= self.batch_max_wait_s):
            return self._bulk
        return self._items

    def only_bulk_waits(self) -> bool:
        """Whether batch work waits and no interactive work does."""
        return bool(self._bulk) and not self._items

    def is_full(self) -> bool:
        """True when the next batch cannot grow any more, so waiting for batch-mates is pointless."""
        return self.queued >= self.max_batch_size

    def should_wait(self, incoming: int, waited: float, max_delay: float) -> bool:
        """Wait for batch-mates only if some are on their way, there is room, and the delay allows it."""
        return incoming > 0 and not self.is_full() and waited < max_delay

    def take(self, max_images: int | None = None) -> tuple[list[Any], list[Any]]:
        """(the next batch, the abandoned requests removed on the way); the batch may be empty.

        ``max_images`` (below ``max_batch_size``) leaves the rest for another instance; the batch
        still takes at least one request.
        """
        limit = self.max_batch_size if max_images is None else max(1, min(max_images, self.max_batch_size))
        batch: list[Any] = []
        abandoned: list[Any] = []
        rows = 0
        queue = self._next_queue()
        while queue:
            head = queue[0]
            if head.abandoned:
                queue.popleft()
                self.queued -= head.size
                abandoned.append(head)
                if not queue and not batch:  # that queue held only abandoned requests: try the other
                    queue = self._next_queue()
                continue
            if rows + head.size > (limit if batch else self.max_batch_size):
                break
            queue.popleft()
            self.queued -= head.size
            rows += head.size
            batch.append(head)
        return batch, abandoned

    def drain(self) -> list[Any]:
        """Everything still queued (at shutdown), leaving the state empty."""
        items = list(self._items) + list(self._bulk)
        self._items.clear()
        self._bulk.clear()
        self.queued = 0
        return items


class Intake:
    """How many requests are being received (body read, images decoded) but are not yet queued.

    Shared by the batchers of one app; a batcher waits for batch-mates only while this is non-zero.
    Listeners are called (on the event loop) each time a request leaves this stage.
    """

    def __init__(self) -> None:
        self.count = 0
        self._listeners: list[Callable[[], None]] = []

    @contextlib.contextmanager
    def receiving(self) -> Iterator[None]:
        self.count += 1
        try:
            yield
        finally:
            self.count -= 1
            for listener in self._listeners:
                listener()

    def subscribe(self, listener: Callable[[], None]) -> None:
        self._listeners.append(listener)

    def unsubscribe(self, listener: Callable[[], None]) -> None:
        with contextlib.suppress(ValueError):
            self._listeners.remove(listener)


@dataclass(eq=False)
class Pending:
    """One request in the queue: its input rows and the future its handler awaits."""

    rows: np.ndarray  # (n, ...) the request's input rows
    future: asyncio.Future
    attention: bool = False  # this request wants the model's attention outputs too
    deadline: float | None = None  # time.monotonic() by which it must be answered
    enqueued_at: float = field(default_factory=time.perf_counter)
    request_id: str | None = field(default_factory=current_request_id)  # to name it in the worker's logs
    timer: asyncio.TimerHandle | None = None  # answers 504 at the deadline
    priority: str = "interactive"
    trace: Any = field(default_factory=lambda: TRACING.current() if TRACING.enabled else None)  # its span context

    @property
    def size(self) -> int:
        return int(self.rows.shape[0])

    @property
    def abandoned(self) -> bool:
        """Its future is done (cancelled by the handler when its client disconnected, or failed at the
        deadline), or the deadline passed: the instance threads read the clock too, so a request is
        not computed past its deadline because the event loop was late to fire its timer."""
        return self.future.done() or (self.deadline is not None and time.monotonic() >= self.deadline)


def _same(x: Any) -> Any:
    return x


class Batcher:
    """One model's queue, and one thread per model instance that takes batches from it.

    The instance threads form their own batches: an instance that finishes a batch takes the next
    one from the queue at once, without waiting for the event loop to notice. (When the event loop
    formed batches, a free instance waited behind every request the loop was busy parsing or
    answering: with 64 clients the onnxruntime threads sat idle a third of the time although
    requests were queued.) Up to ``instances`` batches compute at once (Triton's model instances)
    on one shared onnxruntime session.

    ``prepare`` runs on the event loop, on each request's rows as it is queued; ``run_batch(x,
    attention)`` runs on an instance thread on the concatenated rows of a batch; ``finish`` runs on
    the event loop, once per batch, on its result: an array, or a tuple (named or not) of arrays (or
    None), with one row per input row; each request gets its own rows of each, in the same shape. Keep the thread to work that releases the GIL:
    a thread that needs the GIL while the loop is busy waits for the interpreter's switch interval.
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
        faults: Faults = NONE,
        supervision: Supervision | None = None,
        batch_max_wait_s: float = 10.0,
    ) -> None:
        if instances < 1:
            raise ValueError(f"need at least one instance, got {instances}")
        self.name = name
        self._run_batch = run_batch
        self._prepare = prepare
        self._finish = finish
        self._state = BatchState(max_batch_size, max_queue_images, batch_max_wait_s)
        self._lock = threading.Lock()  # guards _state, _computing, _idle, _gathering and the admission's closing
        self._computing = 0  # batches in onnxruntime now, at most ``instances``
        self._bulk_computing = 0  # of them, batches of batch work
        self._interactive_at = -1e9  # perf_counter() when an interactive batch was last taken or finished
        self._idle: list[threading.Event] = []  # threads waiting for work, the most recently idle last
        self._gathering: list[threading.Event] = []  # threads holding off for batch-mates
        self._max_delay = max_queue_delay_s
        self._intake = intake or Intake()
        self._observer = observer or UNOBSERVED
        self._admission = Admission(name, retry_after_s, self._observer)
        self._instances = instances
        self._faults = faults
        self.supervision = supervision or Supervision()
        self._threads: list[threading.Thread] = []
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def max_batch_size(self) -> int:
        return self._state.max_batch_size

    @property
    def queued_images(self) -> int:
        return self._state.queued

    @property
    def idle(self) -> bool:
        """Nothing queued and nothing computing: a model version being retired has drained."""
        return not len(self._state) and not self._computing

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._intake.subscribe(self._notify)
        for i in range(self._instances):
            thread = threading.Thread(target=self._serve, name=f"ort-{self.name}_{i}", daemon=True)
            thread.start()
            self._threads.append(thread)

    async def stop(self) -> None:
        """Fail what is still queued, let the batches computing finish, stop the threads."""
        self._intake.unsubscribe(self._notify)
        with self._lock:
            self._admission.closed = True
            queued = self._state.drain()
            self._wake(self._idle + self._gathering)
        for item in queued:
            if not item.future.done():
                item.future.set_exception(self._admission.shutting_down())
        for thread in self._threads:
            await asyncio.to_thread(thread.join)
        await asyncio.sleep(0)  # the last batches' answers were handed to the loop: deliver them

    def submit(
        self,
        rows: np.ndarray,
        attention: bool = False,
        prepared: bool = False,
        deadline: float | None = None,
        priority: str = "interactive",
    ) -> asyncio.Future:
        """Queue one request's rows (``prepared``: already what ``prepare`` makes of rows); the future
        resolves to its output rows or a ``ServiceError``. Cancelling the future (client gone) removes
        the request before it is computed; so does its ``deadline`` (``time.monotonic()``) passing,
        which fails the future with 504 ``deadline_exceeded``.
        """
        self._admission.check_open()
        if deadline is not None and time.monotonic() >= deadline:
            raise self._admission.deadline_exceeded()  # spent already (a slow body): it never takes a slot
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        item = Pending(rows if prepared else self._prepare(rows), future, attention, deadline, priority=priority)
        with self._lock:
            try:
                gone = self._state.admit(item)
            except QueueFull as e:
                raise self._admission.overloaded(self._state.queued, self._state.max_queued, "images") from e
            queued = self._state.queued
            # a thread holding off for mates looks again (the batch may be full); else the thread
            # idle most recently takes it: its caches are warm (waking the longest idle, as a
            # Condition does, alternated the instances at one client and cost ~0.2 ms a request)
            if self._gathering:
                self._wake(self._gathering)
            else:
                self._wake(self._idle[-1:])
        if deadline is not None:
            item.timer = loop.call_later(deadline - time.monotonic(), self._expire, item)
        future.add_done_callback(self._answered_after(item.enqueued_at))
        if gone:
            self._observer.dropped(len(gone))
        self._observer.queue_depth(queued)
        return future

    def _answered_after(self, enqueued_at: float) -> Callable[[asyncio.Future], None]:
        """Reports how the request ended, however it ended (an answer, an error, cancelled), and when."""
        observer = self._observer

        def answered(future: asyncio.Future) -> None:
            observer.answered(time.perf_counter() - enqueued_at, succeeded(future))

        return answered

    def _expire(self, item: Pending) -> None:
        """The deadline passed: answer now. A queued request is dropped before compute; one whose batch is
        computing already is not waited for."""
        if not item.future.done():
            item.future.set_exception(self._admission.deadline_exceeded())

    def _notify(self) -> None:
        """A request left the HTTP intake: a thread waiting for batch-mates looks again."""
        if self._gathering:
            with self._lock:
                self._wake(self._gathering)

    def _wake(self, events: list[threading.Event]) -> None:
        """Wake these waiting threads (with ``_lock`` held); each is off the waiting lists until it waits again."""
        for event in list(events):
            self._unlist(event)
            event.set()

    # ---- on the instance threads ----------------------------------------------------------------
    def _serve(self) -> None:
        wakeup = threading.Event()
        while True:
            batch: list[Pending] | None = []
            counted = False  # the batch counts in _computing, which _compute releases however it ends
            try:
                batch, abandoned = self._next_batch(wakeup)
                if batch is None:
                    return
                counted = bool(batch)
                self._faults.hit("batcher")
                if batch:
                    counted = False
                    self._compute(batch, abandoned, wakeup)
                elif abandoned:
                    self._post(self._observer.dropped, len(abandoned))
            except Exception as error:  # noqa: BLE001 - the batch it held is answered, and the thread goes on
                if counted:
                    with self._lock:
                        self._counted(batch, -1)
                backoff = self._instance_failed(batch or [], error)
                if backoff and not self._admission.closed:
                    time.sleep(backoff)

    def _instance_failed(self, batch: list[Pending], error: Exception) -> float:
        """On the instance thread: its batch answered 500 (each request named), logged once, counted; returns
        the seconds to wait before the thread takes work again."""
        log.error(
            "an instance thread of model %s failed; answering its batch's %d requests 500 (%s) and going on",
            self.name,
            len(batch),
            ", ".join(str(p.request_id) for p in batch) or "none",
            exc_info=error,
        )
        self._post(self._fail_batch, batch)
        return self.supervision.failed(error)

    def _fail_batch(self, batch: list[Pending]) -> None:
        self._observer.restarted()
        for p in batch:
            if p.timer is not None:
                p.timer.cancel()
            if not p.future.done():
                p.future.set_exception(self._admission.failed(p.request_id))

    def _next_batch(self, wakeup: threading.Event) -> tuple[list[Pending] | None, list[Pending]]:
        """Block until there is work; None at shutdown. Holds off for batch-mates only while another
        batch computes (the CPU is busy anyway) and requests are still being received."""
        gathering_since: float | None = None
        while True:
            with self._lock:
                if self._admission.closed:
                    return None, []
                timeout = None
                held = 0.0
                if len(self._state):
                    now = time.perf_counter()
                    waited = 0.0 if gathering_since is None else now - gathering_since
                    held = self._held_back(now)
                    if held:
                        timeout = held  # woken by an interactive request, or when the hold ends
                    elif self._computing and self._state.should_wait(self._intake.count, waited, self._max_delay):
                        gathering_since = now - waited
                        timeout = self._max_delay - waited
                    else:
                        self._unlist(wakeup)
                        return self._take()
                self._unlist(wakeup)
                wakeup.clear()
                (self._idle if timeout is None or held else self._gathering).append(wakeup)
            wakeup.wait(timeout)  # woken (and unlisted) or timed out: the next look unlists it either way

    def _held_back(self, now: float) -> float:
        """Seconds this free instance leaves batch work queued (with ``_lock`` held): the last instance is kept for
        interactive work within ``INTERACTIVE_HOLD_S`` of an interactive batch; 0: not held back."""
        if self._instances < 2 or self._bulk_computing < self._instances - 1 or not self._state.only_bulk_waits():
            return 0.0
        return max(0.0, self._interactive_at + INTERACTIVE_HOLD_S - now)

    def _counted(self, batch: list[Pending], delta: int) -> None:
        """A batch starts (+1) or ends (-1) computing (with ``_lock`` held)."""
        self._computing += delta
        if batch[0].priority == "batch":
            self._bulk_computing += delta
        else:
            self._interactive_at = time.perf_counter()

    def _unlist(self, wakeup: threading.Event) -> None:
        for waiting in (self._idle, self._gathering):
            if wakeup in waiting:
                waiting.remove(wakeup)

    def _take(self) -> tuple[list[Pending], list[Pending]]:
        """The next batch (with ``_lock`` held): at most ceil(queued / instances) images of the queue
        (whole requests, at least one), and the next idle instance is woken for the rest.

        On the CPU, one onnxruntime thread per instance computes a batch of 8 barely faster per
        image than 8 batches of 1 (bare: 1,217 vs 1,013 img/s), so two instances on half the queue
        each answer sooner than one on all of it, and sooner answers bring the clients' next
        requests sooner. At 8 clients: 1,086 req/s against 784 without the cap; at 64 the same
        throughput with both instances computing 81% of the time instead of 73%.
        """
        share = -(-self._state.queued // self._instances)
        try:
            batch, abandoned = self._state.take(share)
        except Exception:  # a bug here must not kill the instance, or every later request would hang
            log.exception("batcher %s: unexpected error while forming a batch", self.name)
            return [], []
        if batch:
            self._counted(batch, +1)
        if len(self._state):
            self._wake(self._idle[-1:])
        return batch, abandoned

    def _compute(self, batch: list[Pending], abandoned: list[Pending], wakeup: threading.Event) -> None:
        started = time.perf_counter()
        try:
            x = batch[0].rows if len(batch) == 1 else np.concatenate([p.rows for p in batch])
            out: Any = self._run_batch(x, any(p.attention for p in batch))
        except Exception as e:  # noqa: BLE001 - whatever failed, every request of the batch gets it as its answer
            out = e
        finally:
            with self._lock:
                self._counted(batch, -1)
                if self._gathering:  # no longer worth holding off for mates, perhaps
                    self._wake(self._gathering)
                # idle from now on, before the answers go out: the next request, which they may
                # bring at once, must find this (warm) instance the most recently idle
                wakeup.clear()
                self._idle.append(wakeup)
        self._post(self._deliver, batch, abandoned, started, time.perf_counter(), out)

    def _post(self, callback: Callable[..., None], *args: Any) -> None:
        assert self._loop is not None
        try:
            self._loop.call_soon_threadsafe(callback, *args)
        except RuntimeError:  # the loop is closed: nobody is waiting any more
            pass

    # ---- back on the event loop --------------------------------------------------------------------
    def _deliver(self, batch: list[Pending], abandoned: list[Pending], started: float, ended: float, out: Any) -> None:
        images = sum(p.size for p in batch)
        observer = self._observer
        for p in batch:
            if p.timer is not None:
                p.timer.cancel()
        if abandoned:
            observer.dropped(len(abandoned))
        observer.batch_started(images, [started - p.enqueued_at for p in batch])
        observer.queue_depth(self._state.queued)
        try:
            if isinstance(out, Exception):
                raise out
            out = self._finish(out)
            outputs = out if isinstance(out, tuple) else (out,)
            if any(o is not None and len(o) != images for o in outputs):
                raise RuntimeError(
                    f"the model returned {[len(o) for o in outputs if o is not None]} rows for {images} inputs"
                )
        except Exception as e:
            observer.batch_finished(images, ended - started, ok=False)
            log.error(
                "batch of %d images failed in model %s; failing its requests (%s)",
                images,
                self.name,
                ", ".join(str(p.request_id) for p in batch),
                exc_info=e,
            )
            for p in batch:
                if not p.future.done():
                    p.future.set_exception(self._admission.failed(p.request_id))
            return
        observer.batch_finished(images, ended - started, ok=True)
        if any(p.trace is not None for p in batch):
            with TRACING.guarded():
                self._trace(batch, images, started, ended)
        offset = 0
        for p in batch:
            if not p.future.done():
                p.future.set_result(_rows(out, offset, offset + p.size))
            offset += p.size

    def _trace(self, batch: list[Pending], images: int, started: float, ended: float) -> None:
        """The batch's span, linked to its requests, and each request's ``queue`` and ``classify`` spans, the
        latter linked to the batch."""
        attributes = {"attnserve.model": self.name, "attnserve.rows": images, "attnserve.requests": len(batch)}
        shared = TRACING.shared("classify batch", started, ended, [p.trace for p in batch], attributes)
        for p in batch:
            if p.trace is not None:
                TRACING.child(p.trace, "queue", p.enqueued_at, started, attributes={"attnserve.priority": p.priority})
                TRACING.child(p.trace, "classify", started, ended, [shared], {"attnserve.images": p.size})


def succeeded(future: asyncio.Future) -> bool:
    """Whether a done future holds an answer (not an error, not cancelled)."""
    return not future.cancelled() and future.exception() is None


def _rows(out: Any, start: int, stop: int) -> Any:
    """Rows ``start:stop`` of ``finish``'s answer: of an array, or of each array of a (named) tuple."""
    if not isinstance(out, tuple):
        return out[start:stop]
    rows = [None if o is None else o[start:stop] for o in out]
    return out._make(rows) if hasattr(out, "_make") else tuple(rows)
