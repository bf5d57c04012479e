"""Dynamic batching: the batch-forming rules (no event loop) and the worker's one-answer-per-request contract.

The worker tests give the batcher a real function to run (it doubles its input) and gate it with
a threading.Event where a test must hold a batch in flight; nothing here measures time.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass

import numpy as np
import pytest

from service.engine.batching import Batcher, BatchState, Intake, Pending, QueueFull
from service.errors import DeadlineExceeded, InferenceFailed, Overloaded, ShuttingDown


@dataclass
class Item:
    size: int
    abandoned: bool = False
    tag: str = ""
    priority: str = "interactive"
    enqueued_at: float = 0.0


# ---- BatchState: plain object ---------------------------------------------------------------------
def test_interactive_requests_form_their_own_batches_first_and_batch_work_waits_at_most_its_limit():
    now = [0.0]
    state = BatchState(max_batch_size=8, max_queued=64, batch_max_wait_s=5.0, clock=lambda: now[0])
    for tag, priority in (("a", "batch"), ("b", "batch"), ("c", "interactive"), ("d", "interactive")):
        state.admit(Item(2, tag=tag, priority=priority, enqueued_at=now[0]))
    batch, _ = state.take()
    assert [i.tag for i in batch] == ["c", "d"]  # interactive first, and no bulk image in their run
    state.admit(Item(2, tag="e", priority="interactive", enqueued_at=now[0]))
    now[0] = 5.0  # the batch work has waited its limit: it goes before the interactive request that came later
    batch, _ = state.take()
    assert [i.tag for i in batch] == ["a", "b"]
    batch, _ = state.take()
    assert [i.tag for i in batch] == ["e"] and len(state) == 0 and state.queued == 0


def test_a_queue_of_abandoned_requests_gives_way_to_the_other():
    state = BatchState(max_batch_size=8, max_queued=64, clock=lambda: 0.0)
    state.admit(Item(1, tag="gone", abandoned=True))
    state.admit(Item(1, tag="bulk", priority="batch"))
    batch, abandoned = state.take()
    assert [i.tag for i in batch] == ["bulk"] and [i.tag for i in abandoned] == ["gone"]


def test_batches_take_whole_requests_in_arrival_order_up_to_the_limit():
    state = BatchState(max_batch_size=8, max_queued=64)
    items = [Item(3, tag="a"), Item(4, tag="b"), Item(2, tag="c"), Item(8, tag="d")]
    for it in items:
        state.admit(it)
    batch, dropped = state.take()
    assert [i.tag for i in batch] == ["a", "b"]  # c would make 9 > 8: it waits, order is kept
    assert not dropped
    assert [i.tag for i in state.take()[0]] == ["c"]
    assert [i.tag for i in state.take()[0]] == ["d"]
    assert state.take() == ([], []) and state.queued == 0


def test_a_smaller_share_stops_earlier_but_always_takes_a_whole_request():
    state = BatchState(max_batch_size=8, max_queued=64)
    for tag, size in (("a", 3), ("b", 3), ("c", 2)):
        state.admit(Item(size, tag=tag))
    assert [i.tag for i in state.take(4)[0]] == ["a"]  # a + b would be 6 > 4
    assert [i.tag for i in state.take(1)[0]] == ["b"]  # larger than the share, but never split nor starved
    assert [i.tag for i in state.take(100)[0]] == ["c"]  # never above max_batch_size either
    assert state.queued == 0


def test_requests_whose_client_left_are_dropped_before_compute():
    state = BatchState(max_batch_size=4, max_queued=16)
    gone, kept = Item(2, abandoned=True, tag="gone"), Item(2, tag="kept")
    state.admit(gone)
    state.admit(kept)
    batch, dropped = state.take()
    assert batch == [kept] and dropped == [gone]
    assert state.queued == 0


def test_the_queue_is_bounded_in_images():
    state = BatchState(max_batch_size=4, max_queued=8)
    state.admit(Item(4))
    state.admit(Item(4))
    with pytest.raises(QueueFull):
        state.admit(Item(1))
    state.take()
    state.admit(Item(1))  # room again once a batch left


@pytest.mark.parametrize("size", [0, 5])
def test_a_request_that_cannot_fit_a_batch_is_refused(size):
    with pytest.raises(ValueError):
        BatchState(max_batch_size=4, max_queued=8).admit(Item(size))


@pytest.mark.parametrize(
    "incoming, queued, waited, expected",
    [
        (0, 1, 0.0, False),  # nobody else on the way: an idle queue dispatches at once
        (2, 1, 0.0, True),  # batch-mates are being received and there is room
        (2, 1, 0.005, False),  # ... but the delay is spent
        (2, 4, 0.0, False),  # the batch is full anyway
    ],
)
def test_the_wait_for_batch_mates_depends_on_load_not_on_a_fixed_delay(incoming, queued, waited, expected):
    state = BatchState(max_batch_size=4, max_queued=16)
    state.admit(Item(queued))
    assert state.should_wait(incoming, waited, max_delay=0.002) is expected


# ---- Batcher: asyncio worker ------------------------------------------------------------------
class Doubler:
    """A model that doubles its input, records every batch, and can be held mid-run or made to fail."""

    def __init__(self) -> None:
        self.batches: list[np.ndarray] = []
        self.attention: list[bool] = []
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()
        self.fail_when = lambda x: False

    def __call__(self, x: np.ndarray, attention: bool) -> np.ndarray:
        self.entered.set()
        self.gate.wait(timeout=30)
        self.batches.append(x.copy())
        self.attention.append(attention)
        if self.fail_when(x):
            raise RuntimeError("simulated onnxruntime failure")
        return x * 2


def rows(*values: float) -> np.ndarray:
    return np.array(values, np.float32).reshape(-1, 1)


def make_batcher(model, **kw) -> Batcher:
    args = {"max_batch_size": 8, "max_queue_images": 32, "max_queue_delay_s": 0.002, "intake": Intake()}
    return Batcher("test", model, **{**args, **kw})


async def wait_for(predicate) -> None:
    for _ in range(3000):
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise TimeoutError("condition never held")


def test_every_request_gets_its_own_rows_back_and_concurrent_ones_share_a_run():
    async def scenario():
        model = Doubler()
        batcher = make_batcher(model)
        batcher.start()
        model.gate.clear()  # hold the first batch so the others queue up behind it
        first = batcher.submit(rows(1))
        await asyncio.to_thread(model.entered.wait, 30)
        others = [batcher.submit(rows(v, v + 0.5)) for v in (10, 20, 30)]
        model.gate.set()
        results = await asyncio.gather(first, *others)
        await batcher.stop()
        return model, results

    model, results = asyncio.run(scenario())
    assert np.array_equal(results[0], rows(2))
    for v, out in zip((10, 20, 30), results[1:]):
        assert np.array_equal(out, rows(2 * v, 2 * v + 1))
    assert [len(b) for b in model.batches] == [1, 6]  # the three waiting requests ran together


def test_prepare_runs_on_the_loop_per_request_finish_once_per_batch_and_only_the_model_on_the_thread():
    threads: dict[str, list[int]] = {"prepare": [], "run": [], "finish": []}

    def prepare(x: np.ndarray) -> np.ndarray:
        threads["prepare"].append(threading.get_ident())
        return x + 1

    def finish(out: np.ndarray) -> np.ndarray:
        threads["finish"].append(threading.get_ident())
        return out * 10

    async def scenario():
        model = Doubler()

        def run(x: np.ndarray, attention: bool) -> np.ndarray:
            threads["run"].append(threading.get_ident())
            return model(x, attention)

        batcher = Batcher(
            "test",
            run,
            prepare=prepare,
            finish=finish,
            max_batch_size=8,
            max_queue_images=32,
            max_queue_delay_s=0.002,
            intake=Intake(),
        )
        batcher.start()
        model.gate.clear()
        first = batcher.submit(rows(1))
        await asyncio.to_thread(model.entered.wait, 30)
        others = [batcher.submit(rows(2)), batcher.submit(rows(3))]
        model.gate.set()
        results = await asyncio.gather(first, *others)
        await batcher.stop()
        return results, threading.get_ident()

    results, loop_thread = asyncio.run(scenario())
    assert [r.tolist() for r in results] == [[[40.0]], [[60.0]], [[80.0]]]  # (x + 1) * 2 * 10, each its own row
    assert len(threads["prepare"]) == 3  # each request as it is queued
    assert len(threads["finish"]) == len(threads["run"]) == 2  # two batches
    assert set(threads["prepare"]) == set(threads["finish"]) == {loop_thread}
    assert loop_thread not in threads["run"]


def test_with_two_instances_a_second_batch_computes_while_the_first_is_held():
    async def scenario():
        first_model, entered_twice = Doubler(), threading.Semaphore(0)
        release = threading.Event()

        def run(x: np.ndarray, attention: bool) -> np.ndarray:
            entered_twice.release()
            release.wait(timeout=30)
            return first_model(x, attention)

        batcher = make_batcher(run, instances=2)
        batcher.start()
        a = batcher.submit(rows(1))
        assert await asyncio.to_thread(entered_twice.acquire, True, 30)
        b = batcher.submit(rows(2))
        assert await asyncio.to_thread(entered_twice.acquire, True, 30)  # both in onnxruntime at once
        c = batcher.submit(rows(3))  # no free instance: it queues
        await asyncio.sleep(0.05)
        queued = batcher.queued_images
        release.set()
        results = await asyncio.gather(a, b, c)
        await batcher.stop()
        return queued, results

    queued, results = asyncio.run(scenario())
    assert queued == 1
    assert [r.tolist() for r in results] == [[[2.0]], [[4.0]], [[6.0]]]


@pytest.mark.parametrize("hold_s, at_once", [(0.0, 2), (30.0, 1)])
def test_after_interactive_work_batch_work_leaves_one_instance_free(monkeypatch, hold_s, at_once):
    """Two instances: an interactive request has just been answered, and two bulk requests come. Within the hold,
    the second waits for the first (one instance kept free) and an interactive request arriving is computed at
    once beside it; without a hold both bulk requests compute at once."""
    monkeypatch.setattr("service.engine.batching.INTERACTIVE_HOLD_S", hold_s)

    async def scenario():
        inside, release = [0], threading.Event()

        def run(x: np.ndarray, attention: bool) -> np.ndarray:
            inside[0] += 1  # the GIL makes += atomic enough for two threads here
            if x[0, 0] > 10:  # bulk rows: held until released
                release.wait(timeout=30)
            inside[0] -= 1
            return x * 2

        batcher = make_batcher(run, instances=2)
        batcher.start()
        await batcher.submit(rows(1))
        bulk = [batcher.submit(rows(11), priority="batch"), batcher.submit(rows(12), priority="batch")]
        await wait_for(lambda: inside[0] >= 1)
        await asyncio.sleep(0.1)
        computing, quick = inside[0], None
        if hold_s:  # the instance kept free computes it while the bulk request is held
            quick = await asyncio.wait_for(batcher.submit(rows(2)), timeout=20)
        release.set()
        results = await asyncio.gather(*bulk)
        await batcher.stop()
        return computing, quick, results

    computing, quick, results = asyncio.run(scenario())
    assert computing == at_once and (quick is None or quick.tolist() == [[4.0]])
    assert [r.tolist() for r in results] == [[[22.0]], [[24.0]]]


def test_only_batches_holding_an_attention_request_ask_the_model_for_attention():
    async def scenario():
        model = Doubler()
        batcher = make_batcher(model)
        batcher.start()
        await batcher.submit(rows(1))
        model.gate.clear()  # hold a batch so that a plain and an attention request queue up together
        model.entered.clear()
        held = batcher.submit(rows(2))
        await asyncio.to_thread(model.entered.wait, 30)
        mixed = [batcher.submit(rows(3)), batcher.submit(rows(4), attention=True)]
        model.gate.set()
        await asyncio.gather(held, *mixed)
        await batcher.submit(rows(5))
        await batcher.stop()
        return model

    model = asyncio.run(scenario())
    assert [len(b) for b in model.batches] == [1, 1, 2, 1]
    assert model.attention == [False, False, True, False]


def test_a_failing_batch_fails_only_its_own_requests_and_the_worker_keeps_serving():
    async def scenario():
        model = Doubler()
        model.fail_when = lambda x: bool((x == -1).any())
        batcher = make_batcher(model)
        batcher.start()
        bad = batcher.submit(rows(-1))
        with pytest.raises(InferenceFailed) as failed:
            await bad
        good = await batcher.submit(rows(3))
        await batcher.stop()
        return failed.value, good

    error, good = asyncio.run(scenario())
    assert error.status == 500 and error.code == "inference_failed"
    assert "simulated" not in error.message  # the cause stays in the server log
    assert np.array_equal(good, rows(6))


def test_a_cancelled_request_is_never_computed():
    async def scenario():
        model = Doubler()
        batcher = make_batcher(model)
        batcher.start()
        model.gate.clear()
        running = batcher.submit(rows(1))
        await asyncio.to_thread(model.entered.wait, 30)
        abandoned = batcher.submit(rows(99))
        kept = batcher.submit(rows(2))
        abandoned.cancel()  # what the route does when the client disconnects
        model.gate.set()
        await running
        await kept
        await batcher.stop()
        return model

    model = asyncio.run(scenario())
    assert all(99 not in b for b in model.batches)
    assert sum(len(b) for b in model.batches) == 2


def test_a_full_queue_answers_overloaded_with_retry_after():
    async def scenario():
        model = Doubler()
        batcher = make_batcher(model, max_batch_size=2, max_queue_images=4, retry_after_s=7)
        batcher.start()
        model.gate.clear()
        running = batcher.submit(rows(1, 1))
        await asyncio.to_thread(model.entered.wait, 30)
        queued = [batcher.submit(rows(2, 2)), batcher.submit(rows(3, 3))]
        with pytest.raises(Overloaded) as refused:
            batcher.submit(rows(4))
        model.gate.set()
        await asyncio.gather(running, *queued)
        await batcher.stop()
        return refused.value

    refused = asyncio.run(scenario())
    assert refused.status == 503 and refused.headers == {"Retry-After": "7"}


def test_requests_whose_clients_left_give_their_queue_space_to_new_ones():
    async def scenario():
        model = Doubler()
        batcher = make_batcher(model, max_batch_size=2, max_queue_images=4)
        batcher.start()
        model.gate.clear()
        running = batcher.submit(rows(1, 1))
        await asyncio.to_thread(model.entered.wait, 30)
        left = [batcher.submit(rows(2, 2)), batcher.submit(rows(3, 3))]  # the queue is full...
        for future in left:
            future.cancel()  # ...of requests whose clients went away
        admitted = batcher.submit(rows(4, 4))  # would have been refused as overloaded
        model.gate.set()
        await asyncio.gather(running, admitted)
        await batcher.stop()
        return model, admitted.result()

    model, result = asyncio.run(scenario())
    assert np.array_equal(result, rows(8, 8))
    assert all(2 not in b and 3 not in b for b in model.batches)


class DropCounter:
    """Counts the batcher observer's ``dropped`` events; the other events are not under test here."""

    def __init__(self) -> None:
        self.requests = 0

    def dropped(self, requests: int) -> None:
        self.requests += requests

    def __getattr__(self, name):
        return lambda *args, **kwargs: None


