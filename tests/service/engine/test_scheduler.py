"""The continuous-batching scheduler on the numpy bigram "translator" of test_decoding (no onnxruntime)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from contract.decoding import DecodeRequest
from service.engine.scheduler import Scheduler
from service.errors import DeadlineExceeded, InferenceFailed, InvalidField, Overloaded, TextTooLong
from tests.contract.test_decoding import EOS, LONG, SPEC, TRAP, A, B, bigram_graphs


class BigramTranslator:
    """What the scheduler uses of a ``Translator`` (encoder, decoder, spec), over bigram tables."""

    spec = SPEC

    def __init__(self, fail_after: int | None = None) -> None:
        self._encoder, self._decoder, self.rows_seen = bigram_graphs({A: TRAP, B: LONG})
        self.fail_after = fail_after
        self.refused_source: int | None = None  # the encoder fails on batches holding a source starting so

    def encoder(self, feeds):
        if self.refused_source is not None and (feeds["src_ids"][:, 0] == self.refused_source).any():
            raise RuntimeError("encoder exploded")
        return self._encoder(feeds)

    def decoder(self, feeds):
        if self.fail_after is not None and len(self.rows_seen) >= self.fail_after:
            raise RuntimeError("onnxruntime exploded")
        return self._decoder(feeds)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, timeout=10))


async def with_scheduler(body, translator=None, **limits):
    sched = Scheduler(
        "t", translator or BigramTranslator(), **{"max_running_rows": 8, "max_waiting_rows": 16, **limits}
    )
    sched.start()
    try:
        return await body(sched)
    finally:
        await sched.stop()


def test_greedy_stream_gets_each_token_then_the_end():
    async def body(sched):
        (ticket,) = sched.submit([DecodeRequest([A, EOS], 10)], stream=True)
        events = [await ticket.events.get(), await ticket.events.get()]
        return events, await ticket.future

    events, req = run(with_scheduler(body))
    assert events == [[A], None]  # eos ends the stream; the runner-up beam is never streamed
    assert req.results()[0].tokens == [A] and req.results()[0].finished


def test_late_requests_join_the_running_batch_and_short_ones_leave_early():
    async def body(sched):
        long = sched.submit([DecodeRequest([B, EOS], 200)], stream=True)[0]
        await long.events.get()  # the long one is running
        short = sched.submit([DecodeRequest([A, EOS], 10, beam=2)])[0]
        done = await asyncio.wait_for(short.future, 5)
        still_running = sched.state()["running_sequences"]
        await long.future
        return done, still_running, long.request

    short, still_running, long = run(with_scheduler(body))
    assert short.results()[0].tokens == [B] and still_running == 1
    assert long.results()[0].tokens == [A] * 200


def test_admission_limits():
    async def body(sched):
        with pytest.raises(InvalidField):
            sched.submit([DecodeRequest([A, EOS], 5, beam=9)])
        sched.submit([DecodeRequest([B, EOS], 40, beam=8)] * 1)
        sched.submit([DecodeRequest([B, EOS], 40, beam=8)])
        with pytest.raises(Overloaded) as full:
            sched.submit([DecodeRequest([B, EOS], 40, beam=8), DecodeRequest([A, EOS], 4, beam=8)])
        assert full.value.headers["Retry-After"] == "1"
        return sched.state()

    state = run(with_scheduler(body, max_running_rows=8, max_waiting_rows=16))
    assert state["waiting_rows"] <= 16


def test_a_failing_step_fails_the_running_requests_and_the_scheduler_goes_on():
    translator = BigramTranslator(fail_after=2)

    async def body(sched):
        (ticket,) = sched.submit([DecodeRequest([B, EOS], 30)])
        with pytest.raises(InferenceFailed):
            await ticket.future
        translator.fail_after = None
        (again,) = sched.submit([DecodeRequest([A, EOS], 10)])
        return (await again.future).results()[0].tokens

    assert run(with_scheduler(body, translator)) == [A]


def test_a_failing_encoder_fails_only_the_joining_requests_and_the_running_ones_go_on():
    translator = BigramTranslator()
    translator.refused_source = A

    async def body(sched):
        running = sched.submit([DecodeRequest([B, EOS], 60)], stream=True)[0]
        await running.events.get()  # decoding, with a cache, when the next one joins
        (joining,) = sched.submit([DecodeRequest([A, EOS], 10)])
        with pytest.raises(InferenceFailed):
            await joining.future
        finished = await running.future
        return finished, sched.state()

    finished, state = run(with_scheduler(body, translator))
    assert finished.results()[0].tokens == [A] * 60
    assert state["running_rows"] == 0 and state["running_sequences"] == 0


def test_cancelled_requests_leave_and_free_their_rows():
    async def body(sched):
        (ticket,) = sched.submit([DecodeRequest([B, EOS], 40)], stream=True)
        await ticket.events.get()
        ticket.cancel()
        await ticket.future
        return sched.state()

    state = run(with_scheduler(body))
    assert state["running_rows"] == 0 and state["running_sequences"] == 0


class StepCounter:
    def __init__(self) -> None:
        self.steps: list[tuple[int, int]] = []

    def step(self, rows: int, seconds: float, tokens: int) -> None:
        self.steps.append((rows, tokens))

    def __getattr__(self, name):  # the other observer calls are not under test here
        return lambda *args, **kwargs: None


def test_steps_run_back_to_back_on_the_worker_yet_metrics_see_every_step(monkeypatch):
    from service.engine import scheduler as module

    counter, hops = StepCounter(), []

    async def body(sched):
        real = sched._steps
        sched._steps = lambda lane, batch, *rest: hops.append(1) or real(lane, batch, *rest)
        (ticket,) = sched.submit([DecodeRequest([B, EOS], 40)])  # B -> LONG: 40 tokens, no early end
        return await ticket.future

    monkeypatch.setattr(module, "MAX_HOP_SECONDS", 60.0)  # only the step budget and events end a hop
    req = run(with_scheduler(body, observer=counter))
    assert len(req.results()[0].tokens) == 40
    assert counter.steps == [(1, 1)] * 40  # every step observed, one row, one token each
    # the encoder and the first 16 steps in one hop, then 16-step hops until it finishes: ceil(40 / 16) = 3, not 40
    assert len(hops) == -(-40 // module.MAX_STEPS_PER_HOP)


class SlowTranslator(BigramTranslator):
    """Decoder steps that take ``seconds`` each, counting the rows of every step."""

    def __init__(self, seconds: float = 0.005) -> None:
        super().__init__()
        self.seconds, self.step_rows = seconds, []

    def decoder(self, feeds):
        time.sleep(self.seconds)
        self.step_rows.append(len(feeds["tokens"]))
        return super().decoder(feeds)


def test_a_finished_request_is_answered_while_the_batch_decodes_on_and_joiners_wait_join_every_steps(monkeypatch):
    from service.engine import scheduler as module

    translator, hops = SlowTranslator(), []

    async def body(sched):
        real = sched._steps
        sched._steps = lambda lane, batch, *rest: hops.append(1) or real(lane, batch, *rest)
        short, long = sched.submit([DecodeRequest([A, EOS], 10), DecodeRequest([B, EOS], 40)])  # 2 and 40 steps
        await short.future
        answered = len(hops), long.future.done(), len(translator.step_rows)
        late = sched.submit([DecodeRequest([A, EOS], 10)])[0]  # 2 steps once it joins
        await late.future
        await long.future
        return answered, len(hops)

    monkeypatch.setattr(module, "MAX_HOP_SECONDS", 60.0)
    (hops_then, long_done, steps_then), hops_total = run(with_scheduler(body, translator))
    assert hops_then == 1 and not long_done  # answered from inside the first hop, which went on
    assert translator.step_rows[:2] == [2, 2] and translator.step_rows[2] == 1
    # the late request (submitted after step `steps_then`) joined once the hop had run JOIN_EVERY steps
    joined = translator.step_rows.index(2, 2)
    assert module.JOIN_EVERY <= joined <= max(module.JOIN_EVERY, steps_then + 2)
    assert translator.step_rows.count(2) == 4 and len(translator.step_rows) == 40
    assert hops_total <= 4


class GatedTranslator(BigramTranslator):
    """Records each encoded batch's first source tokens; its decoder steps wait while the gate is shut."""

    def __init__(self) -> None:
        super().__init__()
        self.gate, self.entered = threading.Event(), threading.Event()
        self.gate.set()
        self.encoded: list[int] = []

    def encoder(self, feeds):
        self.encoded += feeds["src_ids"][:, 0].tolist()
        return super().encoder(feeds)

    def decoder(self, feeds):
        self.entered.set()
        self.gate.wait(timeout=10)
        return super().decoder(feeds)


