"""Deadlines and slow clients end to end: uvicorn in a thread serving the shipped models, held still or slowed.

A request past its deadline gets 504 ``deadline_exceeded``: a queued one never reaches the model, a
translation leaves the running batch (a stream ends with an ``error`` event); the client sets the
deadline with ``X-Request-Timeout`` (or the OIP ``timeout`` parameter) within the cap. A body that
trickles in too slowly gets 408 and its connection closed, while other clients are served. The real
onnxruntime run is wrapped with a gate (``GatedRun``) and the real decoder step with a delay, so
"queued behind a busy model" and "still decoding" are reached without sleeping and hoping: every
time below is a bound the answer must respect, never a speed the machine must reach.
"""

from __future__ import annotations

import base64
import json
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from tests.conftest import ROOT
from tests.service.service_testing import BASE_ENV, ThreadServer, metric_value, wait_until
from tests.service.test_serving_states import GatedRun

SHIPPED = ROOT / "models"
SAMPLES = sorted(SHIPPED.glob("vit/*/sample-*.png"))
LONG_TEXT = (
    "Select the cells that you want to format, then choose Format - Cells and set the font, the borders "
    "and the background colour of the selected cells in the dialog that opens."
)
STEP_DELAY_S = 0.2  # each decoder step of the slowed translator takes at least this long: LONG_TEXT >= 8 s


def shipped(tmp_path_factory, name: str) -> Path:
    """A repository of one shipped model alone (linked): nothing else to load and warm up."""
    repo = tmp_path_factory.mktemp(f"deadlines-{name}") / "models"
    repo.mkdir()
    (repo / name).symlink_to(SHIPPED / name, target_is_directory=True)
    return repo


def app(repository: Path, **overrides):
    from service.process import create_app
    from service.settings import Settings

    base = {k.removeprefix("ATTNSERVE_").lower(): v for k, v in BASE_ENV.items()}
    return create_app(Settings(**{"model_repository": repository, **base, **overrides}))


@pytest.fixture(scope="module")
def vit_repository(tmp_path_factory) -> Path:
    return shipped(tmp_path_factory, "vit")


@pytest.fixture
def serve(vit_repository):
    """Factory: ``with serve(**settings) as srv:`` serves a fresh app on the ViT."""
    return lambda **overrides: ThreadServer(app(vit_repository, **overrides))


@pytest.fixture(scope="module")
def slow_translator(tmp_path_factory):
    """The shipped translator alone, each decoder step behind a delay: a long sentence takes seconds to
    decode however fast the machine is."""
    from service.engine import scheduler

    real = scheduler.step

    def slow_step(batch, decoder, spec):
        time.sleep(STEP_DELAY_S)
        return real(batch, decoder, spec)

    limits = {"max_running_sequences": 8, "max_waiting_sequences": 8, "max_beam_size": 4, "max_texts_per_request": 2}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(scheduler, "step", slow_step)
        with ThreadServer(app(shipped(tmp_path_factory, "translator"), **limits)) as srv:
            srv.wait_ready()
            yield srv


@pytest.fixture
def gated_run(monkeypatch):
    gate = GatedRun(monkeypatch)
    yield gate
    gate.open.set()


def classify_body(images: int) -> dict:
    return {"images": [base64.b64encode(p.read_bytes()).decode() for p in SAMPLES[:images]]}


def classify(srv, images: int, timeout: str | None = None) -> httpx.Response:
    headers = {} if timeout is None else {"X-Request-Timeout": timeout}
    return httpx.post(srv.url + "/classify", json=classify_body(images), headers=headers, timeout=60)


def infer_body(**parameters) -> dict:
    """An OIP inference of one blank image, as preprocessed pixels (JSON)."""
    pixels = {"name": "pixels", "shape": [1, 1, 28, 28], "datatype": "FP32", "data": [0.0] * 784}
    return {"inputs": [pixels], "parameters": parameters}


def metric(srv, name: str, **labels: str) -> float:
    return metric_value(srv.get("/metrics").text, name, **labels)


