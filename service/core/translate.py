"""Translation as an operation: texts and options in, translations (and attention) out.

What ``POST /translate`` (``service/http/routes/translate.py``, which also streams) and the Open
Inference Protocol's ``infer`` on a translator (``service/oip/operations.py``, over REST and gRPC) do
once they have read their request: cut each text into sentences, queue one decoding request per
sentence on the model's continuous-batching scheduler, and wait; if the client goes away or the
request's deadline passes meanwhile, its requests leave the running batch at the next step. With
attention, each text's maps are computed once it is decoded, summarised and stored under an id its
caller's key owns. With the response cache on (``service/core/response_cache.py``), the texts it
holds are answered from it and only the others decoded, then kept there.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from service.attention.capture import join_translation_maps, store_records, translation_record, translation_summary
from service.core.caller import Caller, KeyedStore
from service.core.response_cache import (
    CacheReport,
    ModelIdentity,
    TranslationOptions,
    decode_translation,
    encode_translation,
)
from service.core.serving import Serving
from service.core.single_flight import follow
from service.engine.lanes import Ticket
from service.engine.scheduler import Scheduler
from service.errors import InferenceFailed, InvalidField, ServiceError
from service.logs import current_request_id
from service.registry import ServedModel
from service.schemas import TranslateRequest
from service.settings import Settings
from service.translator import Job, Limits, Translator

log = logging.getLogger("attnserve.translate")


def decode_plan(
    served: ServedModel, settings: Settings, body: TranslateRequest
) -> tuple[Translator, Scheduler, TranslationOptions, Limits]:
    """The model's translator and scheduler, the options as resolved (the response cache's key) and the limits, every
    option and text length checked: what can be refused before a text is tokenised."""
    translator, scheduler = served.translator, served.scheduler
    if translator is None or scheduler is None:  # READY translation models always have both
        raise RuntimeError(f"model {served.key} is ready without a scheduler")
    if body.return_attention and not translator.has_attention:
        raise InvalidField(f"model {translator.name} ships no decoder_prefix graph; omit return_attention")
    options = resolved_options(translator, settings, body)
    limits = Limits(
        settings.max_text_chars,
        settings.max_source_tokens,
        settings.max_new_tokens,
        settings.max_beam_size,
        settings.max_html_chars,
    )
    html = body.format == "html"
    translator.check(body.all_texts, limits, options.beam_size, options.num_return_sequences, body.max_new_tokens, html)
    return translator, scheduler, options, limits


def decode_jobs(
    body: TranslateRequest, plan: tuple[Translator, Scheduler, TranslationOptions, Limits]
) -> tuple[Translator, Scheduler, list[Job], TranslationOptions]:
    """One job per text of ``body`` (a decoding request per sentence, tokenised), as ``decode_plan`` planned it."""
    translator, scheduler, options, limits = plan
    jobs = translator.jobs(
        body.all_texts,
        protect=body.protect_placeholders,
        html=body.format == "html",
        beam_size=options.beam_size,
        length_penalty=options.length_penalty,
        num_return_sequences=options.num_return_sequences,
        max_new_tokens=options.max_new_tokens,
        limits=limits,
        checked=True,
    )
    return translator, scheduler, jobs, options


def resolved_options(translator: Translator, settings: Settings, body: TranslateRequest) -> TranslationOptions:
    """The request's decoding options with their defaults applied: every one that changes an answer."""
    default_beam = 1 if body.stream else translator.default_beam  # a stream's tokens come from greedy decoding
    return TranslationOptions(
        protect_placeholders=body.protect_placeholders and translator.sentinels is not None,
        format=body.format,
        beam_size=default_beam if body.beam_size is None else body.beam_size,
        length_penalty=float(
            translator.default_length_penalty if body.length_penalty is None else body.length_penalty
        ),  # 1 and 1.0 are one option: one key
        num_return_sequences=body.num_return_sequences,
        max_new_tokens=body.max_new_tokens,
        max_new_tokens_cap=settings.max_new_tokens,
    )


async def translate_texts(
    caller: Caller,
    serving: Serving,
    served: ServedModel,
    body: TranslateRequest,
    deadline: float,
    report: CacheReport | None = None,
) -> dict:
    """Decode every text of ``body`` on ``served``'s scheduler by ``deadline``: the answer of a non-streamed
    request. With the response cache on, the texts it holds are answered from it and only the others
    decoded (``report`` says how many came from it)."""
    plan = decode_plan(served, serving.settings, body)  # an invalid request is refused before it is charged
    # charged before its texts are tokenised (a request over its quota costs the event loop next to nothing); a
    # hit costs what a miss does: the quota is the caller's
    await caller.charge(characters=characters(body))
    translator, scheduler, jobs, options = decode_jobs(body, plan)
    cache = serving.responses
    if cache is None or body.return_attention:  # attention ids are the caller's: never from the cache
        if report is not None and cache is not None:
            report.bypassed()
        return await _decode(caller, serving, translator, scheduler, jobs, body, deadline)
    texts = body.all_texts
    keys = cache.keys("translate", ModelIdentity.of(served), options, caller.key_id)
    names = [keys.text(t) for t in texts]
    found = await cache.get_many("translate", names, decode_translation, deadline)
    if report is not None:
        report.looked_up(found, len(texts))
    cached = found if found is not None else [None] * len(texts)
    todo: dict[str, int] = {}  # key -> the first text with it not cached: a text asked for twice is decoded once
    for i, (name, entry) in enumerate(zip(names, cached)):
        if entry is None:
            todo.setdefault(name, i)
    made: dict[str, dict] = {}
    lead, following = cache.flights.split(todo)  # a text another request decodes now is not decoded twice
    encoded: dict[str, bytes] = {}
    try:
        if lead:
            fresh = await _decode(caller, serving, translator, scheduler, [jobs[todo[n]] for n in lead], body, deadline)
            made = dict(zip(lead, fresh["results"]))
            encoded = {name: encode_translation(r) for name, r in made.items()}
    finally:
        cache.flights.land(lead, encoded)
    followed = await follow(caller.wait, following, deadline)
    made |= {name: decode_translation(blob) for name, blob in followed.items() if blob is not None}
    if orphans := [name for name, blob in followed.items() if blob is None]:  # their leader failed
        fresh = await _decode(caller, serving, translator, scheduler, [jobs[todo[n]] for n in orphans], body, deadline)
        made |= dict(zip(orphans, fresh["results"]))
        encoded |= {name: encode_translation(made[name]) for name in orphans}
    if encoded and found is not None:  # Redis answered the lookup: keep what was decoded for the next request
        await cache.put_many("translate", encoded, deadline)
    results = [entry if entry is not None else made[name] for name, entry in zip(names, cached)]
    return {"model": translator.name, "version": translator.version, "results": results}