def soon(seconds: float = 0.05) -> float:
    return time.monotonic() + seconds


def test_a_running_beam_past_its_deadline_is_answered_at_once_and_leaves_with_all_its_rows_at_the_next_step():
    translator, counter = GatedTranslator(), StepCounter()

    async def body(sched):
        translator.gate.clear()
        (beam,) = sched.submit([DecodeRequest([B, EOS], 40, beam=4)], deadline=soon())
        (other,) = sched.submit([DecodeRequest([B, EOS], 30)])
        await asyncio.to_thread(translator.entered.wait, 10)  # both run, held in their first step
        with pytest.raises(DeadlineExceeded):
            await beam.future  # answered while the step is still held
        held = sched.state()
        translator.gate.set()
        return held, await other.future, sched.state()

    held, other, after = run(with_scheduler(body, translator, observer=counter))
    assert held["running_rows"] == 5  # the step in flight is the beam's last
    assert [rows for rows, _ in counter.steps] == [5] + [1] * 29  # then only the other sentence's row
    assert len(other.results()[0].tokens) == 30
    assert after["running_rows"] == 0 and after["running_sequences"] == 0


def test_a_waiting_request_past_its_deadline_leaves_the_queue_at_once_and_is_never_encoded():
    translator = GatedTranslator()

    async def body(sched):
        translator.gate.clear()
        (running,) = sched.submit([DecodeRequest([B, EOS], 10, beam=4)])  # takes every row
        await asyncio.to_thread(translator.entered.wait, 10)
        (late,) = sched.submit([DecodeRequest([A, EOS], 10)], deadline=soon())
        with pytest.raises(DeadlineExceeded):
            await late.future
        waiting = sched.state()["waiting_rows"]
        translator.gate.set()
        await running.future
        return waiting

    assert run(with_scheduler(body, translator, max_running_rows=4)) == 0
    assert translator.encoded == [B]  # the late request's source never reached the encoder