def test_a_queued_request_past_its_deadline_is_answered_504_at_once_and_never_computed():
    counter = DropCounter()

    async def scenario():
        model = Doubler()
        batcher = make_batcher(model, max_batch_size=2, max_queue_images=4, observer=counter)
        batcher.start()
        model.gate.clear()
        running = batcher.submit(rows(1, 1))
        await asyncio.to_thread(model.entered.wait, 30)
        late = batcher.submit(rows(2, 2), deadline=time.monotonic() + 0.05)
        queued = batcher.submit(rows(3, 3))  # the queue is full, the late request in it...
        with pytest.raises(DeadlineExceeded):
            await late  # ...answered while the model is still held
        admitted = batcher.submit(rows(4, 4))  # ...and its space goes to a new request
        model.gate.set()
        await asyncio.gather(running, queued, admitted)
        await batcher.stop()
        return model

    model = asyncio.run(asyncio.wait_for(scenario(), timeout=20))
    assert all(2 not in b for b in model.batches)
    assert sum(len(b) for b in model.batches) == 6
    assert counter.requests == 1


def test_a_spent_deadline_never_takes_a_queue_slot():
    async def scenario():
        batcher = make_batcher(Doubler())
        batcher.start()
        with pytest.raises(DeadlineExceeded):
            batcher.submit(rows(1), deadline=time.monotonic() - 0.001)
        queued = batcher.queued_images
        await batcher.stop()
        return queued

    assert asyncio.run(scenario()) == 0


