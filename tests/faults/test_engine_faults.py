"""Faults inside the engines, injected into ``python -m service`` under load (``ATTNSERVE_FAULTS``): the requests
a fault hits get a clear error naming them, every other request in flight gets its fault-free answer, the
service stays (or is back) ready within a bound, and the metrics say what happened."""

from __future__ import annotations

import json
from collections.abc import Callable

import httpx
import pytest

from tests.faults.drill import Answer, ReadyWatch, judge, load, metrics, named_in_log, record
from tests.service.service_testing import serving, wait_until

SETTINGS = {
    "max_new_tokens": "24",  # the tiny translator rambles: its sentences end at this cap
    "decoding_lanes": "2",
    "model_instances": "2",
    "max_queue_delay_ms": "1",
}
COUNTERS = (
    "attnserve_failed_batches_total",
    "attnserve_engine_restarts_total",
    "attnserve_deadline_exceeded_requests_total",
)


def fault_free(url: str, jobs: list[tuple[str, dict]]) -> Callable[[Answer], bool]:
    """Whether an answer is its job's fault-free one, each job asked once the faults are spent (with or
    without attention maps: the answer is the same)."""
    expected = {}
    with httpx.Client(base_url=url, timeout=60) as client:
        for path, body in jobs:
            r = client.post(path, json=body)
            assert r.status_code == 200, r.text
            expected[_key(body)] = essence(path, r.json())
    return lambda a: essence(a.path, a.payload) == expected[_key(a.body)]


def _key(body: dict) -> str:
    return json.dumps({k: v for k, v in body.items() if k != "return_attention"}, sort_keys=True)


def essence(path: str, payload: dict) -> list:
    """What must not change with a fault elsewhere: translations and their tokens; labels and their scores."""
    if path == "/translate":
        return [(r["translation"], r["target_tokens"]) for r in payload["results"]]
    return [[(p["label"], round(p["score"], 4)) for p in r["top_k"]] for r in payload["results"]]


# (fault plan, jobs fixture, log line naming the requests it hits, code those get, extra settings)
DRILLS = {
    "decoder-raise": ("decoder:raise@40", "translate_jobs", "decoder step failed", "inference_failed", {}),
    # the encoder runs to decode, and again for the attention that puts markup and spans back
    "encoder-memory": (
        "encoder:memory@6",
        "translate_jobs",
        ("encoder failed", "attention graphs failed"),
        "inference_failed",
        {},
    ),
    "lane-raise": ("lane:raise@25", "translate_jobs", "failed; answering its", "inference_failed", {}),
    "classifier-memory": ("model:memory@5", "classify_jobs", "images failed in model", "inference_failed", {}),
    "instance-thread-raise": (
        "batcher:raise@5",
        "classify_jobs",
        "an instance thread of model",
        "inference_failed",
        {},
    ),
}


@pytest.mark.parametrize("name", list(DRILLS))
def test_a_fault_fails_only_the_requests_it_hits(name, both_repository, tmp_path, request):
    plan, jobs_fixture, phrase, code, extra = DRILLS[name]
    jobs = request.getfixturevalue(jobs_fixture)
    with serving(tmp_path, both_repository, faults=plan, **SETTINGS, **extra) as srv:
        with ReadyWatch(srv.url) as watch:
            answers = load(srv.url, jobs, clients=8, per_client=8)
        unchanged = fault_free(srv.url, jobs)
        counted = metrics(srv.url, *COUNTERS)
        hit_ids = named_in_log(srv.logs(), *([phrase] if isinstance(phrase, str) else phrase))
    outcome = judge(
        f"{name} (`{plan}`)",
        answers,
        hit_ids,
        unchanged,
    )
    outcome.not_ready_s, outcome.metrics = watch.not_ready_s(), counted
    record(outcome)
    assert outcome.hit, f"the fault {plan} hit no request"
    for a in outcome.hit:  # a clear error that names the request
        assert a.status == 500 and a.code == code and a.request_id in a.payload["error"]["message"], a
    assert not outcome.others_failed, [(a.status, a.payload) for a in outcome.others_failed]
    assert not outcome.others_wrong, [a.body for a in outcome.others_wrong]
    assert watch.not_ready_s() == 0.0  # one failure: the model never stops being ready
    restarted = counted["attnserve_engine_restarts_total"]
    assert restarted == (1 if plan.startswith(("lane", "batcher")) else 0)
    # a failed onnxruntime run is a failed batch (the encoder's may be in the engine or the attention pass)
    assert counted["attnserve_failed_batches_total"] == (1 if plan.startswith(("model", "decoder", "encoder")) else 0)


def test_a_stalled_decoder_run_costs_only_its_batch_its_deadline(both_repository, tmp_path, translate_jobs):
    """One decoder run takes 4 s more: the requests in that lane past their 1.5 s deadline get 504 at their
    deadline; the other lane goes on answering; nothing is lost and the service stays ready."""
    plan = "decoder:stall=4@40"
    with serving(tmp_path, both_repository, faults=plan, **SETTINGS) as srv:
        with ReadyWatch(srv.url) as watch:
            answers = load(srv.url, translate_jobs, 8, 8, headers={"X-Request-Timeout": "1.5"})
        unchanged = fault_free(srv.url, translate_jobs)
        counted = metrics(srv.url, *COUNTERS)
    hit_ids = {a.request_id for a in answers if a.status == 504}
    outcome = judge(
        f"decoder-stall (`{plan}`, 1.5 s deadlines)",
        answers,
        hit_ids,
        unchanged,
    )
    outcome.not_ready_s, outcome.metrics = watch.not_ready_s(), counted
    record(outcome)
    assert counted["attnserve_deadline_exceeded_requests_total"] == len(outcome.hit)
    assert outcome.hit and all(a.code == "deadline_exceeded" and a.ended - a.sent < 3.0 for a in outcome.hit)
    assert not outcome.others_failed and not outcome.others_wrong
    assert len(outcome.others) > len(outcome.hit) and watch.not_ready_s() == 0.0


def test_a_lane_failing_again_and_again_makes_the_model_not_ready_then_ready_again(
    both_repository, tmp_path, translate_jobs
):
    """Six hops in a row raise (limit 3 in 3 s): /readyz says 503 naming the engine while the lanes back off,
    requests that wait are served once a lane is back, and the model is ready again 3 s after the last."""
    plan = "lane:raise@25x6"
    settings = {**SETTINGS, "engine_restart_limit": "3", "engine_restart_window_s": "3"}
    with serving(tmp_path, both_repository, faults=plan, **settings) as srv:
        with ReadyWatch(srv.url) as watch:
            answers = load(srv.url, translate_jobs, 8, 8)
            wait_until(lambda: srv.get("/readyz").status_code == 200, timeout=30, what="ready again")
        unchanged = fault_free(srv.url, translate_jobs)
        counted = metrics(srv.url, *COUNTERS)
        hit_ids = named_in_log(srv.logs(), "failed; answering its")
    outcome = judge(
        f"lane-raise-repeatedly (`{plan}`, limit 3 in 3 s)",
        answers,
        hit_ids,
        unchanged,
    )
    outcome.not_ready_s, outcome.metrics = watch.not_ready_s(), counted
    record(outcome)
    assert counted["attnserve_engine_restarts_total"] == 6
    assert outcome.hit and all(a.status == 500 and a.request_id in a.payload["error"]["message"] for a in outcome.hit)
    assert not outcome.others_failed and not outcome.others_wrong
    assert 0.0 < watch.not_ready_s() < 20.0, watch.not_ready_s()
    assert any("translator/1: its engine failed" in r and "restarting with backoff" in r for r in watch.reasons)
