"""What ``GET /attention/{id}`` answers: a record's maps, sliced by the query, as JSON or ``.npz``.

Slicing keeps the four axes (layer, head, query, key) so that a client reads every answer the same
way; ``layers``/``heads`` say which were kept. Kinds name a record's maps: the ViT has one
(``attention``, plus the computed ``rollout``); the translator has ``encoder``, ``decoder`` and
``cross`` (full names such as ``cross_attention`` are accepted too).
"""

from __future__ import annotations

import io
import json

import numpy as np

from service.attention.capture import TRANSLATION_MAPS, VIT_MAP
from service.attention.record import MAP_AXES, AttentionRecord
from service.attention.rollout import Fusion, class_token_rollout
from service.classifier import TASK as IMAGE_CLASSIFICATION
from service.errors import InvalidField

KINDS = {
    IMAGE_CLASSIFICATION: {"attention": VIT_MAP, VIT_MAP: VIT_MAP},
    "translation": {
        "encoder": TRANSLATION_MAPS[0],
        "decoder": TRANSLATION_MAPS[1],
        "cross": TRANSLATION_MAPS[2],
        **{name: name for name in TRANSLATION_MAPS},
    },
}


def map_names(record: AttentionRecord, kind: str | None) -> list[str]:
    """The record's maps a ``kind`` selects (all of them without one)."""
    if kind is None:
        return list(record.maps)
    kinds = KINDS.get(record.task, {})
    if kind not in kinds:
        shown = sorted(k for k in kinds if "_" not in k)
        raise InvalidField(f"kind: {kind!r} is not a map of this {record.task} record; choose one of {shown}")
    return [kinds[kind]]


def select(
    record: AttentionRecord, name: str, layer: int | None, head: int | None
) -> tuple[np.ndarray, list[int], list[int]]:
    """(the map cut to one layer and/or head, the layers kept, the heads kept); 422 when out of range."""
    m = record.maps[name]
    layers, heads = m.shape[0], m.shape[1]
    if layer is not None and not 0 <= layer < layers:
        raise InvalidField(f"layer: {layer} is out of range; {name} has layers 0..{layers - 1}")
    if head is not None and not 0 <= head < heads:
        raise InvalidField(f"head: {head} is out of range; {name} has heads 0..{heads - 1}")
    kept_layers = list(range(layers)) if layer is None else [layer]
    kept_heads = list(range(heads)) if head is None else [head]
    return m[kept_layers][:, kept_heads], kept_layers, kept_heads


def axis_tokens(record: AttentionRecord, name: str) -> tuple[list[str], list[str]] | None:
    """Token strings of a translation map's (query, key) axes."""
    meta = record.meta
    if record.task != "translation":
        return None
    source, target, fed = meta["source_tokens"], meta["target_tokens"], meta["decoder_input_tokens"]
    return {
        TRANSLATION_MAPS[0]: (source, source),
        TRANSLATION_MAPS[1]: (target, fed),
        TRANSLATION_MAPS[2]: (target, source),
    }[name]


def vit_rollout(record: AttentionRecord, fusion: Fusion) -> np.ndarray:
    meta = record.meta
    return class_token_rollout(record.maps[VIT_MAP], tuple(meta["grid"]), meta["prefix_tokens"], fusion)


def header(record: AttentionRecord, attention_id: str, ttl_s: float) -> dict:
    return {
        "id": attention_id,
        "task": record.task,
        "model": record.model,
        "version": record.version,
        "created_at": record.created_at,
        "expires_at": record.created_at + ttl_s,
        **record.meta,
    }


def _selection(
    record: AttentionRecord,
    attention_id: str,
    ttl_s: float,
    kind: str | None,
    layer: int | None,
    head: int | None,
    fusion: Fusion,
) -> tuple[dict, dict[str, np.ndarray]]:
    """(the answer without arrays: header and each map's axes, kept layers/heads and token labels;
    the arrays: each selected map, and ``rollout`` for the ViT)."""
    body, arrays = header(record, attention_id, ttl_s), {}
    body["maps"] = {}
    for name in map_names(record, kind):
        arrays[name], layers, heads = select(record, name, layer, head)
        entry = body["maps"][name] = {
            "axes": list(MAP_AXES),
            "shape": list(arrays[name].shape),
            "layers": layers,
            "heads": heads,
        }
        tokens = axis_tokens(record, name)
        if tokens is not None:
            entry["query_tokens"], entry["key_tokens"] = tokens
    if record.task == IMAGE_CLASSIFICATION:
        arrays["rollout"] = vit_rollout(record, fusion)
        body["rollout"] = {"fusion": fusion}
    return body, arrays


def as_json(
    record: AttentionRecord,
    attention_id: str,
    ttl_s: float,
    kind: str | None,
    layer: int | None,
    head: int | None,
    fusion: Fusion,
) -> bytes:
    body, arrays = _selection(record, attention_id, ttl_s, kind, layer, head, fusion)
    for name, entry in body["maps"].items():
        entry["data"] = arrays[name].tolist()
    if "rollout" in arrays:
        body["rollout"]["data"] = arrays["rollout"].tolist()
    return json.dumps(body, ensure_ascii=False).encode()


def as_npz(
    record: AttentionRecord,
    attention_id: str,
    ttl_s: float,
    kind: str | None,
    layer: int | None,
    head: int | None,
    fusion: Fusion,
) -> bytes:
    """One array per selected map (and ``rollout`` for the ViT); the rest of the JSON answer as ``meta.json``."""
    meta, arrays = _selection(record, attention_id, ttl_s, kind, layer, head, fusion)
    arrays["meta.json"] = np.frombuffer(json.dumps(meta, ensure_ascii=False).encode(), dtype=np.uint8)
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()
