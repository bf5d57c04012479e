"""``Client``: the blocking client. ``AsyncClient`` (``_async.py``) has the same methods."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import httpx

from attnserve_client import _calls, po
from attnserve_client._base import BaseClient, Call
from attnserve_client._calls import Priority, RolloutFusion, TextFormat
from attnserve_client._images import ImageInput
from attnserve_client._streaming import TranslationStream
from attnserve_client.errors import PayloadTooLargeError
from attnserve_client.types import Attention, ClassifyResponse, Health, ModelInfo, Readiness, TranslateResponse

T = TypeVar("T")

if TYPE_CHECKING:
    from typing_extensions import Self


class Client(BaseClient):
    """A connection pool to one attnserve service; use it as a context manager, or call ``close()``.

    Every argument falls back to an environment variable, then a default: ``base_url``
    (``ATTNSERVE_BASE_URL``, ``http://127.0.0.1:8000``), ``api_key`` (``ATTNSERVE_API_KEY``, sent as
    ``Authorization: Bearer``), ``timeout`` in seconds (``ATTNSERVE_TIMEOUT``, 60), ``max_retries``
    (``ATTNSERVE_MAX_RETRIES``, 2). Connection errors, timeouts, 429 and 503 are retried with
    exponential backoff, or after the service's ``Retry-After``; other errors are raised at once.
    ``http_client`` replaces the underlying ``httpx.Client`` (proxies, custom transports); the
    client does not close one it was given.
    """

    def __init__(
        self,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout: float | httpx.Timeout | None = None,
        max_retries: int | None = None,
        deadline: float | None = None,
        http_client: httpx.Client | None = None,
    ) -> None:
        super().__init__(
            base_url=base_url, api_key=api_key, timeout=timeout, max_retries=max_retries, deadline=deadline
        )
        self._owns_http = http_client is None
        self._http = http_client or httpx.Client()
        self._sleep = time.sleep

    def classify(
        self,
        images: ImageInput | Sequence[ImageInput],
        *,
        top_k: int = 5,
        model: str | None = None,
        return_attention: bool = False,
        rollout_fusion: RolloutFusion | None = None,
    ) -> ClassifyResponse:
        """Top-k labels for one image or a list of images (paths, bytes, binary files, PIL images, uint8 arrays).

        ``return_attention`` adds each image's attention rollout and an ``attention_id`` for ``attention()``.
        """
        return self._call(
            _calls.classify(
                images, top_k=top_k, model=model, return_attention=return_attention, rollout_fusion=rollout_fusion
            )
        )

    def translate(
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
        """English to German, one result per text. Options left as None keep the service's defaults
        (the model's default beam size and length penalty, a length limit from the source length).
        ``num_return_sequences`` > 1 adds an n-best list (at most the beam size); ``return_attention`` adds
        the source-target alignment. ``format="html"``: each text is an HTML fragment or page, translated
        block by block with its tags put back; scripts, styles, ``pre``, ``code``, comments and every
        attribute but ``title``/``alt`` stay as they are. ``priority="batch"``: bulk work, decoded after the
        interactive requests waiting (never longer than the service's ``batch_max_wait_s`` behind them).
        """
        return self._call(
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

    def translate_stream(
        self,
        text: str,
        *,
        beam_size: int | None = None,
        max_new_tokens: int | None = None,
        num_return_sequences: int | None = None,
        length_penalty: float | None = None,
        model: str | None = None,
        return_attention: bool = False,
    ) -> TranslationStream:
        """One text, translated token by token: iterate for ``TokenEvent``s, then one ``DoneEvent``.

        The request is sent (and retried, and its errors raised) here; iteration reads the events. Token
        events come with greedy decoding; beam search knows its best hypothesis only at the end.
        """
        return TranslationStream(
            self._send(
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

    def translate_po(
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
        """Fill the untranslated entries of a gettext catalog (a ``.po``/``.pot`` path, or PO text) with
        translations flagged ``fuzzy``; ``output`` also writes the result there. ``batch_size`` texts go in
        each request (at most the service's ``ATTNSERVE_MAX_TEXTS_PER_REQUEST``); ``language`` names the
        target in a template's header. Sent as ``priority="batch"``: interactive callers go first. The rules:
        ``attnserve_client.po``.
        """
        parsed = po.load(catalog, language=language)
        translations: dict[str, str] = {}
        for batch in po.batches(po.sources(parsed), batch_size):
            translations.update(
                zip(batch, self._translate_texts(batch, beam_size=beam_size, model=model, priority=priority))
            )
        result = po.TranslatedCatalog(parsed, po.fill(parsed, translations))
        if output is not None:
            parsed.save(os.fspath(output))
        return result

    def attention(
        self,
        attention_id: str,
        *,
        layer: int | None = None,
        head: int | None = None,
        kind: str | None = None,
        fusion: RolloutFusion | None = None,
    ) -> Attention:
        """Every attention map stored for an earlier request (a result's ``attention_id``), as
        (layer, head, query, key) arrays: ``.to_numpy()``. ``layer``/``head`` keep one layer or head; ``kind``
        one map (translation: ``encoder``, ``decoder``, ``cross``); ``fusion`` (``mean``/``max``) how the ViT
        rollout fuses heads. ``NotFoundError`` once the id has expired."""
        return self._call(_calls.attention(attention_id, layer=layer, head=head, kind=kind, fusion=fusion))

    def attention_png(
        self,
        attention_id: str,
        *,
        layer: int | None = None,
        head: int | None = None,
        kind: str | None = None,
        fusion: RolloutFusion | None = None,
    ) -> bytes:
        """A PNG heatmap: for an image, ``kind`` ``rollout`` (default) or ``attention`` drawn over it; for a
        translation, ``cross`` (default), ``encoder`` or ``decoder`` as a token grid. ``layer`` defaults to the
        last, ``head`` to the mean over heads."""
        return self._call(_calls.attention_png(attention_id, layer=layer, head=head, kind=kind, fusion=fusion))

    def models(self) -> list[ModelInfo]:
        """Every model the service found, with its status, execution provider and evaluation figures."""
        return self._call(_calls.models())

    def health(self) -> Health:
        """Liveness: the process answers."""
        return self._call(_calls.health())

    def ready(self) -> Readiness:
        """Readiness, ready or not (``.ready``, ``.reason``); asked once, never retried."""
        return self._call(_calls.ready())

    def close(self) -> None:
        """Close the connections (those of an ``http_client`` passed in stay open: they are its owner's)."""
        if self._owns_http:
            self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _translate_texts(self, texts: list[str], **options: Any) -> list[str]:
        """One translation per text; a text the service refuses as too long gets "" (the others are sent alone)."""
        try:
            return [r.translation for r in self.translate(texts, **options).results]
        except PayloadTooLargeError:
            if len(texts) == 1:
                return [""]
            return [self._translate_texts([text], **options)[0] for text in texts]

    def _call(self, call: Call[T]) -> T:
        return call.parse(self._send(call))

    def _send(self, call: Call[Any]) -> httpx.Response:
        request = self._build_request(self._http, call)
        attempt = 0
        while True:
            outcome: httpx.Response | httpx.TransportError
            try:
                outcome = self._http.send(request, stream=call.stream)
                if call.stream and outcome.is_error:
                    outcome.read()
            except httpx.TransportError as exc:
                outcome = exc
            step = self._answer_or_delay(call, request, outcome, attempt)
            if isinstance(step, httpx.Response):
                return step
            self._sleep(step)
            attempt += 1
