"""A load balancer's 502 and 504 in front of the service, from a real HTTP server, for both clients.

HAProxy answers 502 when a replica closes the connection without an answer (killed, restarting) and
the request was too large for it to replay, and 504 when a replica does not answer in time; every call
of the SDK is idempotent, so it sends the request again, the same bytes under the same request id. The
service's own 504 ``deadline_exceeded`` and its 500s are not retried. The server here is the standard
library's, on a loopback port, answering HAProxy's own error bodies (``deploy/haproxy.cfg``) before the
service's answer.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from attnserve_client import DeadlineExceededError, InternalServerError

HAPROXY_502 = {"error": {"code": "internal_error", "message": "the replica closed the connection without an answer"}}
HAPROXY_504 = {"error": {"code": "internal_error", "message": "the replica did not answer in time"}}
DEADLINE = {"error": {"code": "deadline_exceeded", "message": "the request's deadline passed"}}
TRANSLATED = {
    "model": "translator",
    "version": "3",
    "results": [
        {
            "translation": "Öffnen Sie die Datei.",
            "source_tokens": ["▁Open", "▁the", "▁file", ".", "</s>"],
            "target_tokens": ["▁Öffnen", "▁Sie", "▁die", "▁Datei", "."],
            "finished": True,
            "placeholders": [],
            "sentences": [{"source": "Open the file.", "translation": "Öffnen Sie die Datei.", "finished": True}],
        }
    ],
}
CLASSIFIED = {
    "model": "vit",
    "version": "1",
    "results": [{"top_k": [{"label": "Ankle boot", "index": 9, "score": 0.9}]}],
}


class Gateway(ThreadingHTTPServer):
    """Answers each POST with the next of ``failures`` (status, body), then ``answer`` for good; records
    every request it received (path, headers, body)."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.failures: list[tuple[int, dict]] = []
        self.answer: dict = TRANSLATED
        self.received: list[tuple[str, dict[str, str], bytes]] = []
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def script(self, failures: list[tuple[int, dict]], answer: dict) -> None:
        with self.lock:
            self.failures, self.answer, self.received = list(failures), answer, []


class Handler(BaseHTTPRequestHandler):
    server: Gateway
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        gateway = self.server
        with gateway.lock:
            gateway.received.append((self.path, dict(self.headers), body))
            status, answer = gateway.failures.pop(0) if gateway.failures else (200, gateway.answer)
        payload = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        if status != 200:
            self.send_header("Connection", "close")  # as HAProxy's own error answers
        self.end_headers()
        self.wfile.write(payload)
        if status != 200:
            self.close_connection = True

    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def gateway() -> Iterator[Gateway]:
    server = Gateway()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize(
    "failures",
    [
        [(502, HAPROXY_502)],
        [(502, HAPROXY_502), (502, HAPROXY_502)],
        [(504, HAPROXY_504)],
        [(502, HAPROXY_502), (504, HAPROXY_504)],
    ],
    ids=["502", "502 twice", "504", "502 then 504"],
)
def test_a_load_balancers_502_and_504_are_retried_until_the_answer(make_client, gateway, failures):
    gateway.script(failures, TRANSLATED)
    client = make_client(base_url=gateway.url, max_retries=2)
    slept = client.record_sleeps()
    result = client.translate("Open the file.")
    assert result.results[0].translation == "Öffnen Sie die Datei."
    assert len(gateway.received) == len(failures) + 1 and len(slept) == len(failures)
    assert len({headers["X-Request-ID"] for _, headers, _ in gateway.received}) == 1  # one request, tried again
    assert len({body for _, _, body in gateway.received}) == 1


def test_an_image_batch_is_sent_again_whole_after_a_502(make_client, gateway, tmp_path):
    """The case HAProxy cannot replay itself: a multipart body over its buffer."""
    images = []
    for i in range(3):
        path = tmp_path / f"image-{i}.png"
        path.write_bytes(bytes([0x89]) + b"PNG" + bytes(range(256)) * 80 + bytes([i]))  # ~20 KiB each, sent as is
        images.append(path)
    gateway.script([(502, HAPROXY_502)], CLASSIFIED)
    client = make_client(base_url=gateway.url, max_retries=2)
    client.record_sleeps()
    assert client.classify(images, top_k=1).results[0].top_k[0].label == "Ankle boot"
    (_, _, first), (_, _, second) = gateway.received
    assert first == second and len(first) > 16 * 1024


def test_502s_are_retried_only_max_retries_times(make_client, gateway):
    gateway.script([(502, HAPROXY_502)] * 10, TRANSLATED)
    client = make_client(base_url=gateway.url, max_retries=3)
    slept = client.record_sleeps()
    with pytest.raises(InternalServerError) as caught:
        client.translate("Open the file.")
    assert caught.value.status == 502 and "closed the connection" in caught.value.message
    assert len(gateway.received) == 4 and len(slept) == 3


@pytest.mark.parametrize(
    ("status", "body", "raised"),
    [
        (504, DEADLINE, DeadlineExceededError),
        (500, {"error": {"code": "inference_failed", "message": "onnxruntime raised"}}, InternalServerError),
    ],
    ids=["the service's deadline", "500"],
)
def test_the_services_own_504_and_500_are_not_retried(make_client, gateway, status, body, raised):
    gateway.script([(status, body)], TRANSLATED)
    client = make_client(base_url=gateway.url, max_retries=3)
    slept = client.record_sleeps()
    with pytest.raises(raised):
        client.translate("Open the file.")
    assert len(gateway.received) == 1 and slept == []
