"""Image classification as an operation: images and options in, top-k labels (and attention) out.

What ``POST /classify`` (``service/http/routes/classify.py``) and the Open Inference Protocol's
``infer`` on a classifier (``service/oip/operations.py``, over REST and gRPC) do once they have read
their request: decode the images, queue them on the model's batcher, which normalises them as they
are queued, runs onnxruntime on an instance thread and ranks each batch on the event loop; if the
client goes away or the request's deadline passes meanwhile, the request is dropped before compute.
With attention, each image's maps are summarised and stored under an id its caller's key owns. With
the response cache on (``service/core/response_cache.py``), the images whose probabilities it holds
are not queued: only the others are computed, and kept there.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import numpy as np

from service.attention.capture import store_records, vit_record, vit_summary
from service.classifier import Classifier, Ranked
from service.core.caller import Caller, KeyedStore
from service.core.response_cache import (
    CacheReport,
    ImageOptions,
    ModelIdentity,
    ResponseCache,
    encode_probabilities,
    probabilities_decoder,
)
from service.core.serving import Serving
from service.errors import InvalidField, ServiceError
from service.images import ImageDecoder
from service.registry import ServedModel
from service.schemas import ClassifyOptions
from service.settings import Settings


@dataclass(frozen=True)
class Queued:
    """A request's images on their model's batcher: ``future`` is the ranking of those the response cache
    did not hold (None: it held them all)."""

    classifier: Classifier
    rows: np.ndarray  # the decoded pixels, as queued
    future: asyncio.Future | None
    cached: list[np.ndarray | None] | None = None  # with the cache: each image's probabilities, if it held them
    keys: list[str] | None = None  # with the cache: each image's key
    missing: list[int] | None = None  # with the cache: the images it did not hold, those ``future`` ranks
    cache: ResponseCache | None = None  # where the computed ones go (None: nowhere)
    deadline: float | None = None  # the request's: a store keeps it waiting no later


async def queue(
    serving: Serving,
    caller: Caller,
    images: list[bytes],
    options: ClassifyOptions,
    deadline: float,
    report: CacheReport | None = None,
) -> Queued:
    """Find the model the options name, check them against it, decode ``images`` and queue them by
    ``deadline``. Called inside ``registry.intake.receiving()``: batch-mates being decoded are worth waiting for."""
    served = serving.registry.get(options.model)
    classifier = served.classifier
    if classifier is None or served.batcher is None:  # READY models always have both
        raise RuntimeError(f"model {served.key} is ready without a session")
    check_options(options, classifier, serving.settings)
    rows = await decode_images(images, classifier, serving.decoder)
    return await submit(
        serving,
        caller,
        served,
        rows,
        attention=options.return_attention,
        deadline=deadline,
        report=report,
        priority=options.priority,
    )


async def submit(
    serving: Serving,
    caller: Caller,
    served: ServedModel,
    rows: np.ndarray,
    *,
    attention: bool,
    deadline: float,
    prepared: bool = False,
    report: CacheReport | None = None,
    priority: str = "interactive",
) -> Queued:
    """Queue ``rows`` (decoded pixels, or with ``prepared`` the model's input already) on ``served``'s batcher,
    but those whose probabilities the response cache holds: the key of an image is its pixels as decoded,
    so that the same picture in another file format is the same entry, and a hit is refused exactly what
    a miss would be (the image is decoded and checked either way)."""
    classifier, batcher, cache = served.classifier, served.batcher, serving.responses
    assert classifier is not None and batcher is not None  # checked by the callers
    await caller.charge(images=len(rows))  # a hit costs what a miss does: the quota is the caller's
    priority = caller.priority(priority)
    if cache is None or attention:  # attention ids are the caller's: never from the cache
        if report is not None and cache is not None:
            report.bypassed()
        future = batcher.submit(rows, attention=attention, prepared=prepared, deadline=deadline, priority=priority)
        return Queued(classifier, rows, future)
    options = ImageOptions(shared_weights=serving.settings.share_classifier_weights)
    keys = cache.keys("classify", ModelIdentity.of(served), options, caller.key_id).pixels(rows, prepared)
    found = await cache.get_many("classify", keys, probabilities_decoder(len(classifier.labels)), deadline)
    if report is not None:
        report.looked_up(found, len(keys))
    cached = found if found is not None else [None] * len(keys)
    missing = [i for i, c in enumerate(cached) if c is None]
    future = None
    if missing:
        todo = rows if len(missing) == len(rows) else rows[missing]
        future = batcher.submit(todo, attention=False, prepared=prepared, deadline=deadline, priority=priority)
    return Queued(classifier, rows, future, cached, keys, missing, cache if found is not None else None, deadline)


async def ranking(caller: Caller, queued: Queued) -> Ranked:
    """The ranking of every image of a queued request: computed, or the cache's (then the computed ones are
    kept in it), ranked exactly as a computed batch is."""
    computed: Ranked | None = None
    if queued.future is not None:
        future = queued.future
        computed = await caller.wait(future, future.cancel)
    if queued.keys is None or queued.cached is None or queued.missing is None:
        assert computed is not None
        return computed
    keys, cached, missing = queued.keys, queued.cached, queued.missing
    if computed is not None and queued.cache is not None:
        entries = {keys[i]: encode_probabilities(p) for i, p in zip(missing, computed.probabilities)}
        await queued.cache.put_many("classify", entries, queued.deadline)
    if computed is not None and len(missing) == len(cached):
        return computed
    probabilities = np.empty((len(cached), len(queued.classifier.labels)), np.float64)
    for i, p in enumerate(cached):
        if p is not None:
            probabilities[i] = p
    if computed is not None:
        probabilities[missing] = computed.probabilities
    return Ranked(probabilities, np.argsort(-probabilities, axis=1, kind="stable"))


async def answer(serving: Serving, caller: Caller, queued: Queued, options: ClassifyOptions) -> dict:
    """The answer to a queued request once ranked: top-k labels per image, in request order, and with
    ``return_attention`` each image's attention summary and id."""
    classifier = queued.classifier
    ranked = await ranking(caller, queued)
    results = [{"top_k": top} for top in classifier.top_k(ranked, options.top_k)]
    if options.return_attention:  # the batch computed attention, since this request asked for it
        store = caller.store(serving.attention)
        await attach_attention(results, ranked.attention, queued.rows, classifier, options, store)
    return {"model": classifier.name, "version": classifier.version, "results": results}


