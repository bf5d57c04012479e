"""The response cache on real servers (``python -m service`` on the shipped models) sharing a real
``redis-server``.

What a user relies on: an answer asked for again is the same answer, from the cache, by whichever
replica; a batch of which some texts are cached decodes only the others; entries expire; requests
for attention and streams are never answered from it; API keys share entries or not as configured;
and with Redis gone every request is still answered, the failures counted.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import time

import httpx
import pytest
import redis as redis_client

from tests.conftest import ROOT
from tests.service.service_testing import free_port, metric_value, start_subprocess_server

SHIPPED = ROOT / "models"
SAMPLES = sorted((SHIPPED / "vit" / "1").glob("sample-*.png"))
KEY_A, KEY_B = "cache-key-a", "cache-key-b"
GREEDY = {"beam_size": 1}  # options every test may change; greedy keeps the tests quick


@pytest.fixture(scope="module")
def servers(redis, tmp_path_factory):
    """Two replicas with the cache on, one with a 2 s TTL, and two with API keys (scope shared, and key)."""
    hashes = json.dumps([hashlib.sha256(k.encode()).hexdigest() for k in (KEY_A, KEY_B)])
    # a generous budget: five services share two cores here, and these tests are about what is kept, not how fast
    common = {
        "response_cache": "true",
        "redis_url": redis.url,
        "redis_timeout_s": "0.3",
        "response_cache_budget_ms": "300",
    }
    variants = {
        "a": {},
        "b": {"grpc_port": str(free_port())},
        "short": {"response_cache_ttl_s": "2"},
        "shared keys": {"api_key_hashes": hashes},
        "keys apart": {"api_key_hashes": hashes, "response_cache_scope": "key"},
    }
    started = {
        name: start_subprocess_server(tmp_path_factory.mktemp("cache"), SHIPPED, **common, **extra)
        for name, extra in variants.items()
    }
    try:
        for srv in started.values():
            srv.wait_ready()
        yield started
    finally:
        for srv in started.values():
            srv.stop()


def translate(srv, headers=None, **body) -> httpx.Response:
    r = httpx.post(srv.url + "/translate", json=body, headers=headers, timeout=120)
    assert r.status_code == 200, r.text
    return r


def metric(srv, name: str, **labels: str) -> float:
    return metric_value(httpx.get(srv.url + "/metrics", timeout=10).text, name, **labels)


def lookups(srv, operation: str) -> dict[str, float]:
    text = httpx.get(srv.url + "/metrics", timeout=10).text
    return {
        result: metric_value(text, "attnserve_response_cache_lookups_total", operation=operation, result=result)
        for result in ("hit", "miss", "error")
    }


def decoded(srv) -> float:
    """Sentences the translator answered (each single-sentence text is one)."""
    return metric(srv, "attnserve_model_request_duration_seconds_count", model="translator", outcome="success")


def test_a_translation_asked_again_is_the_same_answer_from_the_cache_of_any_replica(servers):
    a, b = servers["a"], servers["b"]
    texts = ["Saves the current document under a new name.", "Closes the window."]
    first = translate(a, texts=texts, **GREEDY)
    assert first.headers["x-cache"] == "miss" and first.headers["x-cache-hits"] == "0/2"
    before = decoded(a)
    again = translate(a, texts=texts, **GREEDY)
    assert again.headers["x-cache"] == "hit" and again.headers["x-cache-hits"] == "2/2"
    assert again.content == first.content  # byte for byte
    assert decoded(a) == before  # nothing was decoded
    elsewhere = translate(b, texts=texts, **GREEDY)
    assert elsewhere.headers["x-cache"] == "hit" and elsewhere.content == first.content
    assert lookups(b, "translate")["hit"] >= 2


def test_a_partly_cached_batch_decodes_only_the_texts_not_cached(servers):
    a = servers["a"]
    known = ["Opens the print dialog.", "Select a color.", "Delete the selected rows."]
    new = ["Insert a new sheet.", "Shows the grid."]
    made = translate(a, texts=known, **GREEDY).json()["results"]
    before, hits = decoded(a), lookups(a, "translate")
    r = translate(a, texts=[known[0], new[0], known[1], new[1], known[2]], **GREEDY)
    assert r.headers["x-cache"] == "partial" and r.headers["x-cache-hits"] == "3/5"
    assert decoded(a) - before == 2  # only the two new texts reached the decoder
    after = lookups(a, "translate")
    assert (after["hit"] - hits["hit"], after["miss"] - hits["miss"]) == (3, 2)
    results = r.json()["results"]
    assert [results[0], results[2], results[4]] == made
    alone = [translate(a, text=t, **GREEDY).json()["results"][0] for t in new]
    assert [results[1], results[3]] == alone  # and the new ones are what each gets on its own


def test_a_text_missed_by_concurrent_requests_is_decoded_once_and_each_gets_its_answer(servers):
    a = servers["a"]
    before = decoded(a)
    body = {"text": "Merges the selected cells into one.", **GREEDY}

    async def at_once() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=a.url, timeout=120) as client:
            return await asyncio.gather(*(client.post("/translate", json=body) for _ in range(6)))

    answers = asyncio.run(at_once())
    assert all(r.status_code == 200 for r in answers)
    assert len({json.dumps(r.json()["results"]) for r in answers}) == 1
    assert decoded(a) - before == 1  # one decode; the others waited for it
    assert translate(a, **body).headers["x-cache"] == "hit"


def test_a_text_asked_twice_in_one_request_is_decoded_once(servers):
    a = servers["a"]
    before = decoded(a)
    r = translate(a, texts=["Rename the file.", "Rename the file."], **GREEDY)
    assert decoded(a) - before == 1
    one, two = r.json()["results"]
    assert one == two and r.headers["x-cache"] == "miss"


@pytest.mark.parametrize(
    "options",
    [
        {"beam_size": 2},
        {"beam_size": 2, "num_return_sequences": 2},
        {"beam_size": 2, "length_penalty": 0.5},
        {"beam_size": 1, "max_new_tokens": 3},
        {"beam_size": 1, "protect_placeholders": False},
    ],
    ids=["beam", "nbest", "length_penalty", "max_new_tokens", "placeholders"],
)
def test_another_option_is_another_entry(servers, options):
    a = servers["a"]
    text = "Copies %s to the clipboard."
    translate(a, text=text, **GREEDY)
    first = translate(a, text=text, **options)
    assert first.headers["x-cache"] == "miss", options
    again = translate(a, text=text, **options)
    assert again.headers["x-cache"] == "hit" and again.content == first.content


def test_entries_expire_after_the_ttl(servers, redis):
    short, a = servers["short"], servers["a"]
    r = redis_client.Redis.from_url(redis.url)
    text = "Exports the chart as an image."
    translate(a, text="Imports the chart from a file.", **GREEDY)
    translate(short, text=text, **GREEDY)
    ttls = [r.pttl(k) for k in r.scan_iter("attnserve:response:translate:*")]
    assert any(0 < t <= 2000 for t in ttls), ttls  # the short replica's entry: 2 s
    assert any(t > 86_000_000 for t in ttls), ttls  # the others': a day
    time.sleep(2.5)
    assert translate(short, text=text, **GREEDY).headers["x-cache"] == "miss"
    r.close()


def test_requests_for_attention_and_streams_are_never_cached(servers):
    a = servers["a"]
    text = "Inserts a page break."
    before = lookups(a, "translate")
    ids = []
    for _ in range(2):
        r = translate(a, text=text, return_attention=True, **GREEDY)
        assert r.headers["x-cache"] == "bypass"
        ids.append(r.json()["results"][0]["attention_id"])
    assert all(ids) and ids[0] != ids[1]  # each request stored its own maps
    with httpx.stream("POST", a.url + "/translate", json={"text": text, "stream": True}, timeout=60) as s:
        assert s.status_code == 200 and s.headers["x-cache"] == "bypass"
        events = [line for line in s.iter_lines() if line.startswith("event: ")]
    assert events[-1] == "event: done"
    assert lookups(a, "translate") == before  # none of them looked anything up
    png = SAMPLES[0].read_bytes()
    r = httpx.post(a.url + "/classify", files={"file": png}, data={"return_attention": "true"}, timeout=60)
    assert r.status_code == 200 and r.headers["x-cache"] == "bypass" and r.json()["results"][0]["attention_id"]


def classify_json(srv, pngs: list[bytes], headers=None, **options) -> httpx.Response:
    images = [base64.b64encode(p).decode() for p in pngs]
    r = httpx.post(srv.url + "/classify", json={"images": images, **options}, headers=headers, timeout=60)
    assert r.status_code == 200, r.text
    return r


def test_an_image_classified_again_is_the_same_answer_whatever_its_encoding_or_top_k(servers):
    a, b = servers["a"], servers["b"]
    png = SAMPLES[1].read_bytes()
    first = classify_json(a, [png], top_k=3)
    assert first.headers["x-cache"] == "miss"
    again = classify_json(b, [png], top_k=3)
    assert again.headers["x-cache"] == "hit" and again.content == first.content
    form = httpx.post(a.url + "/classify", files={"file": png}, data={"top_k": "10"}, timeout=60)
    assert form.status_code == 200 and form.headers["x-cache"] == "hit"  # multipart, all ten labels: one entry
    assert form.json()["results"][0]["top_k"][:3] == first.json()["results"][0]["top_k"]
    batch = classify_json(a, [png, SAMPLES[2].read_bytes()], top_k=3)
    assert batch.headers["x-cache"] == "partial" and batch.headers["x-cache-hits"] == "1/2"
    assert batch.json()["results"][0] == first.json()["results"][0]


def test_a_hit_is_refused_what_a_miss_would_be(servers):
    a = servers["a"]
    png = SAMPLES[3].read_bytes()
    classify_json(a, [png])
    r = httpx.post(a.url + "/classify", json={"images": [base64.b64encode(png).decode()], "top_k": 11}, timeout=60)
    assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_field"
    r = httpx.post(a.url + "/translate", json={"texts": ["Closes the window.", " "]}, timeout=60)
    assert r.status_code == 422


def test_the_open_inference_protocol_shares_the_entries(servers):
    a, b = servers["a"], servers["b"]
    png = SAMPLES[4].read_bytes()
    native = classify_json(a, [png], top_k=10).json()["results"][0]["top_k"]
    before = lookups(b, "classify")
    body = {"inputs": [{"name": "images", "shape": [1], "datatype": "BYTES", "data": [base64.b64encode(png).decode()]}]}
    r = httpx.post(b.url + "/v2/models/vit/infer", json=body, timeout=60)
    assert r.status_code == 200, r.text
    (out,) = r.json()["outputs"]
    assert lookups(b, "classify")["hit"] - before["hit"] == 1
    assert {t["index"]: t["score"] for t in native} == dict(enumerate(out["data"]))
    text = "Prints the current page."
    made = translate(a, text=text).json()["results"][0]["translation"]  # the model's default beam, as OIP's
    before = lookups(b, "translate")
    body = {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": [text]}]}
    r = httpx.post(b.url + "/v2/models/translator/infer", json=body, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["outputs"][0]["data"] == [made]
    assert lookups(b, "translate")["hit"] - before["hit"] == 1


def test_grpc_shares_the_entries(servers):
    """Triton's gRPC client on one replica: a text and an image another replica answered over HTTP are hits."""
    import numpy as np
    import tritonclient.grpc as grpcclient

    a, b = servers["a"], servers["b"]
    text, png = "Quits the application.", SAMPLES[6].read_bytes()
    made = translate(a, text=text).json()["results"][0]["translation"]
    native = classify_json(a, [png], top_k=10).json()["results"][0]["top_k"]
    before = lookups(b, "translate")["hit"], lookups(b, "classify")["hit"]
    client = grpcclient.InferenceServerClient(b.grpc)
    try:
        texts = grpcclient.InferInput("text", [1], "BYTES")
        texts.set_data_from_numpy(np.array([text.encode()], dtype=object))
        translated = client.infer("translator", [texts]).as_numpy("translation")
        images = grpcclient.InferInput("images", [1], "BYTES")
        images.set_data_from_numpy(np.array([png], dtype=object))
        probabilities = client.infer("vit", [images]).as_numpy("probabilities")[0]
    finally:
        client.close()
    assert [t.decode() for t in translated] == [made]
    assert {t["index"]: t["score"] for t in native} == dict(enumerate(probabilities.tolist()))
    assert (lookups(b, "translate")["hit"], lookups(b, "classify")["hit"]) == (before[0] + 1, before[1] + 1)


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_keys_share_entries_unless_the_scope_is_the_key(servers):
    shared, apart = servers["shared keys"], servers["keys apart"]
    text = "Sorts the selected cells."
    assert (
        translate(shared, headers=bearer(KEY_A), text=text, **GREEDY).headers["x-cache"] == "miss"
    )  # asked first here
    assert translate(shared, headers=bearer(KEY_B), text=text, **GREEDY).headers["x-cache"] == "hit"
    text = "Sorts the selected rows."
    first = translate(apart, headers=bearer(KEY_A), text=text, **GREEDY)
    assert first.headers["x-cache"] == "miss"
    assert translate(apart, headers=bearer(KEY_B), text=text, **GREEDY).headers["x-cache"] == "miss"
    again = translate(apart, headers=bearer(KEY_A), text=text, **GREEDY)
    assert again.headers["x-cache"] == "hit" and again.content == first.content


