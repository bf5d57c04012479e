"""Deadlines end to end: uvicorn in a thread serving the shipped models, the model held still by a gate.

A request past its deadline gets 504 ``deadline_exceeded`` and never reaches the model; the client
sets the deadline with ``X-Request-Timeout`` (or the OIP ``timeout`` parameter) within the cap. The
real onnxruntime run is wrapped with a gate (``GatedRun``), so "queued behind a busy model" is
reached without sleeping and hoping; every timing below is a bound the answer must respect, never
a speed the machine must reach.
"""

from __future__ import annotations

import base64
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


@pytest.fixture(scope="module")
def vit_repository(tmp_path_factory) -> Path:
    """A repository of the shipped ViT alone (linked): nothing else to load and warm up."""
    repo = tmp_path_factory.mktemp("deadlines") / "models"
    repo.mkdir()
    (repo / "vit").symlink_to(SHIPPED / "vit", target_is_directory=True)
    return repo


@pytest.fixture
def serve(vit_repository):
    """Factory: ``with serve(**settings) as srv:`` serves a fresh app on the ViT, ready."""
    from service.http.app import create_app
    from service.settings import Settings

    def make(repository: Path = vit_repository, **overrides) -> ThreadServer:
        base = {k.removeprefix("ATTNSERVE_").lower(): v for k, v in BASE_ENV.items()}
        return ThreadServer(create_app(Settings(**{"model_repository": repository, **base, **overrides})))

    return make


@pytest.fixture
def gated_run(monkeypatch):
    gate = GatedRun(monkeypatch)
    yield gate
    gate.open.set()


def classify(srv, images: int, timeout: str | None = None) -> httpx.Response:
    body = {"images": [base64.b64encode(p.read_bytes()).decode() for p in SAMPLES[:images]]}
    headers = {} if timeout is None else {"X-Request-Timeout": timeout}
    return httpx.post(srv.url + "/classify", json=body, headers=headers, timeout=60)


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
