"""From a model's attention outputs to stored records and the compact summaries answers carry inline.

Called by the routes only for requests that asked for attention. A store that cannot take a record
(Redis unreachable) costs the request its ``attention_id`` but never its predictions: the answer
says why instead (``attention_error``).
"""

from __future__ import annotations

import logging

import numpy as np

from contract.manifest import ImageAttention
from service.attention.record import AttentionRecord
from service.attention.rollout import Fusion, alignment, class_token_rollout
from service.attention.store import AttentionStore
from service.classifier import TASK as IMAGE_CLASSIFICATION
from service.errors import AttentionStoreUnavailable
from service.translator import TASK as TRANSLATION

log = logging.getLogger("attnserve.attention")

VIT_MAP = "self_attention"
TRANSLATION_MAPS = ("encoder_self_attention", "decoder_self_attention", "cross_attention")
ALIGNMENT_REDUCTION = "cross-attention of the last decoder layer, mean over heads"


def vit_record(
    model: str, version: str, spec: ImageAttention, attention: np.ndarray, pixels: np.ndarray, prediction: dict
) -> AttentionRecord:
    """One image's (layers, heads, tokens, tokens) attention and the pixels the model saw."""
    meta = {
        "grid": list(spec.grid),
        "prefix_tokens": spec.prefix_tokens,
        "patch_size": spec.patch_size,
        "prediction": prediction,
    }
    return AttentionRecord(IMAGE_CLASSIFICATION, model, version, {VIT_MAP: attention}, meta, pixels)


def vit_summary(spec: ImageAttention, attention: np.ndarray, fusion: Fusion) -> dict:
    grid = class_token_rollout(attention, spec.grid, spec.prefix_tokens, fusion)
    return {"kind": "rollout", "fusion": fusion, "grid": list(spec.grid), "rollout": grid.tolist()}


def translation_record(
    model: str,
    version: str,
    maps: dict[str, np.ndarray],
    source_tokens: list[str],
    target_tokens: list[str],
    decoder_input_tokens: list[str],
    translation: str,
) -> AttentionRecord:
    meta = {
        "source_tokens": source_tokens,
        "target_tokens": target_tokens,
        "decoder_input_tokens": decoder_input_tokens,
        "translation": translation,
    }
    return AttentionRecord(TRANSLATION, model, version, maps, meta)


def join_translation_maps(parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """The maps of a text's sentences as one set: each sentence's map a block on the diagonal, zero between
    sentences (a sentence's tokens attend only its own), so views and heatmaps read them as any translation's."""
    if len(parts) == 1:
        return parts[0]
    joined = {}
    for name in parts[0]:
        blocks = [p[name] for p in parts]
        rows, cols = sum(b.shape[-2] for b in blocks), sum(b.shape[-1] for b in blocks)
        out = np.zeros((*blocks[0].shape[:-2], rows, cols), dtype=blocks[0].dtype)
        r = c = 0
        for b in blocks:
            out[..., r : r + b.shape[-2], c : c + b.shape[-1]] = b
            r, c = r + b.shape[-2], c + b.shape[-1]
        joined[name] = out
    return joined


def translation_summary(cross_attention: np.ndarray, source_tokens: list[str], target_tokens: list[str]) -> dict:
    layers = cross_attention.shape[0]
    return {
        "source_tokens": source_tokens,
        "target_tokens": target_tokens,
        "layer": layers - 1,
        "reduction": ALIGNMENT_REDUCTION,
        "alignment": alignment(cross_attention).tolist(),
    }


async def store_records(store: AttentionStore, records: list[AttentionRecord], results: list[dict]) -> None:
    """Put each record and write its id (or why there is none) into the matching result."""
    for record, result in zip(records, results):
        try:
            result["attention_id"] = await store.put(record)
        except AttentionStoreUnavailable as e:
            log.warning("attention not stored: %s", e.message)
            result["attention_id"] = None
            result["attention_error"] = {"code": e.code, "message": e.message}
