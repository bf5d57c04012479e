"""The shared attention store full: a real ``redis-server`` with 256 KiB of room that evicts nothing refuses
every write once full (``OOM command not allowed``). Requests asking for attention are still answered,
their maps' id null with the reason, and the refusals are counted."""

from __future__ import annotations

import shutil
import subprocess

import httpx
import redis as redis_client

from benchmarks.delay_proxy import DelayProxy
from tests.faults.drill import ReadyWatch, judge, load, metrics, record
from tests.faults.test_engine_faults import SETTINGS, fault_free
from tests.service.service_testing import RedisServer, free_port, serving, wait_until

ROOM = 256 << 10  # bytes Redis may hold beyond what it uses empty


def _redis_answers(port: int) -> bool:
    try:
        return bool(redis_client.Redis(port=port, socket_timeout=0.5).ping())
    except redis_client.RedisError:
        return False


def test_a_full_attention_store_answers_every_request_without_its_maps(
    both_repository, tmp_path, translate_jobs, classify_jobs
):
    port = free_port()
    redis = subprocess.Popen(
        [shutil.which("redis-server"), "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        + ["--dir", str(tmp_path), "--maxmemory-policy", "noeviction"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_until(lambda: _redis_answers(port), timeout=20, what="redis-server")
    client = redis_client.Redis(port=port)
    client.config_set("maxmemory", client.info("memory")["used_memory"] + ROOM)  # room for a few records
    jobs = [(path, {**body, "return_attention": True}) for path, body in translate_jobs + classify_jobs]
    try:
        settings = {**SETTINGS, "attention_store": "redis", "redis_url": f"redis://127.0.0.1:{port}/0"}
        with serving(tmp_path, both_repository, **settings) as srv:
            wait_until(lambda: srv.get("/readyz").status_code == 200)
            with ReadyWatch(srv.url) as watch:
                answers = load(srv.url, jobs, clients=8, per_client=12)
            plain = [(path, {k: v for k, v in body.items() if k != "return_attention"}) for path, body in jobs]
            unchanged = fault_free(srv.url, plain)
            counted = metrics(srv.url, "attnserve_attention_store_failures_total")
            with httpx.Client(base_url=srv.url, timeout=30) as client:
                ids = [r["attention_id"] for a in answers if a.status == 200 for r in a.payload["results"]]
                stored = [i for i in ids if i]
                fetched = client.get(f"/attention/{stored[0]}") if stored else None
    finally:
        redis.terminate()
        redis.wait(10)

    refused = [
        r
        for a in answers
        if a.status == 200
        for r in a.payload["results"]
        if r.get("attention_id") is None and r.get("attention_error")
    ]
    outcome = judge(
        "attention-store-full (Redis `maxmemory` 256 KiB above empty, `noeviction`)", answers, set(), unchanged
    )
    outcome.hit = []  # nobody is failed: the results without maps are the ones the full store refused
    outcome.not_ready_s, outcome.metrics = watch.not_ready_s(), {"maps_refused": len(refused), **counted}
    record(outcome)
    assert refused, "the store never filled up"
    messages = {r["attention_error"]["message"] for r in refused}
    assert all("refused the maps" in m and "maxmemory" in m for m in messages), messages
    assert not outcome.others_failed and not outcome.others_wrong
    assert counted["attnserve_attention_store_failures_total"] >= len(refused)
    assert stored and fetched.status_code == 200  # what fitted before it filled up is served
    assert watch.not_ready_s() == 0.0


CLIENTS = 4


def test_a_redis_slower_than_the_budget_is_left_alone_and_used_again_once_fast(
    both_repository, tmp_path, translate_jobs
):
    """Redis answers 300 ms late (a delaying TCP proxy in front of a real one): requests are answered as without the
    cache (X-Cache: error), each lookup given up after the 50 ms budget, at most one a second; once Redis is fast
    again, the cache serves hits."""
    (tmp_path / "redis").mkdir()
    redis = RedisServer(tmp_path / "redis")
    redis.start()
    try:
        with DelayProxy(redis.port, 0.3) as proxy:
            settings = {**SETTINGS, "response_cache": "true", "redis_url": proxy.url}
            with serving(tmp_path, both_repository, **settings) as srv:
                with ReadyWatch(srv.url) as watch:
                    answers = load(srv.url, translate_jobs, clients=CLIENTS, per_client=40)
                counted = metrics(srv.url, "attnserve_response_cache_failures_total")
                proxy.delay = 0.0
                wait_until(lambda: _cached(srv.url, translate_jobs[0][1]) == "hit", timeout=10, what="a hit")
                unchanged = fault_free(srv.url, translate_jobs)
    finally:
        redis.stop()
    outcome = judge(
        "redis-slow (300 ms a reply, cache budget 50 ms)",
        answers,
        set(),
        unchanged,
    )
    seconds = max(a.ended for a in answers) - min(a.sent for a in answers)
    errors = sum(a.cache == "error" for a in answers)
    failures = counted["attnserve_response_cache_failures_total"]
    outcome.not_ready_s = watch.not_ready_s()
    outcome.metrics = {"x_cache_error": errors, "response_cache_failures_total": failures}
    record(outcome)
    assert not outcome.others_failed and not outcome.others_wrong
    # Redis is tried at most once a second (by the requests that start before the first gives up, at most one per
    # client), each try a failed lookup or store
    tries = CLIENTS * (seconds + 1)
    assert errors >= len(answers) - tries, (errors, len(answers), seconds)
    assert 1 <= failures <= 2 * tries
    assert watch.not_ready_s() == 0.0


def _cached(url: str, body: dict) -> str | None:
    return httpx.post(url + "/translate", json=body, timeout=30).headers.get("x-cache")
