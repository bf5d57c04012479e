"""Identical misses decoded once per process (after Go's ``singleflight``): with the response cache on, a text that
concurrent requests miss at the same time is decoded by the first of them (it *leads*); the others *follow*,
waiting for its answer instead of decoding it again. A follower whose leader failed, or was cancelled, decodes
the text itself; one whose deadline passes or whose client leaves stops waiting, as it would stop decoding.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable

from service.errors import DeadlineExceeded


class Flights:
    def __init__(self) -> None:
        self._running: dict[str, asyncio.Future] = {}  # key -> its answer (encoded), None if its leader failed

    def split(self, keys: Iterable[str]) -> tuple[list[str], dict[str, asyncio.Future]]:
        """(the keys this request leads: nobody decodes them yet, the futures of those others decode)."""
        lead, follow = [], {}
        for key in keys:
            running = self._running.get(key)
            if running is None:
                self._running[key] = asyncio.get_running_loop().create_future()
                lead.append(key)
            else:
                follow[key] = running
        return lead, follow

    def land(self, lead: list[str], made: dict[str, bytes]) -> None:
        """The leader is done: its followers get what it made (None for what it did not: they decode it)."""
        for key in lead:
            running = self._running.pop(key, None)
            if running is not None and not running.done():
                running.set_result(made.get(key))


async def follow(wait, futures: dict[str, asyncio.Future], deadline: float) -> dict[str, bytes | None]:
    """The answers the leaders made, awaited with ``wait`` (the caller's: it watches the client) until
    ``deadline`` (``time.monotonic()``), which fails the request 504 as a decode past it would."""
    if not futures:
        return {}
    waiting = asyncio.gather(*(asyncio.shield(f) for f in futures.values()))
    timer = asyncio.get_running_loop().call_later(max(0.0, deadline - time.monotonic()), waiting.cancel)
    try:
        answers = await wait(waiting, lambda: None)
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if time.monotonic() >= deadline and (task is None or not task.cancelling()):
            raise DeadlineExceeded(
                "the request's deadline passed while an identical text was being translated"
            ) from None
        raise
    finally:
        timer.cancel()
    return dict(zip(futures, answers))
