"""A decoding lane's state and the tickets it decodes, with what the scheduler's priority policy asks of them.

A ``Ticket`` is one submitted sentence (its future, its stream of token events, its priority); a ``Lane`` is
what ``service/engine/scheduler.py`` keeps per decoding loop: its running batch, the tickets running and waiting
in it (and of those waiting, how many are interactive), the batch rows set aside while interactive work runs,
and when it last stepped interactive work (``INTERACTIVE_HOLD_S``, shared with the classify batcher).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from contract.decoding import Batch, DecodeRequest
from service.engine.batching import INTERACTIVE_HOLD_S
from service.logs import current_request_id

INTERACTIVE = "interactive"  # a submission's priority unless it says "batch"


@dataclass(eq=False)
class Ticket:
    """A submitted request: its future (resolves to the finished ``DecodeRequest``) and, when streaming,
    a queue of token events (``list[int]`` of the tokens so far, greedy only; ``None`` at the end)."""

    request: DecodeRequest
    future: asyncio.Future
    events: asyncio.Queue | None = None
    deadline: float | None = None  # time.monotonic() by which it must be answered
    timer: asyncio.TimerHandle | None = None  # answers 504 at the deadline
    enqueued_at: float = field(default_factory=time.perf_counter)
    started_at: float | None = None
    first_token_at: float | None = None
    streamed: int = 0
    group: int = 0  # the submission it came in: a submission's tickets decode in one lane
    request_id: str | None = field(default_factory=current_request_id)  # to name it in errors and logs
    priority: str = INTERACTIVE
    trace: Any = None  # its request's span context when traces are on (service/tracing.py)
    hops: list = field(default_factory=list)  # with traces: the contexts of the hops it was stepped in
    finished_at: float | None = None

    def cancel(self) -> None:
        self.request.cancelled = True

    def past_deadline(self, now: float) -> bool:
        return self.deadline is not None and now >= self.deadline


@dataclass(eq=False)
class Lane:
    """One decoding loop: its running batch, the tickets decoding in it, and the thread that steps it."""

    executor: ThreadPoolExecutor
    index: int = 0
    batch: Batch | None = None
    rows: int = 0
    running: dict[int, Ticket] = field(default_factory=dict)
    waiting: deque[Ticket] = field(default_factory=deque)
    waiting_rows: int = 0
    interactive: int = 0  # interactive tickets in ``waiting``: none, and the head is the next one either way
    wakeup: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task | None = None
    joined: list[Ticket] = field(default_factory=list)  # joining this hop: their first token is its first step's
    fault: Exception | None = None  # raised by a settle the thread posted: the lane fails when its hop returns
    down: bool = False  # failed, waiting to restart: the other lanes take what waits for it
    aside: set[int] = field(default_factory=set)  # running batch requests set aside while interactive work runs
    aside_rows: int = 0  # their rows (not in ``rows``)
    aside_batch: Batch | None = None  # their rows, as the lane's thread split them off
    stepped: int = 0  # steps of the hop under way (its thread counts them)
    interactive_at: float = -1e9  # perf_counter() when a hop last stepped interactive work
    stepping_interactive: bool = False  # its hop under way steps interactive work (the other lanes' threads read it)
    traced: list[Ticket] = field(default_factory=list)  # with traces: finished this hop, their spans to record

    @property
    def load(self) -> int:
        return self.rows + self.waiting_rows

    def enqueue(self, tickets: list[Ticket]) -> None:
        self.waiting.extend(tickets)
        self.waiting_rows += sum(t.request.beam for t in tickets)
        self.interactive += sum(t.priority == INTERACTIVE for t in tickets)

    def dequeue(self, ticket: Ticket) -> None:
        if self.waiting and self.waiting[0] is ticket:
            self.waiting.popleft()
        else:
            self.waiting.remove(ticket)
        self.waiting_rows -= ticket.request.beam
        self.interactive -= ticket.priority == INTERACTIVE

    def clear_aside(self) -> None:
        """Forget what the lane set aside: its requests were answered with the others (a failure, a stop)."""
        self.aside, self.aside_rows, self.aside_batch = set(), 0, None

    def has_interactive(self, waiting: bool = True) -> bool:
        """Whether interactive work runs in the lane, ran in it within ``INTERACTIVE_HOLD_S`` or (with ``waiting``)
        waits for it."""
        return (
            (waiting and self.interactive > 0)
            or any(t.priority == INTERACTIVE for t in self.running.values())
            or self.held()
        )

    def held(self) -> bool:
        """Whether a hop stepped interactive work within ``INTERACTIVE_HOLD_S``."""
        return self.hold_left() > 0

    def hold_left(self) -> float:
        """Seconds until the lane has had no interactive work for ``INTERACTIVE_HOLD_S`` (<= 0: it has)."""
        return self.interactive_at + INTERACTIVE_HOLD_S - time.perf_counter()

    def batch_rows(self) -> int:
        """Rows of batch work decoding in the batch (not set aside): what interactive work here would set aside."""
        return sum(t.request.beam for i, t in self.running.items() if t.priority != INTERACTIVE and i not in self.aside)


def head_rows(waiting: deque[Ticket]) -> int:
    """The rows of the first submission waiting (its tickets come one after the other)."""
    rows, group = 0, waiting[0].group
    for t in waiting:
        if t.group != group:
            break
        rows += t.request.beam
    return rows
