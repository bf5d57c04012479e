"""``POST /translate``: English text in, German out, decoded by the model's continuous-batching scheduler.

The handler reads and checks the body; the translation itself is ``service/core/translate.py``'s,
which the Open Inference Protocol's ``infer`` runs too: tokenised on the event loop (cheap), one
decoding request per sentence queued, and if the client disconnects or the request's deadline passes
meanwhile, its requests leave the running batch at the next step. With ``stream: true`` the answer
is ``text/event-stream``: a ``token`` event per generated token (greedy decoding; beam search only
knows its best hypothesis at the end), then one ``done`` event with the same result a non-streamed
request gets, or an ``error`` event if decoding fails or the deadline passes after the stream began.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Scope

from contract.translation_text import labels, render
from service.core.caller import KeyedStore
from service.core.response_cache import CacheReport
from service.core.serving import Serving
from service.core.translate import Ticket, answer, stream_text, translate_texts
from service.errors import DeadlineExceeded, InvalidField, ServiceError, UnsupportedMediaType
from service.http.common import JSON_TYPE, attention_store, http_caller, parse_json_body
from service.http.deadlines import count_exceeded, request_deadline
from service.http.errors import error_body
from service.http.openapi import CACHE_HEADERS, REF
from service.http.router import Route
from service.schemas import TranslateRequest, TranslateResponse
from service.settings import Settings
from service.translator import TASK, Job, Translator


async def translate(request: Request, serving: Serving) -> Response:
    """One result per text, in request order; `stream: true` answers server-sent events instead."""
    deadline = request_deadline(request, serving.settings)
    body = await _read_body(request, serving.settings)
    served = serving.registry.get(body.model, TASK)
    report = CacheReport()
    if body.stream:  # tokens as they are decoded: never from the cache
        if serving.responses is not None:
            report.bypassed()
        translator, job, tickets = await stream_text(http_caller(request), serving, served, body, deadline)
        store = attention_store(request, serving.attention) if body.return_attention else None
        return StreamingResponse(
            _events(job, tickets, translator, body.num_return_sequences > 1, store, request.scope),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **report.headers()},
        )
    result = await translate_texts(http_caller(request), serving, served, body, deadline, report)
    return Response(json.dumps(result, ensure_ascii=False).encode(), media_type=JSON_TYPE, headers=report.headers())


async def _read_body(request: Request, settings: Settings) -> TranslateRequest:
    media_type = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media_type != JSON_TYPE:
        raise UnsupportedMediaType(f"content type {media_type or 'none'!r} is not accepted; send {JSON_TYPE}")
    body = parse_json_body(await request.body(), TranslateRequest)
    texts = body.all_texts
    if len(texts) > settings.max_texts_per_request:
        raise InvalidField(f"{len(texts)} texts in one request; at most {settings.max_texts_per_request}")
    if body.stream and len(texts) != 1:
        raise InvalidField("stream: true takes exactly one text")
    return body


def _sse(event: str, data: dict) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n".encode()


async def _events(
    job: Job, tickets: list[Ticket], translator: Translator, nbest: bool, store: KeyedStore | None, scope: Scope
) -> AsyncIterator[bytes]:
    """Token events as the scheduler produces them, sentence after sentence, then the final result; cancels on
    disconnect. A token event's ``text`` is the translation so far, its protected spans in place."""
    tok = translator.tokenizer
    offset = 0  # tokens of the sentences streamed before
    try:
        for n, ticket in enumerate(tickets):
            sentence, before = job.plan.sentences[n], translator.streamed_before(job, n)
            while True:
                item = await ticket.events.get()
                if item is None:
                    break
                if isinstance(item, Exception):
                    if isinstance(item, DeadlineExceeded):
                        count_exceeded(scope)
                    error = item if isinstance(item, ServiceError) else None
                    yield (
                        b"event: error\ndata: "
                        + error_body(
                            error.code if error else "internal_error", error.message if error else "decoding failed"
                        )
                        + b"\n\n"
                    )
                    return
                piece = labels(tok, item[-1:], sentence)[0]
                text = before + render(tok, item, sentence).text
                yield _sse("token", {"index": offset + len(item) - 1, "token": piece, "text": text})
            offset += ticket.streamed
        yield _sse("done", await answer(translator, [job], nbest, store))
    finally:  # the client went away (the generator was closed) or the stream ended: either way, stop decoding
        for ticket in tickets:
            ticket.cancel()


def _event(name: str, data: dict, description: str) -> dict:
    return {
        "description": description,
        "properties": {"event": {"const": name}, "data": {"contentMediaType": JSON_TYPE, "contentSchema": data}},
    }


_EVENT = {  # the schema of each event (OpenAPI 3.1: `schema` of an event stream describes one event)
    "description": "With `stream: true`: a `token` event per generated token, then `done` or `error`.",
    "type": "object",
    "required": ["event", "data"],
    "properties": {"event": {"enum": ["token", "done", "error"]}, "data": {"type": "string"}},
    "oneOf": [
        _event(
            "token",
            {
                "type": "object",
                "required": ["index", "token", "text"],
                "properties": {"index": {"type": "integer"}, "token": {"type": "string"}, "text": {"type": "string"}},
            },
            "One generated token (a subword piece) and the translation so far.",
        ),
        _event("done", {"$ref": REF.format(model="TranslateResponse")}, "The answer a non-streamed request gets."),
        _event("error", {"$ref": REF.format(model="ErrorResponse")}, "Decoding failed or the deadline passed."),
    ],
}

ROUTES = [
    Route(
        "POST",
        "/translate",
        translate,
        summary="Translate English to German",
        tags=("translation",),
        body=TranslateRequest,
        response={
            JSON_TYPE: {"schema": TranslateResponse},
            "text/event-stream": {"schema": _EVENT},
        },
        deadline=True,
        headers=CACHE_HEADERS,
        errors={
            400: "Invalid JSON, or an invalid `X-Request-Timeout`.",
            404: "Unknown model, or not a translation model.",
            413: "Body or text too long (characters or tokens).",
            415: "Content type is not JSON.",
            422: "Invalid field (neither or both of `text` and `texts`, a blank text, beam_size above the limit, "
            "num_return_sequences above beam_size, too many texts, `stream` with several texts, ...).",
            500: "Decoding failed; the request id identifies it in the logs.",
            503: "Queue full, too many requests in flight, or model not ready; see `Retry-After`.",
            504: "The request's deadline passed before its answer was ready (a stream ends with an `error` event).",
        },
    )
]