def test_a_queued_request_past_its_deadline_gets_504_without_running_and_frees_its_place(serve, gated_run):
    settings = {"model_instances": 1, "max_batch_size": 4, "max_images_per_request": 4, "max_queue_images": 8}
    with serve(**settings) as srv, ThreadPoolExecutor(4) as pool:
        srv.wait_ready()
        gated_run.sizes.clear()
        gated_run.hold()
        running = pool.submit(classify, srv, 1)
        assert gated_run.entered.wait(timeout=60)  # the model is busy with it, and held
        ahead = pool.submit(classify, srv, 4)
        wait_until(lambda: metric(srv, "attnserve_queue_images", model="vit") == 4, what="4 images queued")
        late = classify(srv, 3, timeout="0.05")  # queued behind them: 7 of 8 places
        assert late.status_code == 504, late.text
        assert late.json()["error"]["code"] == "deadline_exceeded" and late.json()["error"]["message"]
        after = pool.submit(classify, srv, 4)  # fits only if the late request no longer holds its 3 places
        wait_until(lambda: metric(srv, "attnserve_queue_images", model="vit") == 8, what="the next request queued")
        gated_run.open.set()
        assert [f.result().status_code for f in (running, ahead, after)] == [200, 200, 200]
        text = srv.get("/metrics").text
    assert gated_run.sizes == [1, 4, 4]  # the late request's 3 images never reached the model
    assert metric_value(text, "attnserve_images_total", model="vit") == 9
    assert metric_value(text, "attnserve_deadline_exceeded_requests_total", route="/classify") == 1
    assert metric_value(text, "attnserve_http_requests_total", route="/classify", status="504") == 1


@pytest.mark.parametrize(
    "settings, header, status",
    [
        ({}, "0.2", 504),  # shorter than the default deadline (60 s)
        ({"request_timeout_s": 0.2, "max_request_timeout_s": 0.2}, "100", 504),  # cut to the cap
        ({"request_timeout_s": 0.2, "max_request_timeout_s": 60}, "30", 200),  # longer than the default, within it
    ],
    ids=["shortens", "capped", "lengthens-within-the-cap"],
)
def test_x_request_timeout_sets_the_deadline_within_the_cap(serve, gated_run, settings, header, status):
    with serve(model_instances=1, **settings) as srv, ThreadPoolExecutor(1) as pool:
        srv.wait_ready()
        gated_run.hold()
        answer = pool.submit(classify, srv, 1, header)
        assert gated_run.entered.wait(timeout=60)
        if status == 200:
            time.sleep(1.0)  # held five times the default deadline: only the header's keeps it alive
            gated_run.open.set()
        r = answer.result(timeout=60)  # a 504 comes while the model is still held
        gated_run.open.set()
    assert r.status_code == status, r.text


@pytest.mark.parametrize("value", ["abc", "0", "-1", "inf", "nan", "1e3", "", "1,5", "0.0"])
def test_a_malformed_x_request_timeout_is_400_invalid_timeout(serve, value):
    with serve() as srv:
        srv.wait_ready()
        r = classify(srv, 1, value)
        oip = httpx.post(srv.url + "/v2/models/vit/infer", json=infer_body(), headers={"X-Request-Timeout": value})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_timeout", r.text
    assert oip.status_code == 400 and "x-request-timeout" in oip.json()["error"]


def test_the_oip_timeout_parameter_in_microseconds_bounds_an_inference(serve, gated_run):
    pixels = np.zeros((1, 1, 28, 28), np.float32)
    with serve(model_instances=1) as srv:
        srv.wait_ready()
        client = triton.InferenceServerClient(srv.url.removeprefix("http://"))
        tensor = triton.InferInput("pixels", list(pixels.shape), "FP32")
        tensor.set_data_from_numpy(pixels)
        try:
            gated_run.hold()
            with pytest.raises(InferenceServerException) as late:
                client.infer("vit", [tensor], timeout=50_000)  # 50 ms, as tritonclient sends it
            gated_run.open.set()
            assert client.infer("vit", [tensor], timeout=30_000_000).as_numpy("probabilities").shape == (1, 10)
            bad = [
                httpx.post(srv.url + "/v2/models/vit/infer", json=infer_body(timeout=t)) for t in (-1, 1.5, "1s", True)
            ]
        finally:
            client.close()
        text = srv.get("/metrics").text
    assert late.value.status() == "504" and "deadline" in late.value.message()
    assert [r.status_code for r in bad] == [400] * 4 and all("timeout" in r.json()["error"] for r in bad)
    assert metric_value(text, "attnserve_deadline_exceeded_requests_total", route="/v2/models/{name}/infer") == 1


def decoding_stopped(srv) -> bool:
    """Nothing runs or waits in the translator's scheduler, by its own account and by the metrics'."""
    models = httpx.get(srv.url + "/models").json()["models"]
    scheduler = next(m for m in models if m["name"] == "translator")["scheduler"]
    text = srv.get("/metrics").text
    gauges = [metric_value(text, f"attnserve_{kind}_sequences", model="translator") for kind in ("running", "waiting")]
    return scheduler["running_sequences"] == scheduler["waiting_sequences"] == 0 and gauges == [0, 0]


