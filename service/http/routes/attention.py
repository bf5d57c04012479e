"""``GET /attention/{id}`` (the full maps, JSON or ``.npz``) and ``GET /attention/{id}.png`` (a heatmap).

Records come from the attention store (``service/attention/store.py``): an unknown or expired id is
404 ``attention_not_found``; a layer, head or kind the record does not have is 422.
"""

from __future__ import annotations

import asyncio
from typing import Literal

import numpy as np
from pydantic import BaseModel, Field
from starlette.requests import Request
from starlette.responses import Response

from service.attention import render
from service.attention.record import AttentionRecord
from service.attention.rollout import Fusion
from service.attention.store import AttentionStore
from service.attention.views import as_json, as_npz, axis_tokens, map_names, select, vit_rollout
from service.classifier import TASK as IMAGE_CLASSIFICATION
from service.core.serving import Serving
from service.errors import AttentionNotFound, InvalidField
from service.http.common import JSON_TYPE
from service.http.router import Route

NPZ_TYPES = ("application/x-npz", "application/octet-stream")


class MapQuery(BaseModel):
    kind: str | None = Field(None, description="Which maps: see the route's description.")
    layer: int | None = Field(None, ge=0, description="Keep only this layer (0-based).")
    head: int | None = Field(None, ge=0, description="Keep only this head (0-based); PNG: omitted = mean over heads.")
    fusion: Literal["mean", "max"] = Field("mean", description="ViT rollout: fuse heads by their mean or max.")


class MapsQuery(MapQuery):
    format: Literal["json", "npz"] | None = Field(None, description="Default: JSON, or npz when Accept asks.")


async def _record(request: Request, store: AttentionStore, attention_id: str, ttl_s: int) -> AttentionRecord:
    record = await store.get(attention_id)
    if record is None or record.owner != request.scope.get("key_id"):  # another key's: as if unknown, no oracle
        raise AttentionNotFound(
            f"no attention maps with id {attention_id!r}: unknown, or expired "
            f"(maps are kept {ttl_s} s, and only on the replica that made them unless "
            "the store is shared)"
        )
    return record


async def attention_png(request: Request, serving: Serving, q: MapQuery) -> Response:
    """ViT: `kind=rollout` (default) or `attention` (the class token's row, of `layer` (default: last)
    and `head` (default: mean)), over the input image. Translator: `kind=cross` (default), `encoder`
    or `decoder`, a token-labelled grid of `layer` (default: last) and `head` (default: mean)."""
    record = await _record(
        request, serving.attention, request.path_params["attention_id"], serving.settings.attention_ttl_s
    )
    if record.task == IMAGE_CLASSIFICATION:
        draw = _vit_heatmap(record, q.kind or "rollout", q.layer, q.head, q.fusion)
    else:
        draw = _token_heatmap(record, q.kind or "cross", q.layer, q.head)
    png = await asyncio.to_thread(draw)
    return Response(png, media_type="image/png", headers={"Cache-Control": "private, max-age=60"})


async def attention_maps(request: Request, serving: Serving, q: MapsQuery) -> Response:
    """Every map as (layer, head, query, key) with its axes' labels; `layer`/`head`/`kind` select a
    slice. `format=npz` (or `Accept: application/x-npz`) answers a NumPy `.npz` archive instead."""
    ttl = serving.settings.attention_ttl_s
    attention_id = request.path_params["attention_id"]
    record = await _record(request, serving.attention, attention_id, ttl)
    accept = request.headers.get("accept", "")
    if q.format == "npz" or (q.format is None and any(t in accept for t in NPZ_TYPES)):
        body = as_npz(record, attention_id, ttl, q.kind, q.layer, q.head, q.fusion)
        return Response(
            body,
            media_type="application/x-npz",
            headers={"Content-Disposition": f'attachment; filename="attention-{attention_id}.npz"'},
        )
    body = await asyncio.to_thread(as_json, record, attention_id, ttl, q.kind, q.layer, q.head, q.fusion)
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


_ERRORS = {
    404: "Unknown or expired attention id (or another API key's).",
    422: "A layer, head or kind the record does not have.",
    503: "The shared attention store (Redis) cannot be reached.",
}
ROUTES = [  # the .png route first: `{attention_id}` alone would match `abc.png` too
    Route(
        "GET",
        "/attention/{attention_id}.png",
        attention_png,
        summary="A heatmap of one attention map",
        tags=("attention",),
        query=MapQuery,
        response={"image/png": {"schema": {"type": "string", "format": "binary"}}},
        errors=_ERRORS,
    ),
    Route(
        "GET",
        "/attention/{attention_id}",
        attention_maps,
        summary="The full attention maps of an earlier request",
        tags=("attention",),
        query=MapsQuery,
        response={
            JSON_TYPE: {"schema": {"type": "object"}},
            "application/x-npz": {"schema": {"type": "string", "format": "binary"}},
        },
        errors=_ERRORS,
    ),
]
