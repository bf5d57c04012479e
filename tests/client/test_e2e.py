"""Both clients against a real ``python -m service`` serving the shipped ViT and translator.

Every method, streaming included, through the real network stack: what a user relies on is that
the SDK returns exactly what the HTTP API answers, typed, and raises the right class with the
service's code and request id when it refuses.
"""

from __future__ import annotations

import io

import httpx
import numpy as np
import pytest
from attnserve_client import (
    APIConnectionError,
    BadRequestError,
    DeadlineExceededError,
    DoneEvent,
    InvalidFieldError,
    NotFoundError,
    PayloadTooLargeError,
    TokenEvent,
)
from PIL import Image

from tests.service.service_testing import free_port

TEXTS = ["Open the dialog.", "Saves the current document.", "Select the cells you want to format."]


def test_health_readiness_and_models(api):
    assert api.health().status == "ok"
    readiness = api.ready()
    assert readiness.ready and readiness.reason is None
    models = {m.name: m for m in api.models()}
    assert readiness.models == {f"{m.name}/{m.version}": "ready" for m in models.values()}
    assert models["vit"].task == "image-classification" and models["vit"].input.image_size == 28
    assert models["translator"].languages == {"source": "en", "target": "de"}
    assert all(m.status == "ready" and m.provider == "CPUExecutionProvider" for m in models.values())


def test_classify_answers_what_the_http_api_answers(api, server, shoe):
    raw = httpx.post(server.url + "/classify", files={"file": shoe.read_bytes()}, data={"top_k": "3"}).json()
    response = api.classify(shoe, top_k=3)
    assert response.model_dump(exclude_unset=True) == raw
    scores = [s.score for s in response.results[0].top_k]
    assert len(scores) == 3 and scores == sorted(scores, reverse=True)


def test_every_image_form_gives_the_same_answer(api, shoe):
    pixels = np.asarray(Image.open(shoe))
    with open(shoe, "rb") as file:
        forms = [shoe, str(shoe), shoe.read_bytes(), file, Image.open(shoe), pixels, pixels[..., None]]
        response = api.classify(forms)
    first = response.results[0]
    assert len(response.results) == len(forms)
    assert all(result == first for result in response.results)
    assert api.classify(np.stack([pixels[..., None]] * 2)).results == [first, first]  # (N, H, W, C)


def test_translate_one_text_and_several(api, server):
    raw = httpx.post(server.url + "/translate", json={"texts": TEXTS}, timeout=60).json()
    many = api.translate(TEXTS)
    assert many.model_dump(exclude_unset=True) == raw
    assert api.translate(TEXTS[1]).results == [many.results[1]]
    assert (
        api.translate(tuple(TEXTS[:2]), max_new_tokens=3).results[0].target_tokens == many.results[0].target_tokens[:3]
    )


def test_nbest_with_beam_search(api):
    result = api.translate(TEXTS[2], beam_size=4, num_return_sequences=3, length_penalty=1.0).results[0]
    ranks = [h.normalized_score for h in result.nbest]
    assert len(ranks) == 3 and ranks == sorted(ranks, reverse=True)
    assert result.nbest[0].translation == result.translation


def test_the_stream_builds_the_plain_answer_token_by_token(api):
    plain = api.translate(TEXTS[1])
    stream = api.translate_stream(TEXTS[1])
    events = list(stream)
    tokens, done = events[:-1], events[-1]
    assert all(isinstance(e, TokenEvent) for e in tokens) and isinstance(done, DoneEvent)
    assert [e.index for e in tokens] == list(range(len(tokens)))
    assert [e.token for e in tokens] == plain.results[0].target_tokens
    assert "".join(e.delta for e in tokens) == tokens[-1].text == plain.results[0].translation
    assert done.response == stream.result == plain
    assert stream.request_id


def test_a_beam_search_stream_sends_only_its_answer(api):
    events = list(api.translate_stream(TEXTS[0], beam_size=3))
    assert len(events) == 1 and events[0].response == api.translate(TEXTS[0], beam_size=3)


def test_leaving_a_stream_early_closes_it(api):
    stream = api.translate_stream(TEXTS[2])
    first = next(iter(stream))
    stream.close()
    assert isinstance(first, TokenEvent) and stream.response.is_closed
    assert api.health().status == "ok"  # the pool is still usable