def test_without_redis_every_request_is_answered_and_the_errors_counted(servers, redis):
    """Last in this module: it stops the module's Redis, then starts it again (empty)."""
    a = servers["a"]
    text, png = "Adds a comment to the cell.", SAMPLES[5].read_bytes()
    cached = translate(a, text=text, **GREEDY)
    classify_json(a, [png])
    failures = metric(a, "attnserve_response_cache_failures_total", call="get")
    errors = lookups(a, "translate")["error"]
    redis.stop()
    try:
        during = [translate(a, text=text, **GREEDY) for _ in range(3)]
        assert all(r.headers["x-cache"] == "error" and r.content == cached.content for r in during)
        assert classify_json(a, [png]).headers["x-cache"] == "error"
        assert lookups(a, "translate")["error"] - errors == 3
        assert metric(a, "attnserve_response_cache_failures_total", call="get") > failures
        assert httpx.get(a.url + "/readyz", timeout=10).status_code == 200
        warnings = [line for line in a.logs() if "answering without the cache" in line.get("message", "")]
        assert len(warnings) == 1, warnings  # rate-limited: once a minute however many requests fail
    finally:
        redis.start()  # same port, empty: the service reconnects by itself
    time.sleep(1.2)  # past the second during which a failed Redis is left alone
    assert translate(a, text=text, **GREEDY).headers["x-cache"] == "miss"
    assert translate(a, text=text, **GREEDY).headers["x-cache"] == "hit"
