"""``POST /translate``: English text in, German out, decoded by the model's continuous-batching scheduler.

The handler validates and tokenises on the event loop (cheap), queues one decoding request per text
and waits; if the client disconnects meanwhile its requests are cancelled and leave the running
batch at the next step. With ``stream: true`` the answer is ``text/event-stream``: a ``token``
event per generated token (greedy decoding; beam search only knows its best hypothesis at the
end), then one ``done`` event with the same result a non-streamed request gets, or an ``error``
event if decoding fails after the stream began.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive

from service.deps import ServingDep
from service.errors import InvalidField, ServiceError, UnsupportedMediaType, error_body
from service.routes.common import JSON_TYPE, ClientClosedRequest, parse_json_body
from service.scheduler import Ticket
from service.schemas import ERROR_RESPONSES, TranslateRequest, TranslateResponse
from service.settings import Settings
from service.translator import TASK, Limits, Translator

router = APIRouter(tags=["translation"])


@router.post("/translate", response_model=TranslateResponse, responses=ERROR_RESPONSES, summary="Translate English to German")
async def translate(request: Request, serving: ServingDep) -> Response:
    """One result per text, in request order; `stream: true` answers server-sent events instead."""
    settings = serving.settings
    body = await _read_body(request, settings)
    served = serving.registry.get(body.model, TASK)
    translator, scheduler = served.translator, served.scheduler
    if translator is None or scheduler is None:  # READY translation models always have both
        raise RuntimeError(f"model {served.key} is ready without a scheduler")
    requests = translator.requests(
        body.all_texts, beam_size=body.beam_size, length_penalty=body.length_penalty,
        num_return_sequences=body.num_return_sequences, max_new_tokens=body.max_new_tokens,
        limits=Limits(settings.max_text_chars, settings.max_source_tokens, settings.max_new_tokens),
    )  # fmt: skip
    nbest = body.num_return_sequences > 1
    if body.stream:
        (ticket,) = scheduler.submit(requests, stream=True)
        return StreamingResponse(_events(ticket, translator, nbest), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})  # fmt: skip
    tickets = scheduler.submit(requests)
    await _results_or_disconnect(tickets, request.receive)
    return Response(json.dumps(_answer(translator, tickets, nbest), ensure_ascii=False).encode(), media_type=JSON_TYPE)


async def _read_body(request: Request, settings: Settings) -> TranslateRequest:
    media_type = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media_type != JSON_TYPE:
        raise UnsupportedMediaType(f"content type {media_type or 'none'!r} is not accepted; send {JSON_TYPE}")
    body = parse_json_body(await request.body(), TranslateRequest)
    texts = body.all_texts
    if len(texts) > settings.max_texts_per_request:
        raise InvalidField(f"{len(texts)} texts in one request; at most {settings.max_texts_per_request}")
    if body.beam_size > settings.max_beam_size:
        raise InvalidField(f"beam_size: must be at most {settings.max_beam_size}")
    if body.return_attention:
        raise InvalidField("return_attention is not available yet")
    if body.stream and len(texts) != 1:
        raise InvalidField("stream: true takes exactly one text")
    return body


def _answer(translator: Translator, tickets: list[Ticket], nbest: bool) -> dict:
    return {"model": translator.name, "version": translator.version,
            "results": [translator.result(t.request, nbest) for t in tickets]}  # fmt: skip


async def _results_or_disconnect(tickets: list[Ticket], receive: Receive) -> None:
    """Wait for every text's result; a client that disconnects first cancels them all."""
    gathered = asyncio.gather(*(t.future for t in tickets))
    watcher = asyncio.ensure_future(_disconnected(receive))
    try:
        done, _ = await asyncio.wait({gathered, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if gathered in done:
            gathered.result()  # raises the first failure, if any
            return
        raise ClientClosedRequest("client disconnected before its answer was ready")
    finally:
        watcher.cancel()
        if not gathered.done():
            for t in tickets:
                t.cancel()
            gathered.cancel()


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


def _sse(event: str, data: dict) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n".encode()


async def _events(ticket: Ticket, translator: Translator, nbest: bool) -> AsyncIterator[bytes]:
    """Token events as the scheduler produces them, then the final result; cancels on disconnect."""
    tok = translator.tokenizer
    try:
        while True:
            item = await ticket.events.get()
            if item is None:
                break
            if isinstance(item, Exception):
                error = item if isinstance(item, ServiceError) else None
                yield b"event: error\ndata: " + error_body(error.code if error else "internal_error",
                                                           error.message if error else "decoding failed") + b"\n\n"  # fmt: skip
                return
            yield _sse("token", {"index": len(item) - 1, "token": tok.pieces(item[-1:])[0], "text": tok.decode(item)})
        yield _sse("done", _answer(translator, [ticket], nbest))
    finally:  # the client went away (the generator was closed) or the stream ended: either way, stop decoding
        ticket.cancel()