def test_a_stream_past_its_deadline_gets_the_error_as_its_last_event():
    translator = GatedTranslator()

    async def body(sched):
        translator.gate.clear()
        (ticket,) = sched.submit([DecodeRequest([B, EOS], 40)], stream=True, deadline=soon())
        event = await ticket.events.get()
        translator.gate.set()
        await wait_until_idle(sched)
        return event

    assert isinstance(run(with_scheduler(body, translator)), DeadlineExceeded)


def test_a_spent_deadline_never_takes_a_row():
    async def body(sched):
        with pytest.raises(DeadlineExceeded):
            sched.submit([DecodeRequest([A, EOS], 10)], deadline=time.monotonic() - 0.001)
        return sched.state()

    state = run(with_scheduler(body))
    assert state["waiting_rows"] == 0 and state["running_rows"] == 0


async def wait_until_idle(sched) -> None:
    while not sched.idle:
        await asyncio.sleep(0.01)


class ThreadRecordingTranslator(BigramTranslator):
    """Remembers which threads ran the decoder, and how many ran it at once at most."""

    def __init__(self) -> None:
        super().__init__()
        self.threads: set[str] = set()
        self._inside, self.most_at_once = 0, 0
        self._lock = threading.Lock()

    def decoder(self, feeds):
        with self._lock:
            self.threads.add(threading.current_thread().name)
            self._inside += 1
            self.most_at_once = max(self.most_at_once, self._inside)
        time.sleep(0.002)  # a step takes time, as a real one does (and releases the GIL, as onnxruntime does)
        try:
            return super().decoder(feeds)
        finally:
            with self._lock:
                self._inside -= 1


