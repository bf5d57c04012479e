"""Each endpoint of the service as a ``Call``: how its request is built and its answer read.

Both clients build their calls here, so a field name or a default lives in one place.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, TypeVar
from urllib.parse import quote

import httpx
from pydantic import BaseModel

from attnserve_client._base import Call
from attnserve_client._images import ImageInput, uploads
from attnserve_client.types import (
    Attention,
    ClassifyResponse,
    Health,
    ModelInfo,
    Readiness,
    TranslateResponse,
)

M = TypeVar("M", bound=BaseModel)
RolloutFusion = Literal["mean", "max"]
TextFormat = Literal["text", "html"]
Priority = Literal["interactive", "batch"]


def _parser(model: type[M]):
    def parse(response: httpx.Response) -> M:
        return model.model_validate_json(response.content)

    return parse


def _form_value(value: object) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def _given(**fields: Any) -> dict[str, Any]:
    """Only the fields the caller set: the rest keep the service's defaults."""
    return {k: v for k, v in fields.items() if v is not None and v is not False}


def classify(
    images: ImageInput | Sequence[ImageInput],
    *,
    top_k: int,
    model: str | None,
    return_attention: bool,
    rollout_fusion: RolloutFusion | None,
) -> Call[ClassifyResponse]:
    """Images go as multipart ``file`` parts: no base64 inflation, and encoded files are sent untouched."""
    form = _given(top_k=top_k, model=model, return_attention=return_attention, rollout_fusion=rollout_fusion)
    return Call(
        "POST",
        "/classify",
        _parser(ClassifyResponse),
        files=[("file", u) for u in uploads(images)],
        data={k: _form_value(v) for k, v in form.items()},
    )


def translate(
    text_or_texts: str | Sequence[str],
    *,
    beam_size: int | None,
    max_new_tokens: int | None,
    num_return_sequences: int | None,
    length_penalty: float | None,
    model: str | None,
    return_attention: bool,
    format: TextFormat = "text",
    stream: bool = False,
    priority: Priority = "interactive",
) -> Call[Any]:
    """``format`` goes in the body only when it is not ``"text"``, the default: a service older than
    ``format`` still translates plain text, and refuses (422) a format it does not know rather than
    translating HTML as text. ``priority`` likewise, only when it is ``"batch"``."""
    texts = {"text": text_or_texts} if isinstance(text_or_texts, str) else {"texts": list(text_or_texts)}
    body = {
        **texts,
        **_given(
            beam_size=beam_size,
            max_new_tokens=max_new_tokens,
            model=model,
            stream=stream,
            num_return_sequences=num_return_sequences,
            length_penalty=length_penalty,
            return_attention=return_attention,
        ),
        **({} if format == "text" else {"format": format}),
        **({} if priority == "interactive" else {"priority": priority}),
    }
    if stream:
        return Call("POST", "/translate", lambda response: response, json=body, accept="text/event-stream", stream=True)
    return Call("POST", "/translate", _parser(TranslateResponse), json=body)


def attention(
    attention_id: str, *, layer: int | None, head: int | None, kind: str | None, fusion: RolloutFusion | None
) -> Call[Attention]:
    return Call(
        "GET",
        f"/attention/{quote(attention_id, safe='')}",
        _parser(Attention),
        params={"layer": layer, "head": head, "kind": kind, "fusion": fusion, "format": "json"},
    )


def attention_png(
    attention_id: str, *, layer: int | None, head: int | None, kind: str | None, fusion: RolloutFusion | None
) -> Call[bytes]:
    return Call(
        "GET",
        f"/attention/{quote(attention_id, safe='')}.png",
        lambda response: response.content,
        params={"layer": layer, "head": head, "kind": kind, "fusion": fusion},
        accept="image/png",
    )


def models() -> Call[list[ModelInfo]]:
    return Call("GET", "/models", lambda response: [ModelInfo.model_validate(m) for m in response.json()["models"]])


def health() -> Call[Health]:
    return Call("GET", "/healthz", _parser(Health))


def _readiness(response: httpx.Response) -> Readiness:
    body = response.json()
    reason = (body.get("error") or {}).get("message")
    return Readiness(status=body.get("status", "not_ready"), models=body.get("models") or {}, reason=reason)


def ready() -> Call[Readiness]:
    """Not ready is an answer here, not an error, and asking again is the caller's choice: no retries."""
    return Call("GET", "/readyz", _readiness, answers=frozenset({503}), retry=False)