def translator_counts(srv) -> dict[str, float]:
    text = srv.get("/metrics").text
    return {
        "tokens": metric_value(text, "attnserve_generated_tokens_total", model="translator"),
        "dropped": metric_value(text, "attnserve_dropped_requests_total", model="translator"),
        "finished": metric_value(text, "attnserve_time_per_output_token_seconds_count", model="translator"),
    }


def test_a_long_beam_search_past_its_deadline_gets_504_stops_and_frees_its_rows(slow_translator):
    srv, before = slow_translator, translator_counts(slow_translator)
    body = {"text": LONG_TEXT, "beam_size": 4, "max_new_tokens": 200}  # ~40 steps: >= 8 s
    r = httpx.post(srv.url + "/translate", json=body, headers={"X-Request-Timeout": "3"}, timeout=60)
    assert r.status_code == 504, r.text
    assert r.json()["error"]["code"] == "deadline_exceeded"
    wait_until(lambda: decoding_stopped(srv), timeout=30, what="the beam to leave the running batch")
    after = translator_counts(srv)
    assert after["tokens"] > before["tokens"]  # it was decoding when its deadline passed...
    assert after["dropped"] == before["dropped"] + 1  # ...and left the batch cut short,
    assert after["finished"] == before["finished"]  # not finished
    assert metric(srv, "attnserve_deadline_exceeded_requests_total", route="/translate") >= 1


def test_a_streamed_translation_past_its_deadline_ends_with_an_error_event(slow_translator):
    srv, before = slow_translator, translator_counts(slow_translator)
    body = {"text": LONG_TEXT, "stream": True, "max_new_tokens": 200}
    events, kind = [], None
    with httpx.stream("POST", srv.url + "/translate", json=body, headers={"X-Request-Timeout": "3"}, timeout=60) as r:
        assert r.status_code == 200  # the stream began before the deadline
        for line in r.iter_lines():
            if line.startswith("event: "):
                kind = line.removeprefix("event: ")
            elif line.startswith("data: "):
                events.append((kind, json.loads(line.removeprefix("data: "))))
    assert [k for k, _ in events[:-1]] == ["token"] * (len(events) - 1)
    assert events[-1] == (
        "error",
        {"error": {"code": "deadline_exceeded", "message": events[-1][1]["error"]["message"]}},
    )
    wait_until(lambda: decoding_stopped(srv), timeout=30, what="the stream to leave the running batch")
    assert translator_counts(srv)["dropped"] == before["dropped"] + 1


def test_the_oip_timeout_parameter_bounds_a_translation(slow_translator):
    srv = slow_translator
    counted = metric(srv, "attnserve_deadline_exceeded_requests_total", route="/v2/models/{name}/infer")
    client = triton.InferenceServerClient(srv.url.removeprefix("http://"))
    text = triton.InferInput("text", [1], "BYTES")
    text.set_data_from_numpy(np.array([LONG_TEXT], dtype=object))
    try:
        with pytest.raises(InferenceServerException) as late:
            client.infer("translator", [text], parameters={"beam_size": 4}, timeout=3_000_000)
    finally:
        client.close()
    assert late.value.status() == "504"
    wait_until(lambda: decoding_stopped(srv), timeout=30, what="the translation to leave the running batch")
    assert metric(srv, "attnserve_deadline_exceeded_requests_total", route="/v2/models/{name}/infer") == counted + 1


def test_a_body_that_trickles_in_gets_408_and_its_connection_closed_while_others_are_served(serve):
    body = json.dumps(classify_body(1)).encode()
    with serve(body_timeout_s=2.0) as srv:
        srv.wait_ready()
        host, port = srv.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=60) as slow:
            request = f"POST /classify HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            slow.sendall(f"{request}Content-Length: {len(body)}\r\n\r\n".encode())
            for byte in body[:5]:  # a byte every 0.1 s, then nothing: the rest would take a minute at this rate
                slow.sendall(bytes([byte]))
                time.sleep(0.1)
            served = classify(srv, 1)  # another client meanwhile
            answer = b""
            while chunk := slow.recv(65536):  # until the server closes the connection
                answer += chunk
        text = srv.get("/metrics").text
    assert served.status_code == 200
    head, _, payload = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408 ") and b"connection: close" in head.lower()
    assert json.loads(payload)["error"]["code"] == "request_timeout"
    assert metric_value(text, "attnserve_http_requests_total", route="/classify", status="408") == 1
    assert metric_value(text, "attnserve_images_total", model="vit") == 1  # the slow body never reached the queue