@pytest.mark.parametrize("lanes", [1, 2, 3])
def test_lanes_share_the_work_decode_at_once_and_give_what_one_lane_gives(lanes):
    """Each submission goes to the lane with the fewest rows; the lanes' threads step their batches at the
    same time; every request gets the tokens and scores it gets from a single lane."""
    requests = [(B, 30, 1), (A, 10, 2), (B, 25, 1), (A, 12, 1), (B, 40, 3), (A, 8, 1)]

    async def body(sched):
        tickets = [sched.submit([DecodeRequest([src, EOS], n, beam=beam)])[0] for src, n, beam in requests]
        done = await asyncio.gather(*(t.future for t in tickets))
        return [[(h.tokens, h.score) for h in r.results()] for r in done], sched.idle, sched.state()

    translator = ThreadRecordingTranslator()
    got, idle, state = run(with_scheduler(body, translator, lanes=lanes))
    alone, *_ = run(with_scheduler(body, BigramTranslator(), lanes=1))
    assert got == alone and idle and state["lanes"] == lanes and state["running_rows"] == 0
    # every lane decoded some of the requests (each on its thread), and two of them at least at the same time
    assert len(translator.threads) == lanes and all(t.startswith("ort-t") for t in translator.threads)
    assert translator.most_at_once >= min(lanes, 2)


def test_a_request_that_could_never_fit_the_queue_is_refused_as_too_large():
    async def body(sched):
        with pytest.raises(TextTooLong, match="need 20 decoder rows"):
            sched.submit([DecodeRequest([A, EOS], 5, beam=4)] * 5)
        return sched.state()

    assert run(with_scheduler(body, max_running_rows=8, max_waiting_rows=16))["waiting_rows"] == 0


def test_a_submissions_sentences_go_to_one_lane_and_a_lane_that_runs_dry_takes_waiting_work():
    """One row per lane: a long request holds lane 0, a shorter one lane 1, a submission of two sentences
    waits for lane 0 (both lanes as loaded, the first wins); lane 1, done with its own, takes it whole, so
    it finishes long before lane 0 is free."""

    async def body(sched):
        first = sched.lanes[0]
        long = sched.submit([DecodeRequest([B, EOS], 300)])[0]
        short = sched.submit([DecodeRequest([B, EOS], 30)])[0]
        group = sched.submit([DecodeRequest([A, EOS], 10), DecodeRequest([B, EOS], 20)])
        queued = [t in first.waiting for t in group]
        await asyncio.gather(short.future, *(t.future for t in group))
        return queued, long.future.done()

    queued, long_done = run(with_scheduler(body, ThreadRecordingTranslator(), lanes=2, max_running_rows=1))
    assert queued == [True, True] and not long_done


class FinishOrder:
    """An observer that keeps the priority of each sentence as it finishes."""

    def __init__(self) -> None:
        self.priorities: list[str] = []

    def finished(self, tokens, seconds, queue_wait, first_token, priority="interactive") -> None:
        self.priorities.append(priority)

    def __getattr__(self, name):
        return lambda *args, **kwargs: None


@pytest.mark.parametrize("batch_max_wait_s, expected", [(10.0, ["c", "d", "a", "b"]), (0.0, ["a", "b", "c", "d"])])
def test_interactive_work_joins_first_and_batch_work_waits_no_longer_than_its_limit(batch_max_wait_s, expected):
    """One row: a long request runs while two batch submissions and then two interactive ones wait. The
    interactive ones are decoded first; with no wait allowed, the batch ones keep their turn."""
    observer = FinishOrder()

    async def body(sched):
        first = sched.submit([DecodeRequest([B, EOS], 60)])[0]
        queued = {
            name: sched.submit([DecodeRequest([A, EOS], 10)], priority=priority)[0]
            for name, priority in (("a", "batch"), ("b", "batch"), ("c", "interactive"), ("d", "interactive"))
        }
        order: list[str] = []
        for name, ticket in queued.items():
            ticket.future.add_done_callback(lambda _, name=name: order.append(name))
        await asyncio.gather(first.future, *(t.future for t in queued.values()))
        return order, sched.state()

    order, state = run(
        with_scheduler(
            body,
            ThreadRecordingTranslator(),
            max_running_rows=1,
            batch_max_wait_s=batch_max_wait_s,
            observer=observer,
        )
    )
    assert order == expected and state["waiting_rows"] == 0 and state["running_rows"] == 0
    assert sorted(observer.priorities) == ["batch", "batch", "interactive", "interactive", "interactive"]


