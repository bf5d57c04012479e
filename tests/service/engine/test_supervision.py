"""Engines whose own loops fail: answered, counted, restarted, not ready when it keeps happening; and work that
moves to a lane with rows free. On the bigram "translator" of test_decoding and the doubling model of
test_batching (no onnxruntime); faults come from ``service/faults.py`` as the service injects them."""

from __future__ import annotations

import asyncio
import threading

import pytest

from contract.decoding import DecodeRequest
from service.engine import scheduler as scheduler_module
from service.engine.batching import Batcher, Intake
from service.engine.scheduler import Scheduler
from service.engine.supervision import MAX_BACKOFF_S, Supervision
from service.errors import InferenceFailed, ShuttingDown
from service.faults import Faults, parse
from service.logs import bind_request_id, unbind_request_id
from tests.contract.test_decoding import EOS, A, B
from tests.service.engine.test_batching import Doubler, rows
from tests.service.engine.test_scheduler import BigramTranslator, ThreadRecordingTranslator, run


class Events:
    """An observer that counts the restarts and translations the engines report, and ignores the rest."""

    def __init__(self) -> None:
        self.restarts = 0
        self.finished_count = 0

    def restarted(self) -> None:
        self.restarts += 1

    def finished(self, *args) -> None:
        self.finished_count += 1

    def __getattr__(self, name):
        return lambda *args, **kwargs: None


def armed(plan: str) -> Faults:
    faults = Faults(parse(plan))
    faults.arm()
    return faults


def submit_as(sched: Scheduler, request_id: str, requests: list[DecodeRequest]):
    """Submits as a handler would, with its request id bound."""
    _, token = bind_request_id(request_id)
    try:
        return sched.submit(requests)
    finally:
        unbind_request_id(token)


async def with_scheduler(body, translator=None, **kw):
    sched = Scheduler("t", translator or BigramTranslator(), **{"max_running_rows": 8, "max_waiting_rows": 32, **kw})
    sched.start()
    try:
        return await body(sched)
    finally:
        await sched.stop()


def test_a_lane_whose_loop_raises_answers_what_it_held_500_naming_each_request_and_serves_on(caplog):
    observer = Events()

    async def body(sched):
        held = [submit_as(sched, f"req-{i}", [DecodeRequest([B, EOS], 40)])[0] for i in range(3)]
        results = await asyncio.gather(*(t.future for t in held), return_exceptions=True)
        after = [sched.submit([DecodeRequest([A, EOS], 10)])[0] for _ in range(4)]
        done = await asyncio.gather(*(t.future for t in after))
        return results, done, sched.state()

    results, done, state = run(with_scheduler(body, faults=armed("lane:raise@1"), observer=observer, lanes=1))
    failed = [r for r in results if isinstance(r, InferenceFailed)]
    assert failed and len(failed) == 3  # the three were admitted together, then the loop raised
    assert sorted(str(e).split("for request ")[1].split(";")[0] for e in failed) == ["req-0", "req-1", "req-2"]
    assert all(r.results()[0].tokens == [A] for r in done)
    assert observer.restarts == 1 and state["running_rows"] == 0 and state["waiting_rows"] == 0
    logged = [r for r in caplog.records if "failed; answering its 3 running requests 500" in r.getMessage()]
    assert len(logged) == 1 and logged[0].exc_info is not None and "req-1" in logged[0].getMessage()


def test_a_settle_that_raises_mid_hop_fails_the_lane_once_its_hop_returns(monkeypatch):
    """A request finishing while the others decode on is settled from the thread's post: an exception there
    reaches the lane's supervisor, not the event loop's default handler."""
    real = Scheduler._settle
    calls = {"n": 0}

    def settle_once_broken(self, lane, finished, steps):
        calls["n"] += 1
        if calls["n"] == 1 and finished:
            raise RuntimeError("settle exploded")
        return real(self, lane, finished, steps)

    monkeypatch.setattr(Scheduler, "_settle", settle_once_broken)
    monkeypatch.setattr(scheduler_module, "MAX_HOP_SECONDS", 30.0)

    async def body(sched):
        short, long = sched.submit([DecodeRequest([B, EOS], 3)])[0], sched.submit([DecodeRequest([B, EOS], 12)])[0]
        outcome = await asyncio.gather(short.future, long.future, return_exceptions=True)
        again = sched.submit([DecodeRequest([A, EOS], 10)])[0]
        return outcome, await again.future, sched.supervision.restarts

    outcome, again, restarts = run(with_scheduler(body, lanes=1))
    assert all(isinstance(o, InferenceFailed) for o in outcome) and restarts == 1
    assert again.results()[0].tokens == [A]