def test_the_queue_reads_the_clock_itself_so_a_late_timer_cannot_let_a_request_run_past_its_deadline():
    async def scenario():
        loop = asyncio.get_running_loop()
        state = BatchState(max_batch_size=4, max_queued=8)
        spent = Pending(rows(1), loop.create_future(), deadline=time.monotonic() - 0.001)  # its timer has not fired
        kept = Pending(rows(2), loop.create_future(), deadline=time.monotonic() + 60)
        state.admit(spent)
        state.admit(kept)
        return state.take(), spent, kept

    (batch, dropped), spent, kept = asyncio.run(scenario())
    assert batch == [kept] and dropped == [spent]


def test_stop_fails_what_is_still_queued_instead_of_leaving_it_hanging():
    async def scenario():
        model = Doubler()
        batcher = make_batcher(model)
        batcher.start()
        model.gate.clear()
        running = batcher.submit(rows(1))
        await asyncio.to_thread(model.entered.wait, 30)
        queued = batcher.submit(rows(2))
        stopping = asyncio.create_task(batcher.stop())
        await wait_for(queued.done)
        model.gate.set()
        await stopping
        with pytest.raises(ShuttingDown):
            batcher.submit(rows(3))
        return queued, running

    queued, running = asyncio.run(scenario())
    assert isinstance(queued.exception(), ShuttingDown)
    assert running.done()