@pytest.mark.parametrize("batch_max_wait_s, aside", [(10.0, True), (0.0, False)])
def test_batch_rows_step_aside_while_interactive_work_runs_and_decode_the_same(batch_max_wait_s, aside):
    """A batch request of two sentences is decoding when an interactive one arrives: its rows are set aside, so
    that the interactive sentence's steps run its one row alone (never three), then join back and finish
    with the tokens they get alone. A batch ticket already queued ``batch_max_wait_s`` is never set aside."""
    translator = ThreadRecordingTranslator()

    async def body(sched):
        bulk = sched.submit([DecodeRequest([B, EOS], 120), DecodeRequest([B, EOS], 110)], priority="batch")
        while not translator.rows_seen:
            await asyncio.sleep(0.001)
        seen = len(translator.rows_seen)
        quick = sched.submit([DecodeRequest([A, EOS], 10)])[0]
        await quick.future
        during = translator.rows_seen[seen:]
        still = not any(t.future.done() for t in bulk)
        await asyncio.gather(*(t.future for t in bulk))
        return during, still, [t.request for t in bulk], sched.state()

    during, still, bulk, state = run(with_scheduler(body, translator, batch_max_wait_s=batch_max_wait_s))
    assert still  # the batch requests were running all along
    assert (3 in during) is not aside and (1 in during) is aside, during
    for req in bulk:
        alone = run(with_scheduler(lambda s, r=req: s.submit([DecodeRequest(r.source, r.max_new_tokens)])[0].future))
        assert req.results()[0].tokens == alone.results()[0].tokens and len(alone.results()[0].tokens) > 20
    assert state["running_rows"] == 0 and state["waiting_rows"] == 0


class EncoderRecordingTranslator(ThreadRecordingTranslator):
    """Also remembers how many sentences each encoder run took."""

    def __init__(self) -> None:
        super().__init__()
        self.encoded: list[int] = []

    def encoder(self, feeds):
        self.encoded.append(len(feeds["src_ids"]))
        return super().encoder(feeds)


@pytest.mark.parametrize("batch_max_wait_s, joins", [(10.0, False), (0.0, True)])
def test_batch_work_waits_while_interactive_work_runs_unless_it_waited_its_limit(batch_max_wait_s, joins):
    """An interactive request is decoding when batch work arrives: the batch work does not join its steps (an
    interactive sentence steps alone) until it is done; batch work queued its limit joins at once."""
    translator = ThreadRecordingTranslator()

    async def body(sched):
        quick = sched.submit([DecodeRequest([B, EOS], 60)])[0]
        while not translator.rows_seen:
            await asyncio.sleep(0.001)
        bulk = sched.submit([DecodeRequest([A, EOS], 10)], priority="batch")[0]
        await quick.future
        during = list(translator.rows_seen)
        await bulk.future
        return during

    during = run(with_scheduler(body, translator, batch_max_wait_s=batch_max_wait_s))
    assert (max(during) == 2) is joins, during


def test_a_hop_encodes_a_bounded_share_of_batch_work_and_interactive_work_whole(monkeypatch):
    """Batch sentences join a few source tokens at a time (an interactive arrival waits for no long encoder run);
    interactive sentences join together, whatever their length."""
    monkeypatch.setattr("service.engine.scheduler.BATCH_JOIN_TOKENS", 4)  # two sources of two tokens
    translator = EncoderRecordingTranslator()

    async def body(sched):
        bulk = sched.submit([DecodeRequest([A, EOS], 5) for _ in range(6)], priority="batch")
        await asyncio.gather(*(t.future for t in bulk))
        batch_runs = list(translator.encoded)
        quick = sched.submit([DecodeRequest([A, EOS], 5) for _ in range(6)])
        await asyncio.gather(*(t.future for t in quick))
        return batch_runs, translator.encoded[len(batch_runs) :]

    batch_runs, interactive_runs = run(with_scheduler(body, translator))
    assert max(batch_runs) == 2 and sum(batch_runs) == 6 and interactive_runs == [6]