def test_repeated_failures_make_the_engine_unhealthy_and_the_other_lane_takes_the_work():
    """Every hop of lane 0 raises from the first on (x0): after the limit it backs off; submissions go to lane 1,
    which also takes what was queued for lane 0."""
    faults = armed("lane:raise@1x0")

    class OnlyLaneZero(Faults):
        def hit(self, point, path=None):
            if asyncio.current_task().get_name().endswith("-0"):
                faults.hit(point, path)

    async def body(sched):
        failures = []
        for _ in range(3):
            (t,) = sched.submit([DecodeRequest([A, EOS], 10)])
            try:
                await t.future
            except InferenceFailed:
                failures.append(t)
        unhealthy = sched.supervision.reason()
        served = await asyncio.gather(
            *(t.future for t in sched.submit([DecodeRequest([A, EOS], 10) for _ in range(4)]))
        )
        return len(failures), unhealthy, served, sched.lanes[0].down

    supervision = Supervision(limit=2, window_s=60)
    failures, unhealthy, served, down = run(
        with_scheduler(body, faults=OnlyLaneZero([]), supervision=supervision, lanes=2)
    )
    assert failures >= 2 and "failed 2 times in the last 60 s" in unhealthy and "restarting with backoff" in unhealthy
    assert all(r.results()[0].tokens == [A] for r in served) and down


def test_waiting_work_moves_to_a_lane_with_rows_free_not_only_to_an_idle_one():
    """Two rows per lane. Lane 0 holds two long requests, lane 1 a long and a short one; a fifth request (both
    lanes as loaded: the first wins) waits for lane 0. When the short one ends, lane 1 has a row free and takes
    it: it is answered long before lane 0 frees a row."""

    async def body(sched):
        longs = [sched.submit([DecodeRequest([B, EOS], 400)])[0] for _ in range(2)]
        third = sched.submit([DecodeRequest([B, EOS], 400)])[0]
        short = sched.submit([DecodeRequest([B, EOS], 15)])[0]
        late = sched.submit([DecodeRequest([A, EOS], 10)])[0]
        waited_in_lane_0 = late in sched.lanes[0].waiting
        await asyncio.wait_for(late.future, 5)
        return waited_in_lane_0, short.future.done(), [t.future.done() for t in (*longs, third)]

    waited, short_done, longs_done = run(
        with_scheduler(body, ThreadRecordingTranslator(), lanes=2, max_running_rows=2, max_waiting_rows=8)
    )
    assert waited and short_done and not any(longs_done)


def test_stop_answers_running_requests_once_and_a_late_settle_counts_none_of_them(monkeypatch):
    """stop() fails what runs while the lane's thread is mid-hop; the hop goes on and posts the short request as
    finished: it must not be recorded as translated after it was answered 503."""
    monkeypatch.setattr(scheduler_module, "MAX_HOP_SECONDS", 30.0)
    gate = threading.Event()

    class Gated(BigramTranslator):
        def __init__(self) -> None:
            super().__init__()
            self.calls, self.entered = 0, threading.Event()

        def decoder(self, feeds):
            self.calls += 1
            if self.calls == 2:
                self.entered.set()
                gate.wait(10)
            return super().decoder(feeds)

    observer = Events()
    translator = Gated()

    async def body():
        sched = Scheduler("t", translator, max_running_rows=8, max_waiting_rows=8, observer=observer)
        sched.start()
        short, long = sched.submit([DecodeRequest([B, EOS], 5), DecodeRequest([B, EOS], 40)])
        await asyncio.to_thread(translator.entered.wait, 10)
        stopping = asyncio.ensure_future(sched.stop())
        await asyncio.sleep(0.05)  # stop() has answered both and waits for the thread
        gate.set()
        await stopping
        return [type(t.future.exception()) for t in (short, long)]

    assert run(body()) == [ShuttingDown, ShuttingDown]
    assert observer.finished_count == 0


def test_an_instance_thread_that_raises_answers_its_batch_500_and_the_batcher_serves_on(caplog):
    async def scenario():
        observer = Events()
        batcher = Batcher(
            "test",
            Doubler(),
            max_batch_size=8,
            max_queue_images=32,
            max_queue_delay_s=0.002,
            intake=Intake(),
            observer=observer,
            faults=armed("batcher:raise@1"),
        )
        batcher.start()
        try:
            _, token = bind_request_id("img-1")
            first = batcher.submit(rows(1.0))
            unbind_request_id(token)
            with pytest.raises(InferenceFailed, match="img-1"):
                await asyncio.wait_for(first, 5)
            second = await asyncio.wait_for(batcher.submit(rows(2.0)), 5)
            await asyncio.sleep(0.01)
            return second, observer.restarts, batcher.idle, batcher.supervision.restarts
        finally:
            await batcher.stop()

    second, restarts, idle, counted = asyncio.run(scenario())
    assert second.tolist() == [[4.0]] and restarts == 1 and counted == 1 and idle
    assert sum("an instance thread of model test failed" in r.getMessage() for r in caplog.records) == 1


def test_supervision_counts_failures_in_its_window_and_backs_off_past_the_limit():
    now = [0.0]
    s = Supervision(limit=3, window_s=10, clock=lambda: now[0])
    error = RuntimeError("boom")
    assert [s.failed(error) for _ in range(2)] == [0.0, 0.0] and s.healthy and s.reason() is None
    assert s.failed(error) == 1.0 and not s.healthy and "failed 3 times" in s.reason() and "boom" in s.reason()
    assert s.failed(error) == 2.0 and s.failed(error) == 4.0
    assert max(s.failed(error) for _ in range(20)) == MAX_BACKOFF_S
    now[0] = 11.0  # the window emptied: healthy again, restarts counted
    assert s.healthy and s.restarts == 25 and s.failed(error) == 0.0
