"""The Open Inference Protocol's operations on the running service, whatever the transport that asks.

What ``GET /v2/models/{name}``, ``POST .../infer`` (``service/http/routes/oip.py``) and their gRPC
twins (``service/grpc/``) do once their wire format is read: find the model version, describe it,
and run an inference request on the model's own batcher or scheduler, with the native routes'
requests, so that every transport is batched together and has the same limits and errors: the
classification and translation themselves are ``service/core/classify.py``'s and ``translate.py``'s.

- Image classifier: one input, ``images`` (BYTES [N]: encoded image files; base64 text when they
  came as JSON) or ``pixels`` (FP32 [N, C, H, W], preprocessed as the model was trained); output
  ``probabilities`` (FP64 [N, classes]), or with the classification extension (``classification: k``
  on the output) the k best as ``"score:index:label"`` (BYTES [N, k]).
- Translator: input ``text`` (BYTES [N]); output ``translation`` (BYTES [N], or [N, k] with
  ``num_return_sequences`` k > 1); request parameters ``beam_size``, ``length_penalty``,
  ``num_return_sequences``, ``max_new_tokens``, ``protect_placeholders``, ``format``, ``priority`` as on ``POST /translate``.
- ``return_attention: true`` (request parameter) adds ``attention_id`` (BYTES [N]): ids that
  ``GET /attention/{id}`` serves, owned by the caller's key.
"""

from __future__ import annotations

import base64
import binascii

import numpy as np

from service import __version__
from service.classifier import TASK as IMAGE_CLASSIFICATION
from service.core.caller import Caller
from service.core.classify import attach_attention, decode_images, ranking, submit
from service.core.serving import Serving
from service.core.translate import translate_texts
from service.errors import InvalidBase64, InvalidField, ModelNotFound
from service.oip.model_config import PLATFORM, model_config, tensors
from service.oip.tensors import InferRequest, Output, Tensor
from service.registry import ServedModel
from service.schemas import ClassifyOptions, TranslateRequest, validated
from service.statistics import model_statistics
from service.translator import TASK as TRANSLATION

EXTENSIONS = ("binary_tensor_data", "classification", "model_configuration", "statistics")
DECODING_PARAMETERS = (
    "beam_size",
    "length_penalty",
    "num_return_sequences",
    "max_new_tokens",
    "return_attention",
    "protect_placeholders",
    "format",
    "priority",
)


def server_metadata() -> dict:
    return {"name": "attnserve", "version": __version__, "extensions": list(EXTENSIONS)}


def served_model(serving: Serving, name: str, version: str | None = None, ready: bool = True) -> ServedModel:
    """The model version named (or the one answering unpinned requests); 404 if it is not loaded, and
    with ``ready`` 503 if it is not ready."""
    versions = serving.registry.versions.get(name)
    if versions is None or (version is not None and version not in versions):
        what = f"model {name!r}" + (f" version {version!r}" if version is not None else "")
        loaded = ", ".join(m.key for m in serving.registry.all())
        raise ModelNotFound(f"{what} is not loaded (loaded: {loaded})")
    if not ready:
        return versions[version] if version is not None else serving.registry.models[name]
    task = next(iter(versions.values())).task or IMAGE_CLASSIFICATION
    return serving.registry.get(name, task, version)


def model_metadata(serving: Serving, model: ServedModel) -> dict:
    """The model's inputs and outputs: name, datatype and shape (-1: any size)."""
    inputs, outputs = tensors(model)
    versions = list(serving.registry.versions[model.name])
    return {"name": model.name, "versions": versions, "platform": PLATFORM, "inputs": inputs, "outputs": outputs}


def model_configuration(serving: Serving, model: ServedModel) -> dict:
    """Triton's model configuration (``model_config.proto`` in its JSON form): tensors, batching, instances."""
    return model_config(model, serving.registry.policies[model.name], serving.settings)


def statistics(serving: Serving, name: str | None = None, version: str | None = None) -> list[dict]:
    """Triton's ``model_stats`` of every loaded version (no name), of the model's versions, or of one version."""
    if name is None:
        models = serving.registry.all()
    elif version is not None:
        models = [served_model(serving, name, version, ready=False)]
    else:
        served_model(serving, name, ready=False)  # 404 when unknown
        models = list(serving.registry.versions[name].values())
    return model_statistics(serving.metrics, [(m.name, m.version, m.task) for m in models])


async def infer(
    serving: Serving, caller: Caller, model: ServedModel, req: InferRequest, deadline: float
) -> list[Output]:
    """Run ``model`` on the request's inputs by ``deadline`` (``time.monotonic()``): its outputs, as asked."""
    if model.task == TRANSLATION:
        return await _translate(serving, caller, model, req, deadline)
    return await _classify(serving, caller, model, req, deadline)


def _one_input(req: InferRequest, names: tuple[str, ...], model: str) -> Tensor:
    if len(req.inputs) != 1 or next(iter(req.inputs)) not in names:
        raise InvalidField(f"model {model} takes exactly one input, {' or '.join(names)}; got {sorted(req.inputs)}")
    (tensor,) = req.inputs.values()
    if len(tensor.shape) < 1 or tensor.shape[0] < 1:
        raise InvalidField(f"input {tensor.name!r} needs at least one row")
    return tensor


def _wanted(req: InferRequest, available: list[str]) -> list[str]:
    if not req.outputs:
        return available
    unknown = set(req.outputs) - set(available)
    if unknown:
        raise InvalidField(f"no output {sorted(unknown)}; this request can answer {available}")
    return list(req.outputs)


