"""Behaviour at the edges of serving, against uvicorn in a thread so a test can hold the model still.

The real warm-up and the real onnxruntime run are wrapped with a gate (a threading.Event) that
the test opens; that is how "still warming up", "queue full" and "client left while queued" are
reached deterministically, without sleeping and hoping.
"""

from __future__ import annotations

import base64
import logging
import socket
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from service.classifier import Classifier
from service.logs import RequestIdFilter
from tests.service.service_testing import metric_value, wait_until


def body(pngs: list[bytes], **options) -> dict:
    return {"images": [base64.b64encode(p).decode() for p in pngs], **options}


class GatedRun:
    """Wraps ``Classifier.run``: records batch sizes, can hold a batch in flight or fail the next one."""

    def __init__(self, monkeypatch) -> None:
        self.open = threading.Event()
        self.open.set()
        self.entered = threading.Event()
        self.sizes: list[int] = []
        self.fail_next = False
        real = Classifier.run

        def run(classifier, x):
            self.entered.set()
            self.open.wait(timeout=60)
            if self.fail_next:
                self.fail_next = False
                raise RuntimeError("simulated onnxruntime failure: secret internals")
            self.sizes.append(len(x))
            return real(classifier, x)

        monkeypatch.setattr(Classifier, "run", run)

    def hold(self) -> None:
        self.entered.clear()
        self.open.clear()


@pytest.fixture
def gated_run(monkeypatch):
    gate = GatedRun(monkeypatch)
    yield gate
    gate.open.set()