@pytest.mark.parametrize(
    ("call", "kind", "code"),
    [
        (lambda api: api.translate("Open the dialog.", model="nope"), NotFoundError, "model_not_found"),
        (lambda api: api.translate("word " * 500), PayloadTooLargeError, "text_too_long"),
        (lambda api: api.translate(" \n"), InvalidFieldError, "invalid_field"),
        (lambda api: api.translate_stream(""), InvalidFieldError, "invalid_field"),
        (lambda api: api.classify(b"not an image"), BadRequestError, "undecodable_image"),
        (lambda api: api.classify(np.zeros((28, 28), np.uint8), top_k=11), InvalidFieldError, "invalid_field"),
        (lambda api: api.attention("no-such-id"), NotFoundError, "attention_not_found"),
        (lambda api: api.attention_png("no-such-id"), NotFoundError, "attention_not_found"),
    ],
    ids=[
        "unknown model",
        "text too long",
        "blank text",
        "empty stream",
        "not an image",
        "top_k too large",
        "unknown attention id",
        "unknown png id",
    ],
)
def test_refusals_raise_their_class_with_code_message_and_request_id(api, call, kind, code):
    with pytest.raises(kind) as caught:
        call(api)
    error = caught.value
    assert error.code == code and error.status == kind.status and error.message
    assert error.request_id and error.request_id in str(error) and code in str(error)


def test_an_unreachable_service_is_a_connection_error(make_client):
    client = make_client(base_url=f"http://127.0.0.1:{free_port()}", max_retries=1)
    slept = client.record_sleeps()
    with pytest.raises(APIConnectionError) as caught:
        client.health()
    assert len(slept) == 1 and caught.value.request_id


def test_image_attention_summary_full_maps_and_heatmap(api, shoe):
    result = api.classify(shoe, top_k=1, return_attention=True, rollout_fusion="max").results[0]
    rollout = result.attention.to_numpy()
    assert result.attention.fusion == "max" and rollout.shape == tuple(result.attention.grid)
    attention = api.attention(result.attention_id, fusion="max")
    assert attention.task == "image-classification" and attention.prediction.label == result.top_k[0].label
    assert attention.expires_at > attention.created_at
    maps = attention.to_numpy()  # (layer, head, query, key), the class token first
    tokens = attention.prefix_tokens + rollout.size
    assert maps.shape[2:] == (tokens, tokens) and np.allclose(maps.sum(axis=-1), 1, atol=1e-4)
    np.testing.assert_allclose(attention.rollout.to_numpy(), rollout, atol=1e-6)
    one = api.attention(result.attention_id, layer=1, head=0)
    (name,) = one.maps
    assert one.maps[name].layers == [1] and one.maps[name].heads == [0]
    np.testing.assert_allclose(one.to_numpy(name)[0, 0], maps[1, 0], atol=1e-6)
    png = api.attention_png(result.attention_id)
    assert Image.open(io.BytesIO(png)).format == "PNG"
    with pytest.raises(InvalidFieldError):
        api.attention(result.attention_id, layer=99)


def test_translation_alignment_full_maps_and_heatmap(api):
    result = api.translate(TEXTS[1], return_attention=True).results[0]
    alignment = result.attention.to_numpy()
    assert alignment.shape == (len(result.attention.target_tokens), len(result.source_tokens))
    np.testing.assert_allclose(alignment.sum(axis=1), 1, atol=1e-4)
    attention = api.attention(result.attention_id)
    assert attention.task == "translation" and attention.source_tokens == result.source_tokens
    assert set(attention.maps) == {"encoder_self_attention", "decoder_self_attention", "cross_attention"}
    with pytest.raises(ValueError, match="several maps"):
        attention.to_numpy()
    cross = api.attention(result.attention_id, kind="cross").maps["cross_attention"]
    assert cross.key_tokens == result.source_tokens
    np.testing.assert_allclose(cross.to_numpy()[-1].mean(axis=0), alignment, atol=1e-5)
    png = api.attention_png(result.attention_id, kind="encoder", layer=0, head=1)
    assert Image.open(io.BytesIO(png)).format == "PNG"


def test_a_client_deadline_reaches_the_service(make_client, server):
    """``deadline=`` is the service's X-Request-Timeout: ample, the answer comes; spent before the work
    starts, the service answers 504 deadline_exceeded and the SDK raises its class."""
    ample = make_client(base_url=server.url, timeout=60, deadline=30)
    assert ample.translate("Saves the current document.").results[0].translation
    spent = make_client(base_url=server.url, timeout=60, deadline=0.000001, max_retries=0)
    with pytest.raises(DeadlineExceededError) as refused:
        spent.translate("Select the cells you want to format and open the dialog.", beam_size=4)
    assert refused.value.status == 504 and refused.value.code == "deadline_exceeded"