async def _classify(
    serving: Serving, caller: Caller, model: ServedModel, req: InferRequest, deadline: float
) -> list[Output]:
    classifier, batcher, settings = model.classifier, model.batcher, serving.settings
    assert classifier is not None and batcher is not None  # a ready classifier has both
    tensor = _one_input(req, ("images", "pixels"), model.name)
    attention = req.parameters.get("return_attention", False) is True
    priority = req.parameters.get("priority", "interactive")
    if priority not in ("interactive", "batch"):
        raise InvalidField(f"parameter 'priority' is 'interactive' or 'batch', not {priority!r}")
    if attention and classifier.attention is None:
        raise InvalidField(f"model {model.name} exports no attention output; omit return_attention")
    if tensor.shape[0] > settings.max_images_per_request:
        raise InvalidField(f"{tensor.shape[0]} images in one request; at most {settings.max_images_per_request}")
    with serving.registry.intake.receiving():  # batch-mates being decoded are worth waiting for
        if tensor.name == "images":
            if tensor.datatype != "BYTES" or len(tensor.shape) != 1:
                raise InvalidField("input 'images' is BYTES [N]: one encoded image file per row")
            files = [_image_bytes(v, i, tensor) for i, v in enumerate(tensor.data)]
            rows = pixels = await decode_images(files, classifier, serving.decoder)
            queued = await submit(
                serving, caller, model, rows, attention=attention, deadline=deadline, priority=priority
            )
        else:
            if tensor.datatype != "FP32" or list(tensor.shape[1:]) != list(classifier.input_shape):
                raise InvalidField(f"input 'pixels' is FP32 [N, {', '.join(map(str, classifier.input_shape))}]")
            rows = np.ascontiguousarray(tensor.data, np.float32)
            if not np.isfinite(rows).all():
                raise InvalidField("input 'pixels' holds NaN or infinite values")
            pixels = classifier.preprocessing.denormalize(rows) if attention else rows
            queued = await submit(
                serving, caller, model, rows, attention=attention, prepared=True, deadline=deadline, priority=priority
            )
    ranked = await ranking(caller, queued)
    outputs: list[Output] = []
    for name in _wanted(req, ["probabilities", *(["attention_id"] if attention else [])]):
        if name == "attention_id":
            outputs.append(
                (name, "BYTES", await _attention_ids(caller, classifier, ranked, pixels, serving, attention))
            )
            continue
        k = req.outputs.get(name, {}).get("classification")
        if not k:
            outputs.append((name, "FP64", ranked.probabilities))
            continue
        limit = min(settings.max_top_k, len(classifier.labels))
        if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= limit:
            raise InvalidField(f"classification: must be an integer from 1 to {limit}")
        labels = [[f"{t['score']}:{t['index']}:{t['label']}" for t in top] for top in classifier.top_k(ranked, k)]
        outputs.append((name, "BYTES", np.array(labels, dtype=object)))
    return outputs


def _image_bytes(value: bytes, index: int, tensor: Tensor) -> bytes:
    """Raw rows are the file itself; JSON rows are base64 text (JSON cannot hold raw bytes)."""
    if tensor.raw:
        return value
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as e:
        raise InvalidBase64(f"images[{index}]: in JSON, an image is base64 text ({e})") from e


async def _attention_ids(
    caller: Caller, classifier, ranked, pixels: np.ndarray, serving: Serving, asked: bool
) -> np.ndarray:
    if not asked:
        raise InvalidField("output 'attention_id' needs the request parameter return_attention: true")
    results = [{"top_k": top} for top in classifier.top_k(ranked, 1)]
    await attach_attention(
        results, ranked.attention, pixels, classifier, ClassifyOptions(), caller.store(serving.attention)
    )
    return np.array([r.get("attention_id") or "" for r in results], dtype=object)


async def _translate(
    serving: Serving, caller: Caller, model: ServedModel, req: InferRequest, deadline: float
) -> list[Output]:
    tensor = _one_input(req, ("text",), model.name)
    if tensor.datatype != "BYTES" or len(tensor.shape) != 1:
        raise InvalidField("input 'text' is BYTES [N]: one UTF-8 text per row")
    if tensor.shape[0] > serving.settings.max_texts_per_request:
        raise InvalidField(f"{tensor.shape[0]} texts in one request; at most {serving.settings.max_texts_per_request}")
    try:
        texts = [v.decode("utf-8") for v in tensor.data]
    except UnicodeDecodeError as e:
        raise InvalidField(f"input 'text' is not UTF-8: {e}") from e
    options = {k: v for k, v in req.parameters.items() if k in DECODING_PARAMETERS}
    body = validated(TranslateRequest, {"texts": texts, "model": model.name, **options})
    result = await translate_texts(caller, serving, model, body, deadline)
    rows = result["results"]
    outputs: list[Output] = []
    for name in _wanted(req, ["translation", *(["attention_id"] if body.return_attention else [])]):
        if name == "attention_id":
            if not body.return_attention:
                raise InvalidField("output 'attention_id' needs the request parameter return_attention: true")
            outputs.append((name, "BYTES", np.array([r.get("attention_id") or "" for r in rows], dtype=object)))
        elif body.num_return_sequences > 1:
            nbest = [[h["translation"] for h in r["nbest"]] for r in rows]
            outputs.append((name, "BYTES", np.array(nbest, dtype=object)))
        else:
            outputs.append((name, "BYTES", np.array([r["translation"] for r in rows], dtype=object)))
    return outputs
