"""``GET /attention/{id}`` (the full maps, JSON or ``.npz``) and ``GET /attention/{id}.png`` (a heatmap).

Records come from the attention store (``service/attention/store.py``): an unknown or expired id is
404 ``attention_not_found``; a layer, head or kind the record does not have is 422.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Literal

import numpy as np
from fastapi import APIRouter, Query, Request
from starlette.responses import Response

from service.attention import render
from service.attention.record import AttentionRecord
from service.attention.rollout import Fusion
from service.attention.store import AttentionStore
from service.attention.views import as_json, as_npz, axis_tokens, map_names, select, vit_rollout
from service.classifier import TASK as IMAGE_CLASSIFICATION
from service.deps import ServingDep
from service.errors import AttentionNotFound, InvalidField
from service.routes.common import JSON_TYPE
from service.schemas import ERROR_RESPONSES

router = APIRouter(tags=["attention"])

NPZ_TYPES = ("application/x-npz", "application/octet-stream")
LayerQ = Annotated[int | None, Query(description="Keep only this layer (0-based).")]
HeadQ = Annotated[int | None, Query(description="Keep only this head (0-based); PNG: omitted = mean over heads.")]
FusionQ = Annotated[Literal["mean", "max"], Query(description="ViT rollout: fuse heads by their mean or max.")]


async def _record(store: AttentionStore, attention_id: str, ttl_s: int) -> AttentionRecord:
    record = await store.get(attention_id)
    if record is None:
        raise AttentionNotFound(
            f"no attention maps with id {attention_id!r}: unknown, or expired "
            f"(maps are kept {ttl_s} s, and only on the replica that made them unless "
            "the store is shared)"
        )
    return record


@router.get(
    "/attention/{attention_id}.png",
    responses={**ERROR_RESPONSES, 200: {"content": {"image/png": {}}}},
    response_class=Response,
    summary="A heatmap of one attention map",
)
async def attention_png(
    attention_id: str,
    serving: ServingDep,
    kind: str | None = None,
    layer: LayerQ = None,
    head: HeadQ = None,
    fusion: FusionQ = "mean",
) -> Response:
    """ViT: `kind=rollout` (default) or `attention` (the class token's row, of `layer` (default: last)
    and `head` (default: mean)), over the input image. Translator: `kind=cross` (default), `encoder`
    or `decoder`, a token-labelled grid of `layer` (default: last) and `head` (default: mean)."""
    record = await _record(serving.attention, attention_id, serving.settings.attention_ttl_s)
    if record.task == IMAGE_CLASSIFICATION:
        draw = _vit_heatmap(record, kind or "rollout", layer, head, fusion)
    else:
        draw = _token_heatmap(record, kind or "cross", layer, head)
    png = await asyncio.to_thread(draw)
    return Response(png, media_type="image/png", headers={"Cache-Control": "private, max-age=60"})


@router.get(
    "/attention/{attention_id}",
    responses=ERROR_RESPONSES,
    response_class=Response,
    summary="The full attention maps of an earlier request",
)
async def attention_maps(
    attention_id: str,
    request: Request,
    serving: ServingDep,
    kind: str | None = None,
    layer: LayerQ = None,
    head: HeadQ = None,
    fusion: FusionQ = "mean",
    format: Annotated[
        Literal["json", "npz"] | None, Query(description="Default: JSON, or npz when Accept asks.")
    ] = None,
) -> Response:
    """Every map as (layer, head, query, key) with its axes' labels; `layer`/`head`/`kind` select a
    slice. `format=npz` (or `Accept: application/x-npz`) answers a NumPy `.npz` archive instead."""
    ttl = serving.settings.attention_ttl_s
    record = await _record(serving.attention, attention_id, ttl)
    accept = request.headers.get("accept", "")
    if format == "npz" or (format is None and any(t in accept for t in NPZ_TYPES)):
        body = as_npz(record, attention_id, ttl, kind, layer, head, fusion)
        return Response(
            body,
            media_type="application/x-npz",
            headers={"Content-Disposition": f'attachment; filename="attention-{attention_id}.npz"'},
        )
    body = await asyncio.to_thread(as_json, record, attention_id, ttl, kind, layer, head, fusion)
    return Response(body, media_type=JSON_TYPE)


def _pick(record: AttentionRecord, name: str, layer: int | None, head: int | None) -> tuple[np.ndarray, int, str]:
    """One (query, key) matrix: the given layer (default: the last), the given head or the heads' mean."""
    last = record.maps[name].shape[0] - 1
    data, (kept,), _ = select(record, name, last if layer is None else layer, head)
    return (data[0, 0] if head is not None else data[0].mean(axis=0)), kept, ("mean" if head is None else str(head))


def _vit_heatmap(record: AttentionRecord, kind: str, layer: int | None, head: int | None, fusion: Fusion):
    meta = record.meta
    label = meta.get("prediction", {}).get("label", "")
    if kind == "rollout":
        if layer is not None or head is not None:
            raise InvalidField(
                "layer/head select a raw map; the rollout combines every layer and head (use kind=attention)"
            )
        heat, title = vit_rollout(record, fusion), f"attention rollout ({fusion} over heads): {label}"
    else:
        (name,) = map_names(record, kind)  # 422 for a kind the ViT does not have
        matrix, kept, heads = _pick(record, name, layer, head)
        p = meta["prefix_tokens"]
        heat = matrix[0, p:].reshape(meta["grid"])
        title = f"class token attention, layer {kept}, head {heads}: {label}"
    if record.image is None:
        raise InvalidField("this record holds no input image to draw on")
    return lambda: render.vit_overlay(record.image, heat, title)


def _token_heatmap(record: AttentionRecord, kind: str, layer: int | None, head: int | None):
    (name,) = map_names(record, kind)
    matrix, kept, heads = _pick(record, name, layer, head)
    rows, cols = axis_tokens(record, name)
    col_title = "decoder input" if name == "decoder_self_attention" else "source"
    row_title = "source" if name == "encoder_self_attention" else "generated"
    title = f"{name.replace('_', ' ')}, layer {kept}, head {heads}"
    return lambda: render.token_grid(matrix, rows, cols, title, row_title, col_title)