def test_interactive_and_batch_work_go_to_lanes_apart_and_held_batch_work_is_taken_by_a_lane_with_room():
    """Two lanes: batch work goes to the lane without interactive work, interactive work to the lane with no batch
    rows to set aside; batch work queued behind interactive work (all lanes were busy with it) is taken by a lane
    that has rows free."""
    translator = ThreadRecordingTranslator()

    async def body(sched):
        first = sched.submit([DecodeRequest([B, EOS], 80)])[0]
        while not translator.rows_seen:
            await asyncio.sleep(0.001)
        lane_of = {i: lane for lane in sched.lanes for i in lane.running}
        interactive_lane = lane_of[first.request.id]
        bulk = sched.submit([DecodeRequest([B, EOS], 60)], priority="batch")[0]
        await asyncio.sleep(0.02)
        bulk_lane = next(lane for lane in sched.lanes if bulk.request.id in lane.running)
        second = sched.submit([DecodeRequest([A, EOS], 10)])[0]
        second_lane = next(lane for lane in sched.lanes if second in lane.waiting or second.request.id in lane.running)
        # batch work queued on the interactive lane, as when every lane holds interactive work: the other lane takes it
        held = sched.submit([DecodeRequest([A, EOS], 10)], priority="batch")[0]
        for lane in sched.lanes:
            if held in lane.waiting and lane is not interactive_lane:
                lane.dequeue(held)
                interactive_lane.enqueue([held])
        await held.future
        taken_before_first_ended = not first.future.done()  # the interactive lane would admit it only after
        await asyncio.gather(first.future, bulk.future, second.future)
        return interactive_lane, bulk_lane, second_lane, taken_before_first_ended

    interactive_lane, bulk_lane, second_lane, taken = run(with_scheduler(body, translator, lanes=2, max_running_rows=4))
    assert bulk_lane is not interactive_lane and second_lane is interactive_lane and taken


@pytest.mark.parametrize("hold_s", [0.0, 0.4])
def test_a_lane_keeps_batch_work_away_for_a_moment_after_interactive_work(monkeypatch, hold_s):
    """Batch work that arrives just after an interactive request finished starts once the lane has had no
    interactive work for ``INTERACTIVE_HOLD_S`` (an interactive client's next request is a round trip away)."""
    monkeypatch.setattr("service.engine.lanes.INTERACTIVE_HOLD_S", hold_s)

    async def body(sched):
        await sched.submit([DecodeRequest([A, EOS], 10)])[0].future
        started = time.perf_counter()
        await sched.submit([DecodeRequest([A, EOS], 10)], priority="batch")[0].future
        return time.perf_counter() - started

    took = run(with_scheduler(body, ThreadRecordingTranslator()))
    assert (took >= 0.4) is (hold_s > 0), took


@pytest.mark.parametrize("bulk_yield", [0.0, 1.0])
def test_a_lane_of_batch_work_rests_after_each_step_while_another_steps_interactive_work(monkeypatch, bulk_yield):
    """Two lanes: the bulk one rests (sleeps its step's time times ``BULK_YIELD``) after each step taken while the
    other lane steps an interactive request, and only then."""
    monkeypatch.setattr("service.engine.scheduler.BULK_YIELD", bulk_yield)
    rests: list[tuple[str, bool]] = []
    real_sleep = time.sleep

    def sleep(seconds):
        rests.append((threading.current_thread().name, sched_ref[0].lanes[0].stepping_interactive))
        real_sleep(seconds)

    monkeypatch.setattr("service.engine.scheduler.rest", sleep)
    sched_ref: list = []
    translator = ThreadRecordingTranslator()

    async def body(sched):
        sched_ref.append(sched)
        quick = sched.submit([DecodeRequest([B, EOS], 60)])[0]  # lane 0
        while not translator.rows_seen:
            await asyncio.sleep(0.001)
        bulk = sched.submit([DecodeRequest([B, EOS], 120)], priority="batch")[0]  # lane 1, without interactive work
        await quick.future
        during = len(rests)
        await bulk.future
        return during, len(rests)

    during, total = run(with_scheduler(body, translator, lanes=2))
    assert (during > 0) is (bulk_yield > 0) and total == during  # none once the interactive request was done
    assert all(interactive and name.startswith("ort-t-1") for name, interactive in rests)
