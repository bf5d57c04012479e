"""Image classification as an operation: images and options in, top-k labels (and attention) out.

What ``POST /classify`` (``service/http/routes/classify.py``) and the Open Inference Protocol's
``infer`` on a classifier (``service/oip/operations.py``, over REST and gRPC) do once they have read
their request: decode the images, queue them on the model's batcher, which normalises them as they
are queued, runs onnxruntime on an instance thread and ranks each batch on the event loop; if the
client goes away or the request's deadline passes meanwhile, the request is dropped before compute.
With attention, each image's maps are summarised and stored under an id its caller's key owns.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import numpy as np

from service.attention.capture import store_records, vit_record, vit_summary
from service.classifier import Classifier
from service.core.caller import Caller, KeyedStore
from service.core.serving import Serving
from service.errors import InvalidField, ServiceError
from service.images import ImageDecoder
from service.schemas import ClassifyOptions
from service.settings import Settings


@dataclass(frozen=True)
class Queued:
    """A request's images on their model's batcher: ``future`` is its ranking."""

    classifier: Classifier
    rows: np.ndarray  # the decoded pixels, as queued
    future: asyncio.Future


async def queue(serving: Serving, images: list[bytes], options: ClassifyOptions, deadline: float) -> Queued:
    """Find the model the options name, check them against it, decode ``images`` and queue them by
    ``deadline``. Called inside ``registry.intake.receiving()``: batch-mates being decoded are worth waiting for."""
    served = serving.registry.get(options.model)
    classifier, batcher = served.classifier, served.batcher
    if classifier is None or batcher is None:  # READY models always have both
        raise RuntimeError(f"model {served.key} is ready without a session")
    check_options(options, classifier, serving.settings)
    rows = await decode_images(images, classifier, serving.decoder)
    return Queued(classifier, rows, batcher.submit(rows, attention=options.return_attention, deadline=deadline))


async def answer(serving: Serving, caller: Caller, queued: Queued, options: ClassifyOptions) -> dict:
    """The answer to a queued request once ranked: top-k labels per image, in request order, and with
    ``return_attention`` each image's attention summary and id."""
    classifier = queued.classifier
    ranked = await caller.wait(queued.future, queued.future.cancel)
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