class ListHandler(logging.Handler):
    """Keeps the records, each with the request id bound when it was logged, as the service's handlers do
    (whether or not the service installed its own: with this one attached first, it does not)."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []
        self.addFilter(RequestIdFilter())

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_readiness_is_503_until_warm_up_finished(thread_server, monkeypatch, fashion_pngs):
    warming, release = threading.Event(), threading.Event()
    real_warm_up = Classifier.warm_up

    def gated_warm_up(classifier, *args, **kwargs):
        warming.set()
        release.wait(timeout=60)
        return real_warm_up(classifier, *args, **kwargs)

    monkeypatch.setattr(Classifier, "warm_up", gated_warm_up)
    try:
        with thread_server() as srv:
            assert warming.wait(timeout=60)
            not_ready = srv.get("/readyz")
            assert not_ready.status_code == 503
            assert not_ready.headers["retry-after"] == "1"
            assert not_ready.json()["error"]["code"] == "not_ready"
            assert "vit/1: warming" in not_ready.json()["error"]["message"]
            assert srv.get("/healthz").status_code == 200  # alive, just not ready
            early = httpx.post(srv.url + "/classify", json=body(fashion_pngs[:1]))
            assert early.status_code == 503 and early.json()["error"]["code"] == "model_not_ready"
            assert srv.get("/models").json()["models"][0]["status"] == "warming"
            release.set()
            srv.wait_ready()
            assert httpx.post(srv.url + "/classify", json=body(fashion_pngs[:1])).status_code == 200
    finally:
        release.set()


def test_a_full_queue_answers_503_with_retry_after_and_the_queued_requests_complete(
    thread_server, gated_run, fashion_pngs
):
    settings = {
        "max_batch_size": 2,
        "max_images_per_request": 2,
        "max_queue_images": 2,
        "retry_after_s": 3,
        "model_instances": 1,
    }  # one batch held in flight, the next one queued behind it
    with thread_server(**settings) as srv, ThreadPoolExecutor(4) as pool:
        srv.wait_ready()
        gated_run.hold()
        running = pool.submit(httpx.post, srv.url + "/classify", json=body(fashion_pngs[:1]), timeout=60)
        assert gated_run.entered.wait(timeout=60)
        queued = pool.submit(httpx.post, srv.url + "/classify", json=body(fashion_pngs[1:3]), timeout=60)
        wait_until(
            lambda: metric_value(srv.get("/metrics").text, "attnserve_queue_images", model="vit") == 2,
            what="two images queued",
        )
        refused = httpx.post(srv.url + "/classify", json=body(fashion_pngs[3:4]))
        gated_run.open.set()
        assert running.result().status_code == 200 and queued.result().status_code == 200
    assert refused.status_code == 503
    assert refused.headers["retry-after"] == "3"
    assert refused.json()["error"]["code"] == "overloaded"


def test_a_failing_batch_answers_500_json_and_the_service_keeps_serving(thread_server, gated_run, fashion_pngs):
    handler = ListHandler()
    logging.getLogger("attnserve").addHandler(handler)
    try:
        with thread_server() as srv:
            srv.wait_ready()
            gated_run.fail_next = True
            failed = httpx.post(srv.url + "/classify", json=body(fashion_pngs[:2]), headers={"X-Request-ID": "fail-1"})
            after = httpx.post(srv.url + "/classify", json=body(fashion_pngs[:2]))
            metrics = srv.get("/metrics").text
    finally:
        logging.getLogger("attnserve").removeHandler(handler)
    logged = [r for r in handler.records if r.exc_info and "fail-1" in r.getMessage()]
    assert logged and "secret internals" in str(logged[0].exc_info[1])  # the cause is in the log, by request id
    assert failed.status_code == 500
    assert failed.json() == {"error": {"code": "inference_failed", "message": failed.json()["error"]["message"]}}
    assert "secret internals" not in failed.text and "Traceback" not in failed.text
    assert after.status_code == 200 and len(after.json()["results"]) == 2
    assert metric_value(metrics, "attnserve_failed_batches_total", model="vit") == 1


def test_an_unexpected_exception_is_a_json_500_with_the_traceback_only_in_the_log(
    thread_server, monkeypatch, fashion_pngs
):
    def broken_top_k(self, *args):
        raise ValueError("secret internals")

    monkeypatch.setattr(Classifier, "top_k", broken_top_k)
    handler = ListHandler()
    logging.getLogger("attnserve").addHandler(handler)
    try:
        with thread_server() as srv:
            srv.wait_ready()
            r = httpx.post(srv.url + "/classify", json=body(fashion_pngs[:1]), headers={"X-Request-ID": "boom-1"})
            healthy = srv.get("/healthz")
    finally:
        logging.getLogger("attnserve").removeHandler(handler)
    assert r.status_code == 500 and r.json()["error"]["code"] == "internal_error"
    assert "secret" not in r.text and "Traceback" not in r.text
    assert r.headers["x-request-id"] == "boom-1"
    assert healthy.status_code == 200
    logged = [rec for rec in handler.records if rec.exc_info and getattr(rec, "request_id", None) == "boom-1"]
    assert logged and "secret internals" in str(logged[0].exc_info[1])


def raw_post(url: str, payload: bytes) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)))
    head = (
        f"POST /classify HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\n\r\n"
    )
    sock.sendall(head.encode() + payload)
    return sock


def test_a_request_whose_client_left_is_dropped_before_compute(thread_server, gated_run, fashion_pngs):
    import json

    with thread_server(model_instances=1) as srv, ThreadPoolExecutor(2) as pool:  # the second request must queue
        srv.wait_ready()
        gated_run.sizes.clear()
        gated_run.hold()
        running = pool.submit(httpx.post, srv.url + "/classify", json=body(fashion_pngs[:1]), timeout=60)
        assert gated_run.entered.wait(timeout=60)
        leaving = raw_post(srv.url, json.dumps(body(fashion_pngs[1:4])).encode())
        wait_until(
            lambda: metric_value(srv.get("/metrics").text, "attnserve_queue_images", model="vit") == 3,
            what="the leaving client's request to be queued",
        )
        leaving.close()
        wait_until(
            lambda: (
                metric_value(srv.get("/metrics").text, "attnserve_http_requests_total", route="/classify", status="499")
                == 1
            ),
            what="the disconnect to be seen",
        )
        gated_run.open.set()
        assert running.result().status_code == 200
        wait_until(
            lambda: metric_value(srv.get("/metrics").text, "attnserve_dropped_requests_total", model="vit") == 1,
            what="the abandoned request to be dropped",
        )
        assert httpx.post(srv.url + "/classify", json=body(fashion_pngs[:2])).status_code == 200
    assert gated_run.sizes == [1, 2]  # the first request, then the last one: the 3 abandoned images never ran
