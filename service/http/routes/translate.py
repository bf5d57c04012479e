"""``POST /translate``: English text in, German out, decoded by the model's continuous-batching scheduler.

The handler validates and tokenises on the event loop (cheap), queues one decoding request per text
and waits; if the client disconnects or the request's deadline passes meanwhile, its requests leave
the running batch at the next step. With ``stream: true`` the answer is ``text/event-stream``: a
``token`` event per generated token (greedy decoding; beam search only knows its best hypothesis at
the end), then one ``done`` event with the same result a non-streamed request gets, or an ``error``
event if decoding fails or the deadline passes after the stream began.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Scope

from contract.translation_text import labels, render
from service.attention.capture import join_translation_maps, store_records, translation_record, translation_summary
from service.engine.scheduler import Scheduler, Ticket
from service.errors import DeadlineExceeded, InvalidField, ServiceError, UnsupportedMediaType, error_body
from service.http.common import JSON_TYPE, Caller, KeyedStore, attention_store, http_caller, parse_json_body
from service.http.deadlines import count_exceeded, request_deadline
from service.http.openapi import REF
from service.http.router import Route
from service.http.serving import Serving
from service.registry import ServedModel
from service.schemas import TranslateRequest, TranslateResponse
from service.settings import Settings
from service.translator import TASK, Job, Limits, Translator


async def translate(request: Request, serving: Serving) -> Response:
    """One result per text, in request order; `stream: true` answers server-sent events instead."""
    deadline = request_deadline(request, serving.settings)
    body = await _read_body(request, serving.settings)
    served = serving.registry.get(body.model, TASK)
    if body.stream:
        translator, scheduler, (job,) = decode_jobs(served, serving.settings, body)
        tickets = scheduler.submit(job.requests, stream=True, deadline=deadline)
        store = attention_store(request, serving.attention) if body.return_attention else None
        return StreamingResponse(
            _events(job, tickets, translator, body.num_return_sequences > 1, store, request.scope),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
    result = await translate_texts(http_caller(request), serving, served, body, deadline)
    return Response(json.dumps(result, ensure_ascii=False).encode(), media_type=JSON_TYPE)


def decode_jobs(
    served: ServedModel, settings: Settings, body: TranslateRequest
) -> tuple[Translator, Scheduler, list[Job]]:
    """The model's translator and scheduler, and one job per text (a decoding request per sentence), every
    option checked."""
    translator, scheduler = served.translator, served.scheduler
    if translator is None or scheduler is None:  # READY translation models always have both
        raise RuntimeError(f"model {served.key} is ready without a scheduler")
    if body.return_attention and not translator.has_attention:
        raise InvalidField(f"model {translator.name} ships no decoder_prefix graph; omit return_attention")
    default_beam = 1 if body.stream else translator.default_beam  # a stream's tokens come from greedy decoding
    jobs = translator.jobs(
        body.all_texts,
        protect=body.protect_placeholders,
        beam_size=default_beam if body.beam_size is None else body.beam_size,
        length_penalty=translator.default_length_penalty if body.length_penalty is None else body.length_penalty,
        num_return_sequences=body.num_return_sequences,
        max_new_tokens=body.max_new_tokens,
        limits=Limits(
            settings.max_text_chars, settings.max_source_tokens, settings.max_new_tokens, settings.max_beam_size
        ),
    )
    return translator, scheduler, jobs


async def translate_texts(
    caller: Caller, serving: Serving, served: ServedModel, body: TranslateRequest, deadline: float
) -> dict:
    """Decode every text of ``body`` on ``served``'s scheduler by ``deadline``: the answer of a non-streamed request."""
    translator, scheduler, jobs = decode_jobs(served, serving.settings, body)
    tickets = scheduler.submit([r for job in jobs for r in job.requests], deadline=deadline)

    def abandon() -> None:
        for t in tickets:
            t.cancel()

    await caller.wait(asyncio.gather(*(t.future for t in tickets)), abandon)
    store = caller.store(serving.attention) if body.return_attention else None
    return await answer(translator, jobs, body.num_return_sequences > 1, store)


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


async def answer(translator: Translator, jobs: list[Job], nbest: bool, store: KeyedStore | None) -> dict:
    results = [translator.result(job, nbest) for job in jobs]
    if store is not None:
        await _attach_attention(results, jobs, translator, store)
    return {"model": translator.name, "version": translator.version, "results": results}


async def _attach_attention(results: list[dict], jobs: list[Job], translator: Translator, store: KeyedStore) -> None:
    """The returned hypotheses' attention, computed now (off the event loop), summarised and stored: one record
    per text, its sentences' maps as the blocks of one map (``join_translation_maps``)."""
    requests = [r for job in jobs for r in job.requests]
    best = [r.results()[0] for r in requests]
    maps = iter(await asyncio.to_thread(translator.attention, [r.source for r in requests], best))
    hypotheses = iter(best)
    records = []
    for result, job in zip(results, jobs):
        parts, generated, fed = [], [], []
        for sentence in job.plan.sentences:
            parts.append(next(maps))
            made, given = translator.target_pieces(next(hypotheses), sentence)
            generated += made
            fed += given
        m = join_translation_maps(parts)
        source = result["source_tokens"]
        result["attention"] = translation_summary(m["cross_attention"], source, generated)
        records.append(
            translation_record(translator.name, translator.version, m, source, generated, fed, result["translation"])
        )
    await store_records(store, records, results)


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