def check_options(options: ClassifyOptions, classifier: Classifier, settings: Settings) -> None:
    if options.return_attention and classifier.attention is None:
        raise InvalidField(f"model {classifier.name} exports no attention output; omit return_attention")
    limit = min(settings.max_top_k, len(classifier.labels))
    if options.top_k > limit:
        raise InvalidField(
            f"top_k: must be at most {limit} (model {classifier.name} has {len(classifier.labels)} labels, "
            f"the service allows {settings.max_top_k})"
        )


async def decode_images(images: list[bytes], classifier: Classifier, decoder: ImageDecoder) -> np.ndarray:
    prep = classifier.preprocessing
    pixels = []
    for i, data in enumerate(images):
        try:
            pixels.append(await decoder.decode(data, prep.image_size, prep.color_mode, prep.resize, prep.resize_size))
        except ServiceError as e:
            if len(images) > 1:
                e.message = f"images[{i}]: {e.message}"
            raise
    return prep.stack(pixels)


async def attach_attention(
    results: list[dict],
    maps: np.ndarray | None,
    rows: np.ndarray,
    classifier: Classifier,
    options: ClassifyOptions,
    store: KeyedStore,
) -> None:
    spec = classifier.attention
    assert spec is not None and maps is not None  # check_options refused the request otherwise
    records = []
    for result, attention, pixels in zip(results, maps, rows):
        result["attention"] = vit_summary(spec, attention, options.rollout_fusion)
        records.append(vit_record(classifier.name, classifier.version, spec, attention, pixels, result["top_k"][0]))
    await store_records(store, records, results)
