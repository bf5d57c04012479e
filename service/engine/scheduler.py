"""Continuous (iteration-level) batching for the translator, after TGI's router.

A model's scheduler holds a bounded FIFO of waiting requests and one or more *lanes*: a lane is an
asyncio task that owns a running :class:`~contract.decoding.DecodeBatch` and a thread that steps it.
Every ``JOIN_EVERY`` decoder steps (at once when it has none running) a lane admits waiting requests
while its batch has rows free (their encodings are computed together and concatenated onto the batch),
and a request that finishes is answered at once while the others decode on; so a short sentence never
waits for a long one, and a new one starts within a few steps instead of after the whole batch.
Encoder and decoder runs happen on the lanes' threads, never on the event loop. A beam-search request takes ``beam`` rows. Lanes share the model's sessions
(onnxruntime runs a session from several threads at once), so with one intra-op thread each, two
lanes decode on two cores with one copy of the weights. A submission (all the sentences of one HTTP
request) goes whole to the lane with the fewest rows running and waiting, so a text's sentences are
rows of one batch and a request decodes as it would alone; a lane that runs dry takes the oldest
submission waiting for a busy one.

A request whose client went away is marked ``cancelled`` by its handler and leaves the batch at the
next step, freeing its rows (a beam all of them). So does a request whose deadline passed, marked by
a timer that answers it 504 at once; one still waiting never reaches the encoder. A decoder failure
fails the requests in that batch and nothing else. A lane whose loop itself raises (a bug, an injected
fault) answers the requests it held 500 naming each request id, logs the traceback once, and restarts
under ``service/engine/supervision.py``: what waits for it stays queued, and the other lanes take it
when they have rows free.

A submission is ``interactive`` (the default) or ``batch``: a lane admits its interactive tickets first, in
arrival order, then its batch ones; a batch ticket that has waited ``batch_max_wait_s`` is admitted before
any interactive one, so bulk work is delayed, never starved. Interactive submissions go to the lane with the
fewest batch rows running, batch ones to a lane without interactive work; batch tickets join no batch that
holds interactive work, nor within ``INTERACTIVE_HOLD_S`` of it (a lane with rows free takes batch work held
back so), and join ``BATCH_JOIN_TOKENS`` source tokens a hop; a lane of batch work rests after each step
(``BULK_YIELD``) while another lane steps interactive work. When interactive tickets wait for a lane whose
batch holds batch rows, those rows are set aside (:func:`~contract.decoding.split`: the batch itself when
every row leaves, else their caches copied out) for as long as the lane has interactive work, so that an
interactive sentence steps with no bulk rows beside it; they join back (:func:`~contract.decoding.concatenate`)
once it has had none for ``INTERACTIVE_HOLD_S``, or once the oldest of them has been queued ``batch_max_wait_s``
(a ticket that old is never set aside again). A row decodes the same set aside or not. Only host batches are
set aside (a device batch's rows live in OrtValues). A lane's state and tickets: ``service/engine/lanes.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

from contract.decoding import Batch, DecodeBatch, DecodeRequest, concatenate, split, step
from service.engine.admission import Admission
from service.engine.batching import succeeded
from service.engine.lanes import INTERACTIVE, Lane, Ticket, head_rows
from service.engine.supervision import Supervision
from service.errors import InvalidField, TextTooLong
from service.faults import NONE, Faults
from service.observers import UNOBSERVED
from service.tracing import TRACING
from service.translator import Translator

log = logging.getLogger("attnserve.scheduler")

# Decoder steps the worker thread may run back to back while the event loop has nothing to do.
MAX_STEPS_PER_HOP = 16
MAX_HOP_SECONDS = 0.02
# Steps a running batch takes before waiting requests join it: joiners encoded together, and fewer hand-backs
# to the event loop (greedy at 32 clients: 1.16x requests per second against joining at every step).
JOIN_EVERY = 4
# Source tokens of batch work one hop encodes: an interactive arrival waits for the encoder run in progress,
# and 50 bulk sentences joining at once took 50-77 ms of it (bench_priorities: B's p99 beside a bulk client).
BATCH_JOIN_TOKENS = 160
# While another lane steps interactive work, a lane of batch work rests this many times each step's time after it:
# the lanes share the cores (two vCPUs here) with the event loop, and an interactive sentence beside a lane stepping
# bulk rows flat out took 1.5x its time alone at p50, 2x at p99 (bench_priorities; 1.2x and 1.6x resting, the bulk
# client's rate 272 -> 205 sentences/s while the interactive one is busy).
BULK_YIELD = 1.0
rest = time.sleep  # how a lane of batch work rests (a test counts the rests)


class DecodeObserver(Protocol):
    def step(self, rows: int, seconds: float, tokens: int) -> None: ...
    def occupancy(self, running: int, waiting: int) -> None: ...
    def finished(
        self, tokens: int, seconds: float, queue_wait: float, first_token: float | None, priority: str = INTERACTIVE
    ) -> None: ...
    def cancelled(self) -> None: ...
    def rejected(self) -> None: ...
    def restarted(self) -> None: ...
    def failed(self) -> None: ...
    def answered(self, seconds: float, ok: bool) -> None: ...


class Scheduler:
    def __init__(
        self,
        name: str,
        translator: Translator,
        *,
        max_running_rows: int,
        max_waiting_rows: int,
        retry_after_s: int = 1,
        observer: DecodeObserver | None = None,
        lanes: int = 1,
        faults: Faults = NONE,
        supervision: Supervision | None = None,
        batch_max_wait_s: float = 10.0,
    ) -> None:
        if max_running_rows < 1 or max_waiting_rows < 1 or lanes < 1:
            raise ValueError("max_running_rows, max_waiting_rows and lanes must be >= 1")
        self.name = name
        self.translator = translator
        self.max_running_rows = max_running_rows  # per lane
        self.max_waiting_rows = max_waiting_rows
        self.batch_max_wait_s = batch_max_wait_s
        self._observer = observer or UNOBSERVED
        self._admission = Admission(name, retry_after_s, self._observer)
        self._groups = itertools.count()
        self._bulk = 0  # batch tickets not answered yet: none, and interactive work goes where the load is least
        self._faults = faults
        self.supervision = supervision or Supervision()
        self.lanes = [
            Lane(ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"ort-{name}" + (f"-{i}" if i else "")), i)
            for i in range(lanes)
        ]

    @property
    def running_rows(self) -> int:
        return sum(lane.rows for lane in self.lanes)

    @property
    def waiting_rows(self) -> int:
        return sum(lane.waiting_rows for lane in self.lanes)

    @property
    def _waiting(self) -> list[Ticket]:
        return [t for lane in self.lanes for t in lane.waiting]

    @property
    def _running(self) -> dict[int, Ticket]:
        """Every lane's decoding tickets by request id."""
        return {i: t for lane in self.lanes for i, t in lane.running.items()}

    # ---- handle side -----------------------------------------------------------------------------
    def submit(
        self,
        requests: list[DecodeRequest],
        stream: bool = False,
        deadline: float | None = None,
        priority: str = INTERACTIVE,
    ) -> list[Ticket]:
        """Queue all of a HTTP request's sentences, or none of them (503 when the queue is full).

        Past ``deadline`` (``time.monotonic()``) each ticket is failed with 504 ``deadline_exceeded``
        and its sentence leaves the queue, or the running batch at the next step."""
        self._admission.check_open()
        if deadline is not None and time.monotonic() >= deadline:
            raise self._admission.deadline_exceeded()  # spent already (a slow body): it never takes a row
        rows = sum(r.beam for r in requests)
        if any(r.beam > self.max_running_rows for r in requests):
            raise InvalidField(f"beam_size exceeds the {self.max_running_rows} rows this model decodes at once")
        if rows > self.max_waiting_rows:  # would never fit: no retry helps
            raise TextTooLong(
                f"the request's {len(requests)} sentences need {rows} decoder rows (beam_size each); this model "
                f"queues at most {self.max_waiting_rows}: send fewer texts or a smaller beam"
            )
        if self.waiting_rows + rows > self.max_waiting_rows:
            raise self._admission.overloaded(self.waiting_rows, self.max_waiting_rows, "sequences")
        loop = asyncio.get_running_loop()
        group = next(self._groups)
        trace = TRACING.current() if TRACING.enabled else None
        tickets = [
            Ticket(
                r,
                loop.create_future(),
                asyncio.Queue() if stream else None,
                deadline,
                group=group,
                priority=priority,
                trace=trace,
            )
            for r in requests
        ]
        if deadline is not None:
            for t in tickets:
                t.timer = loop.call_later(deadline - time.monotonic(), self._expire, t)
        for t in tickets:
            t.future.add_done_callback(self._answered_after(t))
        up = [lane for lane in self.lanes if not lane.down] or self.lanes
        if priority == INTERACTIVE and not self._bulk:
            lane = min(up, key=lambda lane: lane.load)  # the first of the least loaded
        elif priority == INTERACTIVE:  # the least loaded of the lanes with the fewest batch rows to set aside
            lane = min(up, key=lambda lane: (lane.batch_rows(), lane.load))
        else:
            self._bulk += len(tickets)  # the least loaded of the lanes without interactive work (where it would wait)
            lane = min(up, key=lambda lane: (lane.has_interactive(), lane.load + lane.aside_rows))
        lane.enqueue(tickets)
        self._observer.occupancy(self.running_rows, self.waiting_rows)
        lane.wakeup.set()
        return tickets

    def _answered_after(self, ticket: Ticket) -> Callable[[asyncio.Future], None]:
        """Reports how the sentence ended (translated, failed, or cancelled: its client left or its deadline
        passed) and when."""
        observer = self._observer

        def answered(future: asyncio.Future) -> None:
            if ticket.priority != INTERACTIVE:
                self._bulk -= 1
            ok = succeeded(future) and not ticket.request.cancelled
            observer.answered(time.perf_counter() - ticket.enqueued_at, ok)

        return answered

    @property
    def idle(self) -> bool:
        """Nothing waiting and nothing decoding: a model version being retired has drained."""
        return not any(lane.waiting or lane.running for lane in self.lanes)

    def state(self) -> dict:
        """What runs and waits now: for ``GET /models`` and for tests."""
        return {
            "running_sequences": len(self._running),
            "running_rows": self.running_rows,
            "waiting_sequences": len(self._waiting),
            "waiting_rows": self.waiting_rows,
            "max_running_rows": self.max_running_rows,
            "max_waiting_rows": self.max_waiting_rows,
            "lanes": len(self.lanes),
        }

    def start(self) -> None:
        loop = self._event_loop = asyncio.get_running_loop()
        for i, lane in enumerate(self.lanes):
            lane.task = loop.create_task(self._supervise(lane), name=f"scheduler-{self.name}-{i}")

    async def stop(self) -> None:
        self._admission.closed = True
        for lane in self.lanes:
            if lane.task is not None:
                lane.task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await lane.task
        self._fail(self._waiting + list(self._running.values()), self._admission.shutting_down())
        for lane in self.lanes:  # answered: a hop still on its thread settles none of them again
            lane.waiting.clear()
            lane.waiting_rows = lane.interactive = 0
            lane.running.clear()
            lane.rows = 0
            lane.clear_aside()
        for lane in self.lanes:
            await asyncio.to_thread(lane.executor.shutdown, wait=True)

    # ---- worker side -----------------------------------------------------------------------------
    def _room_for(self, lane: Lane, request: DecodeRequest) -> bool:
        """Whether a waiting request may join the lane's batch now: continuous batching, as rows free up."""
        return lane.rows + request.beam <= self.max_running_rows

    def _joinable(self, lane: Lane) -> bool:
        """Whether decoding hands back to the loop between steps so that waiting requests join.

        Called on the lane's thread: a deque's length is read atomically."""
        return bool(lane.waiting)

    def _steal(self, lane: Lane) -> None:
        """The lane takes the oldest submission waiting for another lane, whole (its sentences stay together):
        an idle lane from any lane that is busy or down; a lane with rows free, a submission that fits them
        and that its own lane has no room to start now."""
        free = None if lane.batch is None else self.max_running_rows - lane.rows
        if free is not None and free <= 0:
            return
        candidates = []
        for other in self.lanes:
            if other is lane or not other.waiting:
                continue
            group = other.waiting[0].group
            if any(t.group == group for t in other.running.values()):
                continue  # begun there: its other sentences join the same batch
            rows = head_rows(other.waiting)
            stuck = (
                other.down
                or (other.batch is not None and (free is None or other.rows + rows > self.max_running_rows))
                or (other.waiting[0].priority != INTERACTIVE and other.has_interactive())  # batch work held back
            )
            if stuck and (free is None or rows <= free):
                candidates.append(other)
        if not candidates:
            return
        victim = max(candidates, key=lambda other: other.waiting_rows)
        group = victim.waiting[0].group
        moving = []
        while victim.waiting and victim.waiting[0].group == group:
            moving.append(victim.waiting[0])
            victim.dequeue(victim.waiting[0])
        lane.enqueue(moving)

    def _next(self, lane: Lane) -> Ticket:
        """The waiting ticket to admit next: a batch one past ``batch_max_wait_s``, else the first interactive one,
        else the first batch one (a submission's tickets are consecutive and of one priority: it stays whole)."""
        head = lane.waiting[0]
        if not lane.interactive or head.priority == INTERACTIVE:
            return head
        if time.perf_counter() - head.enqueued_at >= self.batch_max_wait_s:
            return head  # the oldest batch work has waited its limit
        return next((t for t in lane.waiting if t.priority == INTERACTIVE), head)

    def _admit(self, lane: Lane) -> list[Ticket]:
        """The lane's waiting tickets that fit its rows free now, interactive ones first (``_next``); cancelled ones
        are dropped, and so are those past their deadline whose timer the event loop has not fired yet."""
        joining: list[Ticket] = []
        now, batch_tokens, interactive_running = time.monotonic(), 0, None
        while lane.waiting:
            head = self._next(lane)
            if head.past_deadline(now):
                self._expire(head)
                continue
            if head.request.cancelled:
                lane.dequeue(head)
                self._observer.cancelled()
                self._resolve(head)
                continue
            if not self._room_for(lane, head.request):
                break
            if head.priority != INTERACTIVE:
                if interactive_running is None:  # looked at once a hop, and only for batch work
                    interactive_running = lane.has_interactive(waiting=False)
                if (
                    lane.aside or interactive_running
                ) and time.perf_counter() - head.enqueued_at < self.batch_max_wait_s:
                    break  # batch work waits while interactive work runs (the lane's own batch work set aside)
                batch_tokens += len(head.request.source)
                if batch_tokens > BATCH_JOIN_TOKENS and joining:
                    break  # the rest joins at the next hop, a few steps on
            lane.dequeue(head)
            lane.rows += head.request.beam
            lane.running[head.request.id] = head  # the lane's from now on: answered if it fails
            joining.append(head)
        return joining

    async def _supervise(self, lane: Lane) -> None:
        """Runs the lane's loop, and again after it raised: its requests answered, the failure logged and counted."""
        while True:
            try:
                await self._loop(lane)
            except asyncio.CancelledError:
                raise
            except Exception as error:  # noqa: BLE001 - whatever it was, the lane's requests get an answer
                backoff = self._lane_failed(lane, error)
                if backoff:
                    lane.down = True
                    for other in self.lanes:  # they may take what waits for this lane
                        other.wakeup.set()
                    await asyncio.sleep(backoff)
                    lane.down = False

    def _lane_failed(self, lane: Lane, error: Exception) -> float:
        """Answers the lane's running requests 500 (each naming its request id) and resets the lane; returns
        the seconds to wait before it restarts."""
        tickets = list(lane.running.values())
        lane.running.clear()
        lane.rows, lane.batch, lane.joined, lane.fault = 0, None, [], None
        lane.clear_aside()
        log.error(
            "lane %d of model %s failed; answering its %d running requests 500 (%s) and restarting it",
            lane.index,
            self.name,
            len(tickets),
            _ids(tickets),
            exc_info=error,
        )
        for t in tickets:
            self._fail([t], self._admission.failed(t.request_id))
        self._observer.restarted()
        self._observer.occupancy(self.running_rows, self.waiting_rows)
        return self.supervision.failed(error)

    def _set_aside(self, lane: Lane) -> tuple[set[int], bool]:
        """On the event loop, before a hop: (the ids of the batch requests it sets aside, whether it joins back
        those set aside). Aside while the lane has interactive work running or waiting; back once it has none,
        or once the oldest set aside has been queued ``batch_max_wait_s``, when their rows fit again."""
        now = time.perf_counter()
        if lane.aside:
            interactive = lane.has_interactive()  # the rows set aside are batch work only
            aside = [lane.running[i] for i in lane.aside if i in lane.running]
            overdue = any(now - t.enqueued_at >= self.batch_max_wait_s for t in aside)
            if (overdue or not interactive) and lane.rows + lane.aside_rows <= self.max_running_rows:
                lane.rows += lane.aside_rows
                lane.aside, lane.aside_rows = set(), 0
                return set(), True
            return set(), False
        if not lane.interactive or not isinstance(lane.batch, DecodeBatch):
            return set(), False
        leaving = {
            i
            for i, t in lane.running.items()
            if t.priority != INTERACTIVE and now - t.enqueued_at < self.batch_max_wait_s
        }
        if leaving:
            lane.aside, lane.aside_rows = leaving, sum(lane.running[i].request.beam for i in leaving)
            lane.rows -= lane.aside_rows
        return leaving, False

    async def _loop(self, lane: Lane) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not lane.waiting:
                self._steal(lane)
            if lane.batch is None and not lane.waiting and not lane.aside:
                lane.wakeup.clear()
                await lane.wakeup.wait()
                continue
            leaving, back = self._set_aside(lane)
            joining = self._admit(lane)
            self._faults.hit("lane")
            if lane.batch is None and not joining and not back:
                await self._doze(lane)  # batch work held back for a moment: until it may go, or work arrives
                continue
            interactive = any(t.priority == INTERACTIVE for t in lane.running.values())  # not the hold: it would last
            lane.stepping_interactive = interactive
            try:
                lane.batch = await self._hop(loop, lane, joining, leaving, back)
            finally:
                lane.stepping_interactive = False
            if interactive:
                lane.interactive_at = time.perf_counter()
            self._observer.occupancy(self.running_rows, self.waiting_rows)
            if lane.batch is None:
                for other in self.lanes:  # this lane ran dry: one that sleeps may steal what waits
                    other.wakeup.set()

    @staticmethod
    async def _doze(lane: Lane) -> None:
        lane.wakeup.clear()
        left = lane.hold_left()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(lane.wakeup.wait(), timeout=max(0.001, left))

    def _work(
        self,
        lane: Lane,
        joining: list[DecodeRequest],
        streaming: bool,
        leaving: set[int] = frozenset(),  # type: ignore[assignment]
        back: bool = False,
        yields: bool = False,
    ) -> tuple[BaseException | None, list[DecodeRequest], DecodeBatch | None, list[tuple[int, float, int, float]]]:
        """One hop of the worker thread: encode the joining requests onto the batch, then decoder steps.

        Returns (the encoder's error, if it failed: only the joining requests fail), then ``_steps``'s
        answer. Encoding, joining and the first steps share a hop: each thread hop costs the event
        loop a wake-up, and joining on the loop held the GIL while every running cache was copied.
        """
        error, batch = None, lane.batch
        if leaving and isinstance(batch, DecodeBatch):  # batch work set aside while interactive work runs
            batch, lane.aside_batch = split(batch, leaving)
        if back and lane.aside_batch is not None:
            aside, lane.aside_batch = lane.aside_batch, None
            batch = aside if batch is None else concatenate(batch, aside, room=self.max_running_rows)
        if joining:
            try:
                room = self.max_running_rows if batch is None else None  # a joining batch's rows are copied
                new = DecodeBatch.start(joining, self.translator.encoder, self.translator.spec, room=room)
            except Exception as e:  # noqa: BLE001 - reported by the loop, which fails the joining requests
                error, lane.joined = e, []
            else:
                batch = new if batch is None else concatenate(batch, new, room=self.max_running_rows)
        if batch is None:
            return error, [], None, []
        return (error, *self._steps(lane, batch, streaming, yields))

    def _steps(
        self, lane: Lane, batch: DecodeBatch, streaming: bool, yields: bool = False
    ) -> tuple[list[DecodeRequest], DecodeBatch, list[tuple[int, float, int, float]]]:
        """Decoder steps on the worker thread until the event loop has something to do: requests wait to
        join (once the hop has run ``JOIN_EVERY`` steps), the batch ran dry, a stream has a token to send
        (or its first), or ``MAX_STEPS_PER_HOP`` / ``MAX_HOP_SECONDS`` ran out. One thread hop per such event instead of one per step: at batch 1 a hop
        costs a good part of a step. Requests that finish while others go on are handed to the event loop at
        once (``_settle``) and the steps go on: the batch does not wait for the loop to answer them. Returns
        (the last step's finished requests, the batch, (rows, seconds, tokens, end time) of the steps not
        handed over yet)."""
        loop = self._event_loop
        steps: list[tuple[int, float, int, float]] = []
        deadline, ran = time.perf_counter() + MAX_HOP_SECONDS, 0
        while True:
            started, rows, sentences = time.perf_counter(), len(batch), len(batch.requests)
            finished, batch = step(batch, self.translator.decoder, self.translator.spec)
            now = time.perf_counter()
            steps.append((rows, now - started, sentences - sum(r.cancelled for r in finished), now))
            ran += 1
            if BULK_YIELD and not lane.stepping_interactive and any(o.stepping_interactive for o in self.lanes):
                rest(BULK_YIELD * (now - started))  # cores left to the lane stepping interactive work
            lane.stepped += 1
            if lane.joined:
                for t in lane.joined:
                    t.first_token_at = now
                lane.joined = []
            if (
                not len(batch)
                or lane.fault is not None
                or streaming
                or (ran >= JOIN_EVERY and self._joinable(lane))
                or (yields and lane.interactive)  # batch rows to set aside for an interactive arrival
                or ran >= MAX_STEPS_PER_HOP
                or now >= deadline
            ):
                return finished, batch, steps
            if finished:
                loop.call_soon_threadsafe(self._settle_posted, lane, finished, steps)
                steps = []

    async def _hop(
        self, loop, lane: Lane, joining: list[Ticket], leaving: set[int] = frozenset(), back: bool = False
    ) -> Batch | None:
        now = time.perf_counter()
        for t in joining:
            t.started_at = now
        streaming = any(t.events is not None for t in lane.running.values())
        # a batch that holds batch rows hands back after a step when interactive work arrives, to set them aside
        host = lane.batch is None or isinstance(lane.batch, DecodeBatch)  # a device batch is never set aside
        yields = host and any(t.priority != INTERACTIVE for i, t in lane.running.items() if i not in lane.aside)
        lane.joined = list(joining)
        members = [t for i, t in lane.running.items() if i not in lane.aside] if TRACING.enabled else []
        lane.stepped, hop_started = 0, time.perf_counter()
        try:
            error, finished, batch, steps = await loop.run_in_executor(
                lane.executor, self._work, lane, [t.request for t in joining], streaming, leaving, back, yields
            )
        except asyncio.CancelledError:
            raise  # stop() fails what runs and waits
        except Exception:
            tickets = list(lane.running.values())
            log.exception(
                "decoder step failed in model %s; failing its %d running requests (%s)",
                self.name,
                len(tickets),
                _ids(tickets),
            )
            lane.running.clear()
            lane.rows = 0
            lane.clear_aside()
            self._observer.failed()
            for t in tickets:
                self._fail([t], self._admission.failed(t.request_id))
            return None
        if lane.fault is not None:
            raise lane.fault
        if error is not None:
            log.error(
                "encoder failed in model %s; failing the %d requests that were joining (%s)",
                self.name,
                len(joining),
                _ids(joining),
                exc_info=error,
            )
            for t in joining:
                lane.running.pop(t.request.id, None)
                self._fail([t], self._admission.failed(t.request_id))
            lane.rows -= sum(t.request.beam for t in joining)
            self._observer.failed()
        self._settle(lane, finished, steps)
        if any(t.trace is not None for t in members):
            with TRACING.guarded():
                done, lane.traced = lane.traced, []
                TRACING.hop(self.name, lane.index, lane.stepped, hop_started, members, done)
        if batch is None or not len(batch):
            return None
        now = time.perf_counter()
        for req in batch.requests:
            self._stream(lane.running[req.id], now, finished=False)
        return batch

    def _settle_posted(self, lane: Lane, finished: list[DecodeRequest], steps: list) -> None:
        """``_settle`` posted by the lane's thread mid-hop: what it raises fails the lane once the hop returns."""
        try:
            self._settle(lane, finished, steps)
        except Exception as error:  # noqa: BLE001 - re-raised in the lane's loop by _hop
            lane.fault = lane.fault or error

    def _settle(self, lane: Lane, finished: list[DecodeRequest], steps: list[tuple[int, float, int, float]]) -> None:
        """On the event loop: the steps' metrics, and the finished requests answered and their rows freed."""
        now = time.perf_counter()
        for rows, seconds, tokens, _ in steps:
            self._observer.step(rows, seconds, tokens)
        for req in finished:
            ticket = lane.running.pop(req.id, None)
            if ticket is None:  # failed meanwhile (the scheduler stopped): answered already
                continue
            lane.rows -= req.beam
            if ticket.trace is not None:
                ticket.finished_at = now
                lane.traced.append(ticket)
            if req.cancelled:
                self._observer.cancelled()
            else:
                tokens = len(req.results()[0].tokens)
                self._observer.finished(
                    tokens,
                    now - (ticket.started_at or now),
                    (ticket.started_at or now) - ticket.enqueued_at,
                    (ticket.first_token_at or now) - ticket.enqueued_at,
                    ticket.priority,
                )
            self._stream(ticket, now, finished=True)
            self._resolve(ticket)

    def _stream(self, ticket: Ticket, now: float, finished: bool) -> None:
        """Greedy streams get every new token; the first token's time is kept for the metrics."""
        req = ticket.request
        if ticket.first_token_at is None:
            ticket.first_token_at = now
        if ticket.events is None or req.beam != 1 or req.cancelled:
            return
        tokens = req.results()[0].tokens if finished else req.live[0].tokens
        if len(tokens) > ticket.streamed:
            ticket.streamed = len(tokens)
            ticket.events.put_nowait(list(tokens))

    def _expire(self, ticket: Ticket) -> None:
        """The deadline passed: answer 504 now. A waiting sentence leaves the queue at once, its rows
        free for others; a running one leaves the batch at the next step."""
        ticket.cancel()
        if not ticket.future.done():
            self._fail([ticket], self._admission.deadline_exceeded())
        lane = next((lane for lane in self.lanes if ticket in lane.waiting), None)
        if lane is not None:
            lane.dequeue(ticket)
            self._observer.cancelled()
            self._resolve(ticket)
            self._observer.occupancy(self.running_rows, self.waiting_rows)

    def _resolve(self, ticket: Ticket) -> None:
        if ticket.timer is not None:
            ticket.timer.cancel()
        if ticket.events is not None:
            ticket.events.put_nowait(None)
        if not ticket.future.done():
            ticket.future.set_result(ticket.request)

    def _fail(self, tickets: list[Ticket], error: Exception) -> None:
        for t in tickets:
            if t.timer is not None:
                t.timer.cancel()
            if t.events is not None:
                t.events.put_nowait(error)
            if not t.future.done():
                t.future.set_exception(error)
                if t.events is not None:
                    t.future.exception()  # a stream reads the error from its events; nobody awaits this future


def _ids(tickets: list[Ticket]) -> str:
    return ", ".join(str(t.request_id) for t in tickets) or "none"
