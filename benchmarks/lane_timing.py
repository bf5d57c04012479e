"""``python -m benchmarks.lane_timing``: the service as ``python -m service`` runs it, its decoding lanes timed.

For :mod:`benchmarks.bench_lanes`. Before the service starts, the names the scheduler and the
translator call are wrapped: ``step`` (one decoder step with the search and the cache bookkeeping around
it: its wall time and its thread's CPU time), ``session_fn`` (each graph run: the decoder step's with
its rows, the encoder's with its source tokens), and the translate operation's ``decode_plan`` and ``decode_jobs``
(validating, splitting, masking and tokenising the texts) and ``answer`` (rendering the translations). The sums, since the start, go as JSON to the file named
by ``ATTNSERVE_LANE_TIMING`` every ``WRITE_EVERY_S``; a reader takes two of them around a load. The wrapping
holds in the one process the service runs in by default (``ATTNSERVE_WORKERS=1``), not in workers it would spawn.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import Counter
from pathlib import Path

from contract import decoding
from service import translator
from service.__main__ import main
from service.core import translate
from service.engine import scheduler

WRITE_EVERY_S = 0.2
# The sums written: per step, per decoder run, per encoder run.
FIGURES = (
    "steps",
    "step_s",
    "step_cpu_s",
    "decoder_runs",
    "decoder_s",
    "decoder_rows",
    "encoder_runs",
    "encoder_s",
    "encoder_tokens",
    "jobs_s",
    "answer_s",
)
_sums: Counter = Counter()
_lock = threading.Lock()


def _add(**figures: float) -> None:
    with _lock:
        _sums.update(figures)


def _timed_session_fn(session, outputs=None):
    run = decoding.session_fn(session, outputs)

    def timed(feeds):
        started = time.perf_counter()
        out = run(feeds)
        seconds = time.perf_counter() - started
        if "tokens" in feeds:
            _add(decoder_runs=1, decoder_s=seconds, decoder_rows=len(feeds["tokens"]))
        elif "src_ids" in feeds:
            _add(encoder_runs=1, encoder_s=seconds, encoder_tokens=int(feeds["src_mask"].sum()))
        return out

    return timed


def _timed_step(batch, decoder, spec):
    cpu, wall = time.thread_time(), time.perf_counter()
    out = decoding.step(batch, decoder, spec)
    _add(steps=1, step_s=time.perf_counter() - wall, step_cpu_s=time.thread_time() - cpu)
    return out


def _timed(function):
    """``function`` with its time added to ``jobs_s`` (checking and tokenising a request's texts)."""

    def timed(*args, **kwargs):
        started = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            _add(jobs_s=time.perf_counter() - started)

    return timed


async def _timed_answer(*args, **kwargs):
    started = time.perf_counter()
    try:
        return await _answer(*args, **kwargs)
    finally:
        _add(answer_s=time.perf_counter() - started)


_answer = translate.answer


def _write(path: Path) -> None:
    while True:
        with _lock:
            text = json.dumps(dict(_sums))
        path.with_suffix(".tmp").write_text(text)
        path.with_suffix(".tmp").replace(path)
        time.sleep(WRITE_EVERY_S)


def read(path: Path) -> Counter:
    """The sums the service last wrote (zero before its first write)."""
    return Counter(json.loads(path.read_text())) if path.exists() else Counter()


if __name__ == "__main__":
    scheduler.step = _timed_step
    translator.session_fn = _timed_session_fn
    translate.decode_plan, translate.decode_jobs = _timed(translate.decode_plan), _timed(translate.decode_jobs)
    translate.answer = _timed_answer
    threading.Thread(target=_write, args=(Path(os.environ["ATTNSERVE_LANE_TIMING"]),), daemon=True).start()
    raise SystemExit(main())
