"""Streamed translations: server-sent events in, typed events out.

``EventDecoder`` turns lines into events without doing any I/O; ``TranslationStream`` and
``AsyncTranslationStream`` only feed it lines from the connection, and close the connection when
the stream ends, fails, or the caller leaves early.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING

import httpx

from attnserve_client import errors
from attnserve_client.types import DoneEvent, StreamEvent, TokenEvent, TranslateResponse

_UNFINISHED = "\ufffd"  # what decoding shows for a character whose bytes are split over two tokens

if TYPE_CHECKING:
    from typing_extensions import Self


class EventDecoder:
    """Server-sent events (``event:``/``data:`` lines, a blank line ends one) as typed stream events."""

    def __init__(self, request_id: str | None) -> None:
        self.request_id = request_id
        self.result: TranslateResponse | None = None
        self._event: str | None = None
        self._data: list[str] = []
        self._shown = ""  # text already handed out as deltas

    def feed(self, line: str) -> StreamEvent | None:
        """The event this line completes, if any; raises the service's error for an ``error`` event."""
        if not line:
            return self._dispatch()
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
        return None  # comments (":...") and the fields this API does not use (id, retry)

    def finish(self) -> StreamEvent | None:
        """The connection ended: the event its last lines make, if any; a stream without ``done`` failed."""
        event = self._dispatch()  # a last event may lack its closing blank line
        if self.result is None:
            raise errors.APIConnectionError("the stream ended before its done event", request_id=self.request_id)
        return event

    def _dispatch(self) -> StreamEvent | None:
        event, data = self._event, "\n".join(self._data)
        self._event, self._data = None, []
        if not data:
            return None
        payload = json.loads(data)
        if event == "token":
            return TokenEvent(type="token", **payload, delta=self._delta(payload["text"]))
        if event == "done":
            self.result = TranslateResponse.model_validate(payload)
            return DoneEvent(type="done", response=self.result)
        if event == "error":
            raise errors.from_body(payload, status=None, request_id=self.request_id)
        return None  # an event type this client does not know yet

    def _delta(self, text: str) -> str:
        """What ``text`` adds to what was shown, holding back a character still split over tokens."""
        stable = text.rstrip(_UNFINISHED)
        if not stable.startswith(self._shown):  # decoding revised earlier text: go on from where they agree
            self._shown = os.path.commonprefix([stable, self._shown])
        delta, self._shown = stable[len(self._shown) :], stable
        return delta


class _StreamBase:
    def __init__(self, response: httpx.Response) -> None:
        self.response = response
        self._decoder = EventDecoder(response.headers.get("x-request-id"))

    @property
    def result(self) -> TranslateResponse | None:
        """The final answer, once the ``done`` event has arrived."""
        return self._decoder.result

    @property
    def request_id(self) -> str | None:
        return self._decoder.request_id

    def _transport_error(self, exc: httpx.TransportError) -> errors.APIConnectionError:
        return errors.from_transport(exc, self.request_id)


class TranslationStream(_StreamBase):
    """Iterate for ``TokenEvent``s then one ``DoneEvent``; the connection closes at the end or on ``close()``."""

    def __iter__(self) -> Iterator[StreamEvent]:
        try:
            for line in self.response.iter_lines():
                if (event := self._decoder.feed(line)) is not None:
                    yield event
            if (event := self._decoder.finish()) is not None:
                yield event
        except httpx.TransportError as exc:
            raise self._transport_error(exc) from exc
        finally:
            self.close()

    def close(self) -> None:
        self.response.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class AsyncTranslationStream(_StreamBase):
    """``async for`` over ``TokenEvent``s then one ``DoneEvent``; closes at the end or on ``close()``."""

    async def __aiter__(self) -> AsyncIterator[StreamEvent]:
        try:
            async for line in self.response.aiter_lines():
                if (event := self._decoder.feed(line)) is not None:
                    yield event
            if (event := self._decoder.finish()) is not None:
                yield event
        except httpx.TransportError as exc:
            raise self._transport_error(exc) from exc
        finally:
            await self.close()

    async def close(self) -> None:
        await self.response.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()