def test_a_free_instance_waits_for_requests_still_being_received_only_while_another_batch_computes():
    async def scenario():
        started: list[list[float]] = []
        release = threading.Event()

        def run(x: np.ndarray, attention: bool) -> np.ndarray:
            started.append(x[:, 0].tolist())
            if x[0, 0] == 2:  # the batch that keeps the other instance busy
                release.wait(timeout=30)
            return x * 2

        intake = Intake()
        batcher = make_batcher(run, intake=intake, max_queue_delay_s=30.0, instances=2)
        batcher.start()
        with intake.receiving():  # idle: a request being received is not waited for
            alone = await batcher.submit(rows(1))
        held = batcher.submit(rows(2))
        await wait_for(lambda: len(started) == 2)
        with intake.receiving():  # request B is being received while A is queued and an instance is free
            a = batcher.submit(rows(3))
            await asyncio.sleep(0.05)
            assert len(started) == 2  # A waits for B: the CPU is busy anyway, B is on its way, the batch has room
            b = batcher.submit(rows(4))
        await asyncio.gather(a, b)  # then the free instance takes its share of the two: A, then B
        release.set()
        await held
        await batcher.stop()
        return started, alone

    started, alone = asyncio.run(asyncio.wait_for(scenario(), timeout=20))
    assert started == [[1.0], [2.0], [3.0], [4.0]]
    assert np.array_equal(alone, rows(2))


