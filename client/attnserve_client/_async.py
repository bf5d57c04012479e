"""``AsyncClient``: ``Client``'s methods as coroutines, for asyncio applications.

Only the waiting differs from ``Client``; requests, retries and parsing are shared (``_base``,
``_calls``), and the docstrings are ``Client``'s (copied at import, see the end of this module).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import httpx

from attnserve_client import _calls, po
from attnserve_client._base import BaseClient, Call
from attnserve_client._calls import Priority, RolloutFusion, TextFormat
from attnserve_client._images import ImageInput
from attnserve_client._streaming import AsyncTranslationStream
from attnserve_client._sync import Client
from attnserve_client.errors import PayloadTooLargeError
from attnserve_client.types import Attention, ClassifyResponse, Health, ModelInfo, Readiness, TranslateResponse

T = TypeVar("T")

if TYPE_CHECKING:
    from typing_extensions import Self


class AsyncClient(BaseClient):
    """The asyncio twin of ``Client``: the same arguments and methods, awaited; ``async with`` closes it."""

    def __init__(
        self,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout: float | httpx.Timeout | None = None,
        max_retries: int | None = None,
        deadline: float | None = None,
        http_client: httpx.AsyncClient | None = None,
    ) -> None:
        super().__init__(
            base_url=base_url, api_key=api_key, timeout=timeout, max_retries=max_retries, deadline=deadline
        )
        self._owns_http = http_client is None
        self._http = http_client or httpx.AsyncClient()
        self._sleep = asyncio.sleep

    async def classify(
        self,
        images: ImageInput | Sequence[ImageInput],
        *,
        top_k: int = 5,
        model: str | None = None,
        return_attention: bool = False,
        rollout_fusion: RolloutFusion | None = None,
    ) -> ClassifyResponse:
        return await self._call(
            _calls.classify(
                images, top_k=top_k, model=model, return_attention=return_attention, rollout_fusion=rollout_fusion
            )
        )

    async def translate(
        self,
        text_or_texts: str | Sequence[str],
        *,
        beam_size: int | None = None,
        max_new_tokens: int | None = None,
        num_return_sequences: int | None = None,
        length_penalty: float | None = None,
        model: str | None = None,
        return_attention: bool = False,
        format: TextFormat = "text",
        priority: Priority = "interactive",
    ) -> TranslateResponse:
        return await self._call(
            _calls.translate(
                text_or_texts,
                beam_size=beam_size,
                max_new_tokens=max_new_tokens,
                length_penalty=length_penalty,
                num_return_sequences=num_return_sequences,
                model=model,
                return_attention=return_attention,
                format=format,
                priority=priority,
            )
        )

    async def translate_stream(
        self,
        text: str,
        *,
        beam_size: int | None = None,
        max_new_tokens: int | None = None,
        num_return_sequences: int | None = None,
        length_penalty: float | None = None,
        model: str | None = None,
        return_attention: bool = False,
    ) -> AsyncTranslationStream:
        return AsyncTranslationStream(
            await self._send(
                _calls.translate(
                    text,
                    beam_size=beam_size,
                    max_new_tokens=max_new_tokens,
                    length_penalty=length_penalty,
                    num_return_sequences=num_return_sequences,
                    model=model,
                    return_attention=return_attention,
                    stream=True,
                )
            )
        )

    async def translate_po(
        self,
        catalog: str | os.PathLike[str],
        *,
        output: str | os.PathLike[str] | None = None,
        language: str = "de",
        batch_size: int = po.DEFAULT_BATCH_SIZE,
        beam_size: int | None = None,
        model: str | None = None,
        priority: Priority = "batch",
    ) -> po.TranslatedCatalog:
        parsed = po.load(catalog, language=language)
        translations: dict[str, str] = {}
        for batch in po.batches(po.sources(parsed), batch_size):
            translations.update(
                zip(batch, await self._translate_texts(batch, beam_size=beam_size, model=model, priority=priority))
            )
        result = po.TranslatedCatalog(parsed, po.fill(parsed, translations))
        if output is not None:
            parsed.save(os.fspath(output))
        return result

    async def attention(
        self,
        attention_id: str,
        *,
        layer: int | None = None,
        head: int | None = None,
        kind: str | None = None,
        fusion: RolloutFusion | None = None,
    ) -> Attention:
        return await self._call(_calls.attention(attention_id, layer=layer, head=head, kind=kind, fusion=fusion))

    async def attention_png(
        self,
        attention_id: str,
        *,
        layer: int | None = None,
        head: int | None = None,
        kind: str | None = None,
        fusion: RolloutFusion | None = None,
    ) -> bytes:
        return await self._call(_calls.attention_png(attention_id, layer=layer, head=head, kind=kind, fusion=fusion))

    async def models(self) -> list[ModelInfo]:
        return await self._call(_calls.models())

    async def health(self) -> Health:
        return await self._call(_calls.health())

    async def ready(self) -> Readiness:
        return await self._call(_calls.ready())

    async def close(self) -> None:
        if self._owns_http:
            await self._http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def _translate_texts(self, texts: list[str], **options: Any) -> list[str]:
        try:
            return [r.translation for r in (await self.translate(texts, **options)).results]
        except PayloadTooLargeError:
            if len(texts) == 1:
                return [""]
            return [(await self._translate_texts([text], **options))[0] for text in texts]

    async def _call(self, call: Call[T]) -> T:
        return call.parse(await self._send(call))

    async def _send(self, call: Call[Any]) -> httpx.Response:
        request = self._build_request(self._http, call)
        attempt = 0
        while True:
            outcome: httpx.Response | httpx.TransportError
            try:
                outcome = await self._http.send(request, stream=call.stream)
                if call.stream and outcome.is_error:
                    await outcome.aread()
            except httpx.TransportError as exc:
                outcome = exc
            step = self._answer_or_delay(call, request, outcome, attempt)
            if isinstance(step, httpx.Response):
                return step
            await self._sleep(step)
            attempt += 1


for _name, _method in vars(AsyncClient).items():
    if callable(_method) and not _name.startswith("_") and _method.__doc__ is None:
        _method.__doc__ = getattr(Client, _name).__doc__
