"""The Redis attention store across two real server processes sharing one real ``redis-server``.

Replicas behind a load balancer must serve each other's ids; when Redis goes away, predictions are
still answered (without an id), retrieval answers 503, and both recover when Redis is back.
"""

from __future__ import annotations

import base64

import httpx
import pytest

from tests.service.service_testing import start_subprocess_server


@pytest.fixture(scope="module")
def replicas(redis, both_repository, tmp_path_factory):
    repo = both_repository
    servers = [
        start_subprocess_server(
            tmp_path_factory.mktemp(f"replica{i}"),
            repo,
            attention_store="redis",
            redis_url=redis.url,
            redis_timeout_s=0.3,
        )
        for i in range(2)
    ]
    try:
        for s in servers:
            s.wait_ready()
        yield servers
    finally:
        for s in servers:
            s.stop()


def classify(srv, png: bytes, **options) -> dict:
    r = httpx.post(srv.url + "/classify", json={"images": [base64.b64encode(png).decode()], **options}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["results"][0]


def test_replicas_serve_each_others_ids(replicas, fashion_pngs):
    a, b = replicas
    vit = classify(a, fashion_pngs[0], return_attention=True)
    tr = httpx.post(
        a.url + "/translate", json={"text": "Open the dialog.", "return_attention": True}, timeout=60
    ).json()["results"][0]
    for aid in (vit["attention_id"], tr["attention_id"]):
        here, there = httpx.get(f"{a.url}/attention/{aid}"), httpx.get(f"{b.url}/attention/{aid}")
        assert here.status_code == there.status_code == 200, there.text
        assert here.json() == there.json()
        png = httpx.get(f"{b.url}/attention/{aid}.png")
        assert png.status_code == 200 and png.content.startswith(b"\x89PNG")
    assert httpx.get(f"{b.url}/attention/{vit['attention_id']}").json()["prediction"] == vit["top_k"][0]


def test_without_redis_answers_keep_coming_and_retrieval_says_503_until_it_is_back(replicas, redis, fashion_pngs):
    a, b = replicas
    before = classify(a, fashion_pngs[1], return_attention=True)
    redis.stop()
    try:
        during = classify(a, fashion_pngs[1], return_attention=True)
        assert during["top_k"] == before["top_k"] and during["attention"] == before["attention"]
        assert during["attention_id"] is None and during["attention_error"]["code"] == "attention_store_unavailable"
        r = httpx.get(f"{b.url}/attention/{before['attention_id']}", timeout=10)
        assert r.status_code == 503 and r.json()["error"]["code"] == "attention_store_unavailable"
        assert httpx.get(f"{a.url}/readyz").status_code == 200  # the models still serve
        assert classify(b, fashion_pngs[2])["top_k"]  # and requests without attention never touch the store
        tr = httpx.post(a.url + "/translate", json={"text": "Yes.", "return_attention": True}, timeout=60)
        assert tr.status_code == 200 and tr.json()["results"][0]["attention_id"] is None
    finally:
        redis.start()  # same port: the clients reconnect by themselves
    after = classify(a, fashion_pngs[1], return_attention=True)
    assert httpx.get(f"{b.url}/attention/{after['attention_id']}").status_code == 200