def test_a_batch_takes_at_most_its_share_of_the_queue_per_instance():
    async def scenario():
        sizes: list[int] = []
        release = threading.Event()

        def run(x: np.ndarray, attention: bool) -> np.ndarray:
            sizes.append(len(x))
            if x[0, 0] == 0:
                release.wait(timeout=30)
            return x * 2

        batcher = make_batcher(run, instances=2, max_batch_size=8)
        batcher.start()
        held = [batcher.submit(rows(0)), batcher.submit(rows(0))]  # both instances busy
        await wait_for(lambda: len(sizes) == 2)
        queued = [batcher.submit(rows(v)) for v in range(1, 7)]  # 6 requests queue up
        release.set()
        results = await asyncio.gather(*held, *queued)
        await batcher.stop()
        return sizes, results

    sizes, results = asyncio.run(asyncio.wait_for(scenario(), timeout=20))
    assert sizes[:2] == [1, 1] and sorted(sizes[2:]) == [
        1,
        2,
        3,
    ]  # 6 queued, 2 instances: 3, then 2 of the 3 left, then 1
    assert [r.tolist() for r in results[2:]] == [[[2.0 * v]] for v in range(1, 7)]


def test_one_request_at_a_time_keeps_to_the_instance_idle_most_recently():
    async def scenario():
        threads: list[int] = []

        def run(x: np.ndarray, attention: bool) -> np.ndarray:
            threads.append(threading.get_ident())
            return x * 2

        batcher = make_batcher(run, instances=3)
        batcher.start()
        for v in range(20):
            assert np.array_equal(await batcher.submit(rows(v)), rows(2 * v))
        await batcher.stop()
        return threads

    threads = asyncio.run(asyncio.wait_for(scenario(), timeout=20))
    assert len(threads) == 20 and len(set(threads[1:])) == 1  # its caches are warm; the others stay asleep