async def stream_text(
    caller: Caller, serving: Serving, served: ServedModel, body: TranslateRequest, deadline: float
) -> tuple[Translator, Job, list[Ticket]]:
    """The one text of a streamed request queued for greedy decoding: its translator, job and tickets, whose
    events carry each token as it is decoded."""
    plan = decode_plan(served, serving.settings, body)
    await caller.charge(characters=characters(body))
    translator, scheduler, (job,), _ = decode_jobs(body, plan)
    tickets = scheduler.submit(job.requests, stream=True, deadline=deadline, priority=caller.priority(body.priority))
    return translator, job, tickets


def characters(body: TranslateRequest) -> int:
    """The work a translation request is charged: the characters of its texts."""
    return sum(len(t) for t in body.all_texts)


async def _decode(
    caller: Caller,
    serving: Serving,
    translator: Translator,
    scheduler: Scheduler,
    jobs: list[Job],
    body: TranslateRequest,
    deadline: float,
) -> dict:
    requests = [r for job in jobs for r in job.requests]
    tickets = scheduler.submit(requests, deadline=deadline, priority=caller.priority(body.priority))

    def abandon() -> None:
        for t in tickets:
            t.cancel()

    await caller.wait(asyncio.gather(*(t.future for t in tickets)), abandon)
    store = caller.store(serving.attention) if body.return_attention else None
    failed = serving.metrics.failed_batches.labels(translator.name, translator.version).inc
    return await answer(translator, jobs, body.num_return_sequences > 1, store, failed)


async def answer(
    translator: Translator,
    jobs: list[Job],
    nbest: bool,
    store: KeyedStore | None,
    failed: Callable[[], Any] | None = None,
) -> dict:
    """The answer of decoded jobs: markup and spans put back, attention attached; ``failed`` counts a failed run."""
    if wanted := translator.to_place(jobs, nbest):  # markup and left-out spans, by alignment
        await _off_the_loop(translator, failed, translator.place, wanted)
    results = [translator.result(job, nbest) for job in jobs]
    if store is not None:
        await _attach_attention(results, jobs, translator, store, failed)
    return {"model": translator.name, "version": translator.version, "results": results}


async def _off_the_loop(
    translator: Translator, failed: Callable[[], Any] | None, graphs: Callable[..., Any], *args: Any
) -> Any:
    """``graphs(*args)`` (the attention graphs' runs) in a thread; a failure there fails this request alone, with a
    500 that names it, as a failed decoder step does."""
    try:
        return await asyncio.to_thread(graphs, *args)
    except ServiceError:
        raise
    except Exception as e:  # onnxruntime raises its own types
        if failed is not None:
            failed()
        rid = current_request_id()
        log.error(
            "attention graphs failed in model %s/%s; failing its request (%s)",
            translator.name,
            translator.version,
            rid,
            exc_info=e,
        )
        raise InferenceFailed(
            f"inference failed in model {translator.name}/{translator.version} for request {rid}; see the server log"
        ) from e


async def _attach_attention(
    results: list[dict],
    jobs: list[Job],
    translator: Translator,
    store: KeyedStore,
    failed: Callable[[], Any] | None = None,
) -> None:
    """The returned hypotheses' attention, computed now (off the event loop) unless ``Translator.place`` did,
    summarised and stored: one record per text, its sentences' maps as the blocks of one map."""
    requests = [r for job in jobs if job.maps is None for r in job.requests]  # `place` ran the others' already
    best = [r.results()[0] for r in requests]
    sources = [r.source for r in requests]
    maps = iter(await _off_the_loop(translator, failed, translator.attention, sources, best) if best else [])
    records, answered = [], []
    for result, job in zip(results, jobs):
        if not job.plan.sentences:  # an HTML document with nothing to translate: nothing attended to
            result["attention_id"] = None
            continue
        parts, generated, fed = [], [], []
        own = job.maps or [next(maps) for _ in job.plan.sentences]
        for sentence, request, m in zip(job.plan.sentences, job.requests, own):
            parts.append(m)
            made, given = translator.target_pieces(request.results()[0], sentence)
            generated += made
            fed += given
        m = join_translation_maps(parts)
        source = result["source_tokens"]
        result["attention"] = translation_summary(m["cross_attention"], source, generated)
        records.append(
            translation_record(translator.name, translator.version, m, source, generated, fed, result["translation"])
        )
        answered.append(result)
    await store_records(store, records, answered)
